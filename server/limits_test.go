package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/internal/syncbuf"
	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/scheduler"
	"webdraft/speculative"
	"webdraft/tokenizer"
)

// The regression tests of bounded everything and of the security items
// (issue 26, points 2 and 5). Each serves through s.HTTPServer() on
// s.Listener(ln), as webdraft serve does, so that the timeouts and the
// connection cap are those of a real connection.

// delayed slows every pass of an engine, so that a request lasts.
type delayed struct {
	engine.Engine
	d time.Duration
}

func (e delayed) Step(ctx context.Context, b []*engine.Entry) error {
	time.Sleep(e.d)
	return e.Engine.Step(ctx, b)
}

func (e delayed) Verify(ctx context.Context, b []*engine.VerifyEntry) error {
	time.Sleep(e.d)
	return e.Engine.Verify(ctx, b)
}

// limited is a server on a real listener, its connection cap included.
type limited struct {
	url, addr string
	srv       *Server
	ln        *capListener
	logs      *syncbuf.Buffer // everything logged, at debug level
}

// serveLimited serves c with o as webdraft serve does.
func serveLimited(t *testing.T, o Options, c Config) *limited {
	t.Helper()
	logs := &syncbuf.Buffer{}
	srv := NewWithOptions(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), o)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := srv.Listener(raw).(*capListener)
	hs := srv.HTTPServer()
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
			t.Errorf("serve: %v", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		if err := srv.Run(ctx, c); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(func() {
		if err := hs.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
		<-served
		cancel()
		<-ran
	})
	l := &limited{url: "http://" + raw.Addr().String(), addr: raw.Addr().String(), srv: srv, ln: ln, logs: logs}
	waitReady(t, l.url)
	return l
}

// goldenDrafter is the untied golden model on the CPU engine (vocabulary
// 1024, 512 positions), with the embedded tokenizer, each pass delayed
// by delay.
func goldenDrafter(t *testing.T, delay time.Duration) Model {
	t.Helper()
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", "untied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	cpu, err := engine.NewReference(m.Config, m.Weights, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	var eng engine.Engine = cpu
	if delay > 0 {
		eng = delayed{cpu, delay}
	}
	return Model{Name: "untied", Engine: eng, Tokenizer: tok}
}

// synthPair is a drafter and a target of random one-layer models with
// Qwen3's vocabulary (any text tokenizes within it) and 256 positions, a
// head over 64 tokens (cheap passes, and no stop token), each pass
// delayed by delay.
func synthPair(t *testing.T, delay time.Duration) Config {
	t.Helper()
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	cfg := qwen3.Config{VocabSize: 151936, HiddenSize: 8, IntermediateSize: 16, NumHiddenLayers: 1,
		NumAttentionHeads: 1, NumKeyValueHeads: 1, HeadDim: 8, RMSNormEps: 1e-6, RopeTheta: 10000,
		MaxPositionEmbeddings: 256, TieWordEmbeddings: true}
	model := func(name string, seed uint64) Model {
		dir := filepath.Join(t.TempDir(), name)
		if err := synth.Write(dir, cfg, synth.Options{Seed: seed, Std: 0.5, HeadTokens: 64}); err != nil {
			t.Fatal(err)
		}
		m, err := checkpoint.Load(dir, checkpoint.LoadOptions{Quant: checkpoint.F32})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		cpu, err := engine.NewReference(m.Config, m.Weights, 8<<20)
		if err != nil {
			t.Fatal(err)
		}
		var e engine.Engine = cpu
		if delay > 0 {
			e = delayed{cpu, delay}
		}
		return Model{Name: name, Engine: e, Tokenizer: tok}
	}
	d, tg := model("drafter", 2), model("target", 1)
	return Config{Drafter: d, Target: &tg, Speculative: speculative.Options{K: 4}}
}

// dial opens a raw connection with a deadline for the whole test step.
func dial(t *testing.T, addr string, within time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(within)); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedWithin reports whether the server closes c (a read ends with
// EOF or a reset) before c's deadline; data read first is skipped.
func closedWithin(t *testing.T, c net.Conn) bool {
	t.Helper()
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout() // a timeout: still open at the deadline
}

// readError reads an answer from br and its JSON error's code and message.
func readError(t *testing.T, br *bufio.Reader) (*http.Response, string, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		Error struct{ Code, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%d: the answer is not a JSON error: %v", resp.StatusCode, err)
	}
	return resp, out.Error.Code, out.Error.Message
}

// TestBodyTimeout: a client that stalls mid-body — wherever it stops —
// gets 408 naming the limit, and its connection is closed; before, it
// held the connection for good. A body that arrives in time is served,
// whatever its pace.
func TestBodyTimeout(t *testing.T) {
	l := serveLimited(t, Options{Limits: Limits{BodyTimeout: 200 * time.Millisecond}}, synthPair(t, 0))
	for _, c := range []struct{ path, body string }{
		{"/draft", `{"tokens":[1,2,3],"n":2}`},
		{"/v1/completions", `{"model":"target","prompt":[1,2,3],"max_tokens":2}`},
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
	} {
		// Stalled at once, after several cuts of the body: in a name, after
		// a colon, in an array, before the closing brace.
		cuts := []int{1, 10, 12, len(c.body) - 1}
		conns := make([]net.Conn, len(cuts))
		start := time.Now()
		for i, cut := range cuts {
			conns[i] = dial(t, l.addr, 5*time.Second)
			if _, err := fmt.Fprintf(conns[i], "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.path, len(c.body), c.body[:cut]); err != nil {
				t.Fatal(err)
			}
		}
		for i, conn := range conns {
			resp, code, msg := readError(t, bufio.NewReader(conn))
			if resp.StatusCode != http.StatusRequestTimeout || code != "body_timeout" || !strings.Contains(msg, "--body-timeout") {
				t.Errorf("%s stalled after %q: %d %s %q; want 408 body_timeout naming --body-timeout", c.path, c.body[:cuts[i]], resp.StatusCode, code, msg)
			}
			if !closedWithin(t, conn) || time.Since(start) > 3*time.Second {
				t.Errorf("%s: the connection of a stalled body is still open after %v", c.path, time.Since(start))
			}
		}
		conn := dial(t, l.addr, 5*time.Second)
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.path, len(c.body), c.body[:8])
		time.Sleep(100 * time.Millisecond)
		fmt.Fprint(conn, c.body[8:])
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: a body in time: %v %v", c.path, resp, err)
		}
		resp.Body.Close()
	}
	// A route that reads no body: the deadline still frees the connection.
	conn := dial(t, l.addr, 5*time.Second)
	fmt.Fprint(conn, "POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	if resp, _, _ := readError(t, bufio.NewReader(conn)); resp.StatusCode != http.StatusNotFound || !closedWithin(t, conn) {
		t.Errorf("a stalled body to no route: %d, or still open", resp.StatusCode)
	}
}

// TestIdleTimeout: a keep-alive connection that sends nothing after its
// answer is closed after the idle timeout — before, never.
func TestIdleTimeout(t *testing.T) {
	l := serveLimited(t, Options{Limits: Limits{IdleTimeout: 300 * time.Millisecond}}, Config{Drafter: goldenDrafter(t, 0)})
	c := dial(t, l.addr, 5*time.Second)
	br := bufio.NewReader(c)
	for range 2 { // kept alive between requests
		fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("health: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	start := time.Now()
	if !closedWithin(t, c) {
		t.Fatal("an idle keep-alive connection is still open after 5 s")
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("closed after %v idle; the idle timeout is 300ms", d)
	}
}

// TestStreamsOutliveBodyTimeout: the body deadline ends with the body:
// an SSE stream and a websocket that last well past it are not cut.
func TestStreamsOutliveBodyTimeout(t *testing.T) {
	l := serveLimited(t, Options{Limits: Limits{BodyTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond}}, synthPair(t, 2*time.Millisecond))
	start := time.Now()
	resp, err := http.Post(l.url+"/v1/completions", "application/json", strings.NewReader(
		`{"model":"target","prompt":[1,2,3],"max_tokens":50,"temperature":0,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var last, finish string
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			last = line
			if strings.Contains(line, `"finish_reason":"`) {
				finish = line
			}
		}
	}
	if last != "data: [DONE]" || !strings.Contains(finish, `"finish_reason":"length"`) {
		t.Fatalf("a stream was cut after %v: last %q, finish %q", time.Since(start), last, finish)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("the stream lasted %v: not past the body timeout, nothing tested", d)
	}

	url := "ws" + strings.TrimPrefix(l.url, "http") + "/ws"
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	time.Sleep(300 * time.Millisecond) // past the body timeout before anything is sent
	if err := ws.WriteJSON(map[string]any{"type": "start", "prompt": "def f(x):", "k": 3, "max_tokens": 20}); err != nil {
		t.Fatal(err)
	}
	for {
		if err := ws.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := ws.ReadJSON(&m); err != nil {
			t.Fatalf("the websocket was cut: %v", err)
		}
		if m["type"] == "error" {
			t.Fatalf("run: %v", m)
		}
		if m["type"] == "finished" {
			break
		}
	}
}

// TestConnectionCap: with every connection held by stalled clients,
// GET /health on a fresh connection still answers 200, anything else a
// 503 naming the cap, and past the spare connections one is refused at
// once; when the stalled ones go, the server serves again. Before, there
// was no cap: the stalled clients could take every file descriptor.
func TestConnectionCap(t *testing.T) {
	const max = 4
	l := serveLimited(t, Options{Limits: Limits{MaxConnections: max}}, Config{Drafter: goldenDrafter(t, 0)})
	waitOpen := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for l.ln.open.Load() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections open, want %d", l.ln.open.Load(), n)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	waitOpen(0) // waitReady's connection has gone
	var stalled []net.Conn
	for range max {
		c := dial(t, l.addr, 30*time.Second)
		fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n") // headers never finished
		stalled = append(stalled, c)
	}
	waitOpen(max)

	fresh := func(req string) (*http.Response, string, string) {
		t.Helper()
		c := dial(t, l.addr, 5*time.Second)
		fmt.Fprint(c, req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer on a fresh connection with %d held: %v", max, err)
		}
		defer resp.Body.Close()
		var out struct {
			Status string
			Error  struct{ Code, Message string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		if !resp.Close {
			t.Errorf("a spare connection's answer does not close it")
		}
		return resp, out.Status + out.Error.Code, out.Error.Message
	}
	if resp, status, _ := fresh("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != http.StatusOK || status != "ok" {
		t.Errorf("/health with every connection held: %d %s", resp.StatusCode, status)
	}
	body := `{"tokens":[1,2,3],"n":2}`
	resp, code, msg := fresh(fmt.Sprintf("POST /draft HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	if resp.StatusCode != http.StatusServiceUnavailable || code != "too_many_connections" || !strings.Contains(msg, "--max-connections") ||
		!strings.Contains(msg, fmt.Sprint(max)) || resp.Header.Get("Retry-After") == "" {
		t.Errorf("/draft with every connection held: %d %s %q; want 503 too_many_connections naming the cap", resp.StatusCode, code, msg)
	}

	// The spare connections, held too: the next is refused at once.
	waitOpen(max)
	start := time.Now()
	for range spareConnections {
		stalled = append(stalled, dial(t, l.addr, 30*time.Second))
	}
	waitOpen(max + spareConnections)
	c := dial(t, l.addr, 5*time.Second)
	if !closedWithin(t, c) || time.Since(start) > spareTime {
		t.Errorf("a connection past the spare ones was not refused at once")
	}
	// A spare connection that sends nothing is closed after spareTime.
	if !closedWithin(t, stalled[max]) || time.Since(start) > spareTime+2*time.Second {
		t.Errorf("a stalled spare connection outlived spareTime: %v", time.Since(start))
	}
	for _, c := range stalled {
		c.Close()
	}
	waitOpen(0)
	if code, _, out := post(t, l.url, body); code != http.StatusOK {
		t.Errorf("after the stalled clients left: %d %v", code, out)
	}
	resp, err := http.Get(l.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	exposition, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"webdraft_refused_connections_total 1\n", "webdraft_open_connections ", "webdraft_page_sessions 0\n"} {
		if !strings.Contains(string(exposition), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestQueueBound: requests past --max-queue waiting get 429 at once, with
// Retry-After and the bound named, while the loop runs and drains its
// hand-off channel. Before, the channel's 256 bounded only what the loop
// had not drained yet: the waiting list grew without bound.
func TestQueueBound(t *testing.T) {
	const queue = 2
	l := serveLimited(t, Options{}, Config{Drafter: goldenDrafter(t, 20*time.Millisecond),
		Scheduler: scheduler.Options{MaxBatch: 1, MaxQueue: queue, ChainSteps: 1}})
	type answer struct {
		code    int
		retry   string
		message string
		took    time.Duration
	}
	answers := make(chan answer, 8)
	var wg sync.WaitGroup
	send := func(body string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			code, hdr, out := post(t, l.url, body)
			a := answer{code: code, retry: hdr.Get("Retry-After"), took: time.Since(start)}
			if e, ok := out["error"].(map[string]any); ok {
				a.message, _ = e["message"].(string)
			}
			answers <- a
		}()
	}
	send(`{"tokens":[1,2,3],"n":64}`) // runs for 64 passes of 20 ms
	time.Sleep(100 * time.Millisecond)
	for range 6 { // spaced: the loop drains each into its waiting list
		send(`{"tokens":[4,5],"n":1}`)
		time.Sleep(40 * time.Millisecond)
	}
	wg.Wait()
	close(answers)
	counts := map[int]int{}
	for a := range answers {
		counts[a.code]++
		if a.code == http.StatusTooManyRequests {
			if a.retry == "" || !strings.Contains(a.message, fmt.Sprintf("%d requests waiting", queue)) || !strings.Contains(a.message, "--max-queue") {
				t.Errorf("429: Retry-After %q, %q; want the bound named", a.retry, a.message)
			}
			if a.took > time.Second {
				t.Errorf("a 429 took %v: it should come at once", a.took)
			}
		}
	}
	if counts[http.StatusOK] != 1+queue || counts[http.StatusTooManyRequests] != 6-queue {
		t.Errorf("answers %v: want %d served (one running, %d waiting) and %d refused", counts, 1+queue, queue, 6-queue)
	}
}

// TestTimeLimits: a /draft past --request-timeout gets 504 naming it; a
// generation past --generation-timeout ends with a 504 error, streamed
// after its tokens when streaming. Before, neither had a limit.
func TestTimeLimits(t *testing.T) {
	lim := Limits{RequestTimeout: 300 * time.Millisecond, GenerationTimeout: 300 * time.Millisecond}
	d := serveLimited(t, Options{Limits: lim}, Config{Drafter: goldenDrafter(t, 20*time.Millisecond), Scheduler: scheduler.Options{ChainSteps: 1}})
	start := time.Now()
	code, _, out := post(t, d.url, `{"tokens":[1,2,3],"n":64}`)
	e, _ := out["error"].(map[string]any)
	if msg, _ := e["message"].(string); code != http.StatusGatewayTimeout || e["code"] != "request_timeout" || !strings.Contains(msg, "--request-timeout") {
		t.Errorf("a draft past the request timeout: %d %v", code, out)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("answered after %v; the limit is 300ms", took)
	}

	p := serveLimited(t, Options{Limits: lim}, synthPair(t, 10*time.Millisecond))
	resp, err := http.Post(p.url+"/v1/completions", "application/json", strings.NewReader(`{"model":"target","prompt":[1,2,3],"max_tokens":200}`))
	if err != nil {
		t.Fatal(err)
	}
	var ge struct {
		Error struct{ Type, Code, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&ge)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || ge.Error.Code != "request_timeout" || !strings.Contains(ge.Error.Message, "--generation-timeout") {
		t.Errorf("a generation past its limit: %d %+v", resp.StatusCode, ge)
	}
	resp, err = http.Post(p.url+"/v1/completions", "application/json", strings.NewReader(`{"model":"target","prompt":[1,2,3],"max_tokens":200,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() != "" {
			lines = append(lines, sc.Text())
		}
	}
	n := len(lines)
	if resp.StatusCode != http.StatusOK || n < 3 || lines[n-1] != "data: [DONE]" || !strings.Contains(lines[n-2], `"code":"request_timeout"`) ||
		!strings.Contains(lines[n-2], "--generation-timeout") || !strings.Contains(lines[0], `"choices"`) {
		t.Errorf("a stream past its limit: %d, %d lines, ending %q", resp.StatusCode, n, lines[max(0, n-2):])
	}

	// A page run past the limit ends with an error message naming it.
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(p.url, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteJSON(map[string]any{"type": "start", "prompt": "def f(x):", "k": 2, "max_tokens": 200}); err != nil {
		t.Fatal(err)
	}
	for {
		if err := ws.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := ws.ReadJSON(&m); err != nil {
			t.Fatalf("no end to a page run past its limit: %v", err)
		}
		if m["type"] == "done" || m["type"] == "finished" {
			t.Fatalf("a page run past its limit finished: %v", m)
		}
		if m["type"] == "error" {
			if msg, _ := m["message"].(string); !strings.Contains(msg, "--generation-timeout") {
				t.Errorf("a page run past its limit: %v", m)
			}
			break
		}
	}
}

// deadlines records the write deadlines set through it.
type deadlines struct {
	http.ResponseWriter
	set []time.Time
}

func (d *deadlines) SetWriteDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return nil
}

// TestWriteDeadlineMoves: the write deadline is set when a request
// starts, moved on before each write and flush, and once more when the
// handler returns — so a stream is bounded write by write, never as a
// whole.
func TestWriteDeadlineMoves(t *testing.T) {
	srv := NewWithOptions(slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Limits: Limits{WriteTimeout: time.Hour}})
	rec := &deadlines{ResponseWriter: httptest.NewRecorder()}
	var during []int
	h := srv.writeDeadline(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		during = append(during, len(rec.set))
		fmt.Fprint(w, "a")
		during = append(during, len(rec.set))
		w.(http.Flusher).Flush()
		during = append(during, len(rec.set))
	}))
	start := time.Now()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if fmt.Sprint(during) != "[1 2 3]" || len(rec.set) != 4 {
		t.Errorf("deadlines set %v during the handler, %d in all; want 1, 2, 3 and 4", during, len(rec.set))
	}
	for _, d := range rec.set {
		if d.Before(start.Add(time.Hour)) || d.After(time.Now().Add(time.Hour)) {
			t.Errorf("a deadline %v: want an hour after the write", d)
		}
	}
}

// TestSessionCaps: a client address may hold MaxSessionsPerClient page
// sessions at once; the next websocket is refused with 429 naming the
// bound, and a closed session frees its place. Before, there was no cap.
func TestSessionCaps(t *testing.T) {
	l := serveLimited(t, Options{Limits: Limits{MaxSessionsPerClient: 2}}, synthPair(t, 0))
	url := "ws" + strings.TrimPrefix(l.url, "http") + "/ws"
	var open []*websocket.Conn
	for range 2 {
		c, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		open = append(open, c)
	}
	_, resp, err := websocket.DefaultDialer.Dial(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third session from one address: %v", err)
	}
	var out struct {
		Error struct{ Code, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&out)
	if out.Error.Code != "too_many_sessions" || !strings.Contains(out.Error.Message, "--max-sessions-per-client") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("refused with %+v", out)
	}
	open[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed session never freed its place: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSessionSlots: the caps in all and by address, each named.
func TestSessionSlots(t *testing.T) {
	var o sessionSlots
	l := Limits{MaxSessions: 3, MaxSessionsPerClient: 2}
	var releases []func()
	for _, addr := range []string{"a", "a", "b"} {
		rel, why := o.take(addr, l)
		if why != "" {
			t.Fatalf("%s: %s", addr, why)
		}
		releases = append(releases, rel)
	}
	if _, why := o.take("c", l); !strings.Contains(why, "--max-sessions)") {
		t.Errorf("past the total: %q", why)
	}
	releases[2]()
	releases[2]() // once only
	if _, why := o.take("a", l); !strings.Contains(why, "--max-sessions-per-client") {
		t.Errorf("past the address's: %q", why)
	}
	if _, why := o.take("c", l); why != "" {
		t.Errorf("a freed place: %q", why)
	}
	if o.total != 3 || o.byClient["b"] != 0 {
		t.Errorf("total %d, by client %v", o.total, o.byClient)
	}
}

// TestOneRunPerSession: a start while a run goes on stops that run first;
// a session never has two generations running.
func TestOneRunPerSession(t *testing.T) {
	l := serveLimited(t, Options{}, synthPair(t, 2*time.Millisecond))
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(l.url, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := map[string]any{"type": "start", "prompt": "def f(x):", "k": 2, "max_tokens": 60}
	if err := c.WriteJSON(start); err != nil {
		t.Fatal(err)
	}
	var seen []string
	started := false
	for {
		if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := c.ReadJSON(&m); err != nil {
			t.Fatal(err)
		}
		typ, _ := m["type"].(string)
		seen = append(seen, typ)
		if typ == "step" && !started {
			started = true
			if err := c.WriteJSON(start); err != nil { // a second start while the first runs
				t.Fatal(err)
			}
		}
		if typ == "finished" || typ == "error" {
			break
		}
	}
	joined := strings.Join(seen, " ")
	if !strings.Contains(joined, "stopped start") || strings.Count(joined, "done") != 1 {
		t.Errorf("messages %v: want the first run stopped before the second starts, one done", seen)
	}
}

// TestEventLogBounds: a session's log keeps at most keptEventBytes, and
// all logs keptLogBytes: past it the oldest go first. Before, a log kept
// its first 4096 messages whatever their size.
func TestEventLogBounds(t *testing.T) {
	var s sessionLogs
	big := bytes.Repeat([]byte("x"), 1<<20)
	s.open("first")
	for range 10 {
		s.record("first", big)
	}
	if ev, _ := s.events("first"); len(ev) != keptEventBytes>>20 {
		t.Errorf("a session kept %d MiB of events, want %d", len(ev), keptEventBytes>>20)
	}
	sessions := keptLogBytes/keptEventBytes + 4
	for i := range sessions {
		id := fmt.Sprint("s", i)
		s.open(id)
		for range 4 {
			s.record(id, big)
		}
	}
	if s.bytes > keptLogBytes {
		t.Errorf("%d MiB kept in all, the bound is %d", s.bytes>>20, keptLogBytes>>20)
	}
	if _, ok := s.events("first"); ok {
		t.Error("the oldest log was kept past the bound")
	}
	if ev, ok := s.events(fmt.Sprint("s", sessions-1)); !ok || len(ev) != 4 {
		t.Errorf("the newest log: %d events, %v", len(ev), ok)
	}
}

// TestSendBufferBytes: a tab that reads nothing loses its run once
// wsSendBytes of messages wait, not only wsSendBuffer messages.
func TestSendBufferBytes(t *testing.T) {
	srv := New(slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	canceled := false
	ps := &pageSession{id: "s", s: srv, send: make(chan []byte, wsSendBuffer), abort: func() { canceled = true }}
	srv.sessions.open("s")
	msg := map[string]any{"type": "step", "pad": strings.Repeat("x", 1<<20)}
	for i := 0; i < 8 && !canceled; i++ {
		ps.emit(msg)
	}
	if !canceled || ps.queued.Load() > wsSendBytes {
		t.Errorf("%d MiB queued for a tab that reads nothing, run canceled: %v", ps.queued.Load()>>20, canceled)
	}
}

// TestCORS: off by default — no Access-Control-* header, a preflight
// refused (405); with --cors-origin, a listed origin's preflight is
// answered before the API key, its requests carry its origin, others get
// nothing, and the websocket takes the listed origin.
func TestCORS(t *testing.T) {
	do := func(l *limited, method, path, origin string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, l.url+path, nil)
		if method == "POST" {
			req.Body = io.NopCloser(strings.NewReader(`{"tokens":[1,2,3],"n":2}`))
			req.Header.Set("Content-Type", "application/json")
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	preflight := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"}
	off := serveLimited(t, Options{}, Config{Drafter: goldenDrafter(t, 0)})
	if resp := do(off, "OPTIONS", "/draft", "https://app.example", preflight); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("CORS off, a preflight: %d %v", resp.StatusCode, resp.Header)
	}
	if resp := do(off, "GET", "/health", "https://app.example", nil); resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("CORS off: %v", resp.Header)
	}

	const app = "https://app.example"
	on := serveLimited(t, Options{APIKey: testKey, CORSOrigins: []string{app, "http://localhost:3000"}}, synthPair(t, 0))
	resp := do(on, "OPTIONS", "/v1/completions", app, preflight)
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != app || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "x-stainless-os") || !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
		t.Errorf("a listed origin's preflight: %d %v", resp.StatusCode, h)
	}
	resp = do(on, "POST", "/draft", app, map[string]string{"Authorization": "Bearer " + testKey})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != app {
		t.Errorf("a listed origin's request: %d %v", resp.StatusCode, resp.Header)
	}
	if resp := do(on, "POST", "/draft", app, nil); resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Access-Control-Allow-Origin") != app {
		t.Errorf("a listed origin without the key: %d %v (its page should read the 401)", resp.StatusCode, resp.Header)
	}
	for _, other := range []string{"https://evil.example", "https://app.example.evil", "null"} {
		if resp := do(on, "OPTIONS", "/draft", other, preflight); resp.StatusCode == http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s's preflight: %d %v", other, resp.StatusCode, resp.Header)
		}
	}
	url := "ws" + strings.TrimPrefix(on.url, "http") + "/ws"
	proto := websocket.Dialer{Subprotocols: []string{wsProtocol, wsProtocol + ".bearer." + testKey}}
	if c, _, err := proto.Dial(url, http.Header{"Origin": {"http://LOCALHOST:3000"}}); err != nil {
		t.Errorf("the websocket from a listed origin: %v", err)
	} else {
		c.Close()
	}
	if _, resp, err := proto.Dial(url, http.Header{"Origin": {"https://evil.example"}}); err == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("the websocket from another origin: %v", err)
	}
	for o, ok := range map[string]bool{"*": true, "https://a.example": true, "http://127.0.0.1:8080": true, "https://a.example/": true,
		"ftp://a.example": false, "https://a.example/path": false, "a.example": false, "https://u@a.example": false, "": false} {
		if err := CheckOrigin(o); (err == nil) != ok {
			t.Errorf("CheckOrigin(%q): %v", o, err)
		}
	}
}

// TestStaticFilesOnly: /static/ serves the embedded files and nothing
// else: not a listing of the folder, not a path out of it. Before, GET
// /static/ listed the folder.
func TestStaticFilesOnly(t *testing.T) {
	l := serveLimited(t, Options{}, Config{Drafter: goldenDrafter(t, 0)})
	get := func(path string) (int, string) {
		c := dial(t, l.addr, 5*time.Second)
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path) // sent as is, not cleaned
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, body := get("/static/app.js"); code != http.StatusOK || len(body) == 0 {
		t.Errorf("/static/app.js: %d", code)
	}
	for _, p := range []string{"/static/", "/static/../server/server.go", "/static/..%2f..%2fgo.mod", "/static/%2e%2e/%2e%2e/go.mod", "/static//etc/passwd"} {
		code, body := get(p)
		if code == http.StatusOK || strings.Contains(body, "app.js") || strings.Contains(body, "module webdraft") || strings.Contains(body, "package server") || strings.Contains(body, "root:") {
			t.Errorf("%s: %d %.100q", p, code, body)
		}
	}
}

// TestNoSecretsInLogs: requests carrying the API key (right and wrong)
// and bodies with a marker, good and bad, leave neither in the logs, at
// debug level.
func TestNoSecretsInLogs(t *testing.T) {
	const key, marker = "sk-SECRET-KEY-1234", "BODY-MARKER-5678"
	l := serveLimited(t, Options{APIKey: key, Limits: Limits{BodyTimeout: 200 * time.Millisecond}}, synthPair(t, 0))
	send := func(path, auth, body string) {
		req, _ := http.NewRequest("POST", l.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, auth := range []string{"Bearer " + key, "Bearer " + key + "-wrong", key} {
		send("/draft", auth, `{"text":"`+marker+`","n":2}`)
		send("/draft", auth, `{"text":"`+marker+`","n":0}`)
		send("/draft", auth, `{"text":"`+marker+`",`)
		send("/v1/completions", auth, `{"model":"target","prompt":"`+marker+`","max_tokens":3}`)
		send("/v1/chat/completions", auth, `{"model":"target","messages":[{"role":"`+marker+`","content":"x"}]}`)
		send("/v1/completions", auth, `{"model":"`+marker+`","prompt":"x"}`)
	}
	// A stalled body and a page session with the key as its subprotocol.
	c := dial(t, l.addr, 5*time.Second)
	fmt.Fprintf(c, "POST /draft HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\":\"%s", key, marker)
	closedWithin(t, c)
	ws, _, err := (&websocket.Dialer{Subprotocols: []string{wsProtocol, wsProtocol + ".bearer." + key}}).Dial("ws"+strings.TrimPrefix(l.url, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.WriteJSON(map[string]any{"type": "start", "prompt": marker, "k": 2, "max_tokens": 3})
	ws.WriteJSON(map[string]any{"type": marker})
	time.Sleep(300 * time.Millisecond)
	ws.Close()
	time.Sleep(100 * time.Millisecond)
	logs := l.logs.String()
	if !strings.Contains(logs, "page session") {
		t.Fatalf("nothing was logged: the test does not see the logs\n%s", logs)
	}
	for _, secret := range []string{key, marker, "SECRET", "MARKER"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs hold %q:\n%s", secret, logs)
		}
	}
}
