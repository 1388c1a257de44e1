package server

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestOpenAIModelOptional: the official client with no model (it then
// leaves the field out) gets the target; so does null or ""; an unknown
// model is still 404, the drafter's name a 400 that says what it is.
func TestOpenAIModelOptional(t *testing.T) {
	f := newPairFixture(t, testKey)
	c := f.client()
	ctx := context.Background()
	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("def quicksort(xs):")},
		MaxTokens: openai.Int(8), Temperature: openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if chat.Model != "target" || chat.Usage.CompletionTokens == 0 {
		t.Errorf("chat without a model: model %q, usage %+v", chat.Model, chat.Usage)
	}
	prompt := "def fib(n):\n"
	_, want := f.greedy(t, f.tok.Encode(prompt), 8)
	cmpl, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(8), Temperature: openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if cmpl.Model != "target" || cmpl.Choices[0].Text != want {
		t.Errorf("completion without a model: model %q, text %q; want %q", cmpl.Model, cmpl.Choices[0].Text, want)
	}
	for _, model := range []string{``, `"model":null,`, `"model":"",`} {
		if code, out := f.postJSON(t, "/v1/completions", `{`+model+`"prompt":"x","max_tokens":2}`); code != 200 || out["model"] != "target" {
			t.Errorf("%q: %d %v", model, code, out)
		}
	}
	code, out := f.postJSON(t, "/v1/completions", `{"model":"nope","prompt":"x"}`)
	if e, _ := out["error"].(map[string]any); code != 404 || e["code"] != "model_not_found" {
		t.Errorf("unknown model: %d %v", code, out)
	}
	code, out = f.postJSON(t, "/v1/chat/completions", `{"model":"drafter","messages":[{"role":"user","content":"hi"}]}`)
	if e, _ := out["error"].(map[string]any); code != 400 || e["param"] != "model" || !strings.Contains(e["message"].(string), "drafter") {
		t.Errorf("the drafter's name: %d %v", code, out)
	}
	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 2 {
		t.Fatalf("models %+v, %v", models, err)
	}
	var raw struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.Unmarshal([]byte(models.RawJSON()), &raw); err != nil {
		t.Fatal(err)
	}
	if d := raw.Data[1]; d["id"] != "drafter" || d["role"] != "drafter" || raw.Data[0]["drafter"] != "drafter" || raw.Data[0]["role"] != "target" {
		t.Errorf("models %v", raw.Data)
	}
}

// TestOpenAIPredictionTokens: usage.completion_tokens_details holds
// OpenAI's accepted_prediction_tokens and rejected_prediction_tokens —
// the draft tokens the target accepted and those it rejected — besides
// webdraft's own counts, whole and in the streamed usage chunk, as the
// official client reads them.
func TestOpenAIPredictionTokens(t *testing.T) {
	f := newPairFixture(t, testKey)
	c := f.client()
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write a function that reverses a list.")},
		MaxTokens: openai.Int(24), Temperature: openai.Float(0),
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	var extra struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(resp.RawJSON()), &extra); err != nil {
		t.Fatal(err)
	}
	check := func(where string, d openai.CompletionUsageCompletionTokensDetails, u usage) {
		t.Helper()
		if u.DraftedTokens == 0 || d.AcceptedPredictionTokens != int64(u.AcceptedTokens) || d.RejectedPredictionTokens != int64(u.DraftedTokens-u.AcceptedTokens) {
			t.Errorf("%s: details %+v, usage %+v", where, d, u)
		}
	}
	check("chat", resp.Usage.CompletionTokensDetails, extra.Usage)

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	usageChunks := 0
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			continue
		}
		usageChunks++
		var raw struct {
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ch.RawJSON()), &raw); err != nil {
			t.Fatal(err)
		}
		check("streamed", ch.Usage.CompletionTokensDetails, raw.Usage)
		raw.Usage.PromptTokensDetails = extra.Usage.PromptTokensDetails // the second run reuses the prompt's cache
		if raw.Usage != extra.Usage {
			t.Errorf("streamed usage %+v, whole %+v", raw.Usage, extra.Usage)
		}
	}
	if err := stream.Err(); err != nil || usageChunks != 1 {
		t.Errorf("%d usage chunks, %v", usageChunks, err)
	}
	cmpl, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("import numpy as np\n")},
		MaxTokens: openai.Int(16), Temperature: openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(cmpl.RawJSON()), &extra); err != nil {
		t.Fatal(err)
	}
	check("completion", cmpl.Usage.CompletionTokensDetails, extra.Usage)
}

// checkSpecMetrics checks metrics.speculative_decoding as vLLM's own test
// does — its identities — and against the response's usage.
func checkSpecMetrics(t *testing.T, where string, m, u map[string]any, detailed bool, k int) {
	t.Helper()
	num := func(k string) float64 { v, _ := m[k].(float64); return v }
	hist := ints(m["acceptance_histogram"])
	steps, accepted, drafted := num("num_spec_steps"), num("num_accepted_draft_tokens"), num("num_draft_tokens")
	weighted := 0
	for j, n := range hist {
		weighted += j * n
	}
	ok := steps > 0 && len(hist) == k+1 && num("num_spec_tokens") == float64(k) &&
		steps == u["verification_steps"] && accepted == u["accepted_tokens"] && drafted == u["drafted_tokens"] &&
		float64(sum(hist)) == steps && float64(weighted) == accepted &&
		math.Abs(num("mean_acceptance_length")-(1+accepted/steps)) < 1e-9
	if drafted > 0 {
		ok = ok && math.Abs(num("draft_acceptance_rate")-accepted/drafted) < 1e-9
	} else {
		ok = ok && num("draft_acceptance_rate") == 0
	}
	if detailed {
		pa, pd := ints(m["per_step_accepted"]), ints(m["per_step_drafted"])
		ok = ok && float64(len(pa)) == steps && float64(len(pd)) == steps && float64(sum(pa)) == accepted && float64(sum(pd)) == drafted
	} else {
		_, a := m["per_step_accepted"]
		_, d := m["per_step_drafted"]
		ok = ok && !a && !d
	}
	if !ok {
		t.Errorf("%s: speculative_decoding %v, usage %v", where, m, u)
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// specMetricsOf is a response's metrics.speculative_decoding, or nil.
func specMetricsOf(o map[string]any) map[string]any {
	m, _ := o["metrics"].(map[string]any)
	sd, _ := m["speculative_decoding"].(map[string]any)
	return sd
}

// streamEvents posts a streaming body and returns its events, [DONE]
// left out.
func (f *pairFixture) streamEvents(t *testing.T, path, body string) []map[string]any {
	t.Helper()
	req, err := http.NewRequest("POST", f.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var events []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		events = append(events, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

// TestPerRequestSpecMetrics: with SpecMetrics (serve
// --per-request-spec-decode-metrics), a response carries
// metrics.speculative_decoding in vLLM's names, whole or in the stream's
// last chunk only; without it, none.
func TestPerRequestSpecMetrics(t *testing.T) {
	for _, level := range []SpecMetrics{SpecMetricsSummary, SpecMetricsDetailed} {
		t.Run(level.String(), func(t *testing.T) {
			f := newPairFixtureOptions(t, Options{SpecMetrics: level})
			detailed := level == SpecMetricsDetailed
			for _, c := range []struct {
				body string
				k    int
			}{
				{`{"prompt":"def quicksort(xs):","max_tokens":24,"temperature":0}`, 4},
				{`{"prompt":"def quicksort(xs):","max_tokens":6,"temperature":0,"speculative":{"k":7}}`, 7},
				{`{"prompt":"def quicksort(xs):","max_tokens":6,"temperature":0,"speculative":{"k":0}}`, 0},
				{`{"prompt":"Once upon a time","max_tokens":12,"temperature":0.9,"seed":3}`, 4},
			} {
				code, out := f.postJSON(t, "/v1/completions", c.body)
				if code != 200 {
					t.Fatalf("%s: %d %v", c.body, code, out)
				}
				checkSpecMetrics(t, c.body, specMetricsOf(out), out["usage"].(map[string]any), detailed, c.k)
			}
			chat := `"messages":[{"role":"user","content":"hi"}],"max_tokens":10,"temperature":0,"stream":true`
			for _, withUsage := range []bool{true, false} {
				body := `{` + chat + `}`
				if withUsage {
					body = `{` + chat + `,"stream_options":{"include_usage":true}}`
				}
				events := f.streamEvents(t, "/v1/chat/completions", body)
				var with []int
				for i, ev := range events {
					if specMetricsOf(ev) != nil {
						with = append(with, i)
					}
				}
				if !slices.Equal(with, []int{len(events) - 1}) {
					t.Fatalf("%s: metrics in events %v of %d", body, with, len(events))
				}
				last := events[len(events)-1]
				if withUsage {
					checkSpecMetrics(t, body, specMetricsOf(last), last["usage"].(map[string]any), detailed, 4)
				} else if fr := last["choices"].([]any)[0].(map[string]any)["finish_reason"]; fr == nil {
					t.Errorf("%s: the metrics are not on the finish chunk: %v", body, last)
				}
			}
		})
	}
	f := newPairFixture(t, "")
	code, out := f.postJSON(t, "/v1/completions", `{"prompt":"x","max_tokens":4}`)
	if _, has := out["metrics"]; code != 200 || has {
		t.Errorf("without the option: %d %v", code, out)
	}
}
