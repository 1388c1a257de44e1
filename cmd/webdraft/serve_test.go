package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"webdraft/engine"
	"webdraft/internal/syncbuf"
	"webdraft/server"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeDrainsOnShutdown: the embedded model is served; on SIGTERM (the
// context's end) a request already being received completes with 200 and
// serve exits 0.
func TestServeDrainsOnShutdown(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	var stderr strings.Builder
	go func() { exit <- run(ctx, []string{"serve", "--addr", addr, "--backend", "cpu"}, io.Discard, &stderr) }()

	ready := false
	for i := 0; i < 3000 && !ready; i++ {
		if resp, err := http.Get("http://" + addr + "/health"); err == nil {
			ready = resp.StatusCode == 200
			resp.Body.Close()
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !ready {
		t.Fatalf("never healthy: %s", stderr.String())
	}

	// Send the headers and half the body, shut down, then finish the body.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"tokens":[1,2,3,4],"n":8}`
	fmt.Fprintf(conn, "POST /draft HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	time.Sleep(100 * time.Millisecond)
	cancel()
	time.Sleep(100 * time.Millisecond)
	if _, err := io.WriteString(conn, body[10:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("in-flight request: status %d", resp.StatusCode)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after shutdown")
	}
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Error("still listening after shutdown")
	}
}

// TestWarms: --warmup auto warms up a target (else a drafter alone) on a
// GPU, not on the CPU engine or a software renderer; on and off decide.
func TestWarms(t *testing.T) {
	model := func(info engine.Info) server.Model { return server.Model{Engine: infoEngine{info: info}} }
	gpu, lavapipe, cpu := engine.Info{Backend: "webgpu"}, engine.Info{Backend: "webgpu", Software: true}, engine.Info{Backend: "cpu"}
	for _, c := range []struct {
		flag            string
		drafter, target engine.Info
		alone           bool // no target
		want            bool
	}{
		{"auto", gpu, gpu, false, true},
		{"auto", cpu, cpu, false, false},
		{"auto", lavapipe, lavapipe, false, false},
		{"auto", cpu, gpu, false, true}, // the target decides
		{"auto", gpu, cpu, false, false},
		{"auto", gpu, cpu, true, true}, // a drafter alone
		{"on", cpu, cpu, false, true},
		{"off", gpu, gpu, false, false},
	} {
		cfg := server.Config{Drafter: model(c.drafter)}
		if !c.alone {
			t := model(c.target)
			cfg.Target = &t
		}
		if got := warms(c.flag, cfg); got != c.want {
			t.Errorf("--warmup %s, drafter %+v, target %+v (none: %v): %v, want %v", c.flag, c.drafter, c.target, c.alone, got, c.want)
		}
	}
}

// infoEngine is an engine that only reports its Info.
type infoEngine struct {
	engine.Engine
	info engine.Info
}

func (e infoEngine) Info() engine.Info { return e.info }

func TestServeUsage(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--cache-mb", "0"},
		{"serve", "--chain-steps", "0"},
		{"serve", "--warmup", "yes"},
		{"serve", "--k", "0"},
		{"serve", "--k", "65"},
		{"serve", "--backend", "quantum"},
		{"serve", "--max-connections", "0"},
		{"serve", "--max-queue", "0"},
		{"serve", "--max-sessions", "0"},
		{"serve", "--max-sessions-per-client", "-1"},
		{"serve", "--body-timeout", "0s"},
		{"serve", "--idle-timeout", "-1s"},
		{"serve", "--request-timeout", "soon"},
		{"serve", "--generation-timeout", "0"},
		{"serve", "--cors-origin", "ftp://a.example"},
		{"serve", "--cors-origin", "https://a.example/path"},
		{"serve", "--per-request-spec-decode-metrics=all"},
		{"serve", "--spec-topk", "0"},
		{"serve", "--spec-topk", "21"},
		{"serve", "--spec-topk", "two"},
		{"serve", "--spec-draft-tokens", "0"},
		{"serve", "--spec-draft-tokens", "65"},
		{"serve", "--model", filepath.Join("..", "..", "weights", "drafter"), "--draft-model", filepath.Join("..", "..", "weights", "drafter")}, // a drafter serves /draft itself
	} {
		if code, _, _ := webdraft(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// A pair whose vocabularies differ is refused in one line naming both.
	golden := filepath.Join("..", "..", "testdata", "golden", "untied")
	code, _, stderr := webdraft(t, "serve", "--addr", "127.0.0.1:0", "--backend", "cpu", "--target", golden)
	if last := lastLine(stderr); code != 1 || !strings.Contains(last, "embedded:drafter") || !strings.Contains(last, golden) || !strings.Contains(last, "vocabulary") {
		t.Errorf("a mismatched pair: exit %d, %q", code, last)
	}
	// An address in use is an error, not a hang.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if code, _, stderr := webdraft(t, "serve", "--addr", ln.Addr().String()); code != 1 || !strings.Contains(stderr, "address already in use") {
		t.Errorf("busy address: exit %d, %s", code, stderr)
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// startServe runs serve with args until the test ends, and waits for
// /health to answer 200; it returns the address and serve's stderr.
func startServe(t *testing.T, args ...string) (string, *syncbuf.Buffer) {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	stderr := &syncbuf.Buffer{}
	go func() {
		exit <- run(ctx, append([]string{"serve", "--addr", addr, "--backend", "cpu"}, args...), io.Discard, stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-exit:
		case <-time.After(40 * time.Second):
			t.Error("serve did not exit")
		}
	})
	// Polls on connections of their own, each closed by the server after
	// its answer, so that none is still counted against
	// --max-connections when the test begins.
	health := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3000 {
		select {
		case code := <-exit:
			t.Fatalf("serve exited %d: %s", code, stderr.String())
		default:
		}
		if resp, err := health.Get("http://" + addr + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return addr, stderr
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("never healthy: %s", stderr.String())
	return "", nil
}

// closedWithin reports whether the server closes c before its deadline.
func closedWithin(c net.Conn) bool {
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// TestServeLimits: serve's limit flags reach the server. A client that
// stalls mid-body is answered 408 and closed after --body-timeout; a
// keep-alive connection is closed after --idle-timeout; with
// --max-connections held by stalled clients /health still answers; the
// key from $WEBDRAFT_API_KEY is required and never written to the log.
func TestServeLimits(t *testing.T) {
	const key = "sk-env-SECRET-42"
	t.Setenv("WEBDRAFT_API_KEY", key)
	addr, stderr := startServe(t, "--body-timeout", "300ms", "--idle-timeout", "300ms", "--max-connections", "3")
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	body := `{"tokens":[1,2,3,4],"n":2}`
	post := func(c net.Conn, auth string, part int) *http.Response {
		t.Helper()
		fmt.Fprintf(c, "POST /draft HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", auth, len(body), body[:part])
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		resp.Body.Close()
		return resp
	}
	// Each answered connection closed at once, so that only what the
	// server's health checks opened can still count against the cap.
	c := dial()
	if resp := post(c, "Bearer "+key, len(body)); resp.StatusCode != 200 {
		t.Errorf("with the key from the environment: %d", resp.StatusCode)
	}
	c.Close()
	c = dial()
	if resp := post(c, "Bearer wrong", len(body)); resp.StatusCode != 401 {
		t.Errorf("with a wrong key: %d", resp.StatusCode)
	}
	c.Close()
	// The stalled body, once the server has closed what its health checks
	// opened: until it has, on a loaded machine, this connection can be
	// one over the cap (a spare, answered 503 too_many_connections).
	var start time.Time
	for try := 0; ; try++ {
		start, c = time.Now(), dial()
		resp := post(c, "Bearer "+key, 10)
		if resp.StatusCode == http.StatusServiceUnavailable && try < 50 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("a stalled body: %d, want 408", resp.StatusCode)
		}
		break
	}
	if !closedWithin(c) || time.Since(start) > 3*time.Second {
		t.Errorf("a stalled body's connection still open after %v", time.Since(start))
	}

	c = dial()
	fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	start = time.Now()
	if !closedWithin(c) || time.Since(start) > 3*time.Second {
		t.Errorf("an idle keep-alive connection still open after %v", time.Since(start))
	}

	for range 3 {
		fmt.Fprint(dial(), "GET /health HTTP/1.1\r\n") // headers never finished
	}
	time.Sleep(100 * time.Millisecond)
	c = dial()
	fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
		t.Errorf("/health with every connection held: %v %v", resp, err)
	}
	if strings.Contains(stderr.String(), key) || strings.Contains(stderr.String(), "SECRET") {
		t.Errorf("the key is in serve's log:\n%s", stderr.String())
	}
}

// TestServeTrees: --spec-topk and --spec-draft-tokens are the generations'
// defaults: a greedy request that says nothing of trees verifies more
// nodes a step than --k (a tree's), and its text is a chain's, which
// speculative.topk 1 asks for.
func TestServeTrees(t *testing.T) {
	addr, stderr := startServe(t, "--k", "3", "--spec-topk", "2", "--spec-draft-tokens", "6", "--per-request-spec-decode-metrics=detailed")
	complete := func(extra string) (string, map[string]any) {
		t.Helper()
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"def quicksort(xs):","max_tokens":16,"temperature":0`+extra+`}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Metrics struct {
				SpeculativeDecoding map[string]any `json:"speculative_decoding"`
			} `json:"metrics"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
			t.Fatalf("%s: %d %v", extra, resp.StatusCode, err)
		}
		return out.Choices[0].Text, out.Metrics.SpeculativeDecoding
	}
	most := func(m map[string]any) int {
		n := 0
		for _, v := range m["per_step_drafted"].([]any) {
			n = max(n, int(v.(float64)))
		}
		return n
	}
	tree, tm := complete("")
	chain, cm := complete(`,"speculative":{"topk":1}`)
	if tree != chain || tree == "" {
		t.Errorf("greedy text: %q with the default tree, %q as a chain", tree, chain)
	}
	if tm["num_spec_tokens"] != 3.0 || most(tm) <= 3 || most(tm) > 6 || most(cm) > 3 {
		t.Errorf("the default tree drafted %d nodes a step at most (%v), the chain %d", most(tm), tm, most(cm))
	}
	if !strings.Contains(stderr.String(), "msg=speculation k=3 topk=2 draft_tokens=6") {
		t.Errorf("no speculation line in the log:\n%s", stderr.String())
	}
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h["k"] != 3.0 || h["topk"] != 2.0 || h["draft_tokens"] != 6.0 {
		t.Errorf("/health: %v (%v), want k 3, topk 2, draft_tokens 6", h, err)
	}
}

// TestServeHelpHidesKey: --help lists the limit flags with their
// defaults, and never prints the key that $WEBDRAFT_API_KEY holds.
func TestServeHelpHidesKey(t *testing.T) {
	t.Setenv("WEBDRAFT_API_KEY", "sk-help-SECRET")
	code, _, stderr := webdraft(t, "serve", "--help")
	if code != 0 || strings.Contains(stderr, "SECRET") {
		t.Errorf("exit %d; the help holds the key:\n%s", code, stderr)
	}
	for _, want := range []string{"-max-connections", "(default 1024)", "-max-queue", "(default 256)", "-body-timeout", "(default 30s)",
		"-idle-timeout", "(default 2m0s)", "-request-timeout", "(default 1m0s)", "-generation-timeout", "(default 10m0s)",
		"-max-sessions", "(default 64)", "-max-sessions-per-client", "(default 4)", "-cors-origin", "WEBDRAFT_API_KEY",
		"-per-request-spec-decode-metrics", "metrics.speculative_decoding", "--per-request-spec-decode-metrics[=summary|detailed]",
		"-spec-topk", "speculative.topk overrides it) (default 1)", "-spec-draft-tokens", "speculative.draft_tokens overrides it) (default 16)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the help lacks %q", want)
		}
	}
}

// TestServeRefusesDamagedWeights: a truncated or garbled weights file
// stops serve before it listens for work, with one line naming the file.
func TestServeRefusesDamagedWeights(t *testing.T) {
	for name, damage := range map[string]func(path string) error{
		"truncated": func(p string) error { return os.Truncate(p, 4096) },
		"garbled":   func(p string) error { return os.WriteFile(p, []byte("not a safetensors file"), 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "model")
			if err := os.CopyFS(dir, os.DirFS(goldenTied)); err != nil {
				t.Fatal(err)
			}
			weights := filepath.Join(dir, "model.safetensors")
			if err := damage(weights); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := webdraft(t, "serve", "--model", dir, "--addr", "127.0.0.1:0", "--backend", "cpu")
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			if code != 1 || !strings.HasPrefix(last, "webdraft serve: "+weights+": ") {
				t.Errorf("exit %d, last line %q", code, last)
			}
		})
	}
}

// TestSpecMetricsFlag: --per-request-spec-decode-metrics alone is
// summary; its level may follow "=" or, as vLLM spells it, a space.
func TestSpecMetricsFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want server.SpecMetrics
	}{
		{nil, server.SpecMetricsNone},
		{[]string{"--per-request-spec-decode-metrics"}, server.SpecMetricsSummary},
		{[]string{"--per-request-spec-decode-metrics", "--k", "3"}, server.SpecMetricsSummary},
		{[]string{"--per-request-spec-decode-metrics=detailed"}, server.SpecMetricsDetailed},
		{[]string{"--per-request-spec-decode-metrics", "detailed", "--k", "3"}, server.SpecMetricsDetailed},
		{[]string{"-per-request-spec-decode-metrics", "summary"}, server.SpecMetricsSummary},
		{[]string{"--per-request-spec-decode-metrics", "none"}, server.SpecMetricsNone},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		level := specMetricsVar(fs)
		fs.Int("k", 0, "")
		if err := parseFlags(fs, joinFlagValue(c.args, specMetricsFlagName, "none", "summary", "detailed")); err != nil || *level != c.want {
			t.Errorf("%q: %v, %v; want %v", c.args, *level, err, c.want)
		}
	}
}

// pairEngine is an engine of TestEnginePair: which pair it was opened
// with, and whether it was closed.
type pairEngine struct {
	engine.Engine
	pair, model int
	closed      bool
}

func (e *pairEngine) Close() error { e.closed = true; return nil }

// TestEnginePair: after a fault the server reopens the drafter, then the
// target (server/recovery.go); the pair opened for the first is the one
// the second gets, a pair left half taken is replaced whole, and close
// closes what was never handed out.
func TestEnginePair(t *testing.T) {
	opened := 0
	var all []*pairEngine
	p := &enginePair{open: func(context.Context) ([]engine.Engine, error) {
		opened++
		d, tg := &pairEngine{pair: opened, model: 0}, &pairEngine{pair: opened, model: 1}
		all = append(all, d, tg)
		return []engine.Engine{d, tg}, nil
	}}
	reopen := func(model int) *pairEngine {
		t.Helper()
		e, err := p.reopen(model)(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pe := e.(*pairEngine)
		if pe.model != model || pe.closed {
			t.Fatalf("model %d's Reopen gave %+v", model, pe)
		}
		return pe
	}
	if d, tg := reopen(0), reopen(1); d.pair != 1 || tg.pair != 1 || opened != 1 {
		t.Errorf("a drafter of pair %d, a target of pair %d, %d pairs opened: want one pair", d.pair, tg.pair, opened)
	}
	if tg := reopen(1); tg.pair != 2 { // the target alone: a new pair, its drafter spare
		t.Errorf("the target of pair %d", tg.pair)
	}
	if tg := reopen(1); tg.pair != 3 || !all[2].closed { // the spare drafter of pair 2 replaced
		t.Errorf("pair %d; the half-taken pair's drafter closed: %v", tg.pair, all[2].closed)
	}
	p.close()
	if !all[4].closed || all[5].closed {
		t.Errorf("close: the spare drafter closed %v, the target handed out closed %v", all[4].closed, all[5].closed)
	}
}
