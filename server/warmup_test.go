package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"webdraft/engine"
	"webdraft/internal/syncbuf"
)

// gatedEngine holds every forward pass until gate closes, counting them.
type gatedEngine struct {
	engine.Engine
	gate     chan struct{}
	passes   atomic.Int64
	prepared atomic.Int64 // Prepare's calls
}

func (g *gatedEngine) Prepare(ctx context.Context) error {
	g.prepared.Add(1)
	return engine.Prepare(ctx, g.Engine)
}

func (g *gatedEngine) wait(ctx context.Context) error {
	g.passes.Add(1)
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gatedEngine) Step(ctx context.Context, b []*engine.Entry) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.Engine.Step(ctx, b)
}

func (g *gatedEngine) Verify(ctx context.Context, b []*engine.VerifyEntry) error {
	if err := g.wait(ctx); err != nil {
		return err
	}
	return g.Engine.Verify(ctx, b)
}

// TestWarmup: a server with Config.Warmup runs its warm-up generations
// and draft through both models before it reports ready — meanwhile
// /health answers 503 "loading" with "warming": true, and a request 503
// "loading" with Retry-After —, leaves them out of /metrics, and then
// serves.
func TestWarmup(t *testing.T) {
	f := newPairEngines(t, nil)
	drafter := &gatedEngine{Engine: f.drafter, gate: make(chan struct{})}
	target := &gatedEngine{Engine: f.target, gate: make(chan struct{})}
	close(target.gate)
	f.drafter, f.target = drafter, target
	f.start(t, Options{}, func(c *Config) { c.Warmup = true })

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(f.url + "/health")
		if err != nil {
			t.Fatal(err)
		}
		var h map[string]any
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if h["status"] == "loading" && h["warming"] == true {
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("/health while warming: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			break
		}
		if h["status"] != "loading" || time.Now().After(deadline) {
			t.Fatalf("/health before the warm-up ended: %v, want loading, then loading and warming", h)
		}
		time.Sleep(5 * time.Millisecond)
	}
	resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "def", "max_tokens": 4}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != "loading" || !strings.Contains(body.Error.Message, "warming up") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a completion while warming: %d %+v, Retry-After %q; want 503, code loading, warming up", resp.StatusCode, body.Error, resp.Header.Get("Retry-After"))
	}

	close(drafter.gate)
	waitReadyWithin(t, f.url, 60*time.Second)
	// Five generations of up to 64 tokens, each speculative one's drafts
	// a pass or more, and /draft's 16 tokens.
	if d, tg := drafter.passes.Load(), target.passes.Load(); d < 16 || tg < 16 {
		t.Errorf("the warm-up ran %d drafter and %d target passes, want at least 16 each", d, tg)
	}
	if d, tg := drafter.prepared.Load(), target.prepared.Load(); d != 1 || tg != 1 {
		t.Errorf("the warm-up prepared the drafter %d times and the target %d, want once each (engine.Prepare)", d, tg)
	}
	for _, m := range []string{"webdraft_generation_tokens_total", "webdraft_spec_decode_num_drafts_total", "webdraft_batch_sequences_count"} {
		if v := f.metric(t, m); v != 0 {
			t.Errorf("after the warm-up %s = %v, want 0: the warm-up's work is not the clients'", m, v)
		}
	}
	resp, err = http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "def", "max_tokens": 4, "temperature": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a completion after the warm-up: %d", resp.StatusCode)
	}
	if v := f.metric(t, "webdraft_generation_tokens_total"); v != 4 {
		t.Errorf("after a 4-token completion webdraft_generation_tokens_total = %v, want 4", v)
	}
}

// waitReadyWithin is waitReady with a deadline of its own.
func waitReadyWithin(t *testing.T, url string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if resp, err := http.Get(url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
	t.Fatalf("server not ready after %v", d)
}

// failingEngine fails its first n forward passes with a plain error (not
// a fault), then runs as its engine does.
type failingEngine struct {
	engine.Engine
	n *atomic.Int64
}

func (f failingEngine) fail() error {
	if f.n.Add(-1) >= 0 {
		return errors.New("a pass failed")
	}
	return nil
}

func (f failingEngine) Step(ctx context.Context, b []*engine.Entry) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Engine.Step(ctx, b)
}

func (f failingEngine) Verify(ctx context.Context, b []*engine.VerifyEntry) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Engine.Verify(ctx, b)
}

// TestWarmupFailure: a warm-up whose generation fails is logged, and the
// server serves anyway.
func TestWarmupFailure(t *testing.T) {
	f := newPairEngines(t, nil)
	var n atomic.Int64
	n.Store(1)
	f.target = failingEngine{Engine: f.target, n: &n}
	var logs syncbuf.Buffer
	f.log = slog.New(slog.NewTextHandler(&logs, nil))
	f.start(t, Options{}, func(c *Config) { c.Warmup = true })
	waitReadyWithin(t, f.url, 60*time.Second)
	if got := logs.String(); !strings.Contains(got, "warm-up failed: serving without it") || !strings.Contains(got, "a pass failed") || strings.Contains(got, "warmed up") {
		t.Errorf("the log of a failed warm-up:\n%s", got)
	}
	resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "def", "max_tokens": 4, "temperature": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a completion after a failed warm-up: %d", resp.StatusCode)
	}
}
