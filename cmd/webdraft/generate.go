package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/weights"
)

// generateCacheMB is each model's KV cache for one generation.
const generateCacheMB = 64

func runGenerate(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "generate", "[--model DIR] [--target DIR] (--text … | --ids 1,2,3) [--chat] [--k N] [--spec-topk 1] [--spec-draft-tokens 16] [--max-tokens 128] [--temperature 0] [--top-p 1] [--seed 0] [--backend auto|webgpu|cpu|reference] [--warmup auto|on|off]")
	modelDir := fs.String("model", "", "the drafter's folder; default: the embedded EAGLE-3 head (embedded:eagle3) over the embedded target, with --target or --backend reference the embedded drafter (embedded:drafter)"+headNote)
	targetDir := fs.String("target", "", "the target's folder; default: the embedded target")
	text := fs.String("text", "", "the prompt as text")
	idsFlag := fs.String("ids", "", "the prompt as token ids, comma-separated")
	chat := fs.Bool("chat", false, "wrap --text in Qwen3's chat template as a user's message")
	k := fs.Int("k", 0, kUsage)
	tree := treeFlagsVar(fs, false)
	maxTokens := fs.Int("max-tokens", 128, "tokens to generate at most")
	temperature := fs.Float64("temperature", 0, "0: greedy (the target's own greedy output); above: sampled (0…2)")
	topP := fs.Float64("top-p", 1, "the nucleus of top_p when sampling, (0, 1]")
	seed := fs.Uint64("seed", 0, "the seed of a sampled generation (the same seed gives the same text; a chain's, the same with speculation as without)")
	backendFlag := fs.String("backend", "auto", backendUsage)
	warmup := fs.String("warmup", "auto", warmupUsage("the timed runs (both generations, the speculative one and the target alone's)"))
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkWarmup(*warmup); err != nil {
		return err
	}
	switch {
	case (*idsFlag == "") == (*text == ""):
		return usagef("give exactly one of --ids and --text")
	case *chat && *text == "":
		return usagef("--chat takes --text")
	case isSet(fs, "k") && (*k < 1 || *k > speculative.MaxK):
		return usagef("--k %d: want 1…%d", *k, speculative.MaxK)
	case *maxTokens < 1:
		return usagef("--max-tokens %d: want at least 1", *maxTokens)
	case !(*temperature >= 0 && *temperature <= 2):
		return usagef("--temperature %v: want 0…2", *temperature)
	case !(*topP > 0 && *topP <= 1):
		return usagef("--top-p %v: want a value in (0, 1]", *topP)
	}
	if err := tree.check(); err != nil {
		return err
	}
	backend, err := parseBackend(*backendFlag)
	if err != nil {
		return err
	}
	var d, t engine.Engine
	var drafterName, targetName string
	var tok *tokenizer.Tokenizer
	*modelDir = defaultDrafter(*modelDir, *targetDir, backend)
	if draftsWithHead(*modelDir) {
		tl, err := loadServed(e, *targetDir, weights.TargetDir)
		if err != nil {
			return err
		}
		defer tl.m.Close()
		hp, err := openHeadPair(e, tl.m, tl.name, *modelDir, backend, generateCacheMB<<20)
		if err != nil {
			return err
		}
		defer hp.close()
		d, t, tok = hp.head, hp.target, tl.tok
		drafterName, targetName = "EAGLE-3 head "+*modelDir, tl.name
	} else {
		drafter, target, err := openServedPair(ctx, e, *modelDir, *targetDir, backend, generateCacheMB)
		if err != nil {
			return err
		}
		defer drafter.close()
		defer target.close()
		if err := checkPair(drafter.model, target.model); err != nil {
			return err
		}
		d, t, tok = drafter.model.Engine, target.model.Engine, target.model.Tokenizer
		if tok == nil {
			tok = drafter.model.Tokenizer
		}
		drafterName, targetName = drafter.model.Name, target.model.Name
	}
	if *k == 0 {
		*k = defaultK(t.Info().Backend)
	}
	prompt, err := generatePrompt(tok, *text, *idsFlag, *chat, t.Config().VocabSize)
	if err != nil {
		return err
	}
	req := speculative.Request{
		Prompt: prompt, MaxTokens: *maxTokens, K: *k, TopK: *tree.topK, TreeNodes: *tree.nodes, Seed: *seed,
		Sampling: sampling.Params{Temperature: float32(*temperature), TopP: float32(*topP)},
		Stop:     tokenizer.StopIDs(t.Config().EOSTokenIDs, tok),
	}
	out := &errWriter{w: e.stdout}
	base := req
	base.K = speculative.NoDraft

	// On a GPU each shape's first run builds its pipelines: were the
	// speculative run the first, its time would hold them and the target
	// alone's after it not.
	if warmsOn(*warmup, t.Info()) {
		if err := prepare(ctx, e, t, d); err != nil {
			return err
		}
		start := time.Now()
		for _, r := range []speculative.Request{req, base} {
			if _, _, err := generateOnce(ctx, d, t, r); err != nil {
				return fmt.Errorf("warming up: %w", err)
			}
		}
		e.log.Info("warmed up: each generation run once untimed", "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()))
	}

	// Speculative decoding, streamed as the target accepts.
	var hist []int // hist[a]: steps that accepted a draft tokens
	var dec *tokenizer.StreamDecoder
	if tok != nil {
		dec = tok.NewStreamDecoder()
	}
	req.OnStep = func(s speculative.Step) bool {
		for len(hist) <= s.Accepted {
			hist = append(hist, 0)
		}
		hist[s.Accepted]++
		for _, tk := range s.Tokens {
			if dec == nil {
				fmt.Fprintf(out, "%d ", tk.ID)
				continue
			}
			piece, err := dec.Next(tk.ID)
			if err != nil {
				piece = fmt.Sprintf("<%d>", tk.ID) // an id past the tokenizer's vocabulary
			}
			io.WriteString(out, piece)
		}
		return out.err == nil // stdout gone: stop
	}
	spec, specTime, err := generateOnce(ctx, d, t, req)
	if err != nil {
		return err
	}
	if dec != nil {
		io.WriteString(out, dec.Flush())
	}
	fmt.Fprintln(out)

	// The same generation by the target alone: the baseline.
	alone, aloneTime, err := generateOnce(ctx, d, t, base)
	if err != nil {
		return err
	}
	mode := "greedy"
	if !req.Sampling.Greedy() {
		mode = fmt.Sprintf("temperature %g, top-p %g, seed %d", *temperature, *topP, *seed)
	}
	writeSummary(out, summary{
		drafter: drafterName, target: targetName, backend: t.Info().Backend, k: *k, topK: *tree.topK, nodes: *tree.nodes, mode: mode,
		spec: spec, specTime: specTime, alone: alone, aloneTime: aloneTime, hist: hist,
	})
	if out.err != nil {
		return fmt.Errorf("writing the output: %w", out.err)
	}
	return nil
}

// errWriter keeps the first error of a run of writes.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// generatePrompt turns --text (in the chat template with --chat) or --ids
// into the prompt's ids.
func generatePrompt(tok *tokenizer.Tokenizer, text, ids string, chat bool, vocab int) ([]int, error) {
	var prompt []int
	input := "--ids"
	if ids != "" {
		var err error
		if prompt, err = parseIDs(ids); err != nil {
			return nil, usagef("--ids: %v", err)
		}
	} else {
		input = "--text"
		if tok == nil {
			return nil, fmt.Errorf("--text: the models have no tokenizer (give --ids)")
		}
		if chat {
			var err error
			if text, err = tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: text}}, true, true); err != nil {
				return nil, err
			}
		}
		if prompt = tok.Encode(text); len(prompt) == 0 {
			return nil, usagef("--text: no tokens")
		}
	}
	for i, id := range prompt {
		if id < 0 || id >= vocab {
			return nil, fmt.Errorf("%s: token %d at index %d is outside the models' vocabulary [0, %d)", input, id, i, vocab)
		}
	}
	return prompt, nil
}

// generateOnce runs one generation on a generator of its own (so that no
// run finds another's prompt in a prefix cache) and times it.
func generateOnce(ctx context.Context, d, t engine.Engine, req speculative.Request) (speculative.Result, time.Duration, error) {
	g, err := speculative.New(d, t, speculative.Options{})
	if err != nil {
		return speculative.Result{}, 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { g.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	start := time.Now()
	res, err := g.Submit(ctx, req)
	return res, time.Since(start), err
}

// summary is what generate reports after the text.
type summary struct {
	drafter, target, mode string
	backend               string // the target's engine
	k                     int
	topK, nodes           int // the tree's shape (topK 1: a chain)
	spec, alone           speculative.Result
	specTime, aloneTime   time.Duration
	hist                  []int
}

func writeSummary(w io.Writer, s summary) {
	st := s.spec.Stats
	shape := fmt.Sprintf("k %d", s.k)
	if s.topK > 1 {
		shape = fmt.Sprintf("a tree of depth %d, topk %d, %d draft tokens", s.k, s.topK, s.nodes)
	}
	fmt.Fprintf(w, "\n── %s drafting for %s, %s, %s, %s engine\n", s.drafter, s.target, shape, s.mode, s.backend)
	rate := 0.0
	if st.Drafted > 0 {
		rate = 100 * float64(st.Accepted) / float64(st.Drafted)
	}
	fmt.Fprintf(w, "τ %.2f tokens per verification step (%d tokens in %d steps; %d drafted, %d accepted: %.0f%%)\n",
		st.Tau(), st.Tokens, st.Steps, st.Drafted, st.Accepted, rate)
	fmt.Fprintln(w, "draft tokens accepted per step:")
	top := 0
	for _, n := range s.hist {
		top = max(top, n)
	}
	const width = 30
	for a := range s.k + 1 {
		n := 0
		if a < len(s.hist) {
			n = s.hist[a]
		}
		bar := 0
		if top > 0 {
			bar = (n*width + top - 1) / top
		}
		fmt.Fprintf(w, "  %2d │%-*s %d\n", a, width, strings.Repeat("█", bar), n)
	}
	tps := func(r speculative.Result, d time.Duration) float64 { return float64(len(r.Tokens)) / d.Seconds() }
	fmt.Fprintf(w, "speculative   %4d tokens in %6.2f s: %7.1f tokens/s\n", len(s.spec.Tokens), s.specTime.Seconds(), tps(s.spec, s.specTime))
	fmt.Fprintf(w, "target alone  %4d tokens in %6.2f s: %7.1f tokens/s\n", len(s.alone.Tokens), s.aloneTime.Seconds(), tps(s.alone, s.aloneTime))
	speedup := tps(s.spec, s.specTime) / tps(s.alone, s.aloneTime)
	fmt.Fprintf(w, "speedup %.2f×\n", speedup)
	if speedup < 1 && s.backend == "cpu" {
		rows := "k+1 rows"
		if s.topK > 1 {
			rows = "a tree's N+1 rows"
		}
		fmt.Fprintf(w, "(on the CPU engine each verified position costs the target a row of compute; on a GPU %s cost about one)\n", rows)
	}
	// Greedy, and sampled (its rows keyed by the seed and the position:
	// speculative.Generator.Keyed), chains and trees alike, both runs give
	// the same tokens.
	same := "yes"
	if !slices.Equal(tokenIDs(s.spec.Tokens), tokenIDs(s.alone.Tokens)) {
		same = "NO"
	}
	fmt.Fprintf(w, "the same tokens as the target alone: %s\n", same)
}

func tokenIDs(tokens []speculative.Token) []int {
	ids := make([]int, len(tokens))
	for i, t := range tokens {
		ids[i] = t.ID
	}
	return ids
}
