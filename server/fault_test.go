package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/webgpu"
	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/scheduler"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/weights"
)

// faultFixture serves the embedded pair on WebGPU engines (lavapipe in
// CI), each on a device of its own, with a Reopen that opens a new one —
// after the test lets it (gate), so that the test sees the server
// recovering. With a head, the embedded EAGLE-3 head drafts the
// generations over the target, on the target's device; the target's
// Reopen opens the two, the head's hands out the head opened with it.
type faultFixture struct {
	url  string
	gate chan struct{} // a Reopen waits for a value

	mu        sync.Mutex
	current   map[string]*webgpu.Engine // by model name: the engine in use
	opened    int                       // engines Reopen opened
	spareHead *webgpu.Head              // opened with the target, not handed out yet
}

func newFaultFixture(t *testing.T) *faultFixture { return newFaultFixtureOf(t, false) }

func newFaultFixtureOf(t *testing.T, withHead bool) *faultFixture {
	t.Helper()
	if !weights.Embedded() {
		t.Skip("built without the embedded pair")
	}
	gputest.Device(t) // skips (or fails in CI) without an adapter
	d, err := checkpoint.LoadFS(weights.FS(), weights.DrafterDir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := checkpoint.LoadFS(weights.FS(), weights.TargetDir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	f := &faultFixture{gate: make(chan struct{}), current: map[string]*webgpu.Engine{}}
	open := func(name string, m *checkpoint.Model) (engine.Engine, error) {
		e, err := webgpu.Open(m.Config, m.Weights, webgpu.Options{KVBytes: 16 << 20})
		if err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.current[name] = e
		f.mu.Unlock()
		return e, nil
	}
	model := func(name string, m *checkpoint.Model) Model {
		e, err := open(name, m)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return Model{Name: name, Engine: e, Tokenizer: tok, Reopen: func(ctx context.Context) (engine.Engine, error) {
			select {
			case <-f.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			f.mu.Lock()
			f.opened++
			f.mu.Unlock()
			start := time.Now()
			e, err := open(name, m)
			t.Logf("the %s's engine reopened in %.2f s", name, time.Since(start).Seconds())
			return e, err
		}}
	}
	drafter, target := model("drafter", d), model("target", tg)
	var head *Model
	if withHead {
		head = f.headOver(t, &target, tg)
	}
	srv := New(slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	ts := httptest.NewServer(srv.Handler())
	f.url = ts.URL
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- srv.Run(ctx, Config{Drafter: drafter, Target: &target, Head: head, Speculative: speculative.Options{K: 4}, Scheduler: scheduler.Options{}})
	}()
	t.Cleanup(func() {
		ts.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		d.Close()
		tg.Close()
	})
	waitReady(t, ts.URL)
	return f
}

// headOver makes target's engine one that keeps the features of the
// embedded EAGLE-3 head, and returns the head over it: its Reopen, and
// the target's, replaced by ones that open the two together.
func (f *faultFixture) headOver(t *testing.T, target *Model, tg *checkpoint.Model) *Model {
	t.Helper()
	hm, err := checkpoint.LoadEagle3FS(weights.FS(), weights.HeadDir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hm.Close() })
	open := func() (*webgpu.Engine, *webgpu.Head, error) {
		g, err := webgpu.OpenGroup(gpu.Options{})
		if err != nil {
			return nil, nil, err
		}
		defer g.Close() // the device closes with the last engine
		te, err := g.New(tg.Config, tg.Weights, webgpu.Options{KVBytes: 16 << 20, FeatureLayers: hm.Config.Aux(tg.Config.NumHiddenLayers)})
		if err != nil {
			return nil, nil, err
		}
		he, err := webgpu.NewHead(te, hm.Config, hm.Weights, webgpu.HeadOptions{KVBytes: 16 << 20})
		if err != nil {
			te.Close()
			return nil, nil, err
		}
		f.mu.Lock()
		f.current[target.Name] = te
		f.mu.Unlock()
		return te, he, nil
	}
	te, he, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { he.Close(); te.Close() })
	target.Engine.Close()
	target.Engine = te
	target.Reopen = func(ctx context.Context) (engine.Engine, error) {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		te, he, err := open()
		if err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.opened++
		f.spareHead = he
		f.mu.Unlock()
		return te, nil
	}
	return &Model{Name: "head", Engine: he, Reopen: func(context.Context) (engine.Engine, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.spareHead == nil {
			return nil, errors.New("the head reopened before its target")
		}
		he := f.spareHead
		f.spareHead = nil
		return he, nil
	}}
}

// lose loses the device of the model's engine in use.
func (f *faultFixture) lose(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.current[name].LoseDevice("a fault drill")
}

// health is GET /health's status and body.
func (f *faultFixture) health(t *testing.T) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(f.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, h
}

// recoverNow checks that /health says the server is recovering, lets the
// waiting Reopen open its engine, and waits until /health is ok again.
func (f *faultFixture) recoverNow(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		code, h := f.health(t)
		if code == http.StatusServiceUnavailable && h["status"] == "recovering" {
			if e, _ := h["error"].(string); !strings.Contains(e, "a fault drill") {
				t.Errorf("/health while recovering: %v, want the fault named", h)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health never said recovering: %d %v", code, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case f.gate <- struct{}{}:
	case <-time.After(time.Minute):
		t.Fatal("no engine waited to be reopened within a minute")
	}
	waitReady(t, f.url)
}

// recoverAfter checks the server through a fault of the target's device:
// a completion during it fails with 503, the server recovers
// (recoverNow), and then a completion of prompt gives want again and the
// page session ws, open across it, gives its text again.
func (f *faultFixture) recoverAfter(t *testing.T, prompt, want string, ws *pageConn, text string) {
	t.Helper()
	code, during := f.complete(t, prompt)
	if code != http.StatusServiceUnavailable || (errorCode(during) != "recovering" && errorCode(during) != "engine_fault") {
		t.Errorf("a completion during recovery: %d %v, want 503 recovering", code, during)
	}
	f.recoverNow(t)
	code, after := f.complete(t, prompt)
	if code != http.StatusOK || completionText(after) != want {
		t.Errorf("after recovering: %d %q, want %q", code, completionText(after), want)
	}
	if got := ws.run(t, prompt); got != text {
		t.Errorf("the page session after recovering: %q, want %q", got, text)
	}
}

func (f *faultFixture) complete(t *testing.T, prompt string) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "target", "prompt": prompt, "max_tokens": 12, "temperature": 0})
	return postPath(t, f.url+"/v1/completions", string(b))
}

func postPath(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("response is not JSON: %v", err)
	}
	return resp.StatusCode, out
}

func completionText(m map[string]any) string {
	choices, _ := m["choices"].([]any)
	if len(choices) == 0 {
		return ""
	}
	c, _ := choices[0].(map[string]any)
	s, _ := c["text"].(string)
	return s
}

func errorCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// TestEngineFault: a lost GPU device fails the requests it meets with 503
// (a generation's stream with an error event), /health turns 503
// "recovering", the server reopens the engine and serves again — the same
// answers as before the fault — without a restart; for the target's
// engine and the drafter's, and for a page session, which goes on on the
// new engines.
func TestEngineFault(t *testing.T) {
	f := newFaultFixture(t)
	const prompt = "def add(a, b):\n    "
	code, before := f.complete(t, prompt)
	if code != http.StatusOK || completionText(before) == "" {
		t.Fatalf("before the fault: %d %v", code, before)
	}
	code, _, draftBefore := post(t, f.url, `{"text":"def add(a, b):\n    ","n":6}`)
	if code != http.StatusOK {
		t.Fatalf("draft before the fault: %d %v", code, draftBefore)
	}

	// A page session, open across the faults.
	ws := dialPage(t, f.url)
	text := ws.run(t, prompt)
	if text == "" {
		t.Fatal("the page's run before the fault gave no text")
	}

	// The target's device, lost in the middle of a streamed generation.
	stream := startStream(t, f.url, prompt)
	f.lose("target")
	if ev := stream.rest(t); !strings.Contains(ev, `"engine_fault"`) {
		t.Errorf("the stream after the fault ended with %q, want an engine_fault error event", ev)
	}
	f.recoverAfter(t, prompt, completionText(before), ws, text)

	// The drafter's device, lost before a draft: /draft fails with 503.
	f.lose("drafter")
	code, _, failed := post(t, f.url, `{"text":"def add(a, b):\n    ","n":6}`)
	if code != http.StatusServiceUnavailable || errorCode(failed) != "engine_fault" {
		t.Errorf("a draft on a lost device: %d %v, want 503 engine_fault", code, failed)
	}
	f.recoverNow(t)
	code, _, draftAfter := post(t, f.url, `{"text":"def add(a, b):\n    ","n":6}`)
	if code != http.StatusOK || !equalInts(ints(draftAfter["draft"]), ints(draftBefore["draft"])) {
		t.Errorf("draft after recovering: %d %v, want %v", code, draftAfter["draft"], draftBefore["draft"])
	}
	if got := ws.run(t, prompt); got != text {
		t.Errorf("the page session after the second recovery: %q, want %q", got, text)
	}
	if _, h := f.health(t); h["status"] != "ok" {
		t.Errorf("/health at the end: %v", h)
	}
	if f.opened != 2 {
		t.Errorf("%d engines reopened, want 2 (one per fault)", f.opened)
	}
	metrics := getText(t, f.url+"/metrics")
	for _, want := range []string{"webdraft_engine_faults_total 2", "webdraft_ready 1"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestEngineFaultHead: where an EAGLE-3 head drafts the generations, a
// fault of the target's device (which the head shares) takes both down;
// the server reopens the two together — the target first, the head over
// it — and serves the same greedy text again, a page session included.
func TestEngineFaultHead(t *testing.T) {
	f := newFaultFixtureOf(t, true)
	const prompt = "def add(a, b):\n    "
	code, before := f.complete(t, prompt)
	if code != http.StatusOK || completionText(before) == "" {
		t.Fatalf("before the fault: %d %v", code, before)
	}
	ws := dialPage(t, f.url)
	text := ws.run(t, prompt)
	if text == "" {
		t.Fatal("the page's run before the fault gave no text")
	}
	f.lose("target")
	f.recoverAfter(t, prompt, completionText(before), ws, text)
	if f.opened != 1 || f.spareHead != nil {
		t.Errorf("%d target engines reopened (want 1), a head left unused: %v", f.opened, f.spareHead != nil)
	}
	if _, h := f.health(t); h["status"] != "ok" || h["head"] != "head" {
		t.Errorf("/health at the end: %v", h)
	}
}

func equalInts(a, b []int) bool { return len(a) > 0 && slices.Equal(a, b) }

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sseStream is a streamed completion being read.
type sseStream struct {
	resp *http.Response
	r    *bufio.Reader
}

// startStream starts a long greedy streamed completion and reads its
// first chunk.
func startStream(t *testing.T, url, prompt string) *sseStream {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "target", "prompt": prompt, "max_tokens": 200, "temperature": 0, "stream": true})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	s := &sseStream{resp: resp, r: bufio.NewReader(resp.Body)}
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: no first chunk: %v", err)
		}
		if strings.HasPrefix(line, "data: {") {
			return s
		}
	}
}

// rest reads the stream to its end and returns its last data line.
func (s *sseStream) rest(t *testing.T) string {
	t.Helper()
	last := ""
	for {
		line, err := s.r.ReadString('\n')
		if strings.HasPrefix(line, "data: ") && strings.TrimSpace(line) != "data: [DONE]" {
			last = strings.TrimSpace(line)
		}
		if err != nil {
			return last
		}
	}
}

// pageConn is a page session's websocket.
type pageConn struct{ c *websocket.Conn }

func dialPage(t *testing.T, url string) *pageConn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(url, "http")+"/ws", http.Header{"Origin": {url}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &pageConn{c}
	if m := p.next(t); m["type"] != "hello" {
		t.Fatalf("first message %v", m)
	}
	return p
}

func (p *pageConn) next(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := p.c.SetReadDeadline(time.Now().Add(2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := p.c.ReadJSON(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// runTokens sends start and returns the run's tokens (the step events'),
// failing the test on an error event.
func (p *pageConn) runTokens(t *testing.T, start map[string]any) []int {
	t.Helper()
	if err := p.c.WriteJSON(start); err != nil {
		t.Fatal(err)
	}
	var out []int
	for {
		m := p.next(t)
		switch m["type"] {
		case "step":
			out = append(out, eventIDs(m["tokens"])...)
		case "error":
			t.Fatalf("page run: %v", m["message"])
		case "finished":
			return out
		}
	}
}

// run runs a greedy generation of 12 tokens and returns its text (the
// step events' tokens), or "" after an error event.
func (p *pageConn) run(t *testing.T, prompt string) string {
	t.Helper()
	if err := p.c.WriteJSON(map[string]any{"type": "start", "prompt": prompt, "k": 4, "max_tokens": 12}); err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for {
		m := p.next(t)
		switch m["type"] {
		case "step":
			toks, _ := m["tokens"].([]any)
			for _, tk := range toks {
				s, _ := tk.(map[string]any)["text"].(string)
				text.WriteString(s)
			}
		case "error":
			t.Errorf("page run: %v", m["message"])
			return ""
		case "finished":
			return text.String()
		}
	}
}
