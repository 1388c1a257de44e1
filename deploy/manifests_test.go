// Package deploy holds webdraft's deployment recipes (the container image,
// the Kubernetes manifests) and their test, in a module of its own so that
// the Kubernetes and Inference Extension modules stay out of webdraft's.
package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	eppconfig "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
)

// objects are the manifests' objects, decoded strictly, by kind and name.
type objects struct {
	deployments  map[string]*appsv1.Deployment
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	accounts     map[string]*corev1.ServiceAccount
	roles        map[string]*rbacv1.Role
	roleBindings map[string]*rbacv1.RoleBinding
	pools        map[string]*infv1.InferencePool
	routes       map[string]*gwv1.HTTPRoute
}

// decode decodes one document strictly into the type of its apiVersion
// and kind (an unknown kind is an error) and files it by name.
func (o *objects) decode(doc []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	name := head.Metadata.Name
	if name == "" {
		return fmt.Errorf("%s %s without a name", head.APIVersion, head.Kind)
	}
	kind := head.APIVersion + " " + head.Kind
	switch kind {
	case "apps/v1 Deployment":
		return put(o.deployments, kind, name, doc)
	case "v1 Service":
		return put(o.services, kind, name, doc)
	case "v1 ConfigMap":
		return put(o.configMaps, kind, name, doc)
	case "v1 ServiceAccount":
		return put(o.accounts, kind, name, doc)
	case "rbac.authorization.k8s.io/v1 Role":
		return put(o.roles, kind, name, doc)
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return put(o.roleBindings, kind, name, doc)
	case "inference.networking.k8s.io/v1 InferencePool":
		return put(o.pools, kind, name, doc)
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return put(o.routes, kind, name, doc)
	}
	return fmt.Errorf("%s: unknown kind %s %s", name, head.APIVersion, head.Kind)
}

// put decodes doc strictly into a new T and files it under name.
func put[T any](m map[string]*T, kind, name string, doc []byte) error {
	v := new(T)
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return fmt.Errorf("%s %s: %w", kind, name, err)
	}
	m[name] = v
	return nil
}

// load decodes every document of every manifest in dir.
func load(dir string) (*objects, error) {
	o := &objects{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, accounts: map[string]*corev1.ServiceAccount{},
		roles: map[string]*rbacv1.Role{}, roleBindings: map[string]*rbacv1.RoleBinding{},
		pools: map[string]*infv1.InferencePool{}, routes: map[string]*gwv1.HTTPRoute{},
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no manifests in %s (%v)", dir, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, doc := range splitDocuments(b) {
			if err := o.decode(doc); err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", filepath.Base(f), i+1, err)
			}
		}
	}
	return o, nil
}

// splitDocuments splits a YAML stream at its "---" lines, dropping
// documents of comments only.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(b, []byte("\n---\n")) {
		for _, line := range strings.Split(string(d), "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, d)
				break
			}
		}
	}
	return docs
}

// eppArgs is the picker's flags, --name=value, as a map.
func eppArgs(c corev1.Container) map[string]string {
	args := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		args[k] = v
	}
	return args
}

// extractorParams mirrors the model-server-protocol-metrics extractor's
// parameters (pkg/epp/framework/plugins/datalayer/extractor/metrics,
// factories.go, at the picker's version, v1.4.0), whose Go types the
// module does not export: decoded strictly, a misspelt key fails.
type extractorParams struct {
	EngineLabelKey string `json:"engineLabelKey"`
	DefaultEngine  string `json:"defaultEngine"`
	EngineConfigs  []struct {
		Name                string `json:"name"`
		QueuedRequestsSpec  string `json:"queuedRequestsSpec"`
		RunningRequestsSpec string `json:"runningRequestsSpec"`
		KVUsageSpec         string `json:"kvUsageSpec"`
		LoRASpec            string `json:"loraSpec"`
		CacheInfoSpec       string `json:"cacheInfoSpec"`
	} `json:"engineConfigs"`
}

// TestManifests decodes every manifest strictly into the Kubernetes,
// Gateway API and Inference Extension types, the picker's configuration
// into its EndpointPickerConfig, and checks that the pieces name each
// other: the pool selects webdraft's pods on its port, its picker
// reference is the picker's Service and port, the picker serves that
// pool with the mounted configuration, reads webdraft's metric names
// for the engine its pods are labelled with, and runs as the account
// the role is bound to; the route sends /v1/ to the pool.
func TestManifests(t *testing.T) {
	o, err := load("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	web, epp := o.deployments["webdraft"], o.deployments["webdraft-epp"]
	pool, eppSvc := o.pools["webdraft"], o.services["webdraft-epp"]
	if web == nil || epp == nil || pool == nil || eppSvc == nil || o.services["webdraft"] == nil || o.routes["webdraft"] == nil {
		t.Fatalf("missing objects: deployments %v, services %v, pools %v, routes %v", keys(o.deployments), keys(o.services), keys(o.pools), keys(o.routes))
	}

	// The pool selects webdraft's pods, on the port webdraft listens on.
	pod := web.Spec.Template
	for k, v := range pool.Spec.Selector.MatchLabels {
		if pod.Labels[string(k)] != string(v) {
			t.Errorf("the pool selects %s=%s; webdraft's pods have %v", k, v, pod.Labels)
		}
	}
	for k, v := range web.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("webdraft's Deployment selects %s=%s; its pods have %v", k, v, pod.Labels)
		}
	}
	server := pod.Spec.Containers[0]
	port := server.Ports[0].ContainerPort
	if len(pool.Spec.TargetPorts) != 1 || int32(pool.Spec.TargetPorts[0].Number) != port {
		t.Errorf("the pool's target ports %v; webdraft listens on %d", pool.Spec.TargetPorts, port)
	}
	if !slices.Contains(server.Args, fmt.Sprintf("--addr=0.0.0.0:%d", port)) || server.Args[0] != "serve" {
		t.Errorf("webdraft's args %v: want serve --addr=0.0.0.0:%d", server.Args, port)
	}
	for name, p := range map[string]*corev1.Probe{"startup": server.StartupProbe, "readiness": server.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || p.HTTPGet.Port != intstr.FromString(server.Ports[0].Name) {
			t.Errorf("webdraft's %s probe %+v: want GET /health on its port", name, p)
		}
	}
	// The driver's kernel cache: its folder is a volume of the pod's.
	if dir := envValue(server.Env, "__GL_SHADER_DISK_CACHE_PATH"); !mounted(pod.Spec, server, dir) {
		t.Errorf("webdraft's __GL_SHADER_DISK_CACHE_PATH %q is no folder a volume of the pod is mounted at (mounts %+v)", dir, server.VolumeMounts)
	}

	// The pool's picker is the picker's Service, on its ext-proc port,
	// and that port reaches the picker's gRPC container port.
	ref := pool.Spec.EndpointPickerRef
	if string(ref.Name) != eppSvc.Name || ref.Port == nil {
		t.Fatalf("the pool's endpoint picker %+v; the picker's Service is %s", ref, eppSvc.Name)
	}
	picker := epp.Spec.Template.Spec.Containers[0]
	var reached bool
	for _, sp := range eppSvc.Spec.Ports {
		if sp.Port == int32(ref.Port.Number) {
			for _, cp := range picker.Ports {
				reached = reached || cp.Name == sp.TargetPort.StrVal && cp.ContainerPort == 9002
			}
		}
	}
	if !reached {
		t.Errorf("the pool reaches the picker at port %d, which its Service does not take to the picker's gRPC port 9002", ref.Port.Number)
	}
	for k, v := range eppSvc.Spec.Selector {
		if epp.Spec.Template.Labels[k] != v {
			t.Errorf("the picker's Service selects %s=%s; its pods have %v", k, v, epp.Spec.Template.Labels)
		}
	}

	// The picker serves this pool, with the configuration its ConfigMap
	// mounts, as the account its role is bound to.
	args := eppArgs(picker)
	if args["pool-name"] != pool.Name {
		t.Errorf("the picker's --pool-name %q; the pool is %s", args["pool-name"], pool.Name)
	}
	file := args["config-file"]
	var mount *corev1.VolumeMount
	for i, m := range picker.VolumeMounts {
		if strings.HasPrefix(file, m.MountPath+"/") {
			mount = &picker.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("the picker's --config-file %q is in none of its mounts %v", file, picker.VolumeMounts)
	}
	var cm *corev1.ConfigMap
	for _, v := range epp.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name && v.ConfigMap != nil {
			cm = o.configMaps[v.ConfigMap.Name]
		}
	}
	if cm == nil {
		t.Fatalf("the picker's volume %s is no ConfigMap of the manifests", mount.Name)
	}
	text, ok := cm.Data[strings.TrimPrefix(file, mount.MountPath+"/")]
	if !ok {
		t.Fatalf("ConfigMap %s has no key for %s: %v", cm.Name, file, keys(cm.Data))
	}
	var cfg eppconfig.EndpointPickerConfig
	if err := yaml.UnmarshalStrict([]byte(text), &cfg); err != nil {
		t.Fatalf("the picker's configuration: %v", err)
	}
	checkPickerConfig(t, &cfg, pod.Labels)
	sa := epp.Spec.Template.Spec.ServiceAccountName
	if o.accounts[sa] == nil {
		t.Errorf("the picker runs as %q, which the manifests do not make", sa)
	}
	bound := false
	for _, rb := range o.roleBindings {
		for _, s := range rb.Subjects {
			bound = bound || s.Kind == "ServiceAccount" && s.Name == sa && o.roles[rb.RoleRef.Name] != nil
		}
	}
	if !bound {
		t.Errorf("no RoleBinding gives %s a Role of the manifests", sa)
	}

	// The route sends the OpenAI-compatible API to the pool.
	route := o.routes["webdraft"]
	var toPool bool
	for _, r := range route.Spec.Rules {
		for _, b := range r.BackendRefs {
			toPool = toPool || b.Kind != nil && *b.Kind == "InferencePool" && b.Group != nil && *b.Group == gwv1.Group(infv1.GroupName) && string(b.Name) == pool.Name
		}
	}
	if !toPool {
		t.Errorf("HTTPRoute webdraft does not send to InferencePool %s", pool.Name)
	}
}

// checkPickerConfig: the data layer is on and wired to the metrics
// extractor, which maps the engine webdraft's pods are labelled with to
// webdraft's names; every profile's plugin is declared.
func checkPickerConfig(t *testing.T, cfg *eppconfig.EndpointPickerConfig, podLabels map[string]string) {
	t.Helper()
	if cfg.Kind != "EndpointPickerConfig" || cfg.APIVersion != eppconfig.GroupName+"/v1alpha1" {
		t.Errorf("the picker's configuration is %s %s", cfg.APIVersion, cfg.Kind)
	}
	if !slices.Contains(cfg.FeatureGates, "dataLayer") {
		t.Errorf("feature gates %v: the data layer, which reads webdraft's metric names, is off", cfg.FeatureGates)
	}
	plugins := map[string]eppconfig.PluginSpec{}
	for _, p := range cfg.Plugins {
		name := p.Name
		if name == "" {
			name = p.Type
		}
		plugins[name] = p
	}
	for _, prof := range cfg.SchedulingProfiles {
		for _, p := range prof.Plugins {
			if _, ok := plugins[p.PluginRef]; !ok {
				t.Errorf("profile %s refers to %q, which is not declared", prof.Name, p.PluginRef)
			}
		}
	}
	if cfg.Data == nil || len(cfg.Data.Sources) == 0 {
		t.Fatal("the picker's configuration has no data sources")
	}
	var extractor *eppconfig.PluginSpec
	for _, src := range cfg.Data.Sources {
		if plugins[src.PluginRef].Type != "metrics-data-source" {
			t.Errorf("data source %q is not a metrics-data-source", src.PluginRef)
		}
		for _, e := range src.Extractors {
			if p, ok := plugins[e.PluginRef]; ok && p.Type == "model-server-protocol-metrics" {
				extractor = &p
			}
		}
	}
	if extractor == nil {
		t.Fatal("no model-server-protocol-metrics extractor on the data source")
	}
	var params extractorParams
	dec := json.NewDecoder(bytes.NewReader(extractor.Parameters))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&params); err != nil {
		t.Fatalf("the extractor's parameters: %v", err)
	}
	engine := podLabels[params.EngineLabelKey]
	if engine == "" || engine != params.DefaultEngine {
		t.Errorf("webdraft's pods are labelled %s=%q; the extractor's default engine is %q", params.EngineLabelKey, engine, params.DefaultEngine)
	}
	want := map[string]string{ // webdraft's names (server/metrics.go; the server's tests check it exports them)
		"queued": "webdraft_num_requests_waiting", "running": "webdraft_num_requests_running",
		"kv": "webdraft_kv_cache_usage_perc", "cacheInfo": "webdraft_cache_config_info", "lora": "",
	}
	found := false
	for _, ec := range params.EngineConfigs {
		if ec.Name != engine {
			continue
		}
		found = true
		got := map[string]string{"queued": ec.QueuedRequestsSpec, "running": ec.RunningRequestsSpec, "kv": ec.KVUsageSpec, "cacheInfo": ec.CacheInfoSpec, "lora": ec.LoRASpec}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("engine %s: the %s metric is %q, webdraft's is %q", engine, k, got[k], v)
			}
		}
	}
	if !found {
		t.Errorf("no engine config for %q", engine)
	}
}

// TestStrict: the decoding the manifests pass refuses a misspelt field,
// so that TestManifests means something.
func TestStrict(t *testing.T) {
	o := &objects{pools: map[string]*infv1.InferencePool{}}
	err := o.decode([]byte("apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata:\n  name: p\nspec:\n  targetPort:\n    - number: 8080\n"))
	if err == nil || !strings.Contains(err.Error(), "targetPort") {
		t.Errorf("a misspelt field: %v", err)
	}
	var cfg eppconfig.EndpointPickerConfig
	if err := yaml.UnmarshalStrict([]byte("kind: EndpointPickerConfig\ndataLayer:\n  sources: []\n"), &cfg); err == nil {
		t.Error("a misspelt field of the picker's configuration was taken")
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// envValue is the value of c's variable name ("" where unset).
func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// mounted reports whether dir is where one of spec's volumes is mounted
// in c, writable.
func mounted(spec corev1.PodSpec, c corev1.Container, dir string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir && dir != "" && !m.ReadOnly && slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			return true
		}
	}
	return false
}
