// Package server is webdraft's HTTP API (docs/reference.md, "HTTP API"):
// POST /draft, the drafter an outside verifier calls, and POST
// /completion, the same drafts in llama-server's native API (llama.cpp's
// remote drafter calls it); the OpenAI-compatible API, served by
// speculative decoding with a target in the same process; GET /health;
// GET /metrics in Prometheus' format. Drafts run on a scheduler
// (continuous batching, prefix cache) over the drafter's engine,
// generations on a speculative.Generator over both engines; the server
// never sees a kernel.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"webdraft/engine"
	"webdraft/internal/jobqueue"
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
	// Files, when set, is the model's folder, which the page can fetch to
	// run the model in the browser (/models/).
	Files *ModelFiles
	// Reopen, when set, opens a new engine for the model after Engine
	// faulted (engine.ErrFault); the server has closed the broken one
	// and owns the new one. Without it a fault ends Server.Run.
	Reopen func(ctx context.Context) (engine.Engine, error)
}

// Config is what Run serves.
type Config struct {
	Drafter Model
	// Target, when set, verifies the drafter's drafts behind the
	// OpenAI-compatible API; without one that API answers 404.
	Target *Model
	// Head, when set with Target, drafts the generations in Drafter's
	// place: an EAGLE-3 head over Target's engine (engine.Head), which
	// reads its features. Drafter still serves /draft (an outside
	// verifier sends no features); where Head has Files the page runs the
	// head over the target in its in-browser mode, and over the features
	// each draft request carries in edge drafting. After a fault of
	// either, the target and the head are reopened together, the target
	// first: Head's Reopen opens (or hands out) a head over the engine
	// Target's Reopen returned last.
	Head        *Model
	Scheduler   scheduler.Options
	Speculative speculative.Options
	// Adaptive makes the API's generations that set neither a seed nor
	// speculative.k adaptive (speculative.Request.Adaptive): each runs the
	// target alone where its speculation is measured not to pay.
	Adaptive bool
	// Warmup runs each shape the default requests take once before the
	// server reports ready (warmup.go), again after each recovery: on a
	// GPU the first run of a shape builds its pipelines.
	Warmup bool
}

// Options configure a Server; the zero value is an open server with the
// default limits and no CORS.
type Options struct {
	// APIKey, when set, is required on every endpoint but /health (auth.go).
	APIKey string
	Limits Limits
	// CORSOrigins are the origins whose pages may call the API and open
	// the websocket ("*": any); each must pass CheckOrigin. None: CORS off
	// (cors.go).
	CORSOrigins []string
	// SpecMetrics adds each generation's speculation to its /v1/*
	// response, as metrics.speculative_decoding (vLLM's
	// --per-request-spec-decode-metrics); the zero value adds nothing.
	SpecMetrics SpecMetrics
}

// Server serves the API. It answers 503 until Run has made it ready.
type Server struct {
	log      *slog.Logger
	metrics  *metrics
	apiKey   string
	limits   Limits
	origins  origins
	spec     SpecMetrics
	ready    atomic.Pointer[state]
	fault    atomic.Pointer[faultState] // set while the server recovers from an engine fault
	warming  atomic.Bool                // set while a state warms up (warmup.go)
	sessions sessionLogs                // the live page's sessions' events
	open     sessionSlots               // the live page's sessions open, in all and by client
	conns    atomic.Int64               // connections open on Listener's listener
}

type state struct {
	drafter Model
	target  *Model
	head    *Model // Config.Head: drafts the generations in drafter's place
	sched   *scheduler.Scheduler
	gen     *speculative.Generator // nil without a target
	browser *browserFiles          // the pair for the page's in-browser engine
	// adaptive: the API's generations that leave the seed and k to the
	// server are adaptive (Config.Adaptive).
	adaptive bool
	warmup   bool // Config.Warmup
	started  time.Time
	// drafterText and targetText bound a request's text, in bytes, by
	// the models' contexts (textBound): longer cannot fit.
	drafterText, targetText int
	encodeSlots             chan struct{} // tokenizations at once (encode)
}

// drafts is the model that drafts the generations: the head, else the
// drafter.
func (st *state) drafts() *Model {
	if st.head != nil {
		return st.head
	}
	return &st.drafter
}

// genGauges are the generator's gauges, zero without a target.
func (st *state) genGauges() speculative.Gauges {
	if st.gen == nil {
		return speculative.Gauges{}
	}
	return st.gen.Gauges()
}

// kvUsage is the share of the fullest KV budget that running requests
// reserve: /draft's, and with a target the generations' in each model.
func (st *state) kvUsage() float64 {
	share := func(used, budget int64) float64 {
		if budget <= 0 {
			return 0
		}
		return min(float64(used)/float64(budget), 1)
	}
	g := st.genGauges() // zero budgets without a target
	return max(share(st.sched.Gauges().ReservedTokens, int64(st.sched.CacheBudget())),
		share(g.TargetReserved, g.TargetBudget), share(g.DraftReserved, g.DraftBudget))
}

// cacheLayout is the KV block size and the blocks of the cache that the
// OpenAI-compatible API's requests reuse (the target's, for the
// generations), or /draft's without a target.
func (st *state) cacheLayout() (blockSize, blocks int) {
	if st.gen != nil {
		blockSize = engine.KVBlockSize(st.target.Engine)
		return blockSize, int(st.gen.Gauges().TargetBudget) / blockSize
	}
	blockSize = engine.KVBlockSize(st.drafter.Engine)
	return blockSize, st.sched.CacheBudget() / blockSize
}

// New returns a server that is not ready yet, with the default limits;
// with apiKey set every endpoint but /health needs "Authorization: Bearer
// apiKey".
func New(log *slog.Logger, apiKey string) *Server {
	return NewWithOptions(log, Options{APIKey: apiKey})
}

// NewWithOptions returns a server that is not ready yet, configured by o.
func NewWithOptions(log *slog.Logger, o Options) *Server {
	s := &Server{log: log, metrics: newMetrics(), apiKey: o.APIKey, limits: o.Limits.withDefaults(), origins: newOrigins(o.CORSOrigins), spec: o.SpecMetrics}
	s.metrics.watchServer(s)
	s.metrics.watchState(s.ready.Load)
	s.metrics.watchProtocol(s.ready.Load)
	return s
}

// Run serves c until ctx ends; the server is ready while it runs. With a
// target, the drafter's KV cache is split between /draft and the
// generations, half each. An engine fault (engine.ErrFault: a GPU error,
// a lost device) does not end it: the requests the fault met fail with
// 503, /health answers 503 "recovering", the broken engines are replaced
// through their models' Reopen, and serving resumes (recovery.go). A fault
// with no Reopen to recover through ends Run with the fault.
func (s *Server) Run(ctx context.Context, c Config) error {
	onStep := c.Scheduler.OnStep
	c.Scheduler.OnStep = func(st scheduler.StepStats) {
		if !s.warming.Load() { // the warm-up's steps are not the clients'
			s.metrics.onStep(st)
		}
		if onStep != nil {
			onStep(st)
		}
	}
	if c.Target != nil {
		onSpec := c.Speculative.OnStep
		c.Speculative.OnStep = func(ss speculative.StepStats) {
			if !s.warming.Load() {
				s.metrics.onSpecStep(ss)
			}
			if onSpec != nil {
				onSpec(ss)
			}
		}
	}
	rec := &recovery{s: s}
	defer rec.closeOpened()
	for {
		st, err := s.newState(c)
		if err != nil {
			return err
		}
		err = s.serve(ctx, st)
		if ctx.Err() != nil || !errors.Is(err, engine.ErrFault) {
			return err
		}
		if c, err = rec.recover(ctx, c, err); err != nil || ctx.Err() != nil {
			return err
		}
	}
}

// newState builds what serves c: the scheduler over the drafter, the
// generator over both models, the page's files.
func (s *Server) newState(c Config) (*state, error) {
	st := &state{drafter: c.Drafter, target: c.Target, head: c.Head, adaptive: c.Adaptive, warmup: c.Warmup, started: time.Now(), encodeSlots: newEncodeSlots()}
	st.drafterText = textBound(c.Drafter.Tokenizer, c.Drafter.Engine.Config().MaxPositionEmbeddings)
	if st.drafter.Stop == nil {
		st.drafter.Stop = tokenizer.StopIDs(c.Drafter.Engine.Config().EOSTokenIDs, c.Drafter.Tokenizer)
	}
	if c.Target != nil {
		if c.Target.Stop == nil {
			t := *c.Target
			t.Stop = tokenizer.StopIDs(t.Engine.Config().EOSTokenIDs, t.Tokenizer)
			st.target = &t
		}
		drafts := c.Drafter.Engine
		if c.Head != nil {
			// the drafter's cache is /draft's alone, the head's the generations'
			drafts = c.Head.Engine
		} else {
			half := c.Drafter.Engine.KVCapacity() / 2
			c.Scheduler.CacheTokens, c.Speculative.DraftTokens = half, half
		}
		var err error
		if st.gen, err = speculative.New(drafts, c.Target.Engine, c.Speculative); err != nil {
			return nil, err
		}
		s.metrics.watchGenerator(st.gen)
		st.targetText = textBound(st.target.Tokenizer, st.maxContext())
	}
	var target, head *ModelFiles
	if c.Target != nil {
		target = c.Target.Files
	}
	if c.Head != nil {
		head = c.Head.Files
	}
	browser, err := newBrowserFiles(c.Drafter.Files, target, head)
	if err != nil {
		return nil, err
	}
	st.browser = browser
	st.sched = scheduler.New(c.Drafter.Engine, c.Scheduler)
	return st, nil
}

// serve runs st's scheduler and generator, warms them up (st.warmup),
// makes st the server's state and serves until ctx ends or one of them
// faults; a fault stops the other too, its requests failing with the
// fault.
func (s *Server) serve(ctx context.Context, st *state) error {
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	errs := make(chan error, 2)
	run := func(loop func(context.Context) error) {
		err := loop(runCtx)
		if errors.Is(err, engine.ErrFault) {
			s.faulted(err)
			stop(err)
		}
		errs <- err
	}
	go run(st.sched.Run)
	if st.gen != nil {
		go run(st.gen.Run)
	} else {
		errs <- nil
	}
	if st.warmup {
		if err := s.warm(runCtx, st); err != nil && runCtx.Err() == nil {
			s.log.Warn("warm-up failed: serving without it", "err", err)
		}
	}
	if runCtx.Err() == nil {
		s.fault.Store(nil)
		s.ready.Store(st)
		args := []any{"drafter", st.drafter.Name, "backend", st.drafter.Engine.Info().Backend, "adapter", st.drafter.Engine.Info().Adapter}
		if st.target != nil {
			args = append(args, "target", st.target.Name, "k", st.gen.K())
		}
		s.log.Info("ready", args...)
	}
	err := errors.Join(<-errs, <-errs)
	s.ready.Store(nil)
	return err
}

// Handler routes the API. Every response carries X-Content-Type-Options:
// nosniff, and every error is JSON in its route's shape: OpenAI's under
// /v1/, the server's own elsewhere — a path or method no route takes
// included. Around the routes, outermost first: CORS (off unless
// configured), the spare connections' /health-only rule, the body and
// write deadlines (limits.go), the API key.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /draft", s.draft)
	mux.HandleFunc("POST /completion", s.llamaCompletion)
	mux.HandleFunc("GET /health", s.health)
	mux.Handle("GET /metrics", s.jsonErrors(promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{})))
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /{$}", s.page)
	mux.Handle("GET /static/", s.jsonErrors(http.StripPrefix("/static/", filesOnly(web.Static()))))
	mux.HandleFunc("GET /ws", s.websocket)
	mux.HandleFunc("GET /models/index.json", s.modelsIndex)
	mux.HandleFunc("GET /models/{dir}/{name}", s.modelFileHandler)
	mux.Handle("GET /wasm/", http.StripPrefix("/wasm", s.wasmFiles()))
	mux.HandleFunc("GET /sessions/{id}/events", s.sessionEvents)
	routed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := mux.Handler(r); pattern == "" {
			s.noRoute(w, r, h)
			return
		}
		mux.ServeHTTP(w, r)
	})
	inner := s.cors(s.spareOnly(s.bodyDeadline(s.writeDeadline(s.authorize(routed)))))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		inner.ServeHTTP(w, r)
	})
}

// filesOnly serves the embedded page's files and nothing else: a path
// that names a folder (the static root, say) is 404, not a listing.
// web.Static serves an embedded file system, so no path reaches the
// disk.
func filesOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// noRoute answers a request no route takes: the mux's own answer (404,
// or 405 with Allow) as a JSON error.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, h http.Handler) {
	rec := &headerRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	where := clip(r.Method + " " + r.URL.Path)
	status, code, msg := http.StatusNotFound, "not_found", fmt.Sprintf("%s: no such route (docs/reference.md, \"HTTP API\")", where)
	if rec.status == http.StatusMethodNotAllowed {
		allow := rec.header.Get("Allow")
		w.Header().Set("Allow", allow)
		status, code, msg = rec.status, "method_not_allowed", fmt.Sprintf("%s: the method is not allowed here; allowed: %s", where, allow)
	}
	s.failRoute(w, r, status, code, msg)
}

// failRoute answers an error in the shape of r's route: OpenAI's under
// /v1/, llama-server's on /completion, the server's own elsewhere.
func (s *Server) failRoute(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if isLlamaRoute(r.URL.Path) {
		s.failLlama(w, &apiError{status, code, msg})
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		typ := "invalid_request_error"
		if status >= 500 {
			typ = "server_error"
		}
		s.failOpenAI(w, &openAIError{status, typ, "", code, msg})
		return
	}
	s.fail(w, &apiError{status, code, msg})
}

// headerRecorder keeps what a handler sets — headers and status — and
// drops its body.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header { return h.header }

func (h *headerRecorder) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

func (h *headerRecorder) Write(b []byte) (int, error) {
	h.WriteHeader(http.StatusOK)
	return len(b), nil
}

// jsonErrors makes next's plain-text errors (the file server's 404, the
// metrics handler's 500) JSON errors in the server's shape; its other
// answers pass as they are.
func (s *Server) jsonErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&errorRewriter{ResponseWriter: w, s: s, r: r}, r)
	})
}

// errorRewriter passes a response through unless its status is an error:
// then it answers with a JSON error of that status and drops the body.
type errorRewriter struct {
	http.ResponseWriter
	s         *Server
	r         *http.Request
	wrote     bool
	rewriting bool
}

func (e *errorRewriter) WriteHeader(status int) {
	if e.wrote {
		return
	}
	e.wrote = true
	if status < 400 {
		e.ResponseWriter.WriteHeader(status)
		return
	}
	e.rewriting = true
	h := e.ResponseWriter.Header()
	for _, k := range []string{"Content-Type", "Content-Length", "Content-Encoding"} {
		h.Del(k)
	}
	e.s.failRoute(e.ResponseWriter, e.r, status, statusCode(status), fmt.Sprintf("%s: %s", clip(e.r.Method+" "+e.r.URL.Path), strings.ToLower(http.StatusText(status))))
}

func (e *errorRewriter) Write(b []byte) (int, error) {
	e.WriteHeader(http.StatusOK)
	if e.rewriting {
		return len(b), nil
	}
	return e.ResponseWriter.Write(b)
}

// statusCode is an error code for a status that has no code of its own:
// its text in snake case ("not_found").
func statusCode(status int) string {
	if t := http.StatusText(status); t != "" {
		return strings.ReplaceAll(strings.ToLower(t), " ", "_")
	}
	return "error"
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (e *errorRewriter) Unwrap() http.ResponseWriter { return e.ResponseWriter }

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		w.Header().Set("Retry-After", retryAfter)
		h := map[string]any{"status": "loading"}
		if s.warming.Load() {
			h["warming"] = true // loaded, running the warm-up (warmup.go)
		}
		if f := s.fault.Load(); f != nil {
			h = map[string]any{"status": "recovering", "error": f.err.Error(), "since": f.since.UTC().Format(time.RFC3339Nano), "faults": s.metrics.faultCount()}
		}
		writeJSON(w, http.StatusServiceUnavailable, h)
		return
	}
	info, cfg := st.drafter.Engine.Info(), st.drafter.Engine.Config()
	h := map[string]any{
		"status": "ok", "model": st.drafter.Name, "backend": info.Backend, "adapter": info.Adapter,
		"vocab_size": cfg.VocabSize, "max_context": cfg.MaxPositionEmbeddings,
	}
	if st.target != nil {
		h["target"], h["k"], h["topk"], h["draft_tokens"] = st.target.Name, st.gen.K(), st.gen.TopK(), st.gen.TreeNodes()
	}
	if st.head != nil {
		h["head"] = st.head.Name // drafts the generations; "model" serves /draft
	}
	writeJSON(w, http.StatusOK, h)
}

// draftRequest is the body of POST /draft. tokens, text and messages are
// bounded as they are read (input.go).
type draftRequest struct {
	Tokens   idList               `json:"tokens"`
	Text     boundedText          `json:"text"`
	Messages boundedList[message] `json:"messages"`
	N        *int                 `json:"n"`
	PMin     *float64             `json:"p_min"`   // stop drafting before a token the drafter gives less than this
	Session  string               `json:"session"` // a hint only: the prefix cache works without it
}

type message struct {
	Role    string  `json:"role"`
	Content *string `json:"content"` // required
}

func (m message) textBytes() int {
	if m.Content == nil {
		return len(m.Role)
	}
	return len(m.Role) + len(*m.Content)
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
		s.fail(w, s.unavailable())
		return
	}
	// The request's time limit counts from here: the body, the
	// tokenizer's wait and the queue are in it.
	ctx, cancel := context.WithTimeout(r.Context(), s.limits.RequestTimeout)
	defer cancel()
	req, tokens, apiErr := s.parse(ctx, w, r, st)
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
	res, apiErr := s.runDraft(ctx, r, st, scheduler.Request{Tokens: tokens, N: n, PMin: pMin})
	if apiErr != nil {
		s.fail(w, apiErr)
		return
	}
	s.metrics.result(res)
	s.metrics.request(http.StatusOK, "")
	writeJSON(w, http.StatusOK, draftResponse{
		Draft: res.Draft, Text: st.decodeDraft(res.Draft), CachedTokens: res.CachedTokens, PrefillTokens: res.PrefillTokens,
		TimingMS: map[string]any{"queue": ms(res.Queue), "prefill": ms(res.Prefill), "decode": ms(res.Decode)},
	})
}

// runDraft drafts req on the scheduler within ctx (the request's time
// limit): the drafting path of POST /draft and POST /completion. Nothing
// is queued for a client that has left (499); past the time limit the
// answer is a 504 naming --request-timeout.
func (s *Server) runDraft(ctx context.Context, r *http.Request, st *state, req scheduler.Request) (scheduler.Result, *apiError) {
	if e := gone(r); e != nil {
		return scheduler.Result{}, e
	}
	res, err := st.sched.Submit(ctx, req)
	if err != nil {
		if te := pastLimit(ctx, r, "the request", s.limits.RequestTimeout, "--request-timeout"); te != nil {
			err = te
		}
		return scheduler.Result{}, s.schedulerError(err)
	}
	return res, nil
}

// decodeDraft is ids decoded by the drafter's tokenizer, special tokens
// included: "" without a tokenizer, or when an id is past its vocabulary
// (a model with a larger one).
func (st *state) decodeDraft(ids []int) string {
	tok := st.drafter.Tokenizer
	if tok == nil {
		return ""
	}
	text, err := tok.Decode(ids)
	if err != nil {
		return ""
	}
	return text
}

// parse decodes and validates a request body into the context tokens.
// A context longer than the model's positions cannot be drafted from (n
// is at least 1): such token ids, text or messages are refused as they
// are read, before the rest is decoded or anything is tokenized.
func (s *Server) parse(ctx context.Context, w http.ResponseWriter, r *http.Request, st *state) (*draftRequest, []int, *apiError) {
	body, ie := requestBody(w, r)
	if ie != nil {
		return nil, nil, draftInputError(ie, 0)
	}
	cfg := st.drafter.Engine.Config()
	req := draftRequest{
		Tokens:   idList{max: cfg.MaxPositionEmbeddings},
		Text:     boundedText{max: st.drafterText},
		Messages: boundedList[message]{max: cfg.MaxPositionEmbeddings, maxBytes: st.drafterText},
	}
	if err := decodeStrict(body, &req, noNulls); err != nil {
		return nil, nil, draftInputError(err, cfg.MaxPositionEmbeddings)
	}
	given := 0
	for _, set := range []bool{req.Tokens.set, req.Text.set, req.Messages.set} {
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
	var tokens []int
	field := "tokens"
	if !req.Tokens.set && st.drafter.Tokenizer == nil {
		f := "text"
		if req.Messages.set {
			f = "messages"
		}
		return nil, nil, badRequest(f, "this model has no tokenizer: give \"tokens\"")
	}
	switch {
	case req.Tokens.set:
		tokens = req.Tokens.ids
	case req.Text.set:
		field = "text"
		if req.Text.text == "" {
			return nil, nil, badRequest("text", "text is empty")
		}
		if e := s.encode(ctx, r, st, func() { tokens = st.drafter.Tokenizer.Encode(req.Text.text) }); e != nil {
			return nil, nil, e
		}
	default:
		field = "messages"
		if len(req.Messages.items) == 0 {
			return nil, nil, badRequest("messages", "messages is empty")
		}
		msgs := make([]tokenizer.Message, len(req.Messages.items))
		for i, m := range req.Messages.items {
			switch m.Role {
			case "system", "user", "assistant":
			default:
				return nil, nil, badRequest(fmt.Sprintf("messages[%d].role", i), fmt.Sprintf("role %s: want system, user or assistant", quote(m.Role)))
			}
			if m.Content == nil {
				return nil, nil, badRequest(fmt.Sprintf("messages[%d].content", i), "required")
			}
			msgs[i] = tokenizer.Message{Role: m.Role, Content: *m.Content}
		}
		prompt, err := st.drafter.Tokenizer.ApplyChatTemplate(msgs, true, true)
		if err != nil {
			return nil, nil, badRequest("messages", err.Error())
		}
		if e := s.encode(ctx, r, st, func() { tokens = st.drafter.Tokenizer.Encode(prompt) }); e != nil {
			return nil, nil, e
		}
	}
	if len(tokens) == 0 {
		return nil, nil, badRequest(field, field+" is empty")
	}
	if i := outsideVocab(tokens, cfg.VocabSize); i >= 0 {
		where := field
		if field == "tokens" {
			where = fmt.Sprintf("tokens[%d]", i)
		}
		return nil, nil, badRequest(where, fmt.Sprintf("token %d is outside the model's vocabulary [0, %d)", tokens[i], cfg.VocabSize))
	}
	return &req, tokens, nil
}

// outsideVocab is the index of the first id outside [0, vocab), or -1.
func outsideVocab(ids []int, vocab int) int {
	for i, t := range ids {
		if t < 0 || t >= vocab {
			return i
		}
	}
	return -1
}

// encode runs a tokenization for /draft in an encode slot: a 504 when
// the request's time limit passes first, a 499 when the client leaves.
func (s *Server) encode(ctx context.Context, r *http.Request, st *state, f func()) *apiError {
	if e := gone(r); e != nil {
		return e
	}
	if err := st.encode(ctx, f); err != nil {
		if te := pastLimit(ctx, r, "the request", s.limits.RequestTimeout, "--request-timeout"); te != nil {
			return s.schedulerError(te)
		}
		return gone(r)
	}
	return nil
}

// gone is a 499 when the client has left: nothing more is worth doing.
func gone(r *http.Request) *apiError {
	if r.Context().Err() != nil {
		return &apiError{499, "client_closed", "the client went away"}
	}
	return nil
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

// draftInputError answers a refused body: a *tooLongError as a context
// past the model's positions, others as they are.
func draftInputError(err error, positions int) *apiError {
	var tl *tooLongError
	var ie *inputError
	switch {
	case errors.As(err, &tl):
		return &apiError{http.StatusRequestEntityTooLarge, "context_too_large", fmt.Sprintf("%s: past the model's %d positions", tl.Error(), positions)}
	case errors.As(err, &ie):
		code := ie.code
		if code == "unknown_field" {
			code = "invalid_request" // /draft's code for every bad field
		}
		return &apiError{ie.status, code, ie.Error()}
	}
	return &apiError{http.StatusBadRequest, "invalid_request", "body: " + clip(err.Error())}
}

// queueFull is a 429's message: which queue is full, and its bound.
func queueFull(err error, which string) string {
	size := 0
	var full *jobqueue.FullError
	if errors.As(err, &full) {
		size = full.Size
	}
	return fmt.Sprintf("%s queue is full: %d requests waiting, the most it holds (--max-queue); retry after %s s", which, size, retryAfter)
}

func (s *Server) schedulerError(err error) *apiError {
	var te *timeoutError
	switch {
	case errors.As(err, &te):
		return &apiError{http.StatusGatewayTimeout, "request_timeout", te.Error()}
	case errors.Is(err, scheduler.ErrTooLarge):
		return &apiError{http.StatusRequestEntityTooLarge, "context_too_large", err.Error()}
	case errors.Is(err, scheduler.ErrOverloaded):
		return &apiError{http.StatusTooManyRequests, "overloaded", queueFull(err, "the drafter's")}
	case errors.Is(err, engine.ErrFault):
		return &apiError{http.StatusServiceUnavailable, "engine_fault", faultMessage(err)}
	case errors.Is(err, scheduler.ErrClosed):
		if s.fault.Load() != nil {
			return s.unavailable()
		}
		return &apiError{http.StatusServiceUnavailable, "shutting_down", "the server is shutting down"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &apiError{499, "client_closed", "the client went away"}
	}
	s.log.Error("draft failed", "err", err)
	return &apiError{http.StatusInternalServerError, "internal", "drafting failed: " + err.Error()}
}

func (s *Server) fail(w http.ResponseWriter, e *apiError) {
	s.metrics.request(e.status, e.code)
	errorHeaders(w, e.status)
	writeJSON(w, e.status, map[string]any{"error": map[string]string{"code": e.code, "message": e.message}})
}

// errorHeaders are an error answer's headers: Retry-After on 429 and 503;
// on 408 (a body that did not arrive in time) the connection closes, as
// the rest of the body will not be read.
func errorHeaders(w http.ResponseWriter, status int) {
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", retryAfter)
	case http.StatusRequestTimeout:
		w.Header().Set("Connection", "close")
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client is gone: nothing to do
}

// ms rounds a duration to microseconds, in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
