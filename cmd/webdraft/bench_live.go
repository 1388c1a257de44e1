package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/speculative"
	"webdraft/textstats"
)

// liveBench is what `bench spec --live` measures.
type liveBench struct {
	drafter, target         engine.Engine
	drafterName, targetName string
	prompts                 [][]int
	ks                      []int
	// trees are measured too, each treeDepth levels deep.
	trees     []treeShape
	treeDepth int
	// unfused measures each k a second time with drafting and
	// verification in separate calls (speculative.Options.Unfused).
	unfused bool
	// unchained measures each k a second time with every fused step a
	// call of its own (speculative.Options.Unchained).
	unchained bool
	// uncoupled measures each k and each tree a second time unkeyed: the
	// standard rule, greedy drafts or proposals drawn one a pass (a tree's
	// children such draws, held to the multi-draft rule), steps not
	// chained (speculative.Options.Uncoupled).
	uncoupled bool
	// pMins measures each k a second time for each p_min
	// (speculative.Request.PMin).
	pMins []float64
	// adaptive makes each k's and each tree's generations adaptive
	// (speculative.Request.Adaptive).
	adaptive bool
	// topN lists each token's most likely alternatives, and each draft
	// token's (speculative.Request.TopN, DraftTopN).
	topN             int
	newTokens, batch int
	// rounds repeats the whole sequence (the target alone, each k, each tree),
	// so that a machine whose speed drifts weighs on every figure alike.
	rounds int
	// sampling is every request's: greedy at temperature 0, else prompt i
	// draws with seed i.
	sampling sampling.Params
	args     []string
}

// treeShape is a token tree of --trees: b children a node, n nodes
// verified a step.
type treeShape struct{ b, n int }

func (t treeShape) String() string { return fmt.Sprintf("%d×%d", t.b, t.n) }

// parseTrees reads --trees: b×N pairs, comma-separated ("2x8,4x16"; × or
// x), b 2…MaxTopK (1 is a chain: --ks measures those), N 1…MaxTreeNodes.
func parseTrees(s string) ([]treeShape, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var trees []treeShape
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		bs, ns, ok := strings.Cut(strings.NewReplacer("×", "x", "X", "x").Replace(part), "x")
		b, errB := strconv.Atoi(bs)
		n, errN := strconv.Atoi(ns)
		if !ok || errB != nil || errN != nil || b < 2 || b > speculative.MaxTopK || n < 1 || n > speculative.MaxTreeNodes {
			return nil, usagef("--trees %q: %q is not b×N with b 2…%d children a node and N 1…%d nodes verified (2x8,4x16)", s, part, speculative.MaxTopK, speculative.MaxTreeNodes)
		}
		trees = append(trees, treeShape{b, n})
	}
	return trees, nil
}

// liveShape is what a run drafts: k tokens a step (0: the target alone),
// as a chain or, with tree.b above 1, as a tree k levels deep.
type liveShape struct {
	k         int
	tree      treeShape
	unfused   bool    // speculative.Options.Unfused
	unchained bool    // speculative.Options.Unchained
	uncoupled bool    // speculative.Options.Uncoupled
	pMin      float64 // speculative.Request.PMin
}

// liveRun is one configuration's measurement over every prompt.
type liveRun struct {
	liveShape
	tokens, steps  int
	drafted, accep int
	wall           time.Duration
	draft, verify  []time.Duration // per step
	fused          int             // steps drafted and verified in one call (verify holds their time)
	chained        int             // of them, steps chained on the device (verify holds their share)
	outputs        [][]int         // the timed pass's tokens, per prompt
	alone          int             // adaptive generations that ran the target alone for a while
	generations    int

	// passes that fed prompts only (a head's target is fed the prompt
	// before the first draft; prompts longer than a chunk), counted with
	// the next step, as a prompt fed with the first draft is
	fillDraft, fillVerify time.Duration
}

// record counts a step of the loop: its drafter's and target's times,
// with those of the passes before it that fed prompts only.
func (r *liveRun) record(st speculative.StepStats) {
	if st.Sequences == 0 {
		r.fillDraft += st.Draft
		r.fillVerify += st.Verify
		return
	}
	r.draft = append(r.draft, st.Draft+r.fillDraft)
	r.verify = append(r.verify, st.Verify+r.fillVerify)
	r.fillDraft, r.fillVerify = 0, 0
	if st.Fused {
		r.fused++
	}
	if st.Chained {
		r.chained++
	}
}

// add sums another round of the same configuration into r.
func (r *liveRun) add(o *liveRun) {
	r.tokens += o.tokens
	r.steps += o.steps
	r.drafted += o.drafted
	r.accep += o.accep
	r.wall += o.wall
	r.fused += o.fused
	r.chained += o.chained
	r.alone += o.alone
	r.generations += o.generations
	r.draft = append(r.draft, o.draft...)
	r.verify = append(r.verify, o.verify...)
}

// how says how r's steps ran — "separate", "fused" or "fused n%" (the
// share of steps fused), "chained n%" where some ran in chains on the
// device (the share chained) — and, for fused steps, what the t_draft
// columns hold: "–", their drafter time being inside t_verify.
func (r *liveRun) how() (how, draftMS, draftCost string) {
	switch {
	case r.fused == 0:
		return "separate", "", ""
	case r.chained > 0:
		return fmt.Sprintf("chained %d%%", 100*r.chained/len(r.verify)), "–", "–"
	case r.fused < len(r.verify):
		return fmt.Sprintf("fused %d%%", 100*r.fused/len(r.verify)), "–", "–"
	}
	return "fused", "–", "–"
}

func (r *liveRun) rate() float64 { return float64(r.tokens) / r.wall.Seconds() }
func (r *liveRun) tau() float64  { return float64(r.tokens) / float64(r.steps) }

// step is the wall-clock time per step of the loop (all generations').
func (r *liveRun) step() time.Duration { return r.wall / time.Duration(max(len(r.verify), 1)) }

// benchSpecLive runs the speculative loop over the prompts (greedy, or
// sampling with b.sampling) for each k and for the target alone, and
// reports τ, tokens/s, the speedup
// and the cost model speedup ≈ τ / (k·t_draft/t_target + t_verify/t_target)
// filled in from the measured means: t_draft the drafter's time per
// draft token, t_verify the target's time per verification step, t_target
// the target's time per step alone; and the loop rate and distinct-4 of
// the target alone's outputs. Each tree of b.trees is measured the same
// way, in a table of its own: its t_draft is the drafter's time a step.
func benchSpecLive(ctx context.Context, e *env, b liveBench) error {
	shapes := []liveShape{{}}
	for _, k := range b.ks {
		shapes = append(shapes, liveShape{k: k})
		if b.unfused {
			shapes = append(shapes, liveShape{k: k, unfused: true})
		}
		if b.unchained {
			shapes = append(shapes, liveShape{k: k, unchained: true})
		}
		if b.uncoupled {
			shapes = append(shapes, liveShape{k: k, uncoupled: true})
		}
		for _, p := range b.pMins {
			shapes = append(shapes, liveShape{k: k, pMin: p})
		}
	}
	chainShapes := len(shapes) - 1
	for _, t := range b.trees {
		shapes = append(shapes, liveShape{k: b.treeDepth, tree: t})
		if b.unfused {
			shapes = append(shapes, liveShape{k: b.treeDepth, tree: t, unfused: true})
		}
		if b.uncoupled {
			shapes = append(shapes, liveShape{k: b.treeDepth, tree: t, uncoupled: true})
		}
	}
	treeEnd := len(shapes)
	if b.unchained {
		shapes = append(shapes, liveShape{unchained: true}) // the target alone, a token a call
	}
	// Each run runs once untimed first, but which row counts a batch
	// meets depends on its timings: on a GPU every pass shape's
	// pipelines are built first.
	if warmsOn("auto", b.target.Info()) {
		if err := prepare(ctx, e, b.target, b.drafter); err != nil {
			return err
		}
	}
	runs := make([]*liveRun, len(shapes))
	for round := range max(b.rounds, 1) {
		for i, sh := range shapes {
			e.log.Info("measuring", "k", sh.k, "tree", sh.treeName(), "unfused", sh.unfused, "unchained", sh.unchained, "uncoupled", sh.uncoupled, "p_min", sh.pMin, "round", round+1, "prompts", len(b.prompts), "new_tokens", b.newTokens, "batch", b.batch)
			r, err := b.run(ctx, sh)
			if err != nil {
				if sh.tree.b > 1 {
					return fmt.Errorf("tree %s, depth %d: %w", sh.tree, sh.k, err)
				}
				return fmt.Errorf("k %d: %w", sh.k, err)
			}
			if runs[i] == nil {
				runs[i] = r
			} else {
				runs[i].add(r)
			}
		}
	}
	alone := runs[0]
	tTarget := mean(alone.verify)
	mode := "greedy"
	if !b.sampling.Greedy() {
		mode = fmt.Sprintf("temperature %g, top-p %g, prompt i with seed i", b.sampling.Temperature, b.sampling.TopP)
	}
	fmt.Fprintf(e.stdout, "target %s, drafter %s: %d prompts, %d new tokens each, %s, %d at once, %d round(s)\n",
		b.targetName, b.drafterName, len(b.prompts), b.newTokens, mode, b.batch, max(b.rounds, 1))
	how := "each token read back"
	_, chains := b.target.(engine.Chainer)
	_, samples := b.target.(engine.SampleChainer)
	if b.sampling.Greedy() && chains || !b.sampling.Greedy() && samples {
		how = "its tokens chained on the device, as many a read-back as 20 ms take"
	}
	fmt.Fprintf(e.stdout, "the target alone (%s): %.1f tokens/s, t_target %.3f ms a token (%.3f ms with the loop's own time)\n", how, alone.rate(), ms(tTarget), ms(alone.step()))
	if b.unchained {
		apart := runs[len(runs)-1]
		fmt.Fprintf(e.stdout, "the target alone, each token read back (--unchained): %.1f tokens/s, %.3f ms a token; chained %.2f× as fast\n", apart.rate(), ms(apart.step()), alone.rate()/apart.rate())
	}
	fmt.Fprintf(e.stdout, "the target alone's outputs: %s\n\n", textSummary(textstats.Summarize(alone.outputs)))
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "k\tsteps\tτ\taccepted\ttokens/s\tspeedup\tstep ms\tt_draft ms\tt_verify ms\tk·t_draft/t_target\tt_verify/t_target\tmodel speedup\t")
	fusedSome := false
	for _, r := range runs[1 : 1+chainShapes] {
		tDraft := mean(r.draft) / time.Duration(r.k)
		if r.pMin > 0 && r.drafted > 0 { // drafts of fewer tokens: their mean length
			tDraft = time.Duration(float64(mean(r.draft)) * float64(r.steps) / float64(r.drafted))
		}
		tVerify := mean(r.verify)
		draftCost := float64(mean(r.draft)) / float64(tTarget) // k·t_draft, or a p_min run's drafts' mean length
		verifyCost := float64(tVerify) / float64(tTarget)
		how, draftMS, draftCostCol := r.how()
		if how == "separate" {
			draftMS, draftCostCol = fmt.Sprintf("%.3f", ms(tDraft)), fmt.Sprintf("%.2f", draftCost)
			if r.drafted == 0 { // p_min cut every draft: the passes ran, no token came of them
				draftMS = "–"
			}
		} else {
			fusedSome = true
		}
		fmt.Fprintf(tw, "%d%s%s\t%s\t%.2f\t%.0f%%\t%.1f\t%.2f×\t%.3f\t%s\t%.3f\t%s\t%.2f\t%.2f×\t\n",
			r.k, map[bool]string{true: " uncoupled"}[r.uncoupled], r.pMinName(), how, r.tau(), 100*float64(r.accep)/float64(max(r.drafted, 1)), r.rate(), r.rate()/alone.rate(),
			ms(r.step()), draftMS, ms(tVerify), draftCostCol, verifyCost, r.tau()/(draftCost+verifyCost))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if b.adaptive {
		var parts []string
		for _, r := range runs[1 : 1+chainShapes] {
			parts = append(parts, fmt.Sprintf("k = %d%s%s %d of %d", r.k, map[bool]string{true: " unchained"}[r.unchained], r.pMinName(), r.alone, r.generations))
		}
		fmt.Fprintf(e.stdout, "\nadaptive: generations that ran the target alone for a while, their speculative steps measured slower: %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintln(e.stdout, "\nstep: wall-clock time per step of the loop; t_draft: the drafter's time per draft token (its chained passes of a step over k); t_verify: the target's pass over a step's k+1 tokens; means over the steps.")
	if len(b.pMins) > 0 {
		fmt.Fprintln(e.stdout, "p_min (--p-mins): a draft ended before the first token the drafter gave less than p_min, so that a step drafted and verified fewer tokens where the drafter was unsure (k·t_draft/t_target: its drafts' mean length times t_draft).")
	}
	if b.uncoupled {
		fmt.Fprintln(e.stdout, "uncoupled (--uncoupled): each row drew by the standard rule from the generation's seeded stream, the drafter proposing its greedy tokens (draws from its own distribution where it drafts one a pass, held to the multi-draft rule; a tree's children such draws), its steps not chained on the device; coupled, the drafter drafts the Gumbel-max draws under the keys of the target's rows (a tree's children their Gumbel-top-b).")
	}
	if fusedSome {
		fmt.Fprintln(e.stdout, "steps fused: the drafter's passes and the target's verification ran as one submission, the drafts never read back between them (t_verify is their time together; fused n%: the share of steps fused, the others feeding a prompt or drafting at a context's end); chained n%: the share of steps run in chains of fused steps on the device, each accepted there and the next planned from it, read back once a chain (t_verify a step's share of its chain); separate: as two calls, each read back.")
	}
	if trees := runs[1+chainShapes : treeEnd]; len(trees) > 0 {
		fmt.Fprintf(e.stdout, "\ntoken trees %d levels deep (b×N: b children a node, N nodes verified a step):\n", b.treeDepth)
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "tree\tsteps\tτ\taccepted\ttokens/s\tspeedup\tstep ms\tt_draft ms\tt_verify ms\tt_draft/t_target\tt_verify/t_target\tmodel speedup\t")
		for _, r := range trees {
			tDraft, tVerify := mean(r.draft), mean(r.verify)
			draftCost := float64(tDraft) / float64(tTarget)
			verifyCost := float64(tVerify) / float64(tTarget)
			how, draftMS, draftCostCol := r.how()
			if how == "separate" {
				draftMS, draftCostCol = fmt.Sprintf("%.3f", ms(tDraft)), fmt.Sprintf("%.2f", draftCost)
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%.2f\t%.0f%%\t%.1f\t%.2f×\t%.3f\t%s\t%.3f\t%s\t%.2f\t%.2f×\t\n",
				r.tree, map[bool]string{true: " uncoupled"}[r.uncoupled], how, r.tau(), 100*float64(r.accep)/float64(max(r.drafted, 1)), r.rate(), r.rate()/alone.rate(),
				ms(r.step()), draftMS, ms(tVerify), draftCostCol, verifyCost, r.tau()/(draftCost+verifyCost))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "\ntrees: t_draft is the drafter's time a step (its %d passes, one a level), t_verify the target's pass over a step's nodes (N at most) and its last token (fused: both, the levels drafted and the nodes chosen on the device); accepted: the share of verified nodes on the accepted paths; model speedup τ / (t_draft/t_target + t_verify/t_target).\n", b.treeDepth)
	}
	fmt.Fprintf(e.stdout, "\nreproduce: webdraft bench spec %s\n", strings.Join(b.args, " "))
	return nil
}

// parsePMins parses --p-mins: p_min values in (0, 1], comma-separated
// (empty: none).
func parsePMins(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ps []float64
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(p > 0 && p <= 1) {
			return nil, usagef("--p-mins %q: want probabilities in (0, 1], comma-separated", s)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// pMinName labels a run drafting with a p_min: " p_min 0.5" (else "").
func (sh liveShape) pMinName() string {
	if sh.pMin > 0 {
		return fmt.Sprintf(" p_min %g", sh.pMin)
	}
	return ""
}

// treeName is the shape's tree for a log line ("" for a chain).
func (sh liveShape) treeName() string {
	if sh.tree.b > 1 {
		return sh.tree.String()
	}
	return ""
}

// run generates b.newTokens tokens after each prompt, b.batch at a time,
// drafting as sh says: once untimed, so that every pipeline the batches'
// changing shapes need is compiled, then timed.
func (b liveBench) run(ctx context.Context, sh liveShape) (*liveRun, error) {
	r := &liveRun{liveShape: sh}
	var mu sync.Mutex
	g, err := speculative.New(b.drafter, b.target, speculative.Options{MaxBatch: b.batch, Unfused: sh.unfused, Unchained: sh.unchained, Uncoupled: sh.uncoupled, OnStep: func(st speculative.StepStats) {
		mu.Lock()
		defer mu.Unlock()
		r.record(st)
	}})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { g.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	if _, _, _, err := b.generateAll(ctx, g, sh); err != nil {
		return nil, err
	}
	mu.Lock()
	r.draft, r.verify, r.fused, r.chained, r.fillDraft, r.fillVerify = nil, nil, 0, 0, 0, 0
	mu.Unlock()
	start := time.Now()
	st, alone, outputs, err := b.generateAll(ctx, g, sh)
	if err != nil {
		return nil, err
	}
	r.alone, r.generations = alone, len(outputs)
	r.wall = time.Since(start)
	r.outputs = outputs
	r.tokens, r.steps, r.drafted, r.accep = st.Tokens, st.Steps, st.Drafted, st.Accepted
	return r, nil
}

// generateAll runs every prompt through g, b.batch at a time, and sums
// their stats; alone counts the adaptive generations that went on with
// the target alone, outputs are the tokens of each prompt's generation.
func (b liveBench) generateAll(ctx context.Context, g *speculative.Generator, sh liveShape) (sum speculative.Stats, alone int, outputs [][]int, err error) {
	var mu sync.Mutex
	outputs = make([][]int, len(b.prompts))
	jobs := make(chan int)
	errs := make(chan error, b.batch)
	var wg sync.WaitGroup
	for range b.batch {
		wg.Go(func() {
			for i := range jobs {
				q := speculative.Request{Prompt: b.prompts[i], MaxTokens: b.newTokens, K: sh.k, TopK: max(sh.tree.b, 1), TreeNodes: sh.tree.n,
					Sampling: b.sampling, Seed: uint64(i), Adaptive: b.adaptive && sh.k > 0, TopN: b.topN, DraftTopN: b.topN, PMin: sh.pMin}
				if sh.k == 0 {
					q.K, q.DraftTopN = speculative.NoDraft, 0
				}
				res, err := g.Submit(ctx, q)
				if err != nil {
					errs <- err
					return
				}
				ids := make([]int, len(res.Tokens))
				for j, t := range res.Tokens {
					ids[j] = t.ID
				}
				mu.Lock()
				outputs[i] = ids
				sum.Tokens += res.Stats.Tokens
				sum.Steps += res.Stats.Steps
				sum.Drafted += res.Stats.Drafted
				sum.Accepted += res.Stats.Accepted
				if res.Stats.Alone {
					alone++
				}
				mu.Unlock()
			}
		})
	}
feed:
	for i := range b.prompts {
		select {
		case jobs <- i:
		case err = <-errs:
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return sum, alone, outputs, err
}

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
