package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"webdraft/scheduler"
)

// llama-server's native completion API, POST /completion (docs/reference.md,
// "POST /completion"), in the subset a remote drafter needs: llama.cpp's
// --spec-type draft-remote asks another llama-server there for the draft
// tokens of a token-id prompt. The drafter serves it exactly as it serves
// POST /draft — greedy drafts on the same scheduler and prefix cache, the
// same limits, time limit and metrics — in llama-server's field names,
// response and error shape. Fields llama-server takes that cannot change a
// greedy draft are accepted and ignored; those that would change it
// (sampling, penalties, grammars, stop strings…) are refused with a 400
// naming them unless they hold their neutral value.

// DefaultNPredict is /completion's n_predict when none is given, or -1
// (llama-server's "until a stop"): /draft's default draft length.
const DefaultNPredict = DefaultN

// llamaRequest is the body of POST /completion.
type llamaRequest struct {
	Prompt   llamaPrompt `json:"prompt"`
	NPredict *int        `json:"n_predict"`
	// CachePrompt is accepted whatever it says: the prefix cache is
	// always on, and a draft is the same with it or without.
	CachePrompt  *bool `json:"cache_prompt"`
	ReturnTokens bool  `json:"return_tokens"`
	Stream       bool  `json:"stream"`
	IgnoreEOS    bool  `json:"ignore_eos"`
	// Greedy only: temperature ≤ 0, or top_k 1 with top_k among the
	// samplers (checkGreedy).
	Temperature *float64       `json:"temperature"`
	TopK        *int           `json:"top_k"`
	Samplers    jsontext.Value `json:"samplers"`

	// Refused unless neutral: each changes which token comes out, or the
	// answer's shape.
	NProbs           *int           `json:"n_probs"`
	Stop             jsontext.Value `json:"stop"`
	RepeatPenalty    *float64       `json:"repeat_penalty"`
	PresencePenalty  *float64       `json:"presence_penalty"`
	FrequencyPenalty *float64       `json:"frequency_penalty"`
	DryMultiplier    *float64       `json:"dry_multiplier"`
	XTCProbability   *float64       `json:"xtc_probability"`
	Mirostat         *int           `json:"mirostat"`
	NIndent          *int           `json:"n_indent"`
	NCmpl            *int           `json:"n_cmpl"`
	N                *int           `json:"n"`
	LogitBias        jsontext.Value `json:"logit_bias"`
	Grammar          jsontext.Value `json:"grammar"`
	JSONSchema       jsontext.Value `json:"json_schema"`
	ResponseFields   jsontext.Value `json:"response_fields"`
	Lora             jsontext.Value `json:"lora"`

	// Ignored: they cannot change a greedy draft (top_p, min_p and
	// typical_p never remove the most likely token), or they steer what
	// llama-server does and webdraft does otherwise (slots, the cache's
	// reuse, time limits, timings a token).
	TopP                jsontext.Value `json:"top_p"`
	MinP                jsontext.Value `json:"min_p"`
	TypicalP            jsontext.Value `json:"typical_p"`
	TopNSigma           jsontext.Value `json:"top_n_sigma"`
	DynatempRange       jsontext.Value `json:"dynatemp_range"`
	DynatempExponent    jsontext.Value `json:"dynatemp_exponent"`
	XTCThreshold        jsontext.Value `json:"xtc_threshold"`
	RepeatLastN         jsontext.Value `json:"repeat_last_n"`
	DryBase             jsontext.Value `json:"dry_base"`
	DryAllowedLength    jsontext.Value `json:"dry_allowed_length"`
	DryPenaltyLastN     jsontext.Value `json:"dry_penalty_last_n"`
	DrySequenceBreakers jsontext.Value `json:"dry_sequence_breakers"`
	MirostatTau         jsontext.Value `json:"mirostat_tau"`
	MirostatEta         jsontext.Value `json:"mirostat_eta"`
	Seed                jsontext.Value `json:"seed"`
	MinKeep             jsontext.Value `json:"min_keep"`
	NKeep               jsontext.Value `json:"n_keep"`
	NDiscard            jsontext.Value `json:"n_discard"`
	NCacheReuse         jsontext.Value `json:"n_cache_reuse"`
	IDSlot              jsontext.Value `json:"id_slot"`
	TMaxPredictMS       jsontext.Value `json:"t_max_predict_ms"`
	TimingsPerToken     jsontext.Value `json:"timings_per_token"`
	ReturnProgress      jsontext.Value `json:"return_progress"`
	PostSamplingProbs   jsontext.Value `json:"post_sampling_probs"`
	StreamOptions       jsontext.Value `json:"stream_options"`
	Model               jsontext.Value `json:"model"`
}

// llamaPrompt is /completion's prompt as llama-server reads it: text;
// token ids; or one array that mixes ids and text, whose text parts are
// tokenized one by one (no special token added) and joined with the ids in
// order. An array of prompts — strings only, or arrays — may hold one
// prompt: webdraft drafts one a request. At most maxIDs ids and maxBytes
// of text in all, each id in [0, vocab).
type llamaPrompt struct {
	maxIDs, maxBytes, vocab int
	parts                   []promptPart
	set                     bool
}

// promptPart is a run of token ids, or text to tokenize.
type promptPart struct {
	ids    []int
	text   string
	isText bool
}

func (p *llamaPrompt) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	field := fieldPath(dec.StackPointer())
	want := "want text, token ids, or an array mixing both"
	switch dec.PeekKind() {
	case '"':
		text, err := readText(dec, field, p.maxBytes)
		p.parts, p.set = []promptPart{{text: text, isText: true}}, err == nil
		return err
	case '[':
	case '{':
		return invalidInput(field, "a prompt object (multimodal data) is not implemented: %s", want)
	default:
		return invalidInput(field, "%s, got %s", want, kindOf(dec))
	}
	if _, err := dec.ReadToken(); err != nil {
		return err
	}
	p.set = true
	switch dec.PeekKind() {
	case '[': // an array of prompts, the first an array
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		if err := p.readMixed(dec, field+"[0]"); err != nil {
			return err
		}
		if p.severalTexts() {
			return invalidInput(field+"[0]", "%s; an array of strings alone is several prompts", want)
		}
		if dec.PeekKind() != ']' {
			return invalidInput(field, "several prompts: webdraft drafts for one a request")
		}
		_, err := dec.ReadToken()
		return err
	case '{':
		return invalidInput(field+"[0]", "a prompt object (multimodal data) is not implemented: %s", want)
	}
	if err := p.readMixed(dec, field); err != nil {
		return err
	}
	if p.severalTexts() { // strings only: llama-server's array of prompts
		return invalidInput(field, "several prompts (an array of strings): webdraft drafts for one a request; mix token ids and text in one array, or send one string")
	}
	return nil
}

// severalTexts reports whether the prompt is two strings or more and no
// id: to llama-server, an array of prompts.
func (p *llamaPrompt) severalTexts() bool {
	return len(p.parts) > 1 && !slices.ContainsFunc(p.parts, func(part promptPart) bool { return !part.isText })
}

// readMixed reads the ids and strings of an array up to its end (its '['
// already read) into p's parts.
func (p *llamaPrompt) readMixed(dec *jsontext.Decoder, field string) error {
	ids, textBytes := p.counts()
	for i := 0; dec.PeekKind() != ']'; i++ {
		at := fmt.Sprintf("%s[%d]", field, i)
		switch dec.PeekKind() {
		case '"':
			text, err := readText(dec, at, p.maxBytes-textBytes)
			if tl := (*tooLongError)(nil); errors.As(err, &tl) {
				return &tooLongError{field, fmt.Sprintf("more than %d bytes of text", p.maxBytes)}
			} else if err != nil {
				return err
			}
			textBytes += len(text)
			p.parts = append(p.parts, promptPart{text: text, isText: true})
		case '0':
			if ids == p.maxIDs {
				return &tooLongError{field, fmt.Sprintf("more than %d token ids", p.maxIDs)}
			}
			tok, err := dec.ReadToken()
			if err != nil {
				return err
			}
			id, err := strconv.Atoi(tok.String())
			if err != nil {
				return invalidInput(at, "want a token id (an integer), got %s", clip(tok.String()))
			}
			if id < 0 || id >= p.vocab {
				return invalidInput(at, "token %d is outside the model's vocabulary [0, %d)", id, p.vocab)
			}
			ids++
			if n := len(p.parts); n > 0 && !p.parts[n-1].isText {
				p.parts[n-1].ids = append(p.parts[n-1].ids, id)
			} else {
				p.parts = append(p.parts, promptPart{ids: []int{id}})
			}
		default:
			return invalidInput(at, "want a token id or text, got %s", kindOf(dec))
		}
	}
	_, err := dec.ReadToken()
	return err
}

// counts is the ids and the bytes of text read so far.
func (p *llamaPrompt) counts() (ids, textBytes int) {
	for _, part := range p.parts {
		ids += len(part.ids)
		textBytes += len(part.text)
	}
	return ids, textBytes
}

// llamaDraft is a parsed /completion request, ready to draft.
type llamaDraft struct {
	tokens       []int
	n            int // n_predict: 0 prefills the prompt into the cache and drafts nothing
	returnTokens bool
	ignoreEOS    bool
}

func (s *Server) llamaCompletion(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		s.failLlama(w, s.unavailable())
		return
	}
	// As for /draft, the time limit counts from here: the body, the
	// tokenizer's wait and the queue are in it.
	ctx, cancel := context.WithTimeout(r.Context(), s.limits.RequestTimeout)
	defer cancel()
	d, e := s.parseLlama(ctx, w, r, st)
	if e != nil {
		s.failLlama(w, e)
		return
	}
	// n_predict 0 evaluates the prompt into the cache (llama-server's
	// meaning): a draft of one token, not returned.
	res, e := s.runDraft(ctx, r, st, scheduler.Request{Tokens: d.tokens, N: max(d.n, 1)})
	if e != nil {
		s.failLlama(w, e)
		return
	}
	draft := res.Draft[:min(d.n, len(res.Draft))]
	stopType, text := "limit", ""
	if i := slices.IndexFunc(draft, func(id int) bool { return slices.Contains(st.drafter.Stop, id) }); i >= 0 && !d.ignoreEOS {
		// llama-server keeps the end token in tokens and leaves its text
		// out of content.
		draft, stopType = draft[:i+1], "eos"
		text = st.decodeDraft(draft[:i])
	} else {
		text = st.decodeDraft(draft)
	}
	res.Draft = draft
	s.metrics.result(res)
	s.metrics.request(http.StatusOK, "")
	tokens := []int{}
	if d.returnTokens {
		tokens = draft
	}
	cfg := st.drafter.Engine.Config()
	writeJSON(w, http.StatusOK, llamaResponse{
		Content: text, Tokens: tokens, Stop: true, Model: st.drafter.Name,
		TokensPredicted: len(draft), TokensEvaluated: len(d.tokens), TokensCached: res.CachedTokens,
		GenerationSettings: map[string]any{
			"n_predict": d.n, "temperature": 0, "top_k": 1, "ignore_eos": d.ignoreEOS,
			"cache_prompt": true, "stream": false, "n_ctx": cfg.MaxPositionEmbeddings,
		},
		HasNewLine: strings.Contains(text, "\n"), StopType: stopType,
		Timings: llamaTimingsOf(res, len(draft)),
	})
}

// llamaResponse is /completion's answer, in llama-server's names.
type llamaResponse struct {
	Index              int            `json:"index"`
	Content            string         `json:"content"`
	Tokens             []int          `json:"tokens"`
	Stop               bool           `json:"stop"`
	Model              string         `json:"model"`
	TokensPredicted    int            `json:"tokens_predicted"`
	TokensEvaluated    int            `json:"tokens_evaluated"`
	GenerationSettings map[string]any `json:"generation_settings"`
	HasNewLine         bool           `json:"has_new_line"`
	Truncated          bool           `json:"truncated"`
	StopType           string         `json:"stop_type"`
	StoppingWord       string         `json:"stopping_word"`
	TokensCached       int            `json:"tokens_cached"`
	Timings            llamaTimings   `json:"timings"`
}

// llamaTimings are llama-server's timings: the prompt's positions
// computed (cache_n reused from the cache) and their time, to the first
// token; the tokens predicted and the time after the first. A rate of
// nothing is 0.
type llamaTimings struct {
	CacheN              int     `json:"cache_n"`
	PromptN             int     `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

func llamaTimingsOf(res scheduler.Result, predicted int) llamaTimings {
	rate := func(n int, millis float64) (perToken, perSecond float64) {
		if n == 0 || millis <= 0 {
			return 0, 0
		}
		return millis / float64(n), 1000 * float64(n) / millis
	}
	t := llamaTimings{CacheN: res.CachedTokens, PromptN: res.PrefillTokens, PromptMS: ms(res.Prefill), PredictedN: predicted}
	if predicted > 0 {
		t.PredictedMS = ms(res.Decode)
	}
	t.PromptPerTokenMS, t.PromptPerSecond = rate(t.PromptN, t.PromptMS)
	t.PredictedPerTokenMS, t.PredictedPerSecond = rate(t.PredictedN, t.PredictedMS)
	return t
}

// parseLlama decodes and checks a /completion body, and tokenizes its
// prompt. The prompt's ids and text are bounded as they are read, as
// /draft's are.
func (s *Server) parseLlama(ctx context.Context, w http.ResponseWriter, r *http.Request, st *state) (*llamaDraft, *apiError) {
	body, ie := requestBody(w, r)
	if ie != nil {
		return nil, draftInputError(ie, 0)
	}
	cfg := st.drafter.Engine.Config()
	req := llamaRequest{Prompt: llamaPrompt{maxIDs: cfg.MaxPositionEmbeddings, maxBytes: st.drafterText, vocab: cfg.VocabSize}}
	if err := decodeStrict(body, &req, openAINulls); err != nil {
		return nil, draftInputError(err, cfg.MaxPositionEmbeddings)
	}
	if !req.Prompt.set {
		return nil, badRequest("prompt", "required")
	}
	d := &llamaDraft{n: DefaultNPredict, returnTokens: req.ReturnTokens, ignoreEOS: req.IgnoreEOS}
	if req.NPredict != nil {
		switch n := *req.NPredict; {
		case n == -1:
		case n < 0 || n > MaxN:
			return nil, badRequest("n_predict", fmt.Sprintf("n_predict is %d; want -1 (the default, %d tokens) or 0…%d", n, DefaultNPredict, MaxN))
		default:
			d.n = n
		}
	}
	if req.Stream {
		return nil, badRequest("stream", "streaming is not implemented: a draft comes whole; leave stream out or false")
	}
	if e := checkGreedy(&req); e != nil {
		return nil, e
	}
	if e := checkNeutral(&req); e != nil {
		return nil, e
	}
	tok := st.drafter.Tokenizer
	for _, part := range req.Prompt.parts {
		if part.isText && tok == nil {
			return nil, badRequest("prompt", "this model has no tokenizer: give the prompt as token ids")
		}
	}
	tokens := []int{}
	encode := func() {
		for _, part := range req.Prompt.parts {
			if part.isText {
				tokens = append(tokens, tok.Encode(part.text)...)
			} else {
				tokens = append(tokens, part.ids...)
			}
		}
	}
	if slices.ContainsFunc(req.Prompt.parts, func(p promptPart) bool { return p.isText }) {
		if e := s.encode(ctx, r, st, encode); e != nil {
			return nil, e
		}
	} else {
		encode()
	}
	if len(tokens) == 0 {
		return nil, badRequest("prompt", "the prompt is empty")
	}
	if i := outsideVocab(tokens, cfg.VocabSize); i >= 0 {
		return nil, badRequest("prompt", fmt.Sprintf("its text encodes to token %d, outside the model's vocabulary [0, %d)", tokens[i], cfg.VocabSize))
	}
	d.tokens = tokens
	return d, nil
}

// checkGreedy refuses sampling: the drafter drafts its greedy tokens.
// llama-server samples greedily at temperature ≤ 0, and whatever the
// temperature with top_k 1 among its samplers; left out, the temperature
// is webdraft's server default, greedy (as a llama-server started with
// --temp 0).
func checkGreedy(req *llamaRequest) *apiError {
	topKSampler := true
	if len(req.Samplers) > 0 && req.Samplers.Kind() != 'n' {
		var names []string
		var chars string
		switch {
		case decodeStrict(bytes.NewReader(req.Samplers), &names, noNulls) == nil:
			topKSampler = slices.Contains(names, "top_k")
		case decodeStrict(bytes.NewReader(req.Samplers), &chars, noNulls) == nil:
			topKSampler = strings.ContainsRune(chars, 'k')
		default:
			return badRequest("samplers", "want an array of sampler names or a string of their letters")
		}
	}
	if req.Temperature == nil || *req.Temperature <= 0 {
		return nil
	}
	if req.TopK != nil && *req.TopK == 1 && topKSampler {
		return nil
	}
	return badRequest("temperature", fmt.Sprintf("%v samples, and webdraft drafts greedily: send 0, or top_k 1", *req.Temperature))
}

// checkNeutral refuses a field that would change the draft or the answer's
// shape, unless it holds its neutral value.
func checkNeutral(req *llamaRequest) *apiError {
	for _, f := range []struct {
		name    string
		v       *float64
		neutral float64
	}{
		{"repeat_penalty", req.RepeatPenalty, 1}, {"presence_penalty", req.PresencePenalty, 0},
		{"frequency_penalty", req.FrequencyPenalty, 0}, {"dry_multiplier", req.DryMultiplier, 0},
		{"xtc_probability", req.XTCProbability, 0},
	} {
		if f.v != nil && *f.v != f.neutral {
			return badRequest(f.name, fmt.Sprintf("%v would change the draft: leave it out or %v", *f.v, f.neutral))
		}
	}
	for _, f := range []struct {
		name     string
		v        *int
		neutral  int
		because  string
		neutrals string
	}{
		{"n_probs", req.NProbs, 0, "token probabilities are not implemented", "0"},
		{"mirostat", req.Mirostat, 0, "mirostat samples", "0"},
		{"n_indent", req.NIndent, 0, "indentation rules are not implemented", "0"},
		{"n_cmpl", req.NCmpl, 1, "webdraft drafts once a request", "1"},
		{"n", req.N, 1, "webdraft drafts once a request", "1"},
	} {
		if f.v != nil && *f.v != f.neutral {
			return badRequest(f.name, fmt.Sprintf("%d: %s; leave it out or %s", *f.v, f.because, f.neutrals))
		}
	}
	for _, f := range []struct {
		name, because string
		raw           jsontext.Value
	}{
		{"stop", "stop strings are not implemented (the draft is token ids)", req.Stop},
		{"logit_bias", "logit_bias is not implemented", req.LogitBias},
		{"grammar", "grammars are not implemented", req.Grammar},
		{"response_fields", "the response has all its fields", req.ResponseFields},
		{"lora", "LoRA adapters are not implemented", req.Lora},
	} {
		if !neutralValue(f.raw) {
			return badRequest(f.name, f.because+": leave it out or empty")
		}
	}
	if len(req.JSONSchema) > 0 && req.JSONSchema.Kind() != 'n' { // {} too: it asks for any JSON
		return badRequest("json_schema", "JSON schemas are not implemented: leave it out")
	}
	return nil
}

// neutralValue reports whether a raw field is absent, null, "", [] or {}.
func neutralValue(v jsontext.Value) bool {
	if len(v) == 0 {
		return true
	}
	c := v.Clone()
	if c.Compact() != nil {
		return false
	}
	switch string(c) {
	case "null", `""`, "[]", "{}":
		return true
	}
	return false
}

// failLlama answers an error in llama-server's shape, {"error": {"code":
// status, "message", "type"}}; the request is counted by webdraft's own
// code.
func (s *Server) failLlama(w http.ResponseWriter, e *apiError) {
	s.metrics.request(e.status, e.code)
	errorHeaders(w, e.status)
	writeJSON(w, e.status, map[string]any{"error": map[string]any{"code": e.status, "message": e.message, "type": llamaErrorType(e)}})
}

// llamaErrorType is llama-server's type of an error: its types where it
// has one, invalid_request_error for the other client errors.
func llamaErrorType(e *apiError) string {
	switch {
	case e.code == "context_too_large":
		return "exceed_context_size_error"
	case e.status == http.StatusUnauthorized:
		return "authentication_error"
	case e.status == http.StatusForbidden:
		return "permission_error"
	case e.status == http.StatusNotFound:
		return "not_found_error"
	case e.status == http.StatusNotImplemented:
		return "not_supported_error"
	case e.status == http.StatusTooManyRequests, e.status == http.StatusServiceUnavailable:
		return "unavailable_error"
	case e.status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// isLlamaRoute reports whether path is llama-server's API: its errors take
// llama-server's shape.
func isLlamaRoute(path string) bool { return path == "/completion" }
