// Package cluster runs webdraft replicas behind HAProxy on one machine,
// on loopback: the scale-out recipe of deploy/ in miniature, for `task
// cluster` and its test. HAProxy keeps a session on one replica by
// consistent hashing of its X-Session-ID header (the key `webdraft
// loadtest` sends per conversation), or spreads requests round-robin, and
// checks each replica's /health; Run loads both ways, then kills a replica
// in the middle of a run, and reports what happened.
package cluster

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// SessionHeader carries a conversation's key; ServedByHeader is the
// response header HAProxy names the answering replica in.
const (
	SessionHeader  = "X-Session-ID"
	ServedByHeader = "X-Served-By"
)

// Health checks: HAProxy asks every replica's /health each checkInterval
// and takes it out after checkFall failures in a row, back in after
// checkRise successes.
const (
	checkInterval = 250 * time.Millisecond
	checkFall     = 2
	checkRise     = 2
)

// Config is how the cluster's processes run.
type Config struct {
	Bin      string   // the webdraft binary
	HAProxy  string   // the haproxy binary ("": found on PATH or in /usr/sbin)
	Replicas int      // webdraft serve processes
	Args     []string // serve's flags beside --addr (--backend, --cache-mb …)
	Dir      string   // for haproxy.cfg and each process's log
}

// Cluster is the running processes.
type Cluster struct {
	cfg      Config
	replicas []*replica
	haproxy  *process
	// AffinityURL and RoundRobinURL are HAProxy's two front ends (one
	// hashing X-Session-ID, one round-robin) over the same replicas;
	// statsURL its statistics, as CSV.
	AffinityURL, RoundRobinURL string
	statsURL                   string
}

type replica struct {
	Name, Addr string
	proc       *process
}

type process struct {
	cmd  *exec.Cmd
	log  string
	done chan error // Wait's result
}

// Start starts the replicas and HAProxy, and returns once HAProxy sees
// every replica healthy.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Replicas < 2 {
		return nil, fmt.Errorf("cluster: %d replicas: want 2 at least", cfg.Replicas)
	}
	haproxy, err := findHAProxy(cfg.HAProxy)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c := &Cluster{cfg: cfg}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	for i := range cfg.Replicas {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		r := &replica{Name: fmt.Sprintf("r%d", i), Addr: addr}
		args := append([]string{"serve", "--addr", addr}, cfg.Args...)
		if r.proc, err = start(ctx, cfg.Bin, args, filepath.Join(cfg.Dir, r.Name+".log")); err != nil {
			return nil, fmt.Errorf("cluster: replica %s: %w", r.Name, err)
		}
		c.replicas = append(c.replicas, r)
	}
	var fronts [3]string
	for i := range fronts {
		if fronts[i], err = freeAddr(); err != nil {
			return nil, err
		}
	}
	c.AffinityURL, c.RoundRobinURL, c.statsURL = "http://"+fronts[0], "http://"+fronts[1], "http://"+fronts[2]+"/stats;csv"
	conf := filepath.Join(cfg.Dir, "haproxy.cfg")
	if err := c.writeConfig(conf, fronts); err != nil {
		return nil, err
	}
	check := exec.CommandContext(ctx, haproxy, "-c", "-q", "-f", conf)
	if out, err := check.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("cluster: haproxy -c: %w\n%s", err, out)
	}
	if c.haproxy, err = start(ctx, haproxy, []string{"-db", "-f", conf}, filepath.Join(cfg.Dir, "haproxy.log")); err != nil {
		return nil, fmt.Errorf("cluster: haproxy: %w", err)
	}
	if err := c.waitUp(ctx, 3*time.Minute, len(c.replicas)); err != nil {
		return nil, err
	}
	return c, nil
}

// Replicas are the replicas' names, in order.
func (c *Cluster) Replicas() []string {
	names := make([]string, len(c.replicas))
	for i, r := range c.replicas {
		names[i] = r.Name
	}
	return names
}

// Kill kills replica name at once (SIGKILL: no draining), as a crash or
// a lost machine would.
func (c *Cluster) Kill(name string) error {
	for _, r := range c.replicas {
		if r.Name == name {
			return r.proc.kill()
		}
	}
	return fmt.Errorf("cluster: no replica %q", name)
}

// WaitDown waits until HAProxy has taken replica name out of both back
// ends, and returns when it saw that.
func (c *Cluster) WaitDown(ctx context.Context, name string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st, err := c.status(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if strings.HasPrefix(st["affinity/"+name], "DOWN") && strings.HasPrefix(st["roundrobin/"+name], "DOWN") {
			return time.Now(), nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("cluster: HAProxy still routes to %s after %s", name, timeout)
}

// Close stops every process: the replicas by SIGTERM (they drain), then
// HAProxy.
func (c *Cluster) Close() error {
	var errs []error
	for _, r := range c.replicas {
		if err := r.proc.stop(30 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("replica %s: %w", r.Name, err))
		}
	}
	if c.haproxy != nil {
		if err := c.haproxy.stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("haproxy: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Logs is where the processes write: for a failure's report.
func (c *Cluster) Logs() string { return c.cfg.Dir }

// waitUp waits until HAProxy counts want replicas UP in both back ends.
func (c *Cluster) waitUp(ctx context.Context, timeout time.Duration, want int) error {
	deadline := time.Now().Add(timeout)
	var last map[string]string
	for time.Now().Before(deadline) {
		for _, p := range append([]*process{c.haproxy}, c.procs()...) {
			select {
			case err := <-p.done:
				p.done <- err
				return fmt.Errorf("cluster: %s stopped while starting: %v; its log:\n%s", filepath.Base(p.log), err, tail(p.log))
			default:
			}
		}
		st, err := c.status(ctx)
		if err == nil {
			last = st
			up := 0
			for k, v := range st {
				if strings.HasPrefix(k, "affinity/") && v == "UP" && st["roundrobin/"+strings.TrimPrefix(k, "affinity/")] == "UP" {
					up++
				}
			}
			if up == want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("cluster: after %s HAProxy sees %v, want %d replicas UP", timeout, last, want)
}

func (c *Cluster) procs() []*process {
	var ps []*process
	for _, r := range c.replicas {
		ps = append(ps, r.proc)
	}
	return ps
}

// status reads HAProxy's statistics: "backend/server" → its status (UP,
// DOWN, "UP 1/2" while a check changes it …).
func (c *Cluster) status(ctx context.Context) (map[string]string, error) {
	rows, err := c.stats(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, row := range rows {
		out[k] = row["status"]
	}
	return out, nil
}

// Retries are the requests HAProxy sent to server of backend and then,
// the server having failed them, again to it (retried) or to another
// (redispatched).
func (c *Cluster) Retries(ctx context.Context, backend, server string) (retried, redispatched int, err error) {
	rows, err := c.stats(ctx)
	if err != nil {
		return 0, 0, err
	}
	row, ok := rows[backend+"/"+server]
	if !ok {
		return 0, 0, fmt.Errorf("cluster: haproxy stats: no %s/%s", backend, server)
	}
	retried, _ = strconv.Atoi(row["wretr"])
	redispatched, _ = strconv.Atoi(row["wredis"])
	return retried, redispatched, nil
}

// stats reads HAProxy's statistics, a row a server: "backend/server" →
// column → value.
func (c *Cluster) stats(ctx context.Context) (map[string]map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.statsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cluster: haproxy stats: %w", err)
	}
	defer resp.Body.Close()
	rd := csv.NewReader(resp.Body)
	rd.FieldsPerRecord = -1
	rows, err := rd.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("cluster: haproxy stats: %v", err)
	}
	head := rows[0]
	if len(head) > 0 {
		head[0] = strings.TrimPrefix(head[0], "# ")
	}
	out := map[string]map[string]string{}
	for _, row := range rows[1:] {
		r := map[string]string{}
		for i, v := range row {
			if i < len(head) {
				r[head[i]] = v
			}
		}
		if sv := r["svname"]; sv != "" && sv != "FRONTEND" && sv != "BACKEND" {
			out[r["pxname"]+"/"+sv] = r
		}
	}
	return out, nil
}

var configTemplate = template.Must(template.New("haproxy.cfg").Parse(`# webdraft replicas behind HAProxy (internal/cluster): two front ends over
# the same replicas, one keeping a session on one replica, one round-robin.
global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 2m
    timeout server 2m
    timeout http-request 10s
    # A busy replica's /health may be slow to answer; a dead one refuses
    # at once.
    timeout check 5s
    # A request that found a replica dead (refused, or closed before any
    # answer) goes again to another: /draft is a pure function of its
    # body, so a retry is safe.
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response

# Sessions: consistent hashing of X-Session-ID, so that a conversation's
# prefix cache stays on one replica and a replica's loss moves only its
# own sessions. A request without the header is balanced as round-robin.
frontend affinity
    bind {{.Fronts.Affinity}}
    default_backend affinity

frontend roundrobin
    bind {{.Fronts.RoundRobin}}
    default_backend roundrobin

frontend stats
    bind {{.Fronts.Stats}}
    stats enable
    stats uri /stats

backend affinity
    balance hdr({{.Session}})
    hash-type consistent
{{template "servers" .}}
backend roundrobin
    balance roundrobin
{{template "servers" .}}
{{define "servers"}}    option httpchk GET /health
    http-check expect status 200
    http-response set-header {{.ServedBy}} %[srv_name]
    default-server check inter {{.Inter}} fall {{.Fall}} rise {{.Rise}}
{{- range .Replicas}}
    server {{.Name}} {{.Addr}}
{{- end}}
{{end}}`))

func (c *Cluster) writeConfig(path string, fronts [3]string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	data := map[string]any{
		"Fronts":   map[string]string{"Affinity": fronts[0], "RoundRobin": fronts[1], "Stats": fronts[2]},
		"Session":  SessionHeader,
		"ServedBy": ServedByHeader,
		"Inter":    fmt.Sprintf("%dms", checkInterval.Milliseconds()),
		"Fall":     checkFall, "Rise": checkRise,
		"Replicas": c.replicas,
	}
	if err := configTemplate.Execute(f, data); err != nil {
		f.Close()
		return fmt.Errorf("cluster: haproxy.cfg: %w", err)
	}
	return f.Close()
}

// findHAProxy is the haproxy binary: path, else on PATH, else Debian's.
func findHAProxy(path string) (string, error) {
	if path != "" {
		return path, nil
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/haproxy"); err == nil {
		return "/usr/sbin/haproxy", nil
	}
	return "", ErrNoHAProxy
}

// ErrNoHAProxy: HAProxy is not installed (`go tool task cluster`
// installs Debian's package).
var ErrNoHAProxy = errors.New("cluster: haproxy not found (apt-get install haproxy)")

func start(ctx context.Context, bin string, args []string, log string) (*process, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // nothing outlives the run
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &process{cmd: cmd, log: log, done: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.done <- err
	}()
	return p, nil
}

func (p *process) kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	err := <-p.done
	p.done <- err
	return nil
}

// stop ends p with SIGTERM, SIGKILL after grace; a process already gone
// (killed) is no error.
func (p *process) stop(grace time.Duration) error {
	select {
	case err := <-p.done:
		p.done <- err
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case err := <-p.done:
		p.done <- err
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() > 0 { // -1: ended by the signal
			return fmt.Errorf("exited %d after SIGTERM; its log:\n%s", exit.ExitCode(), tail(p.log))
		}
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("still running %s after SIGTERM", grace)
	}
}

// tail is the last lines of a log, for errors.
func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cluster: a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
