package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/scheduler"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/weights"
)

// pairFixture serves the embedded pair on CPU engines: the drafter for
// /draft and drafting, the target verifying.
type pairFixture struct {
	url             string
	drafter, target engine.Engine
	head            *checkpoint.Eagle3 // newHeadFixture's head
	tok             *tokenizer.Tokenizer
	srv             *Server
	modelDownloads  atomic.Int64 // model files sent (countModelFiles)
	log             *slog.Logger // start's server logs here (nil: nowhere)
}

const testKey = "sk-test"

var (
	pairOnce                sync.Once
	pairDrafter, pairTarget *checkpoint.Model
	pairErr                 error
)

func newPairFixture(t *testing.T, apiKey string) *pairFixture {
	t.Helper()
	return newPairFixtureOptions(t, Options{APIKey: apiKey})
}

// newPairFixtureOptions is newPairFixture with the server's options.
func newPairFixtureOptions(t *testing.T, opts Options) *pairFixture {
	t.Helper()
	f := newPairEngines(t, nil)
	f.serve(t, opts, nil)
	return f
}

// loadPair loads the embedded pair once for every test.
func loadPair(t *testing.T) {
	t.Helper()
	if !weights.Embedded() {
		t.Skip("built without the embedded pair")
	}
	pairOnce.Do(func() {
		if pairDrafter, pairErr = checkpoint.LoadFS(weights.FS(), weights.DrafterDir, checkpoint.LoadOptions{}); pairErr == nil {
			pairTarget, pairErr = checkpoint.LoadFS(weights.FS(), weights.TargetDir, checkpoint.LoadOptions{})
		}
	})
	if pairErr != nil {
		t.Fatal(pairErr)
	}
}

// newPairEngines is a fixture of the embedded pair on the fast CPU
// engine, as `serve` runs it without a GPU, the target keeping the
// features of the layers features lists (an EAGLE-3 head's); not served
// yet (serve).
func newPairEngines(t *testing.T, features []int) *pairFixture {
	t.Helper()
	loadPair(t)
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	d, err := cpu.New(pairDrafter.Config, pairDrafter.Weights, cpu.Options{KVBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	tg, err := cpu.New(pairTarget.Config, pairTarget.Weights, cpu.Options{KVBytes: 64 << 20, FeatureLayers: features})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	return &pairFixture{drafter: d, target: tg, tok: tok}
}

// serve starts a server with opts running the fixture's pair (the
// embedded pair's files for the page) and, where head is set, drafting
// the generations with it; it returns once the server is ready.
func (f *pairFixture) serve(t *testing.T, opts Options, head *Model) {
	t.Helper()
	f.start(t, opts, func(c *Config) { c.Head = head })
	waitReady(t, f.url)
}

// start starts a server with opts running the fixture's pair as serve
// does, its Config as config leaves it (nil: as it is), and returns at
// once.
func (f *pairFixture) start(t *testing.T, opts Options, config func(*Config)) {
	t.Helper()
	log := f.log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f.srv = NewWithOptions(log, opts)
	ts := httptest.NewServer(f.countModelFiles(f.srv.Handler()))
	f.url = ts.URL
	c := Config{
		Drafter:     Model{Name: "drafter", Engine: f.drafter, Tokenizer: f.tok, Files: &ModelFiles{FS: weights.FS(), Dir: weights.DrafterDir}},
		Target:      &Model{Name: "target", Engine: f.target, Tokenizer: f.tok, Files: &ModelFiles{FS: weights.FS(), Dir: weights.TargetDir}},
		Scheduler:   scheduler.Options{},
		Speculative: speculative.Options{K: 4},
	}
	if config != nil {
		config(&c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		f.srv.Run(ctx, c)
		close(done)
	}()
	t.Cleanup(func() { ts.Close(); cancel(); <-done })
}

// greedyText is the target's own greedy continuation of prompt: its ids
// (up to a stop token) and their text.
func (f *pairFixture) greedy(t *testing.T, prompt []int, n int) ([]int, string) {
	t.Helper()
	seq, err := f.target.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	out, err := engine.Draft(context.Background(), f.target, seq, prompt, n)
	if err != nil {
		t.Fatal(err)
	}
	ids := engine.IDs(out)
	for i, id := range ids {
		if slices.Contains(tokenizer.StopIDs(nil, f.tok), id) {
			ids = ids[:i]
			break
		}
	}
	text, err := f.tok.Decode(ids)
	if err != nil {
		t.Fatal(err)
	}
	return ids, text
}

func (f *pairFixture) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(f.url+"/v1"), option.WithAPIKey(testKey), option.WithMaxRetries(0))
}

// TestOpenAIClient: the official Go client, unchanged, against the chat
// and completions endpoints, streaming and not. Greedy output is the
// target's own; usage carries the speculative counts.
func TestOpenAIClient(t *testing.T) {
	f := newPairFixture(t, testKey)
	c := f.client()
	ctx := context.Background()
	msgs := []tokenizer.Message{{Role: "user", Content: "def quicksort(xs):"}}
	chat, err := f.tok.ApplyChatTemplate(msgs, true, true)
	if err != nil {
		t.Fatal(err)
	}
	const n = 24
	_, wantChat := f.greedy(t, f.tok.Encode(chat), n)

	params := openai.ChatCompletionNewParams{
		Model:     "target",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("def quicksort(xs):")},
		MaxTokens: openai.Int(n), Temperature: openai.Float(0),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != wantChat {
		t.Errorf("chat: %q, the target alone %q", got, wantChat)
	}
	var extra struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(resp.RawJSON()), &extra); err != nil {
		t.Fatal(err)
	}
	u := extra.Usage
	if u.CompletionTokens == 0 || u.VerificationSteps == 0 || u.AcceptedTokens > u.DraftedTokens || u.MeanAcceptanceLength < 1 ||
		resp.Usage.PromptTokens != int64(len(f.tok.Encode(chat))) {
		t.Errorf("usage %+v", u)
	}

	// Streaming, with usage in a last chunk.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	chunks, usageChunks := 0, 0
	finish := ""
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if len(ch.Choices) == 0 {
			usageChunks++
			if ch.Usage.CompletionTokens == 0 {
				t.Errorf("usage chunk %s", ch.RawJSON())
			}
			continue
		}
		text.WriteString(ch.Choices[0].Delta.Content)
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != wantChat || usageChunks != 1 || chunks < 3 || finish == "" {
		t.Errorf("streamed %q in %d chunks (%d with usage, finish %q); want %q", text.String(), chunks, usageChunks, finish, wantChat)
	}

	// Completions: text in, text out, the same continuation as the target.
	prompt := "def fib(n):\n"
	_, want := f.greedy(t, f.tok.Encode(prompt), n)
	cresp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model: "target", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(n), Temperature: openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := cresp.Choices[0].Text; got != want {
		t.Errorf("completion: %q, the target alone %q", got, want)
	}
	cstream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: "target", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(n), Temperature: openai.Float(0),
	})
	text.Reset()
	for cstream.Next() {
		if ch := cstream.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
	}
	if err := cstream.Err(); err != nil || text.String() != want {
		t.Errorf("streamed completion %q (%v), want %q", text.String(), err, want)
	}

	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 2 || models.Data[0].ID != "target" || models.Data[1].ID != "drafter" {
		t.Errorf("models %+v, %v", models, err)
	}

	// An API error comes back as the client's error type.
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope", Messages: params.Messages})
	var apiErr *openai.Error
	if !errorAs(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: %v", err)
	}
	wrong := openai.NewClient(option.WithBaseURL(f.url+"/v1"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	_, err = wrong.Models.List(ctx)
	if !errorAs(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Errorf("wrong key: %v", err)
	}
}

// errorAs is errors.As for the client's error.
func errorAs(err error, target **openai.Error) bool {
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

// postJSON posts body with the test key and returns the status and body.
func (f *pairFixture) postJSON(t *testing.T, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", f.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: %v", path, body, err)
	}
	return resp.StatusCode, out
}

// TestOpenAIFields: token ids in and out, logprobs, stop strings, the
// target alone, and what comes back for each.
func TestOpenAIFields(t *testing.T) {
	f := newPairFixture(t, testKey)
	prompt := f.tok.Encode("import numpy as np\n")
	wantIDs, wantText := f.greedy(t, prompt, 12)
	body := func(extra string) string {
		b, _ := json.Marshal(prompt)
		return `{"model":"target","prompt":` + string(b) + `,"max_tokens":12,"temperature":0` + extra + `}`
	}
	for _, k := range []string{`,"speculative":{"k":0}`, `,"speculative":{"k":7}`, ``} {
		code, out := f.postJSON(t, "/v1/completions", body(`,"return_token_ids":true,"logprobs":2`+k))
		if code != 200 {
			t.Fatalf("%s: %d %v", k, code, out)
		}
		ch := out["choices"].([]any)[0].(map[string]any)
		if got := ints(ch["token_ids"]); !slices.Equal(got, wantIDs) || ch["text"] != wantText {
			t.Errorf("%s: ids %v %q, want %v %q", k, got, ch["text"], wantIDs, wantText)
		}
		if !slices.Equal(ints(out["prompt_token_ids"]), prompt) {
			t.Errorf("prompt_token_ids %v", out["prompt_token_ids"])
		}
		lp := ch["logprobs"].(map[string]any)
		if n := len(lp["token_logprobs"].([]any)); n != len(wantIDs) || len(lp["top_logprobs"].([]any)[0].(map[string]any)) != 2 {
			t.Errorf("logprobs %v", lp)
		}
		u := out["usage"].(map[string]any)
		if k == `,"speculative":{"k":0}` && (u["drafted_tokens"].(float64) != 0 || u["mean_acceptance_length"].(float64) != 1) {
			t.Errorf("the target alone: usage %v", u)
		}
	}
	// A stop string cuts the text before it.
	if len(wantText) > 6 {
		stop := wantText[3:6]
		code, out := f.postJSON(t, "/v1/completions", body(`,"stop":`+jsonString(stop)))
		ch := out["choices"].([]any)[0].(map[string]any)
		if code != 200 || ch["text"] != wantText[:strings.Index(wantText, stop)] || ch["finish_reason"] != "stop" {
			t.Errorf("stop %q: %d %q (%v), want %q", stop, code, ch["text"], ch["finish_reason"], wantText[:strings.Index(wantText, stop)])
		}
	}
	// Chat logprobs: each token with its bytes and top alternatives.
	code, out := f.postJSON(t, "/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"logprobs":true,"top_logprobs":3,"seed":4}`)
	if code != 200 {
		t.Fatalf("chat logprobs: %d %v", code, out)
	}
	content := out["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["content"].([]any)
	for _, c := range content {
		c := c.(map[string]any)
		if c["logprob"].(float64) > 0 || len(c["top_logprobs"].([]any)) != 3 || c["bytes"] == nil {
			t.Errorf("chat logprob %v", c)
		}
	}
	// The same seed samples the same text.
	a, b := chatText(t, f, `"seed":11,"temperature":1.2`), chatText(t, f, `"seed":11,"temperature":1.2`)
	if a != b {
		t.Errorf("seed 11 twice: %q, then %q", a, b)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func chatText(t *testing.T, f *pairFixture, extra string) string {
	code, out := f.postJSON(t, "/v1/chat/completions", `{"model":"target","messages":[{"role":"user","content":"Write a poem"}],"max_tokens":20,`+extra+`}`)
	if code != 200 {
		t.Fatalf("%d %v", code, out)
	}
	return out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
}

// TestOpenAIErrors: what OpenAI's API defines but webdraft does not
// implement, and what no one defines, gets a 400 in OpenAI's error shape
// naming the field.
func TestOpenAIErrors(t *testing.T) {
	f := newPairFixture(t, testKey)
	chat := `"model":"target","messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{` + chat + `,"n":2}`, "n"},
		{"/v1/chat/completions", `{` + chat + `,"frobnicate":1}`, "frobnicate"},
		{"/v1/chat/completions", `{` + chat + `,"temperature":3}`, "temperature"},
		{"/v1/chat/completions", `{` + chat + `,"top_p":0}`, "top_p"},
		{"/v1/chat/completions", `{` + chat + `,"top_logprobs":3}`, "top_logprobs"},
		{"/v1/chat/completions", `{` + chat + `,"max_tokens":0}`, "max_tokens"},
		{"/v1/chat/completions", `{` + chat + `,"max_tokens":100000}`, "max_tokens"},
		{"/v1/chat/completions", `{` + chat + `,"stop":["a","b","c","d","e"]}`, "stop"},
		{"/v1/chat/completions", `{` + chat + `,"speculative":{"k":65}}`, "speculative.k"},
		{"/v1/chat/completions", `{` + chat + `,"speculative":{"topk":21}}`, "speculative.topk"},
		{"/v1/chat/completions", `{` + chat + `,"speculative":{"topk":-1}}`, "speculative.topk"},
		{"/v1/completions", `{"prompt":"x","speculative":{"topk":"2"}}`, "speculative.topk"},
		{"/v1/chat/completions", `{` + chat + `,"speculative":{"k":4,"topk":2,"draft_tokens":65}}`, "speculative.draft_tokens"},
		{"/v1/completions", `{"prompt":"x","speculative":{"draft_tokens":-1}}`, "speculative.draft_tokens"},
		{"/v1/completions", `{"prompt":"x","speculative":{"draft_tokens":2.5}}`, "speculative.draft_tokens"},
		{"/v1/completions", `{"prompt":"x","speculative":{"num_draft_tokens":8}}`, "speculative.num_draft_tokens"},
		{"/v1/chat/completions", `{` + chat + `,"tools":[{"type":"function"}]}`, "tools"},
		{"/v1/chat/completions", `{` + chat + `,"stream_options":{"include_usage":true}}`, "stream_options"},
		{"/v1/chat/completions", `{"model":"target","messages":[{"role":"wizard","content":"hi"}]}`, "messages[0].role"},
		{"/v1/chat/completions", `{"model":"target","messages":[]}`, "messages"},
		{"/v1/chat/completions", `{` + chat + `,"temperature":"hot"}`, "temperature"},
		{"/v1/completions", `{"model":"target","prompt":["a","b"]}`, "prompt"},
		{"/v1/completions", `{"model":"target","prompt":[1,2,999999]}`, "prompt[2]"},
		{"/v1/completions", `{"model":"target","prompt":"x","echo":true}`, "echo"},
		{"/v1/completions", `{"model":"target","prompt":"x","logprobs":6}`, "logprobs"},
		{"/v1/completions", `{"model":"target"}`, "prompt"},
		{"/v1/completions", `{"model":"target","prompt":"x"} trailing`, "body"},
	} {
		code, out := f.postJSON(t, c.path, c.body)
		e, _ := out["error"].(map[string]any)
		if code != 400 || e == nil || e["param"] != c.param || e["type"] != "invalid_request_error" || e["message"] == "" {
			t.Errorf("%s %s: %d %v, want a 400 naming %q", c.path, c.body, code, out, c.param)
		}
	}
	// The server goes on.
	if code, out := f.postJSON(t, "/v1/completions", `{"model":"target","prompt":"x","max_tokens":2}`); code != 200 {
		t.Errorf("after the errors: %d %v", code, out)
	}
}

// TestOpenAITrees: speculative.topk and draft_tokens draft token trees,
// and greedy output stays the target's own, token for token, as with a
// chain; usage, metrics.speculative_decoding and /metrics count a tree's
// verified nodes as drafted and its accepted path by depth (position j:
// depth j+1), the per-position counts summing to the accepted tokens; a
// sampled tree's seed repeats its output, the target alone's for the seed.
func TestOpenAITrees(t *testing.T) {
	f := newPairFixtureOptions(t, Options{SpecMetrics: SpecMetricsDetailed})
	prompt := f.tok.Encode("import numpy as np\n")
	const n = 16
	wantIDs, wantText := f.greedy(t, prompt, n)
	promptJSON, _ := json.Marshal(prompt)
	var drafted, accepted float64
	perPos := map[int]int{}
	for _, c := range []struct {
		spec string
		k    int  // the depth the request runs at (the fixture's default 4)
		tree bool // more nodes verified than the depth, some step
	}{
		{`{"k":4,"topk":2,"draft_tokens":8}`, 4, true},
		{`{"topk":4,"draft_tokens":16}`, 4, true},
		{`{"k":6,"topk":3}`, 6, true},                            // the default 16 nodes
		{`{"k":3,"topk":2,"draft_tokens":0,"p_min":0}`, 3, true}, // 0: the default
		{`{"k":5,"topk":20,"draft_tokens":64}`, 5, true},
		{`{"k":4,"topk":1,"draft_tokens":8}`, 4, false}, // a chain: draft_tokens unused
		{`{"k":4,"topk":0}`, 4, false},                  // the default: a chain
		{`{"k":0,"topk":4,"draft_tokens":8}`, 0, false}, // the target alone
	} {
		code, out := f.postJSON(t, "/v1/completions", `{"prompt":`+string(promptJSON)+`,"max_tokens":16,"temperature":0,"return_token_ids":true,"speculative":`+c.spec+`}`)
		if code != 200 {
			t.Fatalf("%s: %d %v", c.spec, code, out)
		}
		ch := out["choices"].([]any)[0].(map[string]any)
		if got := ints(ch["token_ids"]); !slices.Equal(got, wantIDs) || ch["text"] != wantText {
			t.Errorf("%s: %v %q; the target alone %v %q", c.spec, got, ch["text"], wantIDs, wantText)
		}
		u := out["usage"].(map[string]any)
		d := u["completion_tokens_details"].(map[string]any)
		if u["accepted_tokens"].(float64) > u["drafted_tokens"].(float64) || d["accepted_prediction_tokens"] != u["accepted_tokens"] ||
			d["rejected_prediction_tokens"].(float64) != u["drafted_tokens"].(float64)-u["accepted_tokens"].(float64) {
			t.Errorf("%s: usage %v", c.spec, u)
		}
		m := specMetricsOf(out)
		checkSpecMetrics(t, c.spec, m, u, true, c.k)
		pos, steps := ints(m["num_accepted_tokens_per_pos"]), ints(m["per_step_drafted"])
		if len(pos) != c.k || float64(sum(pos)) != u["accepted_tokens"] || !slices.IsSortedFunc(pos, func(a, b int) int { return b - a }) {
			t.Errorf("%s: num_accepted_tokens_per_pos %v, %v accepted", c.spec, pos, u["accepted_tokens"])
		}
		if most := slices.Max(append(steps, 0)); (most > c.k) != c.tree {
			t.Errorf("%s: per_step_drafted %v at depth %d: a tree %v", c.spec, steps, c.k, c.tree)
		}
		drafted += u["drafted_tokens"].(float64)
		accepted += u["accepted_tokens"].(float64)
		for j, a := range pos {
			perPos[j] += a
		}
	}

	// Sampled trees: the same seed, the same output; counts as greedy ones.
	var sampled []string
	for range 2 {
		code, out := f.postJSON(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":12,"temperature":0.9,"seed":5,"speculative":{"k":3,"topk":2,"draft_tokens":6}}`)
		if code != 200 {
			t.Fatalf("a sampled tree: %d %v", code, out)
		}
		u, m := out["usage"].(map[string]any), specMetricsOf(out)
		checkSpecMetrics(t, "a sampled tree", m, u, true, 3)
		pos := ints(m["num_accepted_tokens_per_pos"])
		if float64(sum(pos)) != u["accepted_tokens"] || slices.Max(append(ints(m["per_step_drafted"]), 0)) > 6 {
			t.Errorf("a sampled tree: %v, usage %v", m, u)
		}
		sampled = append(sampled, out["choices"].([]any)[0].(map[string]any)["text"].(string))
		drafted += u["drafted_tokens"].(float64)
		accepted += u["accepted_tokens"].(float64)
		for j, a := range pos {
			perPos[j] += a
		}
	}
	if sampled[0] != sampled[1] {
		t.Errorf("seed 5 twice: %q, then %q", sampled[0], sampled[1])
	}
	// Keyed by its seed, a sampled tree gives the target alone's tokens.
	if code, out := f.postJSON(t, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":12,"temperature":0.9,"seed":5,"speculative":{"k":0}}`); code != 200 {
		t.Fatalf("the target alone: %d %v", code, out)
	} else if alone := out["choices"].([]any)[0].(map[string]any)["text"].(string); alone != sampled[0] {
		t.Errorf("seed 5: a sampled tree %q, the target alone %q", sampled[0], alone)
	}

	// Streamed chat: the same text with a tree as the target alone's.
	msgs := []tokenizer.Message{{Role: "user", Content: "def quicksort(xs):"}}
	chat, err := f.tok.ApplyChatTemplate(msgs, true, true)
	if err != nil {
		t.Fatal(err)
	}
	_, wantChat := f.greedy(t, f.tok.Encode(chat), 12)
	events := f.streamEvents(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"def quicksort(xs):"}],"max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"speculative":{"topk":2,"draft_tokens":12}}`)
	var text strings.Builder
	for _, ev := range events {
		for _, c := range ev["choices"].([]any) {
			s, _ := c.(map[string]any)["delta"].(map[string]any)["content"].(string)
			text.WriteString(s)
		}
	}
	last := events[len(events)-1]
	u := last["usage"].(map[string]any)
	checkSpecMetrics(t, "streamed chat", specMetricsOf(last), u, true, 4)
	if text.String() != wantChat {
		t.Errorf("streamed chat with a tree: %q, the target alone %q", text.String(), wantChat)
	}
	drafted += u["drafted_tokens"].(float64)
	accepted += u["accepted_tokens"].(float64)
	for j, a := range ints(specMetricsOf(last)["num_accepted_tokens_per_pos"]) {
		perPos[j] += a
	}

	// /metrics counts what the responses did, position by position (the
	// loop records a step once its generations have their answers: wait).
	problems := func() []string {
		var p []string
		for _, c := range []struct {
			name string
			want float64
		}{
			{"webdraft_spec_decode_num_draft_tokens_total", drafted},
			{"webdraft_spec_decode_num_accepted_tokens_total", accepted},
		} {
			if got := f.metric(t, c.name); got != c.want {
				p = append(p, fmt.Sprintf("%s %v, the responses %v", c.name, got, c.want))
			}
		}
		if got := f.metricSum(t, "webdraft_spec_decode_num_accepted_tokens_per_pos_total"); got != accepted {
			p = append(p, fmt.Sprintf("%v accepted tokens by position, %v in all", got, accepted))
		}
		for j, a := range perPos {
			if got := f.metric(t, fmt.Sprintf(`webdraft_spec_decode_num_accepted_tokens_per_pos_total{position="%d"}`, j)); got != float64(a) {
				p = append(p, fmt.Sprintf("position %d accepted %v times, the responses %d", j, got, a))
			}
		}
		return p
	}
	deadline := time.Now().Add(5 * time.Second)
	for p := problems(); len(p) > 0; p = problems() {
		if time.Now().After(deadline) {
			t.Errorf("/metrics: %s", strings.Join(p, "; "))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSSEFormat reads the stream as bytes: data lines, a role first, the
// finish reason, the usage chunk, then data: [DONE].
func TestSSEFormat(t *testing.T) {
	f := newPairFixture(t, testKey)
	req, _ := http.NewRequest("POST", f.url+"/v1/chat/completions", strings.NewReader(
		`{"model":"target","messages":[{"role":"user","content":"hello"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("line %q is not an SSE data line", line)
		}
		events = append(events, strings.TrimPrefix(line, "data: "))
	}
	if len(events) < 4 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %v", events)
	}
	var first, last, usageEv map[string]any
	json.Unmarshal([]byte(events[0]), &first)
	json.Unmarshal([]byte(events[len(events)-3]), &last)
	json.Unmarshal([]byte(events[len(events)-2]), &usageEv)
	delta := first["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
	if delta["role"] != "assistant" || first["prompt_token_ids"] == nil || first["object"] != "chat.completion.chunk" {
		t.Errorf("first chunk %v", first)
	}
	if fr := last["choices"].([]any)[0].(map[string]any)["finish_reason"]; fr != "length" && fr != "stop" {
		t.Errorf("last chunk %v", last)
	}
	if len(usageEv["choices"].([]any)) != 0 || usageEv["usage"].(map[string]any)["verification_steps"].(float64) < 1 {
		t.Errorf("usage chunk %v", usageEv)
	}
	var ids int
	for _, ev := range events[:len(events)-1] {
		var c map[string]any
		json.Unmarshal([]byte(ev), &c)
		for _, ch := range c["choices"].([]any) {
			ids += len(ints(ch.(map[string]any)["token_ids"]))
		}
	}
	if ids != int(usageEv["usage"].(map[string]any)["completion_tokens"].(float64)) {
		t.Errorf("%d token ids streamed, usage says %v", ids, usageEv["usage"])
	}
}

// TestSpecMetrics: after a generation the speculative counters are there
// in vLLM's names, and the exposition passes Prometheus' linter (what
// promtool check metrics runs).
func TestSpecMetrics(t *testing.T) {
	f := newPairFixture(t, "")
	code, out := f.postJSON(t, "/v1/completions", `{"model":"target","prompt":"def quicksort(xs):","max_tokens":16,"temperature":0}`)
	if code != 200 {
		t.Fatalf("%d %v", code, out)
	}
	// The counters say what the answer says (the model may end before 16).
	tokens := out["usage"].(map[string]any)["completion_tokens"].(float64)
	finish := out["choices"].([]any)[0].(map[string]any)["finish_reason"]
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, name := range []string{
		"webdraft_spec_decode_num_drafts_total", "webdraft_spec_decode_num_draft_tokens_total",
		"webdraft_spec_decode_num_accepted_tokens_total", `webdraft_spec_decode_num_accepted_tokens_per_pos_total{position="0"}`,
		fmt.Sprintf("webdraft_generation_tokens_total %g", tokens), fmt.Sprintf(`webdraft_generations_total{endpoint="completions",finish_reason=%q} 1`, finish),
	} {
		if !strings.Contains(text, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestAPIKey: with a key, every route but /health needs it, and the
// answer has the route's error shape.
func TestAPIKey(t *testing.T) {
	f := newPairFixture(t, testKey)
	get := func(path, key string) (int, string) {
		req, _ := http.NewRequest("GET", f.url+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/health", ""); code != 200 {
		t.Errorf("/health without the key: %d", code)
	}
	for _, c := range []struct{ path, key, want string }{
		{"/metrics", "", `"code":"unauthorized"`},
		{"/v1/models", "wrong", `"code":"invalid_api_key"`},
	} {
		if code, body := get(c.path, c.key); code != 401 || !strings.Contains(body, c.want) {
			t.Errorf("%s with key %q: %d %s", c.path, c.key, code, body)
		}
	}
	if code, _ := get("/metrics", testKey); code != 200 {
		t.Errorf("/metrics with the key: %d", code)
	}
	// /draft with p_min 1 cuts the draft to nothing (no probability reaches 1 here).
	code, out := f.postJSON(t, "/draft", `{"tokens":[1,2,3],"n":8,"p_min":1}`)
	if code != 200 || len(out["draft"].([]any)) != 0 {
		t.Errorf("p_min 1: %d %v", code, out)
	}
	if code, out := f.postJSON(t, "/draft", `{"tokens":[1,2,3],"p_min":1.5}`); code != 400 {
		t.Errorf("p_min 1.5: %d %v", code, out)
	}
}

// TestDisconnectFreesGeneration: a client that leaves mid-stream ends its
// generation at the loop's next step, its sequences back at once.
func TestDisconnectFreesGeneration(t *testing.T) {
	f := newPairFixture(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"target","messages":[{"role":"user","content":"Write a long story."}],"max_tokens":400,"temperature":0.7,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil { // the first chunk: it runs
		t.Fatal(err)
	}
	if running := f.metric(t, "webdraft_generations_running"); running != 1 {
		t.Fatalf("generations running while streaming: %v", running)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for f.metric(t, "webdraft_generations_running") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a departed client's generation still runs after 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAdaptiveRequests: with Config.Adaptive, an API generation is
// adaptive (speculative.Request.Adaptive) only where it leaves its draft
// length to the server and, sampled with a seed, is keyed (chains and
// trees: its seed gives the same tokens alone or not; an unkeyed
// generator's is not); without it, none is.
func TestAdaptiveRequests(t *testing.T) {
	seed, k, zero, one := int64(3), 4, 0, 1
	temp := 0.0
	m := goldenDrafter(t, 0)
	gen, err := speculative.New(m.Engine, m.Engine, speculative.Options{K: 3, TopK: 1})
	if err != nil {
		t.Fatal(err)
	}
	unkeyed, err := speculative.New(m.Engine, m.Engine, speculative.Options{K: 3, TopK: 1, Uncoupled: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		server   bool
		f        samplingFields
		adaptive bool
	}{
		{"neither", true, samplingFields{}, true},
		{"a seed", true, samplingFields{Seed: &seed}, true},
		{"a seed, greedy", true, samplingFields{Seed: &seed, Temperature: &temp}, true},
		{"a seed, a tree", true, samplingFields{Seed: &seed, Speculative: &speculativeFields{TopK: &k}}, true}, // keyed: its tokens either way
		{"a seed, a chain", true, samplingFields{Seed: &seed, Speculative: &speculativeFields{TopK: &one}}, true},
		{"k", true, samplingFields{Speculative: &speculativeFields{K: &k}}, false},
		{"k 0", true, samplingFields{Speculative: &speculativeFields{K: &zero}}, false},
		{"a tree's shape only", true, samplingFields{Speculative: &speculativeFields{TopK: &k}}, true},
		{"off", false, samplingFields{}, false},
	} {
		st := &state{target: &Model{Name: "target"}, adaptive: c.server, gen: gen}
		var g generation
		if err := st.common(&c.f, &g); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if g.req.Adaptive != c.adaptive {
			t.Errorf("%s: adaptive %v, want %v", c.name, g.req.Adaptive, c.adaptive)
		}
	}
	for _, c := range []struct {
		name     string
		f        samplingFields
		adaptive bool
	}{{"unkeyed, a seed", samplingFields{Seed: &seed}, false}, {"unkeyed, no seed", samplingFields{}, true}} {
		st := &state{target: &Model{Name: "target"}, adaptive: true, gen: unkeyed}
		var g generation
		if err := st.common(&c.f, &g); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if g.req.Adaptive != c.adaptive {
			t.Errorf("%s: adaptive %v, want %v", c.name, g.req.Adaptive, c.adaptive)
		}
	}
}

// TestUsageTargetAlone: usage says target_alone where an adaptive
// generation went on with the target alone, and leaves it out otherwise.
func TestUsageTargetAlone(t *testing.T) {
	for _, alone := range []bool{true, false} {
		b, err := json.Marshal(usageOf(speculative.Result{Stats: speculative.Stats{Steps: 3, Tokens: 3, Alone: alone}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), `"target_alone":true`); got != alone || !alone && strings.Contains(string(b), "target_alone") {
			t.Errorf("alone %v: %s", alone, b)
		}
	}
}
