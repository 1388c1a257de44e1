package server

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/speculative"
	"webdraft/tokenizer"
)

// The OpenAI-compatible API (docs/reference.md, "OpenAI-compatible API"):
// POST /v1/completions, POST /v1/chat/completions and GET /v1/models,
// served by speculative decoding — the drafter drafts, the target
// verifies. Fields OpenAI defines that webdraft does not implement are
// refused with a 400 naming them, as are fields no one defines.

// Limits of the OpenAI-compatible API.
const (
	// DefaultCompletionTokens is /v1/completions' max_tokens when none is
	// given (OpenAI's default); chat completions run to the end of the
	// context.
	DefaultCompletionTokens = 16
	// MaxCompletionLogprobs bounds /v1/completions' logprobs (OpenAI: 5).
	MaxCompletionLogprobs = 5
	// MaxStops bounds stop (OpenAI: 4).
	MaxStops = 4
)

// openAIError is an error in OpenAI's shape.
type openAIError struct {
	status  int
	typ     string // invalid_request_error, not_found_error, …
	param   string // the offending field, or ""
	code    string
	message string
}

func invalid(param, msg string) *openAIError {
	return &openAIError{http.StatusBadRequest, "invalid_request_error", param, "invalid_value", param + ": " + msg}
}

func (s *Server) failOpenAI(w http.ResponseWriter, e *openAIError) {
	s.metrics.request(e.status, e.code)
	errorHeaders(w, e.status)
	writeJSON(w, e.status, map[string]any{"error": errorBody(e)})
}

func errorBody(e *openAIError) map[string]any {
	var param, code any
	if e.param != "" {
		param = e.param
	}
	if e.code != "" {
		code = e.code
	}
	return map[string]any{"message": e.message, "type": e.typ, "param": param, "code": code}
}

// samplingFields are what both endpoints take.
type samplingFields struct {
	Model            string         `json:"model"`
	MaxTokens        *int           `json:"max_tokens"`
	Temperature      *float64       `json:"temperature"`
	TopP             *float64       `json:"top_p"`
	Seed             *int64         `json:"seed"`
	Stop             stopField      `json:"stop"`
	Stream           bool           `json:"stream"`
	StreamOptions    *streamOptions `json:"stream_options"`
	N                *int           `json:"n"`
	User             string         `json:"user"`
	FrequencyPenalty *float64       `json:"frequency_penalty"`
	PresencePenalty  *float64       `json:"presence_penalty"`
	LogitBias        jsontext.Value `json:"logit_bias"` // refused unless {}: read raw, not as a map
	// vLLM's extension: the prompt's and the output's token ids.
	ReturnTokenIDs bool `json:"return_token_ids"`
	// webdraft's: the draft length or tree depth (0: the target alone),
	// the tree's shape and p_min.
	Speculative *speculativeFields `json:"speculative"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// speculativeFields are SGLang's num_steps, topk and num_draft_tokens
// under webdraft's names, and llama.cpp's p_min.
type speculativeFields struct {
	K           *int     `json:"k"`            // draft length; with topk above 1, the tree's depth
	TopK        *int     `json:"topk"`         // children a node (1: a chain; 0: the server's default)
	DraftTokens *int     `json:"draft_tokens"` // a tree's nodes verified a step (0: the server's default)
	PMin        *float64 `json:"p_min"`
}

type completionRequest struct {
	samplingFields
	Prompt   promptField `json:"prompt"`
	Logprobs *int        `json:"logprobs"`
	Echo     bool        `json:"echo"`
	Suffix   *string     `json:"suffix"`
	BestOf   *int        `json:"best_of"`
}

type chatRequest struct {
	samplingFields
	Messages            boundedList[chatMessage] `json:"messages"`
	MaxCompletionTokens *int                     `json:"max_completion_tokens"`
	Logprobs            bool                     `json:"logprobs"`
	TopLogprobs         *int                     `json:"top_logprobs"`
	Tools               jsontext.Value           `json:"tools"`
	ToolChoice          jsontext.Value           `json:"tool_choice"`
	ResponseFormat      jsontext.Value           `json:"response_format"`
	// vLLM's extension: {"enable_thinking": false} turns Qwen3's thinking off.
	ChatTemplateKwargs *struct {
		EnableThinking *bool `json:"enable_thinking"`
	} `json:"chat_template_kwargs"`
}

type chatMessage struct {
	Role    string      `json:"role"`
	Content chatContent `json:"content"` // required
	Name    string      `json:"name"`
}

func (m chatMessage) textBytes() int { return len(m.Role) + len(m.Content.text) }

// chatContent is a message's content: text, or a list of text parts.
type chatContent struct {
	text string
	set  bool
}

// contentPart is one part of a content list; of the kinds OpenAI
// defines only text is implemented, the others are named to be refused
// as such.
type contentPart struct {
	Type       *string        `json:"type"`
	Text       *string        `json:"text"`
	ImageURL   jsontext.Value `json:"image_url"`
	InputAudio jsontext.Value `json:"input_audio"`
	File       jsontext.Value `json:"file"`
	Refusal    jsontext.Value `json:"refusal"`
}

func (c *chatContent) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	field := fieldPath(dec.StackPointer())
	switch dec.PeekKind() {
	case '"':
		tok, err := dec.ReadToken()
		c.text, c.set = tok.String(), err == nil
		return err
	case '[':
	default:
		return invalidInput(field, "want text or a list of {\"type\": \"text\", \"text\": …} parts, got %s", kindOf(dec))
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	var b strings.Builder
	for i := 0; dec.PeekKind() != ']'; i++ {
		var p contentPart
		if err := jsonv2.UnmarshalDecode(dec, &p); err != nil {
			return err
		}
		at := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case p.Type == nil:
			return invalidInput(at+".type", "required")
		case *p.Type != "text":
			return invalidInput(at+".type", "%s: only text is implemented", quote(*p.Type))
		case p.Text == nil:
			return invalidInput(at+".text", "required")
		}
		b.WriteString(*p.Text)
	}
	c.text, c.set = b.String(), true
	_, err := dec.ReadToken()
	return err
}

// generation is a parsed request, ready to run.
type generation struct {
	chat         bool
	model        string
	prompt       []int
	req          speculative.Request
	stops        []string
	logprobs     bool // report each token's logprob (and req.TopN alternatives)
	stream       bool
	includeUsage bool
	returnIDs    bool
	tally        *specTally // counts the steps for metrics.speculative_decoding; nil: not asked for
}

// decodeOpenAI reads a request body into v strictly (input.go): null
// counts as absent for a top-level optional field only.
func (st *state) decodeOpenAI(w http.ResponseWriter, r *http.Request, v any) *openAIError {
	body, ie := requestBody(w, r)
	if ie != nil {
		return st.openAIInputError(ie)
	}
	if err := decodeStrict(body, v, openAINulls); err != nil {
		return st.openAIInputError(err)
	}
	return nil
}

// openAIInputError answers a refused body in OpenAI's shape, param
// naming the field: a *tooLongError as a prompt past the context.
func (st *state) openAIInputError(err error) *openAIError {
	var tl *tooLongError
	var ie *inputError
	switch {
	case errors.As(err, &tl):
		return &openAIError{http.StatusBadRequest, "invalid_request_error", tl.field, "context_length_exceeded",
			fmt.Sprintf("%s: the model's context is %d tokens", tl.Error(), st.maxContext())}
	case errors.As(err, &ie):
		msg := ie.Error()
		if ie.code == "unknown_field" {
			msg += " (webdraft does not take it)"
		}
		return &openAIError{ie.status, "invalid_request_error", ie.field, ie.code, msg}
	}
	return invalid("body", clip(err.Error()))
}

// common checks and applies the fields both endpoints share.
func (st *state) common(f *samplingFields, g *generation) *openAIError {
	switch f.Model {
	case "", st.target.Name: // absent, null or "": the target, as vLLM and llama-server take it
	case st.drafterID():
		return invalid("model", fmt.Sprintf("%s is the drafter: it drafts (POST /draft, POST /completion); generations are the target's, %q", quote(f.Model), st.target.Name))
	default:
		return &openAIError{http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
			fmt.Sprintf("model: %s is not served here; GET /v1/models lists %q (and its drafter)", quote(f.Model), st.target.Name)}
	}
	g.model = st.target.Name
	if f.N != nil && *f.N != 1 {
		return invalid("n", fmt.Sprintf("n is %d: webdraft returns one choice a request", *f.N))
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"frequency_penalty", f.FrequencyPenalty}, {"presence_penalty", f.PresencePenalty}} {
		if p.v != nil && *p.v != 0 {
			return invalid(p.name, "penalties are not implemented: leave it out or 0")
		}
	}
	if !emptyObject(f.LogitBias) {
		return invalid("logit_bias", "logit_bias is not implemented")
	}
	temp, topP := 1.0, 1.0 // OpenAI's defaults
	if f.Temperature != nil {
		temp = *f.Temperature
	}
	if f.TopP != nil {
		topP = *f.TopP
	}
	if !(temp >= 0 && temp <= 2) {
		return invalid("temperature", fmt.Sprintf("temperature %v: want 0…2", temp))
	}
	if !(topP > 0 && topP <= 1) {
		return invalid("top_p", fmt.Sprintf("top_p %v: want a value in (0, 1]", topP))
	}
	g.req.Sampling = sampling.Params{Temperature: float32(temp), TopP: float32(topP)}
	if f.Seed != nil {
		g.req.Seed = uint64(*f.Seed)
	} else {
		g.req.Seed = rand.Uint64()
	}
	stops, e := nonEmpty(f.Stop.stops)
	if e != nil {
		return e
	}
	if len(stops) > 0 && st.target.Tokenizer == nil {
		return invalid("stop", "this model has no tokenizer: stop strings cannot be matched")
	}
	g.stops = stops
	g.stream = f.Stream
	if f.StreamOptions != nil {
		if !f.Stream {
			return invalid("stream_options", "stream_options needs stream: true")
		}
		g.includeUsage = f.StreamOptions.IncludeUsage
	}
	g.returnIDs = f.ReturnTokenIDs
	g.req.Adaptive = st.adaptive && (f.Speculative == nil || f.Speculative.K == nil)
	if sp := f.Speculative; sp != nil {
		if sp.K != nil {
			switch k := *sp.K; {
			case k < 0 || k > speculative.MaxK:
				return invalid("speculative.k", fmt.Sprintf("k is %d: want 0 (the target alone) … %d", k, speculative.MaxK))
			case k == 0:
				g.req.K = speculative.NoDraft
			default:
				g.req.K = k
			}
		}
		if sp.TopK != nil {
			if b := *sp.TopK; b < 0 || b > speculative.MaxTopK {
				return invalid("speculative.topk", fmt.Sprintf("topk is %d: want 0 (the server's default) … %d; 1 drafts a chain", b, speculative.MaxTopK))
			}
			g.req.TopK = *sp.TopK
		}
		if sp.DraftTokens != nil {
			if n := *sp.DraftTokens; n < 0 || n > speculative.MaxTreeNodes {
				return invalid("speculative.draft_tokens", fmt.Sprintf("draft_tokens is %d: want 0 (the server's default) … %d", n, speculative.MaxTreeNodes))
			}
			g.req.TreeNodes = *sp.DraftTokens
		}
		if sp.PMin != nil {
			if !(*sp.PMin >= 0 && *sp.PMin <= 1) {
				return invalid("speculative.p_min", fmt.Sprintf("p_min is %v: want 0…1", *sp.PMin))
			}
			g.req.PMin = *sp.PMin
		}
	}
	if f.Seed != nil && !g.req.Sampling.Greedy() && !st.gen.Keyed(&g.req) {
		// A seed replays a keyed generation's tokens whether or not it
		// goes alone; an unkeyed one's only where it would go the same way.
		g.req.Adaptive = false
	}
	g.req.Stop = st.target.Stop
	return nil
}

// emptyObject reports whether a raw field is absent, null or {}.
func emptyObject(v jsontext.Value) bool {
	if len(v) == 0 || v.Kind() == 'n' {
		return true
	}
	c := v.Clone()
	return c.Compact() == nil && string(c) == "{}"
}

func nonEmpty(stops []string) ([]string, *openAIError) {
	for i, s := range stops {
		if s == "" {
			return nil, invalid(fmt.Sprintf("stop[%d]", i), "an empty stop string")
		}
	}
	return stops, nil
}

// maxTokens settles max_tokens: given, it must fit the context after the
// prompt; else def, or with def 0 the rest of the context.
func (st *state) maxTokens(given *int, field string, def, promptLen int) (int, *openAIError) {
	room := st.maxContext() - promptLen
	if room < 1 {
		return 0, &openAIError{http.StatusBadRequest, "invalid_request_error", "prompt", "context_length_exceeded",
			fmt.Sprintf("prompt: %d tokens leave no room in the model's context of %d", promptLen, st.maxContext())}
	}
	if given == nil {
		if def == 0 {
			return room, nil
		}
		return min(def, room), nil
	}
	switch n := *given; {
	case n < 1:
		return 0, invalid(field, fmt.Sprintf("%s is %d: want at least 1", field, n))
	case n > room:
		return 0, &openAIError{http.StatusBadRequest, "invalid_request_error", field, "context_length_exceeded",
			fmt.Sprintf("%s: the model's context is %d tokens; the prompt takes %d, which leaves %d, not %d", field, st.maxContext(), promptLen, room, n)}
	default:
		return n, nil
	}
}

func (st *state) maxContext() int {
	return min(st.target.Engine.Config().MaxPositionEmbeddings, st.drafter.Engine.Config().MaxPositionEmbeddings)
}

// checkIDs refuses ids outside the target's vocabulary.
func (st *state) checkIDs(field string, ids []int) *openAIError {
	if len(ids) == 0 {
		return invalid(field, "the prompt is empty")
	}
	v := st.target.Engine.Config().VocabSize
	for i, t := range ids {
		if t < 0 || t >= v {
			return invalid(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("token %d is outside the model's vocabulary [0, %d)", t, v))
		}
	}
	return nil
}

// The time limit of a generation (Limits.GenerationTimeout) counts from
// the end of the request's headers: its body, the tokenizer's wait, the
// queue and the generation itself are in it.

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.limits.GenerationTimeout)
	defer cancel()
	st, e := s.openAIState()
	if e == nil {
		req := completionRequest{Prompt: promptField{maxIDs: st.maxContext() - 1, maxBytes: st.targetText}}
		if e = st.decodeOpenAI(w, r, &req); e == nil {
			var g *generation
			if g, e = s.parseCompletion(ctx, r, st, &req); e == nil {
				s.generate(ctx, w, r, st, g)
				return
			}
		}
	}
	s.failOpenAI(w, e)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.limits.GenerationTimeout)
	defer cancel()
	st, e := s.openAIState()
	if e == nil {
		req := chatRequest{Messages: boundedList[chatMessage]{max: st.maxContext(), maxBytes: st.targetText}}
		if e = st.decodeOpenAI(w, r, &req); e == nil {
			var g *generation
			if g, e = s.parseChat(ctx, r, st, &req); e == nil {
				s.generate(ctx, w, r, st, g)
				return
			}
		}
	}
	s.failOpenAI(w, e)
}

// encodeOpenAI runs a tokenization for /v1/* in an encode slot: a 504
// when the generation's time limit passes first, a 499 when the client
// leaves.
func (s *Server) encodeOpenAI(ctx context.Context, r *http.Request, st *state, f func()) *openAIError {
	if e := clientGone(r); e != nil {
		return e
	}
	if err := st.encode(ctx, f); err != nil {
		return s.generationError(s.timedOut(ctx, r, err))
	}
	return nil
}

// timedOut makes err a *timeoutError when ctx ended at the generation's
// time limit, not because the client left.
func (s *Server) timedOut(ctx context.Context, r *http.Request, err error) error {
	if te := pastLimit(ctx, r, "the generation", s.limits.GenerationTimeout, "--generation-timeout"); te != nil {
		return te
	}
	return err
}

// openAIState is the running state, when it has a target.
func (s *Server) openAIState() (*state, *openAIError) {
	st := s.ready.Load()
	switch {
	case st == nil:
		e := s.unavailable()
		return nil, &openAIError{e.status, "server_error", "", e.code, e.message}
	case st.target == nil:
		return nil, &openAIError{http.StatusNotFound, "invalid_request_error", "", "no_target",
			"this server drafts only (POST /draft): start it with a target to serve the OpenAI-compatible API"}
	}
	return st, nil
}

func (s *Server) parseCompletion(ctx context.Context, r *http.Request, st *state, req *completionRequest) (*generation, *openAIError) {
	g := &generation{}
	if e := st.common(&req.samplingFields, g); e != nil {
		return nil, e
	}
	switch {
	case req.Echo:
		return nil, invalid("echo", "echo is not implemented")
	case req.Suffix != nil:
		return nil, invalid("suffix", "suffix is not implemented")
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, invalid("best_of", fmt.Sprintf("best_of is %d: webdraft returns one choice a request", *req.BestOf))
	}
	prompt, e := s.completionPrompt(ctx, r, st, &req.Prompt)
	if e != nil {
		return nil, e
	}
	g.prompt = prompt
	if req.Logprobs != nil {
		if n := *req.Logprobs; n < 0 || n > MaxCompletionLogprobs {
			return nil, invalid("logprobs", fmt.Sprintf("logprobs is %d: want 0…%d", n, MaxCompletionLogprobs))
		}
		g.logprobs, g.req.TopN = true, *req.Logprobs
	}
	if g.logprobs && st.target.Tokenizer == nil {
		return nil, invalid("logprobs", "this model has no tokenizer: use return_token_ids for the tokens")
	}
	var max *openAIError
	g.req.MaxTokens, max = st.maxTokens(req.MaxTokens, "max_tokens", DefaultCompletionTokens, len(prompt))
	g.req.Prompt = prompt
	return g, max
}

// completionPrompt makes prompt token ids: given, or the text's.
func (s *Server) completionPrompt(ctx context.Context, r *http.Request, st *state, p *promptField) ([]int, *openAIError) {
	switch {
	case !p.set:
		return nil, invalid("prompt", "prompt is required")
	case !p.isText:
		field := "prompt"
		if p.nested {
			field = "prompt[0]"
		}
		return p.ids, st.checkIDs(field, p.ids)
	case st.target.Tokenizer == nil:
		return nil, invalid("prompt", "this model has no tokenizer: give the prompt as token ids")
	case p.text == "":
		return nil, invalid("prompt", "the prompt is empty")
	}
	var ids []int
	if e := s.encodeOpenAI(ctx, r, st, func() { ids = st.target.Tokenizer.Encode(p.text) }); e != nil {
		return nil, e
	}
	return ids, st.checkIDs("prompt", ids)
}

// clientGone is a 499 when the client has left: nothing more is worth
// doing.
func clientGone(r *http.Request) *openAIError {
	if r.Context().Err() != nil {
		return &openAIError{499, "invalid_request_error", "", "client_closed", "the client went away"}
	}
	return nil
}

func (s *Server) parseChat(ctx context.Context, r *http.Request, st *state, req *chatRequest) (*generation, *openAIError) {
	g := &generation{chat: true}
	if e := st.common(&req.samplingFields, g); e != nil {
		return nil, e
	}
	for _, f := range []struct {
		name string
		raw  jsontext.Value
	}{{"tools", req.Tools}, {"tool_choice", req.ToolChoice}} {
		if len(f.raw) > 0 && f.raw.Kind() != 'n' {
			return nil, invalid(f.name, "tool calls are not implemented")
		}
	}
	if len(req.ResponseFormat) > 0 && req.ResponseFormat.Kind() != 'n' {
		var rf struct {
			Type string `json:"type"`
		}
		if decodeStrict(bytes.NewReader(req.ResponseFormat), &rf, noNulls) != nil || rf.Type != "text" {
			return nil, invalid("response_format", `only {"type": "text"} is implemented`)
		}
	}
	tok := st.target.Tokenizer
	if tok == nil {
		return nil, invalid("messages", "this model has no tokenizer: use /v1/completions with token ids")
	}
	switch {
	case !req.Messages.set:
		return nil, invalid("messages", "messages is required")
	case len(req.Messages.items) == 0:
		return nil, invalid("messages", "messages is empty")
	}
	msgs := make([]tokenizer.Message, len(req.Messages.items))
	for i, m := range req.Messages.items {
		role := m.Role
		switch role {
		case "developer":
			role = "system" // OpenAI's newer name for it
		case "system", "user", "assistant":
		default:
			return nil, invalid(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("role %s: want system, developer, user or assistant", quote(m.Role)))
		}
		if !m.Content.set {
			return nil, invalid(fmt.Sprintf("messages[%d].content", i), "required")
		}
		msgs[i] = tokenizer.Message{Role: role, Content: m.Content.text}
	}
	thinking := true
	if k := req.ChatTemplateKwargs; k != nil && k.EnableThinking != nil {
		thinking = *k.EnableThinking
	}
	text, err := tok.ApplyChatTemplate(msgs, true, thinking)
	if err != nil {
		return nil, invalid("messages", err.Error())
	}
	if e := s.encodeOpenAI(ctx, r, st, func() { g.prompt = tok.Encode(text) }); e != nil {
		return nil, e
	}
	if e := st.checkIDs("messages", g.prompt); e != nil {
		return nil, e
	}
	if req.TopLogprobs != nil {
		if n := *req.TopLogprobs; n < 0 || n > engine.MaxTopN {
			return nil, invalid("top_logprobs", fmt.Sprintf("top_logprobs is %d: want 0…%d", n, engine.MaxTopN))
		}
		if !req.Logprobs {
			return nil, invalid("top_logprobs", "top_logprobs needs logprobs: true")
		}
		g.req.TopN = *req.TopLogprobs
	}
	g.logprobs = req.Logprobs
	given, field := req.MaxCompletionTokens, "max_completion_tokens"
	if given == nil {
		given, field = req.MaxTokens, "max_tokens"
	}
	var e *openAIError
	g.req.MaxTokens, e = st.maxTokens(given, field, 0, len(g.prompt))
	g.req.Prompt = g.prompt
	return g, e
}

// usage is OpenAI's usage with speculative decoding's counts added.
// OpenAI's completion_tokens_details counts a predicted output's tokens
// the completion kept and those it did not: here the draft tokens the
// target accepted and those it rejected.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
		RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
	} `json:"completion_tokens_details"`
	DraftedTokens        int     `json:"drafted_tokens"`
	AcceptedTokens       int     `json:"accepted_tokens"`
	VerificationSteps    int     `json:"verification_steps"`
	MeanAcceptanceLength float64 `json:"mean_acceptance_length"`
	// TargetAlone: an adaptive generation (serve --adaptive) ran the target
	// alone for a while, its speculative steps measured slower.
	TargetAlone bool `json:"target_alone,omitempty"`
}

func usageOf(res speculative.Result) *usage {
	st := res.Stats
	u := &usage{
		PromptTokens: st.PromptTokens, CompletionTokens: len(res.Tokens), TotalTokens: st.PromptTokens + len(res.Tokens),
		DraftedTokens: st.Drafted, AcceptedTokens: st.Accepted, VerificationSteps: st.Steps,
		MeanAcceptanceLength: math.Round(st.Tau()*1000) / 1000, TargetAlone: st.Alone,
	}
	u.PromptTokensDetails.CachedTokens = st.CachedTokens
	u.CompletionTokensDetails.AcceptedPredictionTokens = st.Accepted
	u.CompletionTokensDetails.RejectedPredictionTokens = st.Drafted - st.Accepted
	return u
}

// logprobs formats tokens' log-probabilities as each endpoint reports them.
type logprobs struct {
	tok  *tokenizer.Tokenizer
	topN int
}

type chatLogprob struct {
	Token       string        `json:"token"`
	Logprob     float32       `json:"logprob"`
	Bytes       []int         `json:"bytes"`
	TopLogprobs []chatLogprob `json:"top_logprobs,omitempty"`
}

func (l logprobs) text(id int) (string, []int) {
	b, err := l.tok.TokenBytes(id)
	if err != nil {
		return "", nil
	}
	s, _ := l.tok.Decode([]int{id}) // valid: TokenBytes took it
	ints := make([]int, len(b))
	for i, c := range b {
		ints[i] = int(c)
	}
	return s, ints
}

func (l logprobs) chat(tokens []speculative.Token) map[string]any {
	content := make([]chatLogprob, len(tokens))
	for i, t := range tokens {
		s, b := l.text(t.ID)
		content[i] = chatLogprob{Token: s, Logprob: t.Logprob, Bytes: b, TopLogprobs: []chatLogprob{}}
		for _, alt := range t.Top[:min(l.topN, len(t.Top))] {
			as, ab := l.text(alt.Token)
			content[i].TopLogprobs = append(content[i].TopLogprobs, chatLogprob{Token: as, Logprob: alt.Logprob, Bytes: ab})
		}
	}
	return map[string]any{"content": content}
}

// completion is /v1/completions' logprobs object; offset is where the
// tokens' text starts in the completion.
func (l logprobs) completion(tokens []speculative.Token, offset int) map[string]any {
	texts, lps, tops, offsets := []string{}, []float32{}, []map[string]float32{}, []int{}
	for _, t := range tokens {
		s, _ := l.text(t.ID)
		texts, lps, offsets = append(texts, s), append(lps, t.Logprob), append(offsets, offset)
		offset += len(s)
		top := map[string]float32{}
		for _, alt := range t.Top[:min(l.topN, len(t.Top))] {
			as, _ := l.text(alt.Token)
			top[as] = alt.Logprob
		}
		tops = append(tops, top)
	}
	return map[string]any{"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
}

// generate runs g within ctx (the generation's time limit) and answers:
// one JSON object, or an SSE stream.
func (s *Server) generate(ctx context.Context, w http.ResponseWriter, r *http.Request, st *state, g *generation) {
	if e := clientGone(r); e != nil { // nothing is queued for a client that has left
		s.failOpenAI(w, e)
		return
	}
	if s.spec != SpecMetricsNone {
		k := g.req.K
		switch k {
		case 0:
			k = st.gen.K()
		case speculative.NoDraft:
			k = 0
		}
		g.tally = &specTally{k: k, detailed: s.spec == SpecMetricsDetailed}
	}
	out := &output{g: g, lp: logprobs{tok: st.target.Tokenizer, topN: g.req.TopN}, created: time.Now().Unix(), id: newID(g.chat)}
	if tok := st.target.Tokenizer; tok != nil {
		out.text = newTextStream(tok, g.stops)
	}
	if g.stream {
		s.stream(ctx, w, r, st, out)
		return
	}
	var text strings.Builder
	var textErr error
	g.req.OnStep = func(step speculative.Step) bool {
		out.tally(step)
		t, err := out.push(step.Tokens)
		text.WriteString(t)
		textErr = errors.Join(textErr, err)
		return !out.stopped()
	}
	res, err := st.gen.Submit(ctx, g.req)
	if err != nil {
		s.failOpenAI(w, s.generationError(s.timedOut(ctx, r, err)))
		return
	}
	if textErr != nil {
		s.log.Warn("decoding the output", "err", textErr) // ids past the tokenizer's vocabulary
	}
	text.WriteString(out.flush())
	s.metrics.generated(res, endpointOf(g))
	s.metrics.request(http.StatusOK, "")
	writeJSON(w, http.StatusOK, out.response(res, text.String()))
}

func endpointOf(g *generation) string {
	if g.chat {
		return "chat_completions"
	}
	return "completions"
}

// output builds a generation's response objects.
type output struct {
	g       *generation
	lp      logprobs
	text    *textStream // nil without a tokenizer
	id      string
	created int64
	emitted int // bytes of text released so far
}

func newID(chat bool) string {
	if chat {
		return "chatcmpl-" + crand.Text()
	}
	return "cmpl-" + crand.Text()
}

// tally counts a step for metrics.speculative_decoding, when asked for.
func (o *output) tally(step speculative.Step) {
	if o.g.tally != nil {
		o.g.tally.add(step)
	}
}

// addMetrics adds metrics.speculative_decoding to a response or its last
// chunk, when asked for.
func (o *output) addMetrics(resp map[string]any) {
	if o.g.tally != nil {
		resp["metrics"] = map[string]any{"speculative_decoding": o.g.tally.speculativeDecoding()}
	}
}

func (o *output) push(tokens []speculative.Token) (string, error) {
	if o.text == nil {
		return "", nil
	}
	ids := make([]int, len(tokens))
	for i, t := range tokens {
		ids[i] = t.ID
	}
	return o.text.push(ids)
}

func (o *output) flush() string {
	if o.text == nil {
		return ""
	}
	return o.text.flush()
}

func (o *output) stopped() bool { return o.text != nil && o.text.stopped }

func finishReason(res speculative.Result, o *output) string {
	if o.stopped() {
		return speculative.FinishStop
	}
	return res.Finish
}

func tokenIDs(tokens []speculative.Token) []int {
	ids := make([]int, len(tokens))
	for i, t := range tokens {
		ids[i] = t.ID
	}
	return ids
}

// response is the whole (not streamed) answer.
func (o *output) response(res speculative.Result, text string) map[string]any {
	choice := map[string]any{"index": 0, "finish_reason": finishReason(res, o), "logprobs": nil}
	if o.g.logprobs {
		if o.g.chat {
			choice["logprobs"] = o.lp.chat(res.Tokens)
		} else {
			choice["logprobs"] = o.lp.completion(res.Tokens, 0)
		}
	}
	if o.g.returnIDs {
		choice["token_ids"] = tokenIDs(res.Tokens)
	}
	object := "text_completion"
	if o.g.chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	resp := map[string]any{
		"id": o.id, "object": object, "created": o.created, "model": o.g.model,
		"choices": []any{choice}, "usage": usageOf(res),
	}
	if o.g.returnIDs {
		resp["prompt_token_ids"] = o.g.prompt
	}
	o.addMetrics(resp)
	return resp
}

// chunk is one streamed event: text released and the tokens of a step;
// finish, when set, ends the choice.
func (o *output) chunk(text string, tokens []speculative.Token, first bool, finish string) map[string]any {
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": nil}
	if finish != "" {
		choice["finish_reason"] = finish
	}
	if o.g.logprobs && len(tokens) > 0 {
		if o.g.chat {
			choice["logprobs"] = o.lp.chat(tokens)
		} else {
			choice["logprobs"] = o.lp.completion(tokens, o.emitted)
		}
	}
	o.emitted += len(text)
	if o.g.returnIDs {
		choice["token_ids"] = tokenIDs(tokens)
	}
	object := "text_completion"
	if o.g.chat {
		object = "chat.completion.chunk"
		delta := map[string]any{}
		if first {
			delta["role"] = "assistant"
		}
		if text != "" || first {
			delta["content"] = text
		}
		choice["delta"] = delta
	} else {
		choice["text"] = text
	}
	c := map[string]any{"id": o.id, "object": object, "created": o.created, "model": o.g.model, "choices": []any{choice}}
	if o.g.includeUsage {
		c["usage"] = nil
	}
	if first && o.g.returnIDs {
		c["prompt_token_ids"] = o.g.prompt
	}
	return c
}

// streamEvent is a step's part of the stream.
type streamEvent struct {
	text   string
	tokens []speculative.Token
}

// stream answers with server-sent events: a chunk a verification step as
// the loop runs, the last with the finish reason, then the usage when
// asked, then [DONE].
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, r *http.Request, st *state, out *output) {
	g := out.g
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.failOpenAI(w, &openAIError{http.StatusInternalServerError, "server_error", "stream", "no_streaming", "this connection cannot stream"})
		return
	}
	// Each step emits a token at least, but the last may emit none: the
	// loop never waits on the channel.
	events := make(chan streamEvent, g.req.MaxTokens+1)
	g.req.OnStep = func(step speculative.Step) bool {
		out.tally(step)
		text, err := out.push(step.Tokens)
		if err != nil {
			s.log.Warn("decoding the output", "err", err)
		}
		events <- streamEvent{text, step.Tokens}
		return !out.stopped()
	}
	type result struct {
		res speculative.Result
		err error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		res, err := st.gen.Submit(ctx, g.req)
		done <- result{res, err}
	}()
	started := false
	send := func(v any) bool {
		if !started {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.Header().Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		var b bytes.Buffer
		b.WriteString("data: ")
		if err := json.NewEncoder(&b).Encode(v); err != nil {
			return false
		}
		b.WriteString("\n")
		if _, err := w.Write(b.Bytes()); err != nil {
			return false // the client is gone: ctx ends the generation
		}
		flusher.Flush()
		return true
	}
	first := true
	emit := func(ev streamEvent) {
		if ev.text == "" && len(ev.tokens) == 0 && !first {
			return
		}
		send(out.chunk(ev.text, ev.tokens, first, ""))
		first = false
	}
	for {
		select {
		case ev := <-events:
			emit(ev)
			continue
		case rs := <-done:
			for len(events) > 0 {
				emit(<-events)
			}
			if rs.err != nil {
				e := s.generationError(s.timedOut(ctx, r, rs.err))
				if !started {
					s.failOpenAI(w, e)
					return
				}
				s.metrics.request(e.status, e.code)
				send(map[string]any{"error": errorBody(e)})
				fmt.Fprint(w, "data: [DONE]\n\n")
				flusher.Flush()
				return
			}
			// The last chunk — the usage's when asked, else the
			// finish reason's — carries metrics.speculative_decoding.
			last := out.chunk(out.flush(), nil, first, finishReason(rs.res, out))
			if g.includeUsage {
				send(last)
				last = map[string]any{"id": out.id, "object": chunkObject(g), "created": out.created, "model": g.model,
					"choices": []any{}, "usage": usageOf(rs.res)}
			}
			out.addMetrics(last)
			send(last)
			fmt.Fprint(w, "data: [DONE]\n\n")
			flusher.Flush()
			s.metrics.generated(rs.res, endpointOf(g))
			s.metrics.request(http.StatusOK, "")
			return
		}
	}
}

func chunkObject(g *generation) string {
	if g.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (s *Server) generationError(err error) *openAIError {
	var te *timeoutError
	switch {
	case errors.As(err, &te):
		return &openAIError{http.StatusGatewayTimeout, "server_error", "", "request_timeout", te.Error()}
	case errors.Is(err, speculative.ErrTooLarge):
		return &openAIError{http.StatusBadRequest, "invalid_request_error", "max_tokens", "context_length_exceeded", err.Error()}
	case errors.Is(err, speculative.ErrOverloaded):
		return &openAIError{http.StatusTooManyRequests, "rate_limit_error", "", "overloaded", queueFull(err, "the generator's")}
	case errors.Is(err, engine.ErrFault):
		return &openAIError{http.StatusServiceUnavailable, "server_error", "", "engine_fault", faultMessage(err)}
	case errors.Is(err, speculative.ErrClosed):
		if s.fault.Load() != nil {
			e := s.unavailable()
			return &openAIError{e.status, "server_error", "", e.code, e.message}
		}
		return &openAIError{http.StatusServiceUnavailable, "server_error", "", "shutting_down", "the server is shutting down"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &openAIError{499, "invalid_request_error", "", "client_closed", "the client went away"}
	}
	s.log.Error("generation failed", "err", err)
	return &openAIError{http.StatusInternalServerError, "server_error", "", "internal", "generation failed: " + err.Error()}
}

// models answers GET /v1/models: the target, by the name requests give
// (or leave out), then its drafter, which serves /draft and /completion.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	st, e := s.openAIState()
	if e != nil {
		s.failOpenAI(w, e)
		return
	}
	tcfg, dcfg := st.target.Engine.Config(), st.drafter.Engine.Config()
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{
			"id": st.target.Name, "object": "model", "created": st.started.Unix(), "owned_by": "webdraft", "role": "target",
			"max_model_len": st.maxContext(), "vocab_size": tcfg.VocabSize, "drafter": st.drafterID(),
		},
		map[string]any{
			"id": st.drafterID(), "object": "model", "created": st.started.Unix(), "owned_by": "webdraft", "role": "drafter",
			"max_model_len": dcfg.MaxPositionEmbeddings, "vocab_size": dcfg.VocabSize, "endpoints": []string{"/draft", "/completion"},
		},
	}})
}

// drafterID is the drafter's id in GET /v1/models: its name, or with a
// target of the same name (one folder served as both), the name and
// ":drafter".
func (st *state) drafterID() string {
	if st.target != nil && st.drafter.Name == st.target.Name {
		return st.drafter.Name + ":drafter"
	}
	return st.drafter.Name
}
