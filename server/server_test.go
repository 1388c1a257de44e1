package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/scheduler"
	"webdraft/tokenizer"
)

type fixture struct {
	url string
	eng engine.Engine
	srv *Server
}

// newFixture serves the untied golden model (vocab 1024, 512 positions) on
// the CPU engine, with the embedded Qwen3 tokenizer; wrap, when set,
// decorates the engine.
func newFixture(t *testing.T, opts scheduler.Options, wrap func(engine.Engine) engine.Engine) *fixture {
	t.Helper()
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	return newFixtureTokenizer(t, opts, wrap, tok)
}

// newFixtureTokenizer is newFixture with the given tokenizer (nil: none).
func newFixtureTokenizer(t *testing.T, opts scheduler.Options, wrap func(engine.Engine) engine.Engine, tok *tokenizer.Tokenizer) *fixture {
	t.Helper()
	m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", "untied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	c, err := cpu.New(m.Config, m.Weights, cpu.Options{KVBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var eng engine.Engine = c
	if wrap != nil {
		eng = wrap(eng)
	}
	srv := New(slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	ts := httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		srv.Run(ctx, Config{Drafter: Model{Name: "untied", Engine: eng, Tokenizer: tok}, Scheduler: opts})
		close(done)
	}()
	t.Cleanup(func() { ts.Close(); cancel(); <-done })
	waitReady(t, ts.URL)
	return &fixture{url: ts.URL, eng: eng, srv: srv}
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	for range 200 {
		if resp, err := http.Get(url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("server never became ready")
}

// post sends a raw body to /draft and decodes the JSON answer.
func post(t *testing.T, url, body string) (int, http.Header, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/draft", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("response is not JSON: %v", err)
	}
	return resp.StatusCode, resp.Header, out
}

func ints(v any) []int {
	var out []int
	for _, x := range v.([]any) {
		out = append(out, int(x.(float64)))
	}
	return out
}

func TestDraft(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	code, _, out := post(t, f.url, `{"tokens":[5,6,7,8],"n":6,"session":"abc"}`)
	if code != 200 {
		t.Fatalf("status %d: %v", code, out)
	}
	seq, err := f.eng.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	want, err := engine.Draft(context.Background(), f.eng, seq, []int{5, 6, 7, 8}, 6)
	if err != nil {
		t.Fatal(err)
	}
	if got := ints(out["draft"]); !slices.Equal(got, engine.IDs(want)) {
		t.Errorf("draft %v, engine alone %v", got, want)
	}
	for _, k := range []string{"text", "cached_tokens", "prefill_tokens", "timing_ms"} {
		if _, ok := out[k]; !ok {
			t.Errorf("response lacks %q: %v", k, out)
		}
	}
	timing := out["timing_ms"].(map[string]any)
	for _, k := range []string{"queue", "prefill", "decode"} {
		if _, ok := timing[k]; !ok {
			t.Errorf("timing_ms lacks %q", k)
		}
	}
	// Default n is 16; the call extends the last: the cache is reused.
	code, _, out = post(t, f.url, `{"tokens":[5,6,7,8,9]}`)
	if code != 200 || len(ints(out["draft"])) != 16 || out["cached_tokens"].(float64) != 4 || out["prefill_tokens"].(float64) != 1 {
		t.Errorf("status %d, %v", code, out)
	}
	// Text and messages go through the tokenizer (ids below 1024 only here).
	if code, _, out := post(t, f.url, `{"text":"a","n":2}`); code != 200 {
		t.Errorf("text: %d %v", code, out)
	}
}

func TestBadInput(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	cases := []struct {
		name, body string
		status     int
		mention    string
	}{
		{"malformed", `{"tokens":[1,2`, 400, "body"},
		{"not an object", `[1,2]`, 400, "body"},
		{"empty body", ``, 400, "body"},
		{"trailing", `{"tokens":[1]} {}`, 400, "trailing"},
		{"wrong type tokens", `{"tokens":"1,2"}`, 400, "tokens"},
		{"wrong type n", `{"tokens":[1],"n":"3"}`, 400, "n"},
		{"float token", `{"tokens":[1.5]}`, 400, "tokens"},
		{"unknown field", `{"tokens":[1],"temperature":0.7}`, 400, "temperature"},
		{"nothing", `{}`, 400, "exactly one"},
		{"two inputs", `{"tokens":[1],"text":"a"}`, 400, "exactly one"},
		{"empty tokens", `{"tokens":[]}`, 400, "tokens"},
		{"empty text", `{"text":""}`, 400, "text"},
		{"empty messages", `{"messages":[]}`, 400, "messages"},
		{"bad role", `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages[0].role"},
		{"negative token", `{"tokens":[1,-2]}`, 400, "tokens[1]"},
		{"token past vocab", `{"tokens":[1,2,1024]}`, 400, "tokens[2]"},
		{"text past vocab", `{"text":"hello world"}`, 400, "text"},
		{"n zero", `{"tokens":[1],"n":0}`, 400, "n"},
		{"n too big", `{"tokens":[1],"n":65}`, 400, "n"},
		{"context too long", `{"tokens":[` + strings.Repeat("1,", 510) + `1],"n":16}`, 413, "context"},
		{"body too large", `{"tokens":[` + strings.Repeat("1,", MaxBodyBytes/2) + `1]}`, 413, "body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, out := post(t, f.url, c.body)
			if code != c.status {
				t.Errorf("status %d, want %d: %v", code, c.status, out)
			}
			e, ok := out["error"].(map[string]any)
			if !ok || e["code"] == "" || !strings.Contains(e["message"].(string), c.mention) {
				t.Errorf("error %v does not mention %q", out, c.mention)
			}
		})
	}
	// The server is still serving.
	if code, _, out := post(t, f.url, `{"tokens":[1,2,3],"n":2}`); code != 200 {
		t.Errorf("after bad input: %d %v", code, out)
	}
	// Wrong method and path.
	resp, err := http.Get(f.url + "/draft")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /draft: %d", resp.StatusCode)
	}
}

func TestMessages(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	// The chat template's special tokens (<|im_start|> = 151644) are outside
	// this tiny model's vocabulary: a clear 400 naming messages.
	code, _, out := post(t, f.url, `{"messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || !strings.Contains(out["error"].(map[string]any)["message"].(string), "messages") {
		t.Errorf("status %d: %v", code, out)
	}
}

func TestConcurrentRequestsMatchSequential(t *testing.T) {
	f := newFixture(t, scheduler.Options{}, nil)
	rng := rand.New(rand.NewPCG(9, 9))
	const n = 16
	bodies := make([][]int, n)
	for i := range bodies {
		bodies[i] = make([]int, 1+rng.IntN(60))
		for j := range bodies[i] {
			bodies[i][j] = rng.IntN(1024)
		}
	}
	got := make([][]int, n)
	var wg sync.WaitGroup
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(map[string]any{"tokens": bodies[i], "n": 8})
			resp, err := http.Post(f.url+"/draft", "application/json", bytes.NewReader(b))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out struct{ Draft []int }
			json.NewDecoder(resp.Body).Decode(&out)
			got[i] = out.Draft
		}()
	}
	wg.Wait()
	for i, p := range bodies {
		seq, err := f.eng.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		want, err := engine.Draft(context.Background(), f.eng, seq, p, 8)
		seq.Release()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got[i], engine.IDs(want)) {
			t.Errorf("request %d: %v, sequential %v", i, got[i], want)
		}
	}
}

// slow delays every forward pass.
type slow struct{ engine.Engine }

func (s slow) Step(ctx context.Context, b []*engine.Entry) error {
	time.Sleep(10 * time.Millisecond)
	return s.Engine.Step(ctx, b)
}

func TestOverload(t *testing.T) {
	f := newFixture(t, scheduler.Options{MaxBatch: 1, MaxQueue: 1}, func(e engine.Engine) engine.Engine { return slow{e} })
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, hdr, _ := post(t, f.url, `{"tokens":[1,2,3],"n":10}`)
			if code == 429 && hdr.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			mu.Lock()
			statuses[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if statuses[429] == 0 || statuses[200] == 0 || statuses[200]+statuses[429] != 6 {
		t.Errorf("statuses %v: want some 200 and some 429, nothing else", statuses)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	// Not ready: 503 loading.
	srv := New(slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if resp.StatusCode != 503 || h["status"] != "loading" {
		t.Errorf("before ready: %d %v", resp.StatusCode, h)
	}
	if code, hdr, _ := post(t, ts.URL, `{"tokens":[1]}`); code != 503 || hdr.Get("Retry-After") == "" {
		t.Errorf("draft before ready: %d", code)
	}

	f := newFixture(t, scheduler.Options{}, nil)
	resp, err = http.Get(f.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if resp.StatusCode != 200 || h["status"] != "ok" || h["model"] != "untied" || h["backend"] != "cpu" || h["adapter"] == "" {
		t.Errorf("ready: %d %v", resp.StatusCode, h)
	}
	post(t, f.url, `{"tokens":[1,2,3],"n":4}`)
	post(t, f.url, `{"tokens":[1,2,3,4],"n":4}`)
	post(t, f.url, `{"tokens":"x"}`)
	resp, err = http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`webdraft_requests_total{code="",status="200"} 2`,
		`webdraft_requests_total{code="invalid_request",status="400"} 1`,
		`webdraft_draft_tokens_total 8`,
		`webdraft_cached_tokens_total 3`,
		`webdraft_prefill_tokens_total 4`,
		`webdraft_batch_sequences_count`,
		`webdraft_request_phase_seconds_bucket{phase="decode"`,
		`webdraft_queue_depth 0`,
		`webdraft_cache_sequences 1`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// A model without a tokenizer drafts from token ids, and refuses text and
// messages with a 400 that says why.
func TestNoTokenizer(t *testing.T) {
	f := newFixtureTokenizer(t, scheduler.Options{}, nil, nil)
	code, _, body := post(t, f.url, `{"tokens":[1,2,3],"n":4}`)
	if code != http.StatusOK || len(body["draft"].([]any)) != 4 || body["text"] != "" {
		t.Errorf("tokens: %d %v", code, body)
	}
	for _, req := range []string{`{"text":"hi"}`, `{"messages":[{"role":"user","content":"hi"}]}`} {
		code, _, body := post(t, f.url, req)
		e, _ := body["error"].(map[string]any)
		if msg, _ := e["message"].(string); code != http.StatusBadRequest || !strings.Contains(msg, "no tokenizer") {
			t.Errorf("%s: %d %v; want 400 saying the model has no tokenizer", req, code, body)
		}
	}
}
