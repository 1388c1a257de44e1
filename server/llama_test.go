package server

import (
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

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/tokenizer"
)

// llamaFixture serves the untied golden model (vocab 1024, 512 positions)
// as a drafter alone, on the CPU engine with the embedded tokenizer: what
// a llama-server with --spec-type draft-remote calls. stop, when set, are
// the drafter's end tokens.
type llamaFixture struct {
	url string
	eng engine.Engine
	tok *tokenizer.Tokenizer
	key string
}

func newLlamaFixture(t *testing.T, apiKey string, stop []int) *llamaFixture {
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
	eng, err := cpu.New(m.Config, m.Weights, cpu.Options{KVBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	srv := New(slog.New(slog.NewTextHandler(io.Discard, nil)), apiKey)
	ts := httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Run(ctx, Config{Drafter: Model{Name: "untied", Engine: eng, Tokenizer: tok, Stop: stop}}); err != nil && ctx.Err() == nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { ts.Close(); cancel(); <-done })
	waitReady(t, ts.URL)
	return &llamaFixture{url: ts.URL, eng: eng, tok: tok, key: apiKey}
}

// post sends body to path and returns the status and the raw answer.
func (f *llamaFixture) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if f.key != "" {
		req.Header.Set("Authorization", "Bearer "+f.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// completion posts body to /completion and decodes a 200.
func (f *llamaFixture) completion(t *testing.T, body string) llamaAnswer {
	t.Helper()
	code, b := f.post(t, "/completion", body)
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", body, code, b)
	}
	var a llamaAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s: %v: %s", body, err, b)
	}
	return a
}

// greedy is the drafter's own greedy continuation of prompt, n tokens.
func (f *llamaFixture) greedy(t *testing.T, prompt []int, n int) []int {
	t.Helper()
	seq, err := f.eng.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	out, err := engine.Draft(context.Background(), f.eng, seq, prompt, n)
	if err != nil {
		t.Fatal(err)
	}
	return engine.IDs(out)
}

// llamaAnswer is /completion's answer as llama.cpp's client reads it
// (nlohmann::json: tokens as llama_token, int32), with the rest of the
// fields checked here.
type llamaAnswer struct {
	Content            string             `json:"content"`
	Tokens             []int32            `json:"tokens"`
	Stop               bool               `json:"stop"`
	StopType           string             `json:"stop_type"`
	Model              string             `json:"model"`
	TokensPredicted    int                `json:"tokens_predicted"`
	TokensEvaluated    int                `json:"tokens_evaluated"`
	TokensCached       int                `json:"tokens_cached"`
	GenerationSettings map[string]any     `json:"generation_settings"`
	Timings            map[string]float64 `json:"timings"`
}

func ids32(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

func idsJSON(ids []int) string {
	b, err := json.Marshal(ids)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestLlamaRemoteDraft drives /completion as llama.cpp's remote drafter
// does (ggml-org/llama.cpp PR #25818, --spec-type draft-remote
// --spec-draft-model-url URL): its description says the client reuses
// llama-server's /completion, sends the target's token history (at most
// --spec-draft-context-limit tokens, 8192 by default) and asks for
// --spec-draft-n-max draft tokens (default 3). The body below is that: a
// token-id prompt, n_predict 3, the draft's ids asked for (return_tokens:
// llama-server returns them only when asked), the prompt cached, greedy.
// The client reads the ids from "tokens". Each round the target accepts
// part of the draft and adds its own token; the next request extends the
// last, and the prefix cache serves the shared part.
func TestLlamaRemoteDraft(t *testing.T) {
	f := newLlamaFixture(t, "", nil)
	history := []int{785, 397, 138, 5, 6, 7, 8, 9, 10, 11}
	const nMax = 3
	for round := range 4 {
		body := fmt.Sprintf(`{"prompt":%s,"n_predict":%d,"cache_prompt":true,"return_tokens":true,"temperature":0,"top_k":1,"samplers":["top_k"],"stream":false}`, idsJSON(history), nMax)
		a := f.completion(t, body)
		want := f.greedy(t, history, nMax)
		if got := ids32(a.Tokens); !slices.Equal(got, want) {
			t.Fatalf("round %d: tokens %v, the drafter's greedy %v", round, got, want)
		}
		text, err := f.tok.Decode(want)
		if err != nil {
			t.Fatal(err)
		}
		if a.Content != text || !a.Stop || a.StopType != "limit" || a.TokensPredicted != nMax || a.TokensEvaluated != len(history) || a.Model != "untied" {
			t.Errorf("round %d: %+v", round, a)
		}
		tm := a.Timings
		if tm["predicted_n"] != nMax || int(tm["prompt_n"]+tm["cache_n"]) != len(history) || int(tm["cache_n"]) != a.TokensCached {
			t.Errorf("round %d: timings %v, tokens_cached %d", round, tm, a.TokensCached)
		}
		for _, k := range []string{"prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"} {
			if v, ok := tm[k]; !ok || v < 0 {
				t.Errorf("round %d: timings' %s %v", round, k, v)
			}
		}
		if round > 0 && a.TokensCached == 0 {
			t.Errorf("round %d: nothing reused from the cache (%+v)", round, a)
		}
		// The target keeps the first draft token and corrects the next.
		history = append(history, want[0], (want[1]+1)%1024)
	}
}

// TestLlamaPrompt: the prompt's forms llama-server takes — text, ids, an
// array mixing both, one prompt in an array — draft what the same ids do;
// several prompts, objects and bad elements are refused naming the field.
func TestLlamaPrompt(t *testing.T) {
	f := newLlamaFixture(t, "", nil)
	a, b := f.tok.Encode("a"), f.tok.Encode(" b")
	ids := append(append(append([]int{5, 6}, a...), b...), 7)
	want := f.greedy(t, ids, 4)
	for _, prompt := range []string{
		idsJSON(ids),
		`[5,6,"a"," b",7]`,
		`[[5,6,"a"," b",7]]`,
		`[5,"",6,"a"," b",7]`,
	} {
		got := f.completion(t, `{"prompt":`+prompt+`,"n_predict":4,"return_tokens":true}`)
		if !slices.Equal(ids32(got.Tokens), want) || got.TokensEvaluated != len(ids) {
			t.Errorf("prompt %s: %v (%d evaluated), want %v (%d)", prompt, got.Tokens, got.TokensEvaluated, want, len(ids))
		}
	}
	text := f.completion(t, `{"prompt":"a","n_predict":2,"return_tokens":true}`)
	if !slices.Equal(ids32(text.Tokens), f.greedy(t, a, 2)) {
		t.Errorf("text prompt: %v", text.Tokens)
	}
	one := f.completion(t, `{"prompt":["a"],"n_predict":2,"return_tokens":true}`)
	if !slices.Equal(one.Tokens, text.Tokens) {
		t.Errorf(`["a"]: %v, "a": %v`, one.Tokens, text.Tokens)
	}
	for _, c := range []struct{ prompt, field string }{
		{`["a","b"]`, "prompt"},
		{`[[1,2],[3]]`, "prompt"},
		{`[[1],"a"]`, "prompt"},
		{`{"prompt_string":"a"}`, "prompt"},
		{`[1,{"a":1}]`, "prompt[1]"},
		{`[1,2.5]`, "prompt[1]"},
		{`[1,null]`, "prompt[1]"},
		{`[1,1024]`, "prompt[1]"},
		{`[]`, "prompt"},
		{`""`, "prompt"},
		{`"hello world"`, "prompt"}, // ids past the golden model's 1024
		{`true`, "prompt"},
		{`null`, "prompt"},
	} {
		llamaRefused(t, f, `{"prompt":`+c.prompt+`}`, 400, c.field)
	}
	llamaRefused(t, f, `{"n_predict":3}`, 400, "prompt")
	llamaRefused(t, f, `{"prompt":[`+strings.Repeat("1,", 512)+`1]}`, 413, "prompt")
	llamaRefused(t, f, `{"prompt":[`+strings.Repeat("1,", 505)+`1],"n_predict":16}`, 413, "")
}

// llamaRefused posts body to /completion and checks the answer: status,
// llama-server's error shape, a message naming field.
func llamaRefused(t *testing.T, f *llamaFixture, body string, status int, field string) {
	t.Helper()
	code, b := f.post(t, "/completion", body)
	var out map[string]map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Errorf("%s: %d %s: %v", body, code, b, err)
		return
	}
	e := out["error"]
	msg, _ := e["message"].(string)
	typ, _ := e["type"].(string)
	wantType := "invalid_request_error"
	if status == 413 && !strings.Contains(msg, "body") {
		wantType = "exceed_context_size_error"
	}
	if code != status || len(out) != 1 || len(e) != 3 || e["code"] != float64(status) || typ != wantType || !strings.HasPrefix(msg, field) {
		t.Errorf("%.200s: %d %s; want %d %s naming %q", body, code, b, status, wantType, field)
	}
}

// TestLlamaFields: n_predict, the greedy rule, and the fields accepted,
// ignored or refused.
func TestLlamaFields(t *testing.T) {
	f := newLlamaFixture(t, "", nil)
	prompt := `"prompt":[5,6,7,8]`
	if a := f.completion(t, `{`+prompt+`}`); a.TokensPredicted != DefaultNPredict || len(a.Tokens) != 0 || a.StopType != "limit" {
		t.Errorf("defaults: %+v (want %d tokens predicted, none returned)", a, DefaultNPredict)
	}
	if a := f.completion(t, `{`+prompt+`,"n_predict":-1,"return_tokens":true}`); len(a.Tokens) != DefaultNPredict {
		t.Errorf("n_predict -1: %d tokens", len(a.Tokens))
	}
	if a := f.completion(t, `{`+prompt+`,"n_predict":64,"return_tokens":true}`); len(a.Tokens) != MaxN {
		t.Errorf("n_predict 64: %d tokens", len(a.Tokens))
	}
	// n_predict 0 drafts nothing but leaves the prompt in the cache.
	zero := f.completion(t, `{"prompt":[9,10,11,12,13],"n_predict":0,"return_tokens":true}`)
	if len(zero.Tokens) != 0 || zero.TokensPredicted != 0 || zero.Content != "" || zero.TokensEvaluated != 5 || zero.Timings["predicted_n"] != 0 {
		t.Errorf("n_predict 0: %+v", zero)
	}
	if again := f.completion(t, `{"prompt":[9,10,11,12,13,14],"n_predict":1}`); again.TokensCached != 5 {
		t.Errorf("after n_predict 0, %d tokens cached; want 5", again.TokensCached)
	}
	for _, extra := range []string{
		`"temperature":0`, `"temperature":-1`, `"temperature":0.8,"top_k":1`, `"temperature":0.8,"top_k":1,"samplers":"kt"`,
		`"top_k":40`, `"cache_prompt":false`, `"stream":false`, `"top_p":0.9,"min_p":0.1,"seed":7,"id_slot":-1,"n_keep":-1,"typical_p":1`,
		`"samplers":["top_k","temperature"]`, `"timings_per_token":true,"t_max_predict_ms":500,"n_cache_reuse":0,"model":"x"`,
		`"n_probs":0,"stop":[],"repeat_penalty":1,"presence_penalty":0,"logit_bias":[],"grammar":"","n_cmpl":1,"response_fields":[]`,
		`"temperature":null,"top_k":null`,
	} {
		if code, b := f.post(t, "/completion", `{`+prompt+`,"n_predict":2,`+extra+`}`); code != 200 {
			t.Errorf("%s: %d %s", extra, code, b)
		}
	}
	for _, c := range []struct{ extra, field string }{
		{`"n_predict":65`, "n_predict"},
		{`"n_predict":-2`, "n_predict"},
		{`"n_predict":"3"`, "n_predict"},
		{`"stream":true`, "stream"},
		{`"temperature":0.8`, "temperature"},
		{`"temperature":0.8,"top_k":40`, "temperature"},
		{`"temperature":0.8,"top_k":1,"samplers":["temperature"]`, "temperature"},
		{`"samplers":7`, "samplers"},
		{`"n_probs":5`, "n_probs"},
		{`"stop":["\n"]`, "stop"},
		{`"repeat_penalty":1.1`, "repeat_penalty"},
		{`"frequency_penalty":0.5`, "frequency_penalty"},
		{`"mirostat":2`, "mirostat"},
		{`"grammar":"root ::= \"a\""`, "grammar"},
		{`"json_schema":{}`, "json_schema"},
		{`"logit_bias":[[5,false]]`, "logit_bias"},
		{`"n_cmpl":2`, "n_cmpl"},
		{`"response_fields":["content"]`, "response_fields"},
		{`"lora":[{"id":0,"scale":1}]`, "lora"},
		{`"frobnicate":1`, "frobnicate"},
		// llama-server's own speculation's: /completion is the drafter's
		// (speculation's settings are /v1/*'s speculative object).
		{`"speculative.n_max":8`, "speculative.n_max"},
		{`"Prompt":[1]`, "Prompt"},
	} {
		llamaRefused(t, f, `{`+prompt+`,`+c.extra+`}`, 400, c.field)
	}
}

// TestLlamaEOS: an end token ends the draft; it is in tokens, its text is
// not in content, and stop_type is eos; ignore_eos drafts past it.
func TestLlamaEOS(t *testing.T) {
	probe := newLlamaFixture(t, "", nil)
	prompt := []int{5, 6, 7, 8}
	want := probe.greedy(t, prompt, 6)
	end := want[2]
	f := newLlamaFixture(t, "", []int{end})
	cut := slices.Index(want, end)
	a := f.completion(t, `{"prompt":`+idsJSON(prompt)+`,"n_predict":6,"return_tokens":true}`)
	text, err := f.tok.Decode(want[:cut])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids32(a.Tokens), want[:cut+1]) || a.Content != text || a.StopType != "eos" || a.TokensPredicted != cut+1 {
		t.Errorf("end token %d: %+v; want tokens %v, content %q, eos", end, a, want[:cut+1], text)
	}
	b := f.completion(t, `{"prompt":`+idsJSON(prompt)+`,"n_predict":6,"return_tokens":true,"ignore_eos":true}`)
	if !slices.Equal(ids32(b.Tokens), want) || b.StopType != "limit" {
		t.Errorf("ignore_eos: %+v; want %v", b, want)
	}
}

// TestLlamaRoute: every error on /completion — method, key, media type,
// body — has llama-server's shape.
func TestLlamaRoute(t *testing.T) {
	f := newLlamaFixture(t, testKey, nil)
	get, err := http.NewRequest("GET", f.url+"/completion", nil)
	if err != nil {
		t.Fatal(err)
	}
	get.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(get)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 405 || !strings.Contains(string(b), `"code":405`) || !strings.Contains(string(b), `"type":"invalid_request_error"`) || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /completion: %d %s", resp.StatusCode, b)
	}
	noKey := *f
	noKey.key = ""
	if code, b := noKey.post(t, "/completion", `{"prompt":[1]}`); code != 401 || !strings.Contains(string(b), `"type":"authentication_error"`) || !strings.Contains(string(b), `"code":401`) {
		t.Errorf("no key: %d %s", code, b)
	}
	req, err := http.NewRequest("POST", f.url+"/completion", strings.NewReader(`{"prompt":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "text/plain")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 415 || !strings.Contains(string(b), `"code":415`) {
		t.Errorf("text/plain: %d %s", resp.StatusCode, b)
	}
	llamaRefused(t, f, `{"prompt":[1]`, 400, "body")
	llamaRefused(t, f, `{"prompt":[1]} {}`, 400, "body")
	llamaRefused(t, f, `{"prompt":[1],"prompt":[2]}`, 400, "prompt")
	llamaRefused(t, f, `{"prompt":[`+strings.Repeat("1,", MaxBodyBytes/2)+`1]}`, 413, "body")
	// The server goes on.
	if a := f.completion(t, `{"prompt":[1,2,3],"n_predict":2}`); a.TokensPredicted != 2 {
		t.Errorf("after the errors: %+v", a)
	}
}
