package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/scheduler"
	"webdraft/server"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/weights"
)

// drainTimeout bounds how long SIGTERM waits for in-flight requests.
const drainTimeout = 30 * time.Second

// defaultQueue is --max-queue's default: the scheduler's and the
// generator's own (their Options.MaxQueue).
const defaultQueue = 256

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "serve", "[--model DIR] [--target DIR] [--k N] [--adaptive=true] [--spec-topk 1] [--spec-draft-tokens 16] [--addr 127.0.0.1:8080] [--backend auto|webgpu|cpu|reference] [--cache-mb N] [--chain-steps 8] [--warmup auto|on|off] [--api-key KEY] [--cors-origin URL]... [--per-request-spec-decode-metrics[=summary|detailed]] [limits: --max-connections N --max-queue N --body-timeout D --idle-timeout D --request-timeout D --generation-timeout D --max-sessions N --max-sessions-per-client N]")
	modelDir := fs.String("model", "", "the drafter's folder (webdraft convert output, or an HF checkpoint quantized on load), or an EAGLE-3 draft head's folder (LlamaForCausalLMEagle3: public BF16/F16/F32, quantized to int4 on load, or webdraft convert's), which then drafts the generations from the target's hidden states (and in the page: in-browser, and in edge drafting over the hidden states the server sends), the embedded drafter (or --draft-model) serving /draft; default: the embedded EAGLE-3 head (embedded:eagle3) over the embedded target, with --target or --backend reference the embedded drafter (embedded:drafter)")
	draftModelDir := fs.String("draft-model", "", "with an EAGLE-3 head drafting the generations: the drafter that serves /draft beside it (and the page's browser modes), a drafter's folder as --model takes; default: the embedded drafter (embedded:drafter)")
	targetDir := fs.String("target", "", "the target's folder, which verifies behind the OpenAI-compatible API; default: the embedded target when --model is not given or names an EAGLE-3 head, else none")
	k := fs.Int("k", 0, kUsage+" (a request's speculative.k overrides it)")
	adaptive := fs.Bool("adaptive", true, "an API generation that sets no speculative.k (nor, sampling a token tree, seed) runs the target alone where its speculative steps are measured not to pay, speculating again every 256 tokens to be weighed anew (false: it speculates throughout)")
	tree := treeFlagsVar(fs, true)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	backendFlag := fs.String("backend", "auto", backendUsage)
	cacheMB := fs.Int("cache-mb", 512, "KV-cache memory of each model, for running and cached sequences, in MiB (an EAGLE-3 head's holds as many positions as its target's)")
	chainSteps := fs.Int("chain-steps", 8, "decode passes chained on the GPU when every request is decoding and none waits (1: one pass at a time)")
	warmup := fs.String("warmup", "auto", warmupUsage("reporting ready (the default requests' shapes: generations speculative and alone, greedy and sampled, a long prompt, four at once; /draft requests)"))
	// The key's default is read after parsing, so that --help never
	// prints it; the environment keeps it out of the process list too.
	apiKey := fs.String("api-key", "", "require Authorization: Bearer KEY on every endpoint but /health, /, /static/ (default: $WEBDRAFT_API_KEY, which keeps the key out of the process list; neither: open)")
	var corsOrigins []string
	fs.Func("cors-origin", "an origin (scheme://host[:port], or * for any) whose pages may call the API and open the websocket; repeat it or separate with commas (default: none, CORS off)", func(v string) error {
		for o := range strings.SplitSeq(v, ",") {
			o = strings.TrimSpace(o)
			if err := server.CheckOrigin(o); err != nil {
				return err
			}
			corsOrigins = append(corsOrigins, o)
		}
		return nil
	})
	specMetrics := specMetricsVar(fs)
	d := server.DefaultLimits
	maxConns := fs.Int("max-connections", d.MaxConnections, "open connections at most (keep it below ulimit -n); past it 16 more are answered GET /health only, and any more refused with 503")
	maxQueue := fs.Int("max-queue", defaultQueue, "requests waiting to start, each for /draft and for generations; past it 429 with Retry-After")
	bodyTimeout := fs.Duration("body-timeout", d.BodyTimeout, "a request's body must arrive within this, from its headers' end (else 408 and the connection closes)")
	idleTimeout := fs.Duration("idle-timeout", d.IdleTimeout, "a keep-alive connection with no new request is closed after this")
	requestTimeout := fs.Duration("request-timeout", d.RequestTimeout, "a POST /draft or /completion, queue included, is answered 504 past this")
	generationTimeout := fs.Duration("generation-timeout", d.GenerationTimeout, "a generation (/v1/*, a page run), queue included, ends with a 504 error past this")
	maxSessions := fs.Int("max-sessions", d.MaxSessions, "the live page's sessions (websockets) open at once; past it 429")
	maxSessionsPerClient := fs.Int("max-sessions-per-client", d.MaxSessionsPerClient, "the live page's sessions open at once from one client address; past it 429")
	if err := parseFlags(fs, joinFlagValue(args, specMetricsFlagName, "none", "summary", "detailed")); err != nil {
		return err
	}
	if *apiKey == "" {
		*apiKey = os.Getenv("WEBDRAFT_API_KEY")
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"max-connections", *maxConns}, {"max-queue", *maxQueue}, {"max-sessions", *maxSessions}, {"max-sessions-per-client", *maxSessionsPerClient}} {
		if c.v < 1 {
			return usagef("--%s %d: want at least 1", c.name, c.v)
		}
	}
	for _, c := range []struct {
		name string
		v    time.Duration
	}{{"body-timeout", *bodyTimeout}, {"idle-timeout", *idleTimeout}, {"request-timeout", *requestTimeout}, {"generation-timeout", *generationTimeout}} {
		if c.v <= 0 {
			return usagef("--%s %v: want a positive duration (30s, 2m)", c.name, c.v)
		}
	}
	if *cacheMB < 1 {
		return usagef("--cache-mb %d: want at least 1", *cacheMB)
	}
	if err := checkWarmup(*warmup); err != nil {
		return err
	}
	if *chainSteps < 1 || *chainSteps > maxDraft {
		return usagef("--chain-steps %d: want 1…%d", *chainSteps, maxDraft)
	}
	if isSet(fs, "k") && (*k < 1 || *k > speculative.MaxK) {
		return usagef("--k %d: want 1…%d", *k, speculative.MaxK)
	}
	if err := tree.check(); err != nil {
		return err
	}
	backend, err := parseBackend(*backendFlag)
	if err != nil {
		return err
	}
	if *draftModelDir != "" && !draftsWithHead(defaultDrafter(*modelDir, *targetDir, backend)) {
		return usagef("--draft-model %q names the drafter /draft serves beside an EAGLE-3 head, and --model %q is a drafter, which serves /draft itself", *draftModelDir, *modelDir)
	}
	if err := stopWithParent(); err != nil {
		return fmt.Errorf("asking to stop with the parent process: %w", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	limits := d
	limits.MaxConnections, limits.BodyTimeout, limits.IdleTimeout = *maxConns, *bodyTimeout, *idleTimeout
	limits.RequestTimeout, limits.GenerationTimeout = *requestTimeout, *generationTimeout
	limits.MaxSessions, limits.MaxSessionsPerClient = *maxSessions, *maxSessionsPerClient
	srv := server.NewWithOptions(e.log, server.Options{APIKey: *apiKey, Limits: limits, CORSOrigins: corsOrigins, SpecMetrics: *specMetrics})
	httpSrv := srv.HTTPServer()
	served := make(chan error, 1)
	go func() { served <- httpSrv.Serve(srv.Listener(ln)) }()
	e.log.Info("listening", "addr", ln.Addr().String(), "api_key", *apiKey != "", "cors_origins", len(corsOrigins),
		"max_connections", *maxConns, "max_queue", *maxQueue, "per_request_spec_decode_metrics", specMetrics.String())

	// Load while /health answers "loading".
	start := time.Now()
	*modelDir = defaultDrafter(*modelDir, *targetDir, backend)
	head := draftsWithHead(*modelDir)
	withTarget := *targetDir != "" || *modelDir == "" || head
	drafter, target, hp, err := openServedModels(ctx, e, *modelDir, *draftModelDir, *targetDir, withTarget, head, backend, *cacheMB)
	if err != nil {
		httpSrv.Close()
		return stoppedLoading(ctx, e, err)
	}
	defer drafter.close()
	cfg := server.Config{Drafter: drafter.model}
	if hp != nil {
		cfg.Head = &server.Model{Name: "EAGLE-3 head " + *modelDir, Engine: hp.head, Files: headFiles(*modelDir), Reopen: hp.reopen.reopen(1)}
	}
	if withTarget {
		defer target.close()
		if err := checkPair(drafter.model, target.model); err != nil {
			httpSrv.Close()
			return err
		}
		cfg.Target = &target.model
		if *k == 0 {
			*k = defaultK(target.model.Engine.Info().Backend)
		}
	}
	*k = max(*k, 1) // a drafter alone drafts n a request; its k is unused
	cfg.Scheduler = scheduler.Options{ChainSteps: *chainSteps, MaxQueue: *maxQueue}
	cfg.Speculative = speculative.Options{K: *k, TopK: *tree.topK, TreeNodes: *tree.nodes, MaxQueue: *maxQueue}
	cfg.Adaptive = *adaptive
	cfg.Warmup = warms(*warmup, cfg)
	if cfg.Target != nil {
		e.log.Info("speculation", "k", *k, "topk", *tree.topK, "draft_tokens", *tree.nodes)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(runCtx, cfg) }()
	e.log.Info("loaded", "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()))
	if cfg.Target != nil {
		e.log.Info("the live page", "url", "http://"+ln.Addr().String()+"/")
	}

	select {
	case <-ctx.Done(): // SIGTERM or interrupt: drain
	case err := <-served:
		stopRun()
		<-ran
		return fmt.Errorf("http: %w", err)
	}
	e.log.Info("shutting down: draining in-flight requests")
	drainCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	shutdownErr := httpSrv.Shutdown(drainCtx)
	stopRun()
	if err := <-ran; err != nil {
		return err
	}
	if shutdownErr != nil && !errors.Is(shutdownErr, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", shutdownErr)
	}
	e.log.Info("stopped")
	return nil
}

// warms is --warmup's choice for cfg: auto warms up where the target (or
// a drafter alone) runs on a GPU (warmsOn).
func warms(flag string, cfg server.Config) bool {
	m := cfg.Drafter
	if cfg.Target != nil {
		m = *cfg.Target
	}
	return warmsOn(flag, m.Engine.Info())
}

// warmsOn is --warmup's choice for an engine: auto warms up WebGPU on a
// GPU, whose first run of a shape builds its pipelines; the CPU engine
// builds nothing, and a software renderer's warm-up generations take
// longer than its pipelines.
func warmsOn(flag string, info engine.Info) bool {
	if flag != "auto" {
		return flag == "on"
	}
	return info.Backend == "webgpu" && !info.Software
}

// prepare builds ahead, on each engine that has any, the pipelines of
// every pass shape (engine.Prepare), and logs what it took.
func prepare(ctx context.Context, e *env, engines ...engine.Engine) error {
	start := time.Now()
	for _, eng := range engines {
		if err := engine.Prepare(ctx, eng); err != nil {
			return fmt.Errorf("preparing the pipelines of every pass shape: %w", err)
		}
	}
	e.log.Info("prepared every pass shape", "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()))
	return nil
}

// warmupUsage is --warmup's help, for serve and generate.
func warmupUsage(what string) string {
	return "before " + what + ", build the pipelines of every row count and context length a pass may have, then run each shape once untimed, so that no timed request waits while a GPU builds its pipelines: auto (on a GPU; not on the CPU engine or a software renderer, where it costs more than it saves), on, off"
}

// checkWarmup refuses a --warmup value other than auto, on and off.
func checkWarmup(v string) error {
	if !slices.Contains([]string{"auto", "on", "off"}, v) {
		return usagef("--warmup %q: want auto, on or off", v)
	}
	return nil
}

// specMetricsFlagName is vLLM's flag for per-request speculation metrics.
const specMetricsFlagName = "per-request-spec-decode-metrics"

// specMetricsVar defines --per-request-spec-decode-metrics on fs.
func specMetricsVar(fs *flag.FlagSet) *server.SpecMetrics {
	level := new(server.SpecMetrics)
	fs.Var(specMetricsFlag{level}, specMetricsFlagName, "add each generation's speculation to its /v1/* response as metrics.speculative_decoding, in vLLM's names (vLLM's flag): alone or =summary, the counts, the rates and the acceptance histogram; =detailed, each step's counts too; =none (the default), nothing")
	return level
}

// specMetricsFlag is --per-request-spec-decode-metrics: alone it means
// summary (a boolean flag's "true"); =summary, =detailed and =none name
// the level as vLLM does.
type specMetricsFlag struct{ level *server.SpecMetrics }

func (f specMetricsFlag) String() string {
	if f.level == nil { // the flag package's zero value, for its defaults
		return server.SpecMetricsNone.String()
	}
	return f.level.String()
}

func (f specMetricsFlag) Set(v string) error {
	switch v {
	case "true":
		*f.level = server.SpecMetricsSummary
	case "false":
		*f.level = server.SpecMetricsNone
	default:
		level, err := server.ParseSpecMetrics(v)
		if err != nil {
			return err
		}
		*f.level = level
	}
	return nil
}

func (f specMetricsFlag) IsBoolFlag() bool { return true }

// joinFlagValue writes "--name value" as "--name=value" when value is one
// of values: vLLM puts --per-request-spec-decode-metrics' level after a
// space, and a flag that may stand alone takes its value after "=". Args
// after "--" are left as they are.
func joinFlagValue(args []string, name string, values ...string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "-"+name || a == "--"+name) && i+1 < len(args) && slices.Contains(values, args[i+1]) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// served is a model opened for serving: its weights, engine and tokenizer.
type served struct {
	model server.Model
	close func()
}

// stoppedLoading is serve's end when loading a model failed with err: a
// stop like any other when a signal (ctx) interrupted the loading, else
// the error.
func stoppedLoading(ctx context.Context, e *env, err error) error {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		e.log.Info("stopped", "while", "loading")
		return nil
	}
	return err
}

// openServed loads the model in dir (or the embedded one named embedded),
// its tokenizer (none: it serves token ids only) and an engine with
// cacheMB of KV cache, warmed up.
func openServed(ctx context.Context, e *env, dir, embedded string, backend backendChoice, cacheMB int) (*served, error) {
	l, err := loadServed(e, dir, embedded)
	if err != nil {
		return nil, err
	}
	open := func(ctx context.Context) (engine.Engine, error) {
		eng, err := openEngine(e, l.m, backend, int64(cacheMB)<<20, 0)
		if err != nil {
			return nil, err
		}
		if err := engine.Warm(ctx, eng); err != nil {
			eng.Close()
			return nil, fmt.Errorf("%s: warm-up: %w", l.name, err)
		}
		return eng, nil
	}
	eng, err := open(ctx)
	if err != nil {
		l.m.Close()
		return nil, err
	}
	return l.served(e, eng, open, nil), nil
}

// openServedModels opens serve's drafter, and its target withTarget
// (nil without); with head, drafterDir is an EAGLE-3 head's folder and
// draftDir the drafter for /draft beside it (openServedHead).
func openServedModels(ctx context.Context, e *env, drafterDir, draftDir, targetDir string, withTarget, head bool, backend backendChoice, cacheMB int) (drafter, target *served, hp *headPair, err error) {
	switch {
	case head:
		return openServedHead(ctx, e, drafterDir, draftDir, targetDir, backend, cacheMB)
	case withTarget:
		drafter, target, err = openServedPair(ctx, e, drafterDir, targetDir, backend, cacheMB)
		return drafter, target, nil, err
	}
	drafter, err = openServed(ctx, e, drafterDir, weights.DrafterDir, backend, cacheMB)
	return drafter, nil, nil, err
}

// openServedHead opens what serve runs for an EAGLE-3 head in headDir (or
// the embedded one): the target keeping the features the head reads, the head
// over it, and the drafter in draftDir (or the embedded one) for /draft (an
// outside verifier sends no features) and the page's browser modes.
func openServedHead(ctx context.Context, e *env, headDir, draftDir, targetDir string, backend backendChoice, cacheMB int) (drafter, target *served, hp *headPair, err error) {
	t, err := loadServed(e, targetDir, weights.TargetDir)
	if err != nil {
		return nil, nil, nil, err
	}
	if hp, err = openHeadPair(e, t.m, t.name, headDir, backend, int64(cacheMB)<<20); err != nil {
		t.m.Close()
		return nil, nil, nil, err
	}
	hp.reopen = hp.reopener(t.m, backend, int64(cacheMB)<<20)
	target = t.served(e, hp.target, hp.reopen.reopen(0), func() { hp.reopen.close(); hp.close() })
	if drafter, err = openServed(ctx, e, draftDir, weights.DrafterDir, backend, cacheMB); err != nil {
		target.close()
		return nil, nil, nil, err
	}
	return drafter, target, hp, nil
}

// openServedPair loads a drafter and a target as openServed does, and
// opens their engines together (openEngines: on WebGPU, one device that
// they share, so that sampled drafts are verified on it); after a fault,
// which breaks both, the server reopens them together too (enginePair).
func openServedPair(ctx context.Context, e *env, drafterDir, targetDir string, backend backendChoice, cacheMB int) (drafter, target *served, err error) {
	d, err := loadServed(e, drafterDir, weights.DrafterDir)
	if err != nil {
		return nil, nil, err
	}
	t, err := loadServed(e, targetDir, weights.TargetDir)
	if err != nil {
		d.m.Close()
		return nil, nil, err
	}
	pair := &enginePair{open: func(ctx context.Context) ([]engine.Engine, error) {
		kv := int64(cacheMB) << 20
		engs, err := openEngines(e, []*checkpoint.Model{d.m, t.m}, backend, []int64{kv, kv}, 0)
		if err != nil {
			return nil, err
		}
		for i, l := range []*loaded{d, t} {
			if err := engine.Warm(ctx, engs[i]); err != nil {
				for _, eng := range engs {
					eng.Close()
				}
				return nil, fmt.Errorf("%s: warm-up: %w", l.name, err)
			}
		}
		return engs, nil
	}}
	engs, err := pair.open(ctx)
	if err != nil {
		d.m.Close()
		t.m.Close()
		return nil, nil, err
	}
	return d.served(e, engs[0], pair.reopen(0), nil), t.served(e, engs[1], pair.reopen(1), pair.close), nil
}

// loaded is a model loaded for serving and its tokenizer (nil: it
// serves token ids only).
type loaded struct {
	m             *checkpoint.Model
	name          string
	tok           *tokenizer.Tokenizer
	dir, embedded string
}

// loadServed loads the model in dir (or the embedded one named embedded)
// and its tokenizer.
func loadServed(e *env, dir, embedded string) (*loaded, error) {
	m, name, err := loadModelOr(dir, embedded)
	if err != nil {
		return nil, err
	}
	tok, err := modelTokenizer(m)
	switch {
	case errors.Is(err, tokenizer.ErrNoTokenizer):
		e.log.Warn("serving token ids only", "model", name, "reason", err)
	case err != nil:
		m.Close()
		return nil, err
	}
	return &loaded{m: m, name: name, tok: tok, dir: dir, embedded: embedded}, nil
}

// served is l served by eng, reopened by reopen after a fault; its close
// closes eng, then also (when set), then the model.
func (l *loaded) served(e *env, eng engine.Engine, reopen func(context.Context) (engine.Engine, error), also func()) *served {
	e.log.Info("model", "name", l.name, "cache_tokens", eng.KVCapacity())
	return &served{
		// After an engine fault the server reopens the engine from the
		// weights in memory (the folder is not read again).
		model: server.Model{Name: l.name, Engine: eng, Tokenizer: l.tok, Files: modelFiles(l.dir, l.embedded), Reopen: reopen},
		close: func() {
			eng.Close()
			if also != nil {
				also()
			}
			l.m.Close()
		},
	}
}

// enginePair opens a drafter's and a target's engines together and hands
// them to the two models' Reopen one at a time: after a fault the server
// closes each broken engine and reopens it (server/recovery.go) — both,
// engines on one device breaking together — and the pair opened for the
// first is the one the second gets.
type enginePair struct {
	open  func(ctx context.Context) ([]engine.Engine, error)
	mu    sync.Mutex
	spare [2]engine.Engine // opened, not handed out yet
}

// reopen is model i's Reopen (0 the drafter, 1 the target).
func (p *enginePair) reopen(i int) func(context.Context) (engine.Engine, error) {
	return func(ctx context.Context) (engine.Engine, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if eng := p.spare[i]; eng != nil {
			p.spare[i] = nil
			return eng, nil
		}
		if eng := p.spare[1-i]; eng != nil { // a pair left half taken: replaced whole
			eng.Close()
			p.spare[1-i] = nil
		}
		engs, err := p.open(ctx)
		if err != nil {
			return nil, err
		}
		p.spare[1-i] = engs[1-i]
		return engs[i], nil
	}
}

// close closes an engine opened and never handed out.
func (p *enginePair) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, eng := range p.spare {
		if eng != nil {
			eng.Close()
			p.spare[i] = nil
		}
	}
}

// modelFiles is where the page's in-browser engine fetches the model
// from: the embedded folder, or dir within its parent (so that a folder
// beside it, whose embedding the model may use, is there too).
func modelFiles(dir, embedded string) *server.ModelFiles {
	if dir == "" {
		return &server.ModelFiles{FS: weights.FS(), Dir: embedded}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil // the page then runs on the server only
	}
	return &server.ModelFiles{FS: os.DirFS(filepath.Dir(abs)), Dir: filepath.Base(abs)}
}

// headFiles is where the page's in-browser engine fetches an EAGLE-3
// head from: the embedded folder, or dir's (modelFiles).
func headFiles(dir string) *server.ModelFiles {
	if dir == embeddedHead {
		return modelFiles("", weights.HeadDir)
	}
	return modelFiles(dir, "")
}

// checkPair refuses a drafter and a target whose token ids do not mean
// the same: vocabularies of another size, or tokenizers that differ.
func checkPair(d, t server.Model) error {
	dv, tv := d.Engine.Config().VocabSize, t.Engine.Config().VocabSize
	if dv != tv {
		return fmt.Errorf("the drafter %s has a vocabulary of %d tokens and the target %s one of %d: a pair must share its vocabulary", d.Name, dv, t.Name, tv)
	}
	if d.Tokenizer != nil && t.Tokenizer != nil {
		if same, why := d.Tokenizer.SameVocabulary(t.Tokenizer); !same {
			return fmt.Errorf("the drafter %s and the target %s have different tokenizers (%s): a pair must share its tokenizer", d.Name, t.Name, why)
		}
	}
	return nil
}
