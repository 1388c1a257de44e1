package server

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestProtocolMetrics: the gauges of the Inference Extension's
// model-server protocol read the server's state — nothing running at
// rest, a running generation and its KV reservation while one streams,
// nothing again once its client leaves — and cache_config_info names
// the target's KV layout.
func TestProtocolMetrics(t *testing.T) {
	f := newPairFixture(t, "")
	for name, want := range map[string]float64{protocolWaiting: 0, protocolRunning: 0, protocolKVUsage: 0} {
		if got := f.metric(t, name); got != want {
			t.Errorf("at rest %s = %g, want %g", name, got, want)
		}
	}
	info := fmt.Sprintf(`%s{block_size="1",num_gpu_blocks="%d"}`, protocolCacheInfo, f.target.KVCapacity())
	if got := f.metric(t, info); got != 1 {
		t.Errorf("%s = %g, want 1", info, got)
	}

	// The endpoint picker's configuration in deploy/ names these gauges.
	epp, err := os.ReadFile("../deploy/kubernetes/epp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	exposition := f.metricsText(t)
	specs := regexp.MustCompile(`(?m)^\s+(\w+Spec): (\S+)$`).FindAllStringSubmatch(string(epp), -1)
	if len(specs) < 4 {
		t.Fatalf("deploy/kubernetes/epp.yaml names %d metrics, want the protocol's 4", len(specs))
	}
	for _, m := range specs {
		if name := strings.Trim(m[2], `"`); name != "" && !strings.Contains(exposition, "\n"+name+" ") && !strings.Contains(exposition, "\n"+name+"{") {
			t.Errorf("deploy/kubernetes/epp.yaml's %s is %s, which /metrics does not export", m[1], name)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/completions",
		strings.NewReader(`{"model":"target","prompt":"def quicksort(xs):","max_tokens":400,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // the first event: the generation runs
		t.Fatal(err)
	}
	if got := f.metric(t, protocolRunning); got != 1 {
		t.Errorf("while a generation streams %s = %g, want 1", protocolRunning, got)
	}
	if got := f.metric(t, protocolKVUsage); got <= 0 || got > 1 {
		t.Errorf("while a generation streams %s = %g, want in (0, 1]", protocolKVUsage, got)
	}

	cancel() // the client leaves: its generation and reservation go
	deadline := time.Now().Add(30 * time.Second)
	for f.metric(t, protocolRunning) != 0 || f.metric(t, protocolKVUsage) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the client left: %s = %g, %s = %g", protocolRunning, f.metric(t, protocolRunning), protocolKVUsage, f.metric(t, protocolKVUsage))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
