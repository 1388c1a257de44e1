// Package server is webdraft's HTTP API (docs/reference.md, "HTTP API"):
// POST /draft, the drafter an outside verifier calls; the OpenAI-compatible
// API, served by speculative decoding with a target in the same process;
// GET /health; GET /metrics in Prometheus' format. Drafts run on a
// scheduler (continuous batching, prefix cache) over the drafter's engine,
// generations on a speculative.Generator over both engines; the server
// never sees a kernel.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"webdraft/engine"
	"webdraft/scheduler"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/web"
)

// Limits of a /draft request.
const (
	DefaultN     = 16
	MaxN         = 64
	MaxBodyBytes = 4 << 20
	retryAfter   = "1" // seconds, on 429 and 503
)

// Model is one model the server runs.
type Model struct {
	Name      string
	Engine    engine.Engine
	Tokenizer *tokenizer.Tokenizer // nil: the model takes token ids only
	// Stop are the tokens that end a generation (the config's
	// eos_token_id, the tokenizer's end-of-text and end-of-turn).
	Stop []int
}

// Config is what Run serves.
type Config struct {
	Drafter Model
	// Target, when set, verifies the drafter's drafts behind the
	// OpenAI-compatible API; without one that API answers 404.
	Target      *Model
	Scheduler   scheduler.Options
	Speculative speculative.Options
}

// Server serves the API. It answers 503 until Run has made it ready.
type Server struct {
	log      *slog.Logger
	metrics  *metrics
	apiKey   string
	ready    atomic.Pointer[state]
	sessions sessionLogs // the live page's sessions' events
}

type state struct {
	drafter Model
	target  *Model
	sched   *scheduler.Scheduler
	gen     *speculative.Generator // nil without a target
	started time.Time
}

// New returns a server that is not ready yet; with apiKey set every
// endpoint but /health needs "Authorization: Bearer apiKey".
func New(log *slog.Logger, apiKey string) *Server {
	return &Server{log: log, metrics: newMetrics(), apiKey: apiKey}
}

// Run serves c until ctx ends; the server is ready while it runs. With a
// target, the drafter's KV cache is split between /draft and the
// generations, half each.
func (s *Server) Run(ctx context.Context, c Config) error {
	onStep := c.Scheduler.OnStep
	c.Scheduler.OnStep = func(st scheduler.StepStats) {
		s.metrics.onStep(st)
		if onStep != nil {
			onStep(st)
		}
	}
	st := &state{drafter: c.Drafter, target: c.Target, started: time.Now()}
	if c.Target != nil {
		if c.Target.Stop == nil {
			t := *c.Target
			t.Stop = tokenizer.StopIDs(t.Engine.Config().EOSTokenIDs, t.Tokenizer)
			st.target = &t
		}
		half := c.Drafter.Engine.KVCapacity() / 2
		c.Scheduler.CacheTokens, c.Speculative.DraftTokens = half, half
		onSpec := c.Speculative.OnStep
		c.Speculative.OnStep = func(ss speculative.StepStats) {
			s.metrics.onSpecStep(ss)
			if onSpec != nil {
				onSpec(ss)
			}
		}
		var err error
		if st.gen, err = speculative.New(c.Drafter.Engine, c.Target.Engine, c.Speculative); err != nil {
			return err
		}
		s.metrics.watchGenerator(st.gen)
	}
	st.sched = scheduler.New(c.Drafter.Engine, c.Scheduler)
	s.metrics.watch(st.sched)
	s.ready.Store(st)
	args := []any{"drafter", c.Drafter.Name, "backend", c.Drafter.Engine.Info().Backend, "adapter", c.Drafter.Engine.Info().Adapter}
	if c.Target != nil {
		args = append(args, "target", c.Target.Name, "k", st.gen.K())
	}
	s.log.Info("ready", args...)
	errs := make(chan error, 2)
	go func() { errs <- st.sched.Run(ctx) }()
	if st.gen != nil {
		go func() { errs <- st.gen.Run(ctx) }()
	} else {
		errs <- nil
	}
	err := errors.Join(<-errs, <-errs)
	s.ready.Store(nil)
	return err
}

// Handler routes the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /draft", s.draft)
	mux.HandleFunc("GET /health", s.health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /{$}", s.page)
	mux.Handle("GET /static/", http.StripPrefix("/static/", web.Static()))
	mux.HandleFunc("GET /ws", s.websocket)
	mux.HandleFunc("GET /sessions/{id}/events", s.sessionEvents)
	return s.authorize(mux)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		w.Header().Set("Retry-After", retryAfter)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading"})
		return
	}
	info, cfg := st.drafter.Engine.Info(), st.drafter.Engine.Config()
	h := map[string]any{
		"status": "ok", "model": st.drafter.Name, "backend": info.Backend, "adapter": info.Adapter,
		"vocab_size": cfg.VocabSize, "max_context": cfg.MaxPositionEmbeddings,
	}
	if st.target != nil {
		h["target"], h["k"] = st.target.Name, st.gen.K()
	}
	writeJSON(w, http.StatusOK, h)
}

// draftRequest is the body of POST /draft.
type draftRequest struct {
	Tokens   []int     `json:"tokens"`
	Text     *string   `json:"text"`
	Messages []message `json:"messages"`
	N        *int      `json:"n"`
	PMin     *float64  `json:"p_min"`   // stop drafting before a token the drafter gives less than this
	Session  string    `json:"session"` // a hint only: the prefix cache works without it
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type draftResponse struct {
	Draft         []int          `json:"draft"`
	Text          string         `json:"text"`
	CachedTokens  int            `json:"cached_tokens"`
	PrefillTokens int            `json:"prefill_tokens"`
	TimingMS      map[string]any `json:"timing_ms"`
}

func (s *Server) draft(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		s.fail(w, &apiError{http.StatusServiceUnavailable, "loading", "the model is still loading"})
		return
	}
	req, tokens, apiErr := s.parse(w, r, st)
	if apiErr != nil {
		s.fail(w, apiErr)
		return
	}
	n := DefaultN
	if req.N != nil {
		n = *req.N
	}
	var pMin float64
	if req.PMin != nil {
		pMin = *req.PMin
	}
	res, err := st.sched.Submit(r.Context(), scheduler.Request{Tokens: tokens, N: n, PMin: pMin})
	if err != nil {
		s.fail(w, s.schedulerError(err))
		return
	}
	var text string
	if tok := st.drafter.Tokenizer; tok != nil {
		if text, err = tok.Decode(res.Draft); err != nil {
			text = "" // ids past the tokenizer's vocabulary (a model with a larger one)
		}
	}
	s.metrics.result(res)
	s.metrics.request(http.StatusOK, "")
	writeJSON(w, http.StatusOK, draftResponse{
		Draft: res.Draft, Text: text, CachedTokens: res.CachedTokens, PrefillTokens: res.PrefillTokens,
		TimingMS: map[string]any{"queue": ms(res.Queue), "prefill": ms(res.Prefill), "decode": ms(res.Decode)},
	})
}

// parse decodes and validates a request body into the context tokens.
func (s *Server) parse(w http.ResponseWriter, r *http.Request, st *state) (*draftRequest, []int, *apiError) {
	body := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	var req draftRequest
	if err := dec.Decode(&req); err != nil {
		return nil, nil, decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, badRequest("body", "trailing data after the JSON object")
	}
	given := 0
	for _, set := range []bool{req.Tokens != nil, req.Text != nil, req.Messages != nil} {
		if set {
			given++
		}
	}
	if given != 1 {
		return nil, nil, badRequest("tokens", "give exactly one of \"tokens\", \"text\" and \"messages\"")
	}
	if req.N != nil && (*req.N < 1 || *req.N > MaxN) {
		return nil, nil, badRequest("n", fmt.Sprintf("n is %d; want 1…%d", *req.N, MaxN))
	}
	if req.PMin != nil && !(*req.PMin >= 0 && *req.PMin <= 1) {
		return nil, nil, badRequest("p_min", fmt.Sprintf("p_min is %v; want 0…1", *req.PMin))
	}
	cfg := st.drafter.Engine.Config()
	var tokens []int
	field := "tokens"
	if req.Tokens == nil && st.drafter.Tokenizer == nil {
		f := "text"
		if req.Messages != nil {
			f = "messages"
		}
		return nil, nil, badRequest(f, "this model has no tokenizer: give \"tokens\"")
	}
	switch {
	case req.Tokens != nil:
		tokens = req.Tokens
	case req.Text != nil:
		field = "text"
		if *req.Text == "" {
			return nil, nil, badRequest("text", "text is empty")
		}
		tokens = st.drafter.Tokenizer.Encode(*req.Text)
	default:
		field = "messages"
		if len(req.Messages) == 0 {
			return nil, nil, badRequest("messages", "messages is empty")
		}
		msgs := make([]tokenizer.Message, len(req.Messages))
		for i, m := range req.Messages {
			switch m.Role {
			case "system", "user", "assistant":
			default:
				return nil, nil, badRequest(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("role %q: want system, user or assistant", m.Role))
			}
			msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		prompt, err := st.drafter.Tokenizer.ApplyChatTemplate(msgs, true, true)
		if err != nil {
			return nil, nil, badRequest("messages", err.Error())
		}
		tokens = st.drafter.Tokenizer.Encode(prompt)
	}
	if len(tokens) == 0 {
		return nil, nil, badRequest(field, field+" is empty")
	}
	for i, t := range tokens {
		if t < 0 || t >= cfg.VocabSize {
			where := field
			if field == "tokens" {
				where = fmt.Sprintf("tokens[%d]", i)
			}
			return nil, nil, badRequest(where, fmt.Sprintf("token %d is outside the model's vocabulary [0, %d)", t, cfg.VocabSize))
		}
	}
	return &req, tokens, nil
}

// apiError is an error response: {"error": {"code", "message"}}.
type apiError struct {
	status  int
	code    string
	message string
}

// badRequest is a 400 whose message starts with the offending field's path.
func badRequest(field, msg string) *apiError {
	return &apiError{http.StatusBadRequest, "invalid_request", field + ": " + msg}
}

func decodeError(err error) *apiError {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return &apiError{http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body: larger than %d bytes", tooBig.Limit)}
	case errors.As(err, &syntax):
		return badRequest("body", fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err))
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return badRequest(field, fmt.Sprintf("want %s, got JSON %s", typ.Type, typ.Value))
	case errors.Is(err, io.EOF):
		return badRequest("body", "empty body: want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("body", "malformed JSON: unexpected end")
	}
	// encoding/json reports unknown fields as `json: unknown field "x"`.
	msg := err.Error()
	const prefix = "json: unknown field "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		name, _ := strconv.Unquote(msg[len(prefix):])
		return badRequest(name, "unknown field")
	}
	return badRequest("body", msg)
}

func (s *Server) schedulerError(err error) *apiError {
	switch {
	case errors.Is(err, scheduler.ErrTooLarge):
		return &apiError{http.StatusRequestEntityTooLarge, "context_too_large", err.Error()}
	case errors.Is(err, scheduler.ErrOverloaded):
		return &apiError{http.StatusTooManyRequests, "overloaded", "too many requests waiting; retry shortly"}
	case errors.Is(err, scheduler.ErrClosed):
		return &apiError{http.StatusServiceUnavailable, "shutting_down", "the server is shutting down"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &apiError{499, "client_closed", "the client went away"}
	}
	s.log.Error("draft failed", "err", err)
	return &apiError{http.StatusInternalServerError, "internal", "drafting failed: " + err.Error()}
}

func (s *Server) fail(w http.ResponseWriter, e *apiError) {
	s.metrics.request(e.status, e.code)
	if e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfter)
	}
	writeJSON(w, e.status, map[string]any{"error": map[string]string{"code": e.code, "message": e.message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client is gone: nothing to do
}

// ms rounds a duration to microseconds, in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
