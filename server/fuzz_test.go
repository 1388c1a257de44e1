package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/speculative"
	"webdraft/tokenizer"
)

// The handlers' fuzz targets: /draft, /completion, /v1/completions and
// /v1/chat/completions bodies, driven in-process (httptest), and the live
// page's websocket messages. Whatever the bytes, the server must answer
// in time with a 2xx or a 4xx — never a 5xx — in JSON (an SSE stream of
// JSON for stream: true), an error in its route's shape with the echo
// clipped, and an answer that keeps its promises (below). Bounded runs
// (Taskfile's fuzz task), e.g.:
//
//	go test ./server -run '^$' -fuzz '^FuzzDraft$' -fuzztime 10s

// fuzzAnswerWait bounds one answer: a request that gets none by then has
// hung the server.
const fuzzAnswerWait = 30 * time.Second

// fuzzMessageBytes bounds an error message, whatever was sent: values are
// echoed clipped (issue 26).
const fuzzMessageBytes = 512

// fuzzServer serves a pair of synthetic one-layer models (Qwen3's
// vocabulary, so that any text tokenizes within it; a head over 64 of its
// tokens, so that a step is cheap; 64 positions, so that a generation is
// short) on CPU engines, with the embedded tokenizer.
type fuzzServer struct {
	h    http.Handler
	srv  *Server
	tok  *tokenizer.Tokenizer
	head map[int]bool // the tokens the drafter can draft
	url  string       // of an httptest server, when asked for
}

func newFuzzServer(f *testing.F, network bool) *fuzzServer {
	f.Helper()
	tok, err := tokenizer.Default()
	if err != nil {
		f.Fatal(err)
	}
	cfg := qwen3.Config{VocabSize: 151936, HiddenSize: 8, IntermediateSize: 16, NumHiddenLayers: 1,
		NumAttentionHeads: 1, NumKeyValueHeads: 1, HeadDim: 8, RMSNormEps: 1e-6, RopeTheta: 10000,
		MaxPositionEmbeddings: 64, TieWordEmbeddings: true}
	load := func(name string, seed uint64) *checkpoint.Model {
		dir := filepath.Join(f.TempDir(), name)
		if err := synth.Write(dir, cfg, synth.Options{Seed: seed, Std: 0.5, HeadTokens: 64}); err != nil {
			f.Fatal(err)
		}
		m, err := checkpoint.Load(dir, checkpoint.LoadOptions{Quant: checkpoint.F32})
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { m.Close() })
		return m
	}
	newEngine := func(m *checkpoint.Model) engine.Engine {
		e, err := engine.NewReference(m.Config, m.Weights, 4<<20)
		if err != nil {
			f.Fatal(err)
		}
		return e
	}
	dm, tm := load("drafter", 2), load("target", 1)
	fs := &fuzzServer{srv: New(slog.New(slog.NewTextHandler(io.Discard, nil)), ""), tok: tok, head: map[int]bool{}}
	for _, id := range dm.Weights.HeadTokens {
		fs.head[int(id)] = true
	}
	fs.h = fs.srv.Handler()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := fs.srv.Run(ctx, Config{
			Drafter:     Model{Name: "drafter", Engine: newEngine(dm), Tokenizer: tok},
			Target:      &Model{Name: "target", Engine: newEngine(tm), Tokenizer: tok},
			Speculative: speculative.Options{K: 4},
		})
		if err != nil && ctx.Err() == nil {
			panic(err)
		}
	}()
	var ts *httptest.Server
	if network {
		ts = httptest.NewServer(fs.h)
		fs.url = ts.URL
	}
	f.Cleanup(func() {
		if ts != nil {
			ts.Close()
		}
		cancel()
		<-done
	})
	for fs.srv.ready.Load() == nil {
		time.Sleep(time.Millisecond)
	}
	return fs
}

// fuzzSeeds adds bodies as seeds.
func fuzzSeeds(f *testing.F, bodies ...string) {
	for _, b := range bodies {
		f.Add([]byte(b))
	}
}

// post serves one POST in-process and returns its answer.
func (fs *fuzzServer) post(t *testing.T, path string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	served := make(chan any, 1)
	go func() {
		defer func() { served <- recover() }()
		fs.h.ServeHTTP(rec, req)
	}()
	select {
	case p := <-served:
		if p != nil {
			t.Fatalf("POST %s %q: panic: %v", path, body, p)
		}
	case <-time.After(fuzzAnswerWait):
		t.Fatalf("POST %s %q: no answer in %v", path, body, fuzzAnswerWait)
	}
	return rec
}

// errorShape is the shape of a route's errors.
type errorShape int

const (
	ownErrors    errorShape = iota // {"error": {"code", "message"}}
	openAIErrors                   // {"error": {"message", "type", "param", "code"}}
	llamaErrors                    // llama-server's {"error": {"code": status, "message", "type"}}
)

// answer checks what every answer must be — 2xx or 4xx, nosniff, JSON in
// the route's error shape when it is an error — and returns the status
// and the JSON object; for an SSE stream (OpenAI's routes only), its
// events (the [DONE] left out) instead.
func answer(t *testing.T, rec *httptest.ResponseRecorder, body []byte, shape errorShape) (int, map[string]any, []map[string]any) {
	t.Helper()
	status, h := rec.Code, rec.Header()
	where := fmt.Sprintf("body %q: status %d", body, status)
	if !(status >= 200 && status < 300 || status >= 400 && status < 500) {
		t.Fatalf("%s: %s", where, rec.Body.Bytes())
	}
	if h.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("%s: no X-Content-Type-Options: nosniff", where)
	}
	if status == http.StatusTooManyRequests && h.Get("Retry-After") == "" {
		t.Fatalf("%s: no Retry-After", where)
	}
	if status == http.StatusOK && h.Get("Content-Type") == "text/event-stream" {
		if shape != openAIErrors {
			t.Fatalf("%s: an event stream", where)
		}
		return status, nil, sseEvents(t, where, rec.Body.Bytes())
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: Content-Type %q", where, ct)
	}
	var obj map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &obj); err != nil {
		t.Fatalf("%s: not a JSON object (%v): %q", where, err, rec.Body.Bytes())
	}
	if status >= 400 {
		checkError(t, where, obj, shape, status)
	}
	return status, obj, nil
}

// checkError checks an error body in shape: {"error": {"code",
// "message"}}, OpenAI's {"error": {"message", "type", "param", "code"}},
// or llama-server's {"error": {"code", "message", "type"}}, its code the
// status (0: not known, in a stream).
func checkError(t *testing.T, where string, obj map[string]any, shape errorShape, status int) {
	t.Helper()
	e, ok := obj["error"].(map[string]any)
	if !ok || len(obj) != 1 {
		t.Fatalf("%s: not an error object: %v", where, obj)
	}
	msg, ok := e["message"].(string)
	if !ok || msg == "" || len(msg) > fuzzMessageBytes {
		t.Fatalf("%s: error message of %d bytes: %.2000q", where, len(msg), msg)
	}
	switch shape {
	case ownErrors:
		if code, ok := e["code"].(string); !ok || code == "" || len(e) != 2 {
			t.Fatalf("%s: error %v", where, e)
		}
		return
	case llamaErrors:
		typ, ok := e["type"].(string)
		if code, isNum := e["code"].(float64); !isNum || int(code) != status || !ok || typ == "" || typ == "server_error" || len(e) != 3 {
			t.Fatalf("%s: error %v", where, e)
		}
		return
	}
	typ, ok := e["type"].(string)
	if !ok || typ == "" || typ == "server_error" || len(e) != 4 {
		t.Fatalf("%s: error %v", where, e)
	}
	for _, k := range []string{"param", "code"} {
		if v, ok := e[k]; !ok || v != nil && !isString(v) {
			t.Fatalf("%s: error's %s is %v", where, k, v)
		}
	}
}

func isString(v any) bool { _, ok := v.(string); return ok }

// sseEvents reads a server-sent event stream: "data: {json}" events, each
// followed by a blank line, the last "data: [DONE]".
func sseEvents(t *testing.T, where string, stream []byte) []map[string]any {
	t.Helper()
	var events []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(stream))
	sc.Buffer(nil, 1<<24)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || done {
			t.Fatalf("%s: stream line %q", where, line)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%s: event %q: %v", where, data, err)
		}
		if _, isErr := ev["error"]; isErr {
			checkError(t, where, ev, openAIErrors, 0)
		}
		events = append(events, ev)
	}
	if !done {
		t.Fatalf("%s: the stream does not end with [DONE]: %q", where, stream)
	}
	return events
}

// lenient is what the checks need of an accepted body, read by
// encoding/json (a body the strict decoder took reads the same).
type lenient struct {
	N                   *int            `json:"n"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stop                json.RawMessage `json:"stop"`
	ReturnTokenIDs      bool            `json:"return_token_ids"`
	NPredict            *int            `json:"n_predict"`
	ReturnTokens        bool            `json:"return_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
}

func readLenient(t *testing.T, body []byte) lenient {
	t.Helper()
	var l lenient
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("body %q was accepted, encoding/json refuses it: %v", body, err)
	}
	return l
}

func (l lenient) stops() []string {
	var one string
	if json.Unmarshal(l.Stop, &one) == nil {
		return []string{one}
	}
	var list []string
	_ = json.Unmarshal(l.Stop, &list)
	return list
}

// FuzzDraft posts arbitrary bodies to /draft. Besides what every answer
// must be, a 200 drafts at most n tokens (16 when not given), each one the
// drafter's head can score, with the text the tokenizer gives them.
func FuzzDraft(f *testing.F) {
	fs := newFuzzServer(f, false)
	fuzzSeeds(f, `{"tokens":[5,6,7,8],"n":6,"session":"abc"}`, `{"text":"def f(x):","n":3,"p_min":0.2}`,
		`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"n":2}`,
		`{"tokens":[1,null,2]}`, `{"Tokens":[1],"tokens":null,"TEXT":"a"}`, `{"tokens":[1],"n":65}`, `{"text":"a\u00e9\ud83d\ude00","n":1}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, obj, _ := answer(t, fs.post(t, "/draft", body), body, ownErrors)
		if status != http.StatusOK {
			return
		}
		n := DefaultN
		if l := readLenient(t, body); l.N != nil {
			n = *l.N
		}
		raw, ok := obj["draft"].([]any)
		if !ok || len(raw) > n {
			t.Fatalf("body %q: draft %v for n %d", body, obj["draft"], n)
		}
		ids := make([]int, len(raw))
		for i, v := range raw {
			x, ok := v.(float64)
			if ids[i] = int(x); !ok || !fs.head[ids[i]] {
				t.Fatalf("body %q: drafted %v, which the drafter's head cannot score", body, v)
			}
		}
		want, err := fs.tok.Decode(ids)
		if err != nil {
			want = "" // ids past the tokenizer's vocabulary
		}
		if obj["text"] != want {
			t.Fatalf("body %q: text %q for %v, the tokenizer's %q", body, obj["text"], ids, want)
		}
		for _, k := range []string{"cached_tokens", "prefill_tokens"} {
			if v, ok := obj[k].(float64); !ok || v < 0 {
				t.Fatalf("body %q: %s %v", body, k, obj[k])
			}
		}
	})
}

// FuzzLlamaCompletion posts arbitrary bodies to /completion (llama-server's
// API). Besides what every answer must be (errors in llama-server's
// shape), a 200 drafts at most n_predict tokens (16 when not given or -1),
// each one the drafter's head can score, returned only with return_tokens;
// content is their text (an end token's left out); the timings add up.
func FuzzLlamaCompletion(f *testing.F) {
	fs := newFuzzServer(f, false)
	fuzzSeeds(f, `{"prompt":[5,6,7,8],"n_predict":3,"cache_prompt":true,"return_tokens":true,"temperature":0,"top_k":1,"samplers":["top_k"],"stream":false}`,
		`{"prompt":"def f(x):","n_predict":-1,"return_tokens":true,"id_slot":-1,"top_p":0.9,"seed":3}`,
		`{"prompt":[1,2,"x = ",3],"n_predict":0}`, `{"prompt":[[9,8,7]],"n_predict":2,"ignore_eos":true,"return_tokens":true}`,
		`{"prompt":["a"],"temperature":0.7,"top_k":1,"samplers":"kt"}`, `{"prompt":["a","b"]}`, `{"prompt":[1],"stream":true}`,
		`{"prompt":[1],"n_predict":65}`, `{"prompt":{"prompt_string":"a"}}`, `{"prompt":[1,null]}`, `{"prompt":null,"n_probs":2}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, obj, _ := answer(t, fs.post(t, "/completion", body), body, llamaErrors)
		if status != http.StatusOK {
			return
		}
		l := readLenient(t, body)
		n := DefaultNPredict
		if l.NPredict != nil && *l.NPredict >= 0 {
			n = *l.NPredict
		}
		num := func(o map[string]any, k string) int {
			v, ok := o[k].(float64)
			if !ok || v < 0 || v != float64(int(v)) {
				t.Fatalf("body %q: %s %v", body, k, o[k])
			}
			return int(v)
		}
		raw, ok := obj["tokens"].([]any)
		predicted := num(obj, "tokens_predicted")
		if !ok || predicted > n || !l.ReturnTokens && len(raw) != 0 || l.ReturnTokens && len(raw) != predicted || obj["stop"] != true {
			t.Fatalf("body %q: %d tokens of %d predicted for n_predict %d: %v", body, len(raw), predicted, n, obj)
		}
		ids := make([]int, len(raw))
		for i, v := range raw {
			x, ok := v.(float64)
			if ids[i] = int(x); !ok || !fs.head[ids[i]] {
				t.Fatalf("body %q: drafted %v, which the drafter's head cannot score", body, v)
			}
		}
		switch obj["stop_type"] {
		case "limit":
			if predicted != n {
				t.Fatalf("body %q: %d tokens to the limit %d", body, predicted, n)
			}
		case "eos":
			if l.IgnoreEOS || len(ids) > 0 && !slices.Contains(tokenizer.StopIDs(nil, fs.tok), ids[len(ids)-1]) {
				t.Fatalf("body %q: stop_type eos, tokens %v", body, ids)
			}
			ids = ids[:max(len(ids)-1, 0)]
		default:
			t.Fatalf("body %q: stop_type %v", body, obj["stop_type"])
		}
		if l.ReturnTokens {
			want, err := fs.tok.Decode(ids)
			if err != nil {
				want = "" // ids past the tokenizer's vocabulary
			}
			if obj["content"] != want {
				t.Fatalf("body %q: content %q for %v, the tokenizer's %q", body, obj["content"], ids, want)
			}
		}
		tm, ok := obj["timings"].(map[string]any)
		if !ok || num(tm, "prompt_n")+num(tm, "cache_n") != num(obj, "tokens_evaluated") || num(tm, "cache_n") != num(obj, "tokens_cached") || num(tm, "predicted_n") != predicted || num(obj, "tokens_evaluated") < 1 {
			t.Fatalf("body %q: timings %v in %v", body, obj["timings"], obj)
		}
	})
}

// checkGeneration checks a 200 of /v1/completions or /v1/chat/completions,
// whole or streamed: one choice that ends once, for a reason OpenAI
// defines; its text free of the stop strings asked for; no more tokens
// than max_tokens; usage that adds up.
func (fs *fuzzServer) checkGeneration(t *testing.T, body []byte, obj map[string]any, events []map[string]any, chat bool) {
	t.Helper()
	l := readLenient(t, body)
	max := l.MaxTokens
	if chat && l.MaxCompletionTokens != nil {
		max = l.MaxCompletionTokens
	}
	var text strings.Builder
	var usage map[string]any
	finishes, tokens := 0, 0
	choice := func(c map[string]any) {
		if chat {
			if m, ok := c["message"].(map[string]any); ok {
				s, _ := m["content"].(string)
				text.WriteString(s)
			} else if d, ok := c["delta"].(map[string]any); ok {
				s, _ := d["content"].(string)
				text.WriteString(s)
			} else {
				t.Fatalf("body %q: chat choice %v", body, c)
			}
		} else {
			s, ok := c["text"].(string)
			if !ok {
				t.Fatalf("body %q: choice %v", body, c)
			}
			text.WriteString(s)
		}
		if ids, ok := c["token_ids"].([]any); ok {
			tokens += len(ids)
		}
		switch c["finish_reason"] {
		case nil:
		case "stop", "length":
			finishes++
		default:
			t.Fatalf("body %q: finish_reason %v", body, c["finish_reason"])
		}
	}
	each := func(o map[string]any) {
		if _, isErr := o["error"]; isErr {
			return
		}
		cs, ok := o["choices"].([]any)
		if !ok || len(cs) > 1 {
			t.Fatalf("body %q: choices %v", body, o["choices"])
		}
		for _, c := range cs {
			choice(c.(map[string]any))
		}
		if u, ok := o["usage"].(map[string]any); ok {
			usage = u
		}
	}
	if obj != nil {
		each(obj)
	}
	for _, ev := range events {
		each(ev)
	}
	if len(events) > 0 {
		if _, failed := events[len(events)-1]["error"]; failed {
			return // a stream that failed after it started (a 4xx, checked)
		}
	}
	if finishes != 1 {
		t.Fatalf("body %q: %d choices' ends", body, finishes)
	}
	for _, stop := range l.stops() {
		if strings.Contains(text.String(), stop) {
			t.Fatalf("body %q: text %q holds the stop string %q", body, text.String(), stop)
		}
	}
	if usage == nil {
		if obj != nil {
			t.Fatalf("body %q: no usage", body)
		}
		return
	}
	num := func(k string) int { v, _ := usage[k].(float64); return int(v) }
	p, c := num("prompt_tokens"), num("completion_tokens")
	if p < 1 || c < 0 || num("total_tokens") != p+c || max != nil && c > *max || l.ReturnTokenIDs && tokens != c {
		t.Fatalf("body %q: usage %v (max_tokens %v, %d token ids)", body, usage, max, tokens)
	}
	// A chain's or a tree's: no more accepted than drafted, OpenAI's
	// prediction counts the same.
	details, _ := usage["completion_tokens_details"].(map[string]any)
	drafted, accepted := num("drafted_tokens"), num("accepted_tokens")
	if accepted > drafted || details["accepted_prediction_tokens"] != float64(accepted) ||
		details["rejected_prediction_tokens"] != float64(drafted-accepted) {
		t.Fatalf("body %q: usage %v: drafted and accepted do not add up", body, usage)
	}
}

// FuzzCompletions posts arbitrary bodies to /v1/completions.
func FuzzCompletions(f *testing.F) {
	fs := newFuzzServer(f, false)
	fuzzSeeds(f, `{"model":"target","prompt":"def f(x):","max_tokens":8,"temperature":0,"stop":["\n\n","ret"]}`,
		`{"model":"target","prompt":[1,2,3],"max_tokens":4,"logprobs":2,"return_token_ids":true,"speculative":{"k":3,"p_min":0.1}}`,
		`{"model":"target","prompt":["x = "],"stream":true,"stream_options":{"include_usage":true},"seed":7,"temperature":0.8,"top_p":0.9}`,
		`{"model":"target","prompt":[[9,8]],"max_tokens":3,"speculative":{"k":0},"n":1,"best_of":1,"logit_bias":{}}`,
		`{"prompt":"def f(x):","max_tokens":10,"temperature":0,"speculative":{"k":3,"topk":2,"draft_tokens":6},"return_token_ids":true}`,
		`{"prompt":[5,6],"max_tokens":6,"temperature":0.7,"seed":2,"speculative":{"topk":3,"draft_tokens":0,"p_min":0.05}}`,
		`{"prompt":"a","speculative":{"topk":21,"draft_tokens":65}}`,
		`{"model":"nope","prompt":"a"}`, `{"model":"target","prompt":"a","n":2}`, `{"model":"target","prompt":null}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, obj, events := answer(t, fs.post(t, "/v1/completions", body), body, openAIErrors)
		if status == http.StatusOK {
			fs.checkGeneration(t, body, obj, events, false)
		}
	})
}

// FuzzChatCompletions posts arbitrary bodies to /v1/chat/completions.
func FuzzChatCompletions(f *testing.F) {
	fs := newFuzzServer(f, false)
	fuzzSeeds(f, `{"model":"target","messages":[{"role":"user","content":"hi"}],"max_tokens":6,"temperature":0,"stop":"\n"}`,
		`{"model":"target","messages":[{"role":"developer","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":"def f(x):","name":"u"}],"max_completion_tokens":5,"logprobs":true,"top_logprobs":3,"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"model":"target","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"<think>\nb\n</think>\n\nc"},{"role":"user","content":"d"}],"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true,"response_format":{"type":"text"}}`,
		`{"model":"target","messages":[{"role":"user","content":"x"}],"tools":[],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"speculative":{"k":4,"topk":4,"draft_tokens":16}}`,
		`{"model":"target","messages":[{"role":"user","content":null}]}`, `{"model":"target","messages":[]}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		status, obj, events := answer(t, fs.post(t, "/v1/chat/completions", body), body, openAIErrors)
		if status == http.StatusOK {
			fs.checkGeneration(t, body, obj, events, true)
		}
	})
}

// FuzzWebsocket sends arbitrary messages on the live page's websocket,
// one connection a fuzzing process. After each it sends a stop and a
// message of its own that the session must refuse; until that refusal
// comes, every message the server sends must be a JSON object of a type
// the page knows, an error's message clipped. So the session survives
// every message (one past the read limit closes it, as it should: then a
// new one is opened).
func FuzzWebsocket(f *testing.F) {
	fs := newFuzzServer(f, true)
	url := "ws" + strings.TrimPrefix(fs.url, "http") + "/ws"
	fuzzSeeds(f, `{"type":"start","prompt":"def f(x):","k":3,"max_tokens":8}`,
		`{"type":"start","prompt":"hi","chat":true,"k":2,"max_tokens":4,"temperature":0.7,"top_p":0.9,"seed":3,"race":true}`,
		`{"type":"stop"}`, `{"type":"dance"}`, `nope`, `{"type":"start","prompt":"x","K":3,"k":2,"max_tokens":5}`,
		`{"type":"start","prompt":"x","k":2,"max_tokens":5,"seed":null}`,
		`{"type":"start","prompt":"x","k":2,"max_tokens":3,"edge":true}`, `{"type":"draft","id":1,"tokens":[1,2],"draft_ms":3}`,
		`{"type":"draft","id":1,"tokens":[1],"draft_ms":null}`, `{"type":"draft","id":1,"error":"no GPU"}`, `{"type":"draft","tokens":[-1]}`)
	var conn *websocket.Conn
	dial := func(t *testing.T) {
		c, resp, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, resp)
		}
		conn = c
		if m := wsNext(t, conn, nil); m["type"] != "hello" {
			t.Fatalf("first message %v", m)
		}
	}
	f.Cleanup(func() {
		if conn != nil {
			conn.Close()
		}
	})
	n := 0
	f.Fuzz(func(t *testing.T, msg []byte) {
		if conn == nil {
			dial(t)
		}
		if len(msg) > wsReadLimit { // refused by closing the connection
			_ = conn.WriteMessage(websocket.TextMessage, msg) // the server may close before it has all
			for wsNext(t, conn, msg) != nil {
			}
			conn.Close()
			conn = nil
			return
		}
		n++
		mark := fmt.Sprintf("fuzz-sync-%d", n)
		for _, m := range [][]byte{msg, []byte(`{"type":"stop"}`), []byte(`{"type":"` + mark + `"}`)} {
			if err := conn.WriteMessage(websocket.TextMessage, m); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
		for {
			m := wsNext(t, conn, msg)
			if m == nil {
				t.Fatalf("message %q: the session closed", msg)
			}
			if m["type"] == "error" && strings.Contains(m["message"].(string), mark) {
				return
			}
		}
	})
}

// wsNext reads the session's next message and checks it; nil when the
// server closed the connection for a message past the read limit.
func wsNext(t *testing.T, c *websocket.Conn, sent []byte) map[string]any {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(fuzzAnswerWait)); err != nil {
		t.Fatal(err)
	}
	_, data, err := c.ReadMessage()
	if err != nil {
		if websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
			return nil
		}
		t.Fatalf("after %q: read: %v", sent, err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("after %q: message %q is not a JSON object: %v", sent, data, err)
	}
	typ, _ := m["type"].(string)
	if !slices.Contains([]string{"hello", "error", "warming", "start", "step", "done", "stopped", "finished", "race", "draft_request"}, typ) {
		t.Fatalf("after %q: message %q", sent, data)
	}
	if typ == "error" {
		if msg, ok := m["message"].(string); !ok || msg == "" || len(msg) > fuzzMessageBytes {
			t.Fatalf("after %q: error %.2000q", sent, m["message"])
		}
	}
	return m
}
