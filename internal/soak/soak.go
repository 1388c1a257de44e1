// Package soak holds a running webdraft server under a hostile mix of
// clients for a while and reports what it survived: well-formed drafts
// and generations (streamed or not) beside malformed, oversized, slow and
// disconnecting clients and page sessions that leave mid-run, with the
// server's memory, GPU buffers and prefix cache sampled throughout. Then
// every recorded answer is asked for again, alone, and must be the same.
// `go tool task soak` runs it against `webdraft serve` (soak_test.go).
package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"webdraft/internal/memstat"
)

// Options shape a soak.
type Options struct {
	URL      string        // the server, e.g. http://127.0.0.1:8080
	PID      int           // the server's process, whose resident memory is sampled (0: not sampled)
	Duration time.Duration // how long the mix runs
	// Concurrency is the clients at once (default 64), in fixed shares:
	// about 60 % drafting conversations, 10 % generations, and the rest
	// malformed, oversized, slow and disconnecting clients in equal parts.
	Concurrency int
	// BodyTimeout and IdleTimeout are the server's (--body-timeout,
	// --idle-timeout): slow clients expect a 408, and idle ones the
	// close, within them.
	BodyTimeout, IdleTimeout time.Duration
	// GenerationTimeout is the server's --generation-timeout (and bounds
	// its --request-timeout): clients wait that long and a minute more,
	// so that a request the server is slow to serve is answered by the
	// server — 504, load shed as designed — before its client gives up.
	GenerationTimeout time.Duration
	SampleEvery       time.Duration // default 1 s
	Replay            int           // recorded answers asked for again alone (default 200)
	Seed              uint64
}

func (o *Options) defaults() {
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.SampleEvery <= 0 {
		o.SampleEvery = time.Second
	}
	if o.Replay <= 0 {
		o.Replay = 200
	}
	if o.GenerationTimeout <= 0 {
		o.GenerationTimeout = 10 * time.Minute
	}
}

// Report is what a soak saw.
type Report struct {
	Duration time.Duration
	Clients  map[string]int // clients by kind
	// Outcomes counts requests by kind and outcome ("draft 200",
	// "malformed 400", "slow 408", "disconnect left" …); the deliberate
	// refusals (4xx, 429) are outcomes, not failures.
	Outcomes map[string]int
	// Failures counts what should not have happened, by kind and what:
	// a 5xx, a transport error on a well-formed request, a hostile client
	// answered otherwise than its refusal.
	Failures map[string]int
	Examples []string // the first few failures, in words
	Replayed int      // answers asked for again alone
	Differed []string // those that came back different
	Samples  []Sample
	// Final is the server once the clients stopped, its work drained and
	// then a garbage collection completed (Collected): its live heap is
	// what the server kept with nothing running.
	Final     Sample
	Collected bool
}

// Sample is the server's state at a moment of the soak.
type Sample struct {
	At            time.Duration
	RSSAnon       int64 // the server's anonymous resident memory (its heap and the engines' host memory)
	HeapInuse     int64 // go_memstats_heap_inuse_bytes: the live heap and the garbage not yet collected
	HeapLive      int64 // go_gc_heap_live_bytes: the heap the last collection marked live
	HeapRetained  int64 // go_memstats_heap_sys_bytes − go_memstats_heap_released_bytes: the heap's pages Go holds from the OS
	GPUBytes      int64 // webdraft_gpu_buffer_bytes, both models
	CacheTokens   int64 // webdraft_cache_tokens
	Reserved      int64 // webdraft_reserved_tokens
	CacheBudget   int64 // webdraft_cache_budget_tokens
	Running       int64 // webdraft_running_requests + webdraft_generations_running
	Connections   int64 // webdraft_open_connections
	PageSessions  int64 // webdraft_page_sessions
	Goroutines    int64 // go_goroutines
	OpenFDs       int64 // process_open_fds
	Faults        int64 // webdraft_engine_faults_total
	RequestsTotal int64 // Σ webdraft_requests_total
	GCCycles      int64 // go_gc_duration_seconds_count: the garbage collections completed
}

// Failed reports whether anything beyond the deliberate refusals went
// wrong.
func (r *Report) Failed() bool { return len(r.Failures) > 0 || len(r.Differed) > 0 }

// Served is the well-formed requests answered 200.
func (r *Report) Served() int {
	return r.Outcomes["draft 200"] + r.Outcomes["completion 200"] + r.Outcomes["stream 200"] + r.Outcomes["page finished"]
}

// Run soaks the server at o.URL and returns what it saw; the error is for
// a soak that could not run (no server), not for what failed in it.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	s := &soak{o: o, rep: &Report{Clients: map[string]int{}, Outcomes: map[string]int{}, Failures: map[string]int{}},
		client: &http.Client{Timeout: o.GenerationTimeout + time.Minute}, start: time.Now()}
	if err := s.health(ctx); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithTimeout(ctx, o.Duration)
	defer stop()
	var wg sync.WaitGroup
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s.sampleUntil(runCtx)
	}()
	for i, kind := range shares(o.Concurrency) {
		s.rep.Clients[kind]++
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.Seed, uint64(i)))
			for runCtx.Err() == nil {
				s.play(runCtx, kind, rng)
				if hostile(kind) {
					// A hostile client comes back after a pause: the mix
					// then holds the server's connections and loops without
					// taking all of its CPU from the well-formed ones.
					pause(runCtx, time.Duration(20+rng.IntN(80))*time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	<-sampled
	s.rep.Duration = time.Since(s.start)
	s.settle(ctx)
	s.replay(ctx)
	return s.rep, ctx.Err()
}

func hostile(kind string) bool { return kind != "draft" && kind != "completion" }

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// shares assigns the n clients their kinds.
func shares(n int) []string {
	kinds := make([]string, n)
	hostile := []string{"malformed", "oversized", "slow", "disconnect"}
	drafts, gens := n*60/100, n*10/100
	for i := range kinds {
		switch {
		case i < drafts:
			kinds[i] = "draft"
		case i < drafts+gens:
			kinds[i] = "completion"
		default:
			kinds[i] = hostile[(i-drafts-gens)%len(hostile)]
		}
	}
	return kinds
}

type soak struct {
	o      Options
	client *http.Client
	start  time.Time
	vocab  int
	maxCtx int
	model  string // the target's name, as requests give it

	mu       sync.Mutex
	rep      *Report
	recorded []recorded // answers to ask for again
	seen     int        // answers offered to recorded (reservoir sampling)
}

// recorded is a well-formed request and the answer it got.
type recorded struct {
	path, body string
	stream     bool
	answer     string
}

func (s *soak) outcome(kind, what string) {
	s.mu.Lock()
	s.rep.Outcomes[kind+" "+what]++
	s.mu.Unlock()
}

func (s *soak) fail(kind, what, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Failures[kind+" "+what]++
	if len(s.rep.Examples) < 12 {
		s.rep.Examples = append(s.rep.Examples, fmt.Sprintf("%s at %.1fs: %s: %.300s", kind, time.Since(s.start).Seconds(), what, detail))
	}
}

// record keeps a uniform sample of o.Replay answers (reservoir sampling).
func (s *soak) record(r recorded, rng *rand.Rand) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen++
	if len(s.recorded) < s.o.Replay {
		s.recorded = append(s.recorded, r)
	} else if j := rng.IntN(s.seen); j < s.o.Replay {
		s.recorded[j] = r
	}
}

func (s *soak) health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.o.URL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("soak: the server: %w", err)
	}
	defer resp.Body.Close()
	var h struct {
		Status     string `json:"status"`
		VocabSize  int    `json:"vocab_size"`
		MaxContext int    `json:"max_context"`
		Target     string `json:"target"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Status != "ok" {
		return fmt.Errorf("soak: /health: %d %+v %v", resp.StatusCode, h, err)
	}
	if h.Target == "" {
		return errors.New("soak: the server has no target: the soak needs the OpenAI-compatible API")
	}
	s.vocab, s.maxCtx, s.model = h.VocabSize, h.MaxContext, h.Target
	return nil
}

// play runs one round of a client of kind.
func (s *soak) play(ctx context.Context, kind string, rng *rand.Rand) {
	switch kind {
	case "draft":
		s.conversation(ctx, rng)
	case "completion":
		s.completion(ctx, rng)
	case "malformed":
		s.malformed(ctx, rng)
	case "oversized":
		s.oversized(ctx, rng)
	case "slow":
		s.slow(ctx, rng)
	case "disconnect":
		s.disconnect(ctx, rng)
	}
}

// prompts are the generations' prompts.
var prompts = []string{
	"def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        ", "import os\n\n\ndef walk(root):\n",
	"func main() {\n\t", "# Sort a list of numbers\n", "def read_config(path):\n    \"\"\"", "for i in range(10):\n    ",
	"package main\n\nimport (\n", "def parse(line):\n    parts = line.split(", "    return ",
}

// post sends a JSON body and returns the status and the body read.
func (s *soak) post(ctx context.Context, path, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.URL+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// wellFormed judges a well-formed request's answer: 200, or a deliberate
// 429 under load; anything else fails. It reports whether it was a 200.
func (s *soak) wellFormed(ctx context.Context, kind string, code int, body []byte, err error) bool {
	switch {
	case ended(ctx):
		return false // the soak's end cut it short
	case errors.Is(err, errTimeLimit):
		s.outcome(kind, "time limit") // as the 504 below, in a stream
	case err != nil:
		s.fail(kind, "transport", err.Error())
	case code == http.StatusOK:
		s.outcome(kind, "200")
		return true
	case code == http.StatusTooManyRequests:
		s.outcome(kind, "429")
	case code == http.StatusGatewayTimeout && bytes.Contains(body, []byte("request_timeout")):
		// The server's own bound on a request's time (queue included):
		// load shed as designed, like a 429.
		s.outcome(kind, "504")
	default:
		s.fail(kind, strconv.Itoa(code), string(body))
	}
	return false
}

// conversation plays a verifier: /draft on a growing context, keeping a
// random prefix of each draft and a token of its own, for a few turns.
func (s *soak) conversation(ctx context.Context, rng *rand.Rand) {
	tokens := make([]int, 8+rng.IntN(120))
	for i := range tokens {
		tokens[i] = rng.IntN(s.vocab)
	}
	for turn := 0; turn < 12 && ctx.Err() == nil; turn++ {
		n := 1 + rng.IntN(16)
		if len(tokens)+n > s.maxCtx {
			return
		}
		body, _ := json.Marshal(map[string]any{"tokens": tokens, "n": n})
		code, b, err := s.post(ctx, "/draft", string(body))
		if !s.wellFormed(ctx, "draft", code, b, err) {
			return
		}
		var res struct {
			Draft []int `json:"draft"`
		}
		if err := json.Unmarshal(b, &res); err != nil || len(res.Draft) != n {
			s.fail("draft", "answer", fmt.Sprintf("%d tokens for n %d (%v): %.200s", len(res.Draft), n, err, b))
			return
		}
		s.record(recorded{path: "/draft", body: string(body), answer: fmt.Sprint(res.Draft)}, rng)
		k := rng.IntN(n + 1)
		tokens = append(append(tokens, res.Draft[:k]...), rng.IntN(s.vocab))
	}
}

// completion asks for a greedy completion, streamed or not.
func (s *soak) completion(ctx context.Context, rng *rand.Rand) {
	prompt := prompts[rng.IntN(len(prompts))]
	req := map[string]any{"model": s.model, "prompt": prompt, "max_tokens": 4 + rng.IntN(20), "temperature": 0}
	if rng.IntN(3) == 0 {
		req["stream"] = true
		body, _ := json.Marshal(req)
		text, code, err := s.stream(ctx, string(body))
		if s.wellFormed(ctx, "stream", code, []byte(text), err) {
			s.record(recorded{path: "/v1/completions", body: string(body), stream: true, answer: text}, rng)
		}
		return
	}
	body, _ := json.Marshal(req)
	code, b, err := s.post(ctx, "/v1/completions", string(body))
	if !s.wellFormed(ctx, "completion", code, b, err) {
		return
	}
	text, err := completionText(b)
	if err != nil {
		s.fail("completion", "answer", err.Error())
		return
	}
	s.record(recorded{path: "/v1/completions", body: string(body), answer: text}, rng)
}

func completionText(b []byte) (string, error) {
	var res struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.Choices) != 1 {
		return "", fmt.Errorf("not a completion (%v): %.200s", err, b)
	}
	return res.Choices[0].Text, nil
}

// errTimeLimit: a stream ended with the server's time limit's error event
// (--generation-timeout), the streamed form of its 504.
var errTimeLimit = errors.New("the generation's time limit")

// stream reads a streamed completion whole: its text, or an error for an
// error event in it (errTimeLimit for the server's time limit).
func (s *soak) stream(ctx context.Context, body string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.URL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.StatusCode, nil
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return "", resp.StatusCode, fmt.Errorf("a stream event is not JSON: %.200s", line)
		}
		if ev.Error != nil {
			var e struct {
				Code string `json:"code"`
			}
			if json.Unmarshal(ev.Error, &e) == nil && e.Code == "request_timeout" {
				return "", resp.StatusCode, fmt.Errorf("%w: %s", errTimeLimit, ev.Error)
			}
			return "", resp.StatusCode, fmt.Errorf("an error event: %s", ev.Error)
		}
		for _, c := range ev.Choices {
			text.WriteString(c.Text)
		}
	}
	if err := sc.Err(); err != nil {
		return "", resp.StatusCode, err
	}
	if !done {
		return "", resp.StatusCode, errors.New("the stream ended without [DONE]")
	}
	return text.String(), resp.StatusCode, nil
}

// malformedBodies are bodies every endpoint must refuse with a 4xx.
var malformedBodies = []struct{ path, body string }{
	{"/draft", `{"tokens":[1,null,2]}`},
	{"/draft", `{"Tokens":[1],"tokens":null,"TEXT":"a"}`},
	{"/draft", `{"tokens":[1],"tokens":[2]}`},
	{"/draft", `{"tokens":[-1]}`},
	{"/draft", `{"tokens":[999999999]}`},
	{"/draft", `{"tokens":[1],"n":0}`},
	{"/draft", `{"text":""}`},
	{"/draft", `[1,2,3]`},
	{"/draft", `{"tokens":"abc"}`},
	{"/draft", `{"tokens":[1]`},
	{"/draft", `{"messages":[{"role":"wizard","content":"x"}]}`},
	{"/v1/completions", `{"model":"MODEL","prompt":"x","max_tokens":-4}`},
	{"/v1/completions", `{"model":"nope","prompt":"x"}`},
	{"/v1/completions", `{"model":"MODEL","prompt":null}`},
	{"/v1/completions", `{"model":"MODEL","prompt":"x","temperature":"hot"}`},
	{"/v1/chat/completions", `{"model":"MODEL","messages":[{"role":"user"}]}`},
	{"/v1/chat/completions", `{"model":"MODEL","messages":[]}`},
	{"/v1/chat/completions", "\x00\x01\x02"},
}

// malformed sends a bad body — one of malformedBodies, a good one with
// bytes flipped, or a good one with the wrong content type — and expects
// a 4xx (a flipped body that is still valid may be served: 200).
func (s *soak) malformed(ctx context.Context, rng *rand.Rand) {
	m := malformedBodies[rng.IntN(len(malformedBodies))]
	path, body, ctype := m.path, strings.ReplaceAll(m.body, "MODEL", s.model), "application/json"
	switch rng.IntN(3) {
	case 0: // a good body, damaged
		b := []byte(fmt.Sprintf(`{"tokens":[%d,%d,%d],"n":%d}`, rng.IntN(1000), rng.IntN(1000), rng.IntN(1000), 1+rng.IntN(8)))
		for range 1 + rng.IntN(3) {
			b[rng.IntN(len(b))] = byte(rng.IntN(256))
		}
		path, body = "/draft", string(b)
	case 1:
		ctype = "text/plain"
		path, body = "/draft", `{"tokens":[1,2,3],"n":2}`
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.URL+path, strings.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := s.client.Do(req)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		s.fail("malformed", "transport", err.Error())
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		if !json.Valid(b) {
			s.fail("malformed", "not JSON", string(b))
			return
		}
		s.outcome("malformed", strconv.Itoa(resp.StatusCode))
	case resp.StatusCode == http.StatusOK && path == "/draft" && ctype == "application/json":
		s.outcome("malformed", "200 (still valid)")
	default:
		s.fail("malformed", strconv.Itoa(resp.StatusCode), body+" → "+string(b))
	}
}

// oversized sends a body over the 4 MiB limit: declared in
// Content-Length (413 before it is sent), or streamed without one.
func (s *soak) oversized(ctx context.Context, rng *rand.Rand) {
	const size = 5 << 20
	if rng.IntN(2) == 0 {
		code, b, err := s.rawRequest(ctx, fmt.Sprintf("POST /draft HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"tokens\":[", size), 10*time.Second)
		s.expect(ctx, "oversized", code, b, err, http.StatusRequestEntityTooLarge)
		return
	}
	body := io.MultiReader(strings.NewReader(`{"tokens":[`), &repeat{s: "1,", n: size / 2}, strings.NewReader(`1]}`))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.URL+"/draft", body)
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		if !ended(ctx) && !isReset(err) {
			s.fail("oversized", "transport", err.Error())
		} else if !ended(ctx) {
			s.outcome("oversized", "closed while sending")
		}
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	s.expect(ctx, "oversized", resp.StatusCode, b, nil, http.StatusRequestEntityTooLarge)
}

// repeat is a reader of s, n times.
type repeat struct {
	s   string
	n   int
	buf []byte
}

func (r *repeat) Read(p []byte) (int, error) {
	if len(r.buf) == 0 {
		if r.n == 0 {
			return 0, io.EOF
		}
		k := min(r.n, 4096)
		r.buf = []byte(strings.Repeat(r.s, k))
		r.n -= k
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// isReset is a write the server cut off (it answered early and closed).
func isReset(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection reset") || strings.Contains(s, "broken pipe")
}

func (s *soak) expect(ctx context.Context, kind string, code int, body []byte, err error, want int) {
	switch {
	case ended(ctx):
	case err != nil:
		s.fail(kind, "transport", err.Error())
	case code == want:
		s.outcome(kind, strconv.Itoa(code))
	default:
		s.fail(kind, strconv.Itoa(code), fmt.Sprintf("want %d: %.200s", want, body))
	}
}

// rawRequest writes head on a fresh connection and reads the answer's
// status and body, within limit.
func (s *soak) rawRequest(ctx context.Context, head string, limit time.Duration) (int, []byte, error) {
	conn, err := s.dial(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(limit)); err != nil {
		return 0, nil, err
	}
	if _, err := io.WriteString(conn, head); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, nil
}

// ended reports whether the soak's end has come for ctx: canceled, or
// past its deadline. A dial or read bounded by the deadline can fail
// with an i/o timeout a moment before ctx.Err() says so.
func ended(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(d)
}

func (s *soak) dial(ctx context.Context) (net.Conn, error) {
	u, err := url.Parse(s.o.URL)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", u.Host)
}

// slow holds a connection the slow way: a body that stops coming (408
// within --body-timeout, and the connection closed), or a keep-alive
// connection left idle after a request (closed within --idle-timeout).
func (s *soak) slow(ctx context.Context, rng *rand.Rand) {
	slack := 5 * time.Second
	if rng.IntN(2) == 0 {
		start := time.Now()
		code, b, err := s.rawRequest(ctx, "POST /draft HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tok", s.o.BodyTimeout+slack)
		if !ended(ctx) && err == nil && code == http.StatusRequestTimeout && time.Since(start) < s.o.BodyTimeout-time.Second/2 {
			s.fail("slow", "408 early", fmt.Sprintf("after %v, before --body-timeout %v", time.Since(start), s.o.BodyTimeout))
			return
		}
		s.expect(ctx, "slow", code, b, err, http.StatusRequestTimeout)
		return
	}
	conn, err := s.dial(ctx)
	if err != nil {
		if !ended(ctx) {
			s.fail("slow", "transport", err.Error())
		}
		return
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(s.o.IdleTimeout + slack)); err != nil {
		return
	}
	if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: soak\r\n\r\n"); err != nil {
		return
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		if !ended(ctx) {
			s.fail("slow", "transport", err.Error())
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Idle now: the server must close the connection.
	_, err = br.ReadByte()
	switch {
	case ended(ctx):
	case errors.Is(err, io.EOF):
		s.outcome("slow", "idle closed")
	default:
		s.fail("slow", "idle kept", fmt.Sprintf("%v past --idle-timeout %v", err, s.o.IdleTimeout))
	}
}

// disconnect leaves in the middle: a streamed generation after its first
// event, a draft after a moment, a page session mid-run.
func (s *soak) disconnect(ctx context.Context, rng *rand.Rand) {
	switch rng.IntN(3) {
	case 0:
		body, _ := json.Marshal(map[string]any{"model": s.model, "prompt": prompts[rng.IntN(len(prompts))], "max_tokens": 200, "temperature": 0, "stream": true})
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, s.o.URL+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.client.Do(req)
		if err != nil {
			if !ended(ctx) {
				s.fail("disconnect", "transport", err.Error())
			}
			return
		}
		br := bufio.NewReader(resp.Body)
		_, _ = br.ReadString('\n') // the first event, or the answer's first line
		cancel()
		resp.Body.Close()
		s.outcome("disconnect", "stream left")
	case 1:
		tokens := make([]int, 32+rng.IntN(200))
		for i := range tokens {
			tokens[i] = rng.IntN(s.vocab)
		}
		body, _ := json.Marshal(map[string]any{"tokens": tokens, "n": 16})
		rctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(200))*time.Millisecond)
		defer cancel()
		_, _, err := s.post(rctx, "/draft", string(body))
		if err == nil {
			s.outcome("disconnect", "draft served first")
			return
		}
		s.outcome("disconnect", "draft left")
	default:
		s.pageSession(ctx, rng)
	}
}

// pageSession opens the live page's websocket, starts a run and leaves
// after its first steps.
func (s *soak) pageSession(ctx context.Context, rng *rand.Rand) {
	u := "ws" + strings.TrimPrefix(s.o.URL, "http") + "/ws"
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	c, resp, err := d.DialContext(ctx, u, nil)
	if err != nil {
		if ended(ctx) {
			return
		}
		if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
			s.outcome("page", "429")
			return
		}
		s.fail("page", "dial", err.Error())
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(s.o.GenerationTimeout + time.Minute))
	start := map[string]any{"type": "start", "prompt": prompts[rng.IntN(len(prompts))], "k": 4, "max_tokens": 64}
	if err := c.WriteJSON(start); err != nil {
		return
	}
	steps := 1 + rng.IntN(3)
	for {
		var m map[string]any
		if err := c.ReadJSON(&m); err != nil {
			if !ended(ctx) {
				s.fail("page", "read", err.Error())
			}
			return
		}
		switch m["type"] {
		case "step":
			if steps--; steps == 0 {
				s.outcome("page", "left mid-run")
				return
			}
		case "error":
			if msg := fmt.Sprint(m["message"]); strings.Contains(msg, "--generation-timeout") {
				s.outcome("page", "timed out (--generation-timeout)")
			} else {
				s.fail("page", "error event", msg)
			}
			return
		case "finished":
			s.outcome("page", "finished")
			return
		}
	}
}

// sampleUntil samples the server every SampleEvery until ctx ends.
func (s *soak) sampleUntil(ctx context.Context) {
	t := time.NewTicker(s.o.SampleEvery)
	defer t.Stop()
	for {
		if smp, err := s.sample(context.WithoutCancel(ctx)); err == nil {
			s.mu.Lock()
			s.rep.Samples = append(s.rep.Samples, smp)
			s.mu.Unlock()
		} else {
			s.fail("sampler", "metrics", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample reads the server's metrics and resident memory.
func (s *soak) sample(ctx context.Context) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.o.URL+"/metrics", nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return Sample{}, err
	}
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_gc_heap_live_bytes", "go_gc_duration_seconds_count", "webdraft_cache_budget_tokens"} {
		if _, ok := m[name]; !ok {
			return Sample{}, fmt.Errorf("the server's /metrics has no %s", name)
		}
	}
	smp := Sample{
		At: time.Since(s.start), HeapInuse: m["go_memstats_heap_inuse_bytes"], HeapLive: m["go_gc_heap_live_bytes"],
		HeapRetained: m["go_memstats_heap_sys_bytes"] - m["go_memstats_heap_released_bytes"], GPUBytes: m["webdraft_gpu_buffer_bytes"],
		CacheTokens: m["webdraft_cache_tokens"], Reserved: m["webdraft_reserved_tokens"], CacheBudget: m["webdraft_cache_budget_tokens"],
		Running: m["webdraft_running_requests"] + m["webdraft_generations_running"], Connections: m["webdraft_open_connections"],
		PageSessions: m["webdraft_page_sessions"], Goroutines: m["go_goroutines"], OpenFDs: m["process_open_fds"],
		Faults: m["webdraft_engine_faults_total"], RequestsTotal: m["webdraft_requests_total"], GCCycles: m["go_gc_duration_seconds_count"],
	}
	if s.o.PID > 0 {
		r, err := memstat.ReadProcess(s.o.PID)
		if err != nil {
			return Sample{}, err
		}
		smp.RSSAnon = r.Anon
	}
	return smp, nil
}

// parseMetrics sums each metric's samples (over its labels) in
// Prometheus' text format.
func parseMetrics(r io.Reader) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			name, rest, ok = line[:i], strings.TrimSpace(line[j+1:]), j > i
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		out[name] += int64(v)
	}
	return out, sc.Err()
}

// settle waits for the server to finish what the soak left running (up to
// a minute), then for a garbage collection to complete with nothing
// running (the runtime forces one at least every two minutes; up to
// CollectionWait), and takes that sample as the final one: its live heap
// is what the server kept once its work was done — a leak raises it, the
// load's requests in flight and its garbage do not.
func (s *soak) settle(ctx context.Context) {
	deadline := time.Now().Add(time.Minute)
	idleCycles := int64(-1) // the collections completed when the server was first seen idle
	for {
		smp, err := s.sample(ctx)
		idle := err == nil && smp.Running == 0 && smp.Reserved == 0 && smp.PageSessions == 0
		if idle && idleCycles < 0 {
			idleCycles, deadline = smp.GCCycles, time.Now().Add(CollectionWait)
		}
		collected := idle && smp.GCCycles > idleCycles
		if collected || time.Now().After(deadline) || ctx.Err() != nil {
			s.rep.Final, s.rep.Collected = smp, collected
			if err != nil {
				s.fail("settle", "metrics", err.Error())
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// replay asks for each recorded answer again, one request at a time.
func (s *soak) replay(ctx context.Context) {
	recs := slices.Clone(s.recorded)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].path < recs[j].path })
	for _, r := range recs {
		if ctx.Err() != nil {
			return
		}
		var answer string
		var code int
		var b []byte
		var err error
		if r.stream {
			answer, code, err = s.stream(ctx, r.body)
		} else {
			code, b, err = s.post(ctx, r.path, r.body)
		}
		if err == nil && code == http.StatusOK && !r.stream {
			if r.path == "/draft" {
				var res struct {
					Draft []int `json:"draft"`
				}
				err = json.Unmarshal(b, &res)
				answer = fmt.Sprint(res.Draft)
			} else {
				answer, err = completionText(b)
			}
		}
		s.rep.Replayed++
		switch {
		case err != nil || code != http.StatusOK:
			s.fail("replay", strconv.Itoa(code), fmt.Sprintf("%v %.200s", err, b))
		case answer != r.answer:
			s.rep.Differed = append(s.rep.Differed, fmt.Sprintf("%s %.120s: %q under load, %q alone", r.path, r.body, r.answer, answer))
		}
	}
}
