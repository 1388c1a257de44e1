package speculative

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"webdraft/engine"
	"webdraft/internal/jobqueue"
	"webdraft/prefixcache"
	"webdraft/sampling"
)

// Run drives both engines until ctx ends or one of them faults; it then
// fails what is still queued or running and releases every sequence. After
// a fault (engine.ErrFault) it returns the fault, which every unfinished
// generation gets too; when ctx is cancelled with a cause
// (context.WithCancelCause) they get the cause, else ErrClosed.
func (g *Generator) Run(ctx context.Context) (err error) {
	r := &runner{g: g, draftCache: prefixcache.New(g.draftBudget), targetCache: prefixcache.New(g.targetBudget)}
	defer func() { r.shutdown(jobqueue.StopError(ctx, err)) }()
	for {
		if len(r.active) == 0 && len(r.waiting) == 0 {
			j, ok := g.queue.Next(ctx)
			if !ok {
				return nil
			}
			r.waiting = append(r.waiting, j)
		}
		if ctx.Err() != nil {
			return nil
		}
		r.waiting = g.queue.Drain(r.waiting)
		r.admit()
		r.idle, r.until = false, time.Time{}
		if g.forget.Swap(false) {
			r.aloneAt, r.specAt, r.aloneToken, r.specStep = nil, nil, 0, 0
		}
		if err := r.step(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, engine.ErrFault) {
				return err
			}
		}
		g.running.Store(int64(len(r.active)))
		if r.idle && len(r.active) > 0 {
			r.wait(ctx)
		}
	}
}

// wait sleeps while every running generation waits for its remote draft:
// until one comes (or a client leaves: g.wake), a job arrives, the first
// remote wait runs out, or ctx ends.
func (r *runner) wait(ctx context.Context) {
	var timeout <-chan time.Time
	if !r.until.IsZero() {
		t := time.NewTimer(time.Until(r.until))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.g.wake:
	case j := <-r.g.queue.C():
		r.waiting = append(r.waiting, j)
	case <-timeout:
	case <-ctx.Done():
	}
}

// runner is Run's state.
type runner struct {
	g                             *Generator
	draftCache, targetCache       *prefixcache.Cache
	waiting                       []*job
	active                        []*gen
	draftReserved, targetReserved int // Σ active generations' reservations
	// idle: the last step ran no pass (every generation waits for a remote
	// draft); until: the first of those waits' ends.
	idle  bool
	until time.Time
	// aloneToken is what a token of the target alone took in the last
	// chained step (runner.alone): the next takes as many as fit aloneSpan.
	aloneToken time.Duration
	// specStep is what a fused speculative step took last (runner.fused,
	// runner.chained): a chain of them takes as many as fit aloneSpan.
	specStep time.Duration
	// aloneAt and specAt are, by batch size, what a token of the target
	// alone took in the last call that chained two or more (runner.alone)
	// and what the last speculative step took: an adaptive generation
	// weighs its speculation by them (runner.adapt).
	aloneAt, specAt map[int]time.Duration
}

// gen is a running generation. Each of its sequences holds a prefix of
// context, one token short of it at least: the tokens each model still has
// to feed.
type gen struct {
	*job
	context []int // the prompt and the tokens emitted
	out     []Token
	draft   engine.Sequence // nil when the target runs alone or a remote drafts
	target  engine.Sequence
	remote  *remoteDraft // Request.Remote's state; nil without
	// sampled: with Options.Uncoupled, the drafter samples its proposals
	// from its own distribution and the target holds them to the
	// multi-draft rule (engine.SampledPair): a sampled token tree's, and a
	// chain's over a drafter that does not chain greedy steps on its
	// device (chains). Else a sampled generation is keyed (below).
	sampled bool
	// keyed: a sampled generation draws coupled rows
	// (sampling.Draw.Coupled), each under the key of the position it
	// decides (keys: sampling.Keys of its seed), so that its tokens are
	// the target's Gumbel-max draws at their positions, whatever drafted
	// them, the same as the target alone's; a drafter that couples its
	// drafts (engine.CouplesDrafts in fused steps, engine.DraftsCoupled
	// outside them; a remote through DraftAsk.Coupled) drafts the
	// Gumbel-max draws of its own distribution under those keys, accepted
	// where they are the target's own draws; any other drafts its greedy
	// tokens. A keyed token tree's children are the Gumbel-top-b of the
	// drafter's rows under those keys (tree.go).
	// Options.Uncoupled leaves it uncoupled: greedy drafts, the standard
	// rule, its draws from rng.
	keyed bool
	keys  sampling.Keys
	// head: the drafter is an EAGLE-3 head reading the target's features
	// (Generator.head); it drafts once the target holds a position.
	head bool
	// The remote's draft for this step, the round trip, the remote's time.
	remoteTokens         []engine.Token
	remoteRTT, remoteOwn time.Duration
	rng                  *rand.Rand // an unkeyed sampled generation's draws and proposals
	// specSteps and specTokens count the speculative steps and the tokens
	// they emitted; weighed: runner.adapt weighed them (Request.Adaptive).
	specSteps, specTokens int
	weighed               bool
	probing               bool // drafts nothing this step: runner.adapt times the target alone
	probes                int  // steps it drafted nothing for that
	// speculateK is its draft length while it runs alone (k is then 0),
	// since it emitted aloneFrom tokens.
	speculateK, aloneFrom int
	stats                 Stats
	started               time.Time
	first                 time.Time
	draftNeed             int // KV positions reserved in each engine
	targetNeed            int
	maxContext            int    // the longest context both models take
	finishedWhy           string // set when the generation is done: FinishLength or FinishStop
	retired               bool
}

// readsFeatures reports whether gn's drafter reads the target's features:
// an EAGLE-3 head, the generator's or a remote one. The target then feeds
// the prompt, all but its last token, before the first draft.
func (gn *gen) readsFeatures() bool {
	return gn.head && gn.draft != nil || gn.remote != nil && gn.remote.features
}

// chains reports whether e runs chained greedy steps on its device
// (engine.Chainer).
func chains(e engine.Engine) bool {
	_, ok := e.(engine.Chainer)
	return ok
}

// admit starts waiting jobs, oldest first, while the batch and both KV
// budgets have room; cached sequences are evicted to make room.
func (r *runner) admit() {
	g := r.g
	for len(r.waiting) > 0 && len(r.active) < g.opts.MaxBatch {
		j := r.waiting[0]
		if j.Canceled() {
			r.pop()
			j.Finish(context.Canceled)
			continue
		}
		tNeed := g.need(&j.req)
		dNeed := 0
		if j.k > 0 && j.req.Remote == nil {
			// A drafter pass drafts as many tokens as the longest draft in
			// it, so a generation beside others reserves room for the
			// longest a request may ask; at most the whole budget, where it
			// runs alone and drafts its own, which Check found room for.
			dNeed = min(len(j.req.Prompt)+j.req.MaxTokens+MaxK, g.drafter.Config().MaxPositionEmbeddings, g.draftBudget)
		}
		if r.targetReserved+tNeed > g.targetBudget || r.draftReserved+dNeed > g.draftBudget {
			return // wait for running generations to finish
		}
		r.pop()
		gn := &gen{job: j, context: slices.Clip(slices.Clone(j.req.Prompt)), rng: rand.New(rand.NewPCG(j.req.Seed, 0x5eed)),
			started: time.Now(), targetNeed: tNeed, draftNeed: dNeed, maxContext: g.target.Config().MaxPositionEmbeddings}
		if j.k > 0 {
			gn.maxContext = min(gn.maxContext, g.drafter.Config().MaxPositionEmbeddings)
		}
		gn.head = g.head && j.req.Remote == nil
		gn.sampled = g.samplesTree(&j.req) || g.opts.Uncoupled && j.k > 0 && j.req.Remote == nil && !j.req.Sampling.Greedy() &&
			engine.SampledPair(g.drafter, g.target) && !chains(g.drafter)
		gn.keyed = g.Keyed(&j.req)
		gn.keys = sampling.NewKeys(j.req.Seed)
		gn.stats.PromptTokens, gn.stats.Queue = len(j.req.Prompt), gn.started.Sub(j.arrived)
		var err error
		gn.target, gn.stats.CachedTokens, err = r.take(r.targetCache, g.target, g.targetBudget-r.targetReserved-tNeed, j.req.Prompt, j.req.Fresh)
		if j.req.Remote != nil {
			gn.remote = &remoteDraft{Remote: j.req.Remote}
			gn.remote.mu.Lock()
			gn.remote.wake = g.poke
			gn.remote.mu.Unlock()
		} else if err == nil && j.k > 0 {
			gn.draft, _, err = r.take(r.draftCache, g.drafter, g.draftBudget-r.draftReserved-dNeed, j.req.Prompt, j.req.Fresh)
		}
		if err != nil {
			if gn.target != nil {
				gn.target.Release()
			}
			j.Finish(fmt.Errorf("new sequence: %w", err))
			continue
		}
		r.reserve(tNeed, dNeed)
		r.active = append(r.active, gn)
	}
}

// reserve adds target and draft positions to the reservations, and
// publishes them for Gauges.
func (r *runner) reserve(target, draft int) {
	r.targetReserved += target
	r.draftReserved += draft
	r.g.targetReserved.Store(int64(r.targetReserved))
	r.g.draftReserved.Store(int64(r.draftReserved))
}

func (r *runner) pop() {
	r.waiting = r.waiting[1:]
	r.g.queue.Started()
}

// take returns a sequence for prompt from cache or else a fresh one of e,
// and how many of prompt's positions it already holds (at most all but the
// last: its logits start the generation); cache then holds at most limit
// positions.
func (r *runner) take(cache *prefixcache.Cache, e engine.Engine, limit int, prompt []int, fresh bool) (engine.Sequence, int, error) {
	var entry *prefixcache.Entry
	shared := 0
	if !fresh {
		entry, shared = cache.Take(prompt)
	}
	shared = min(shared, len(prompt)-1)
	cache.Shrink(limit)
	if entry != nil && shared > 0 {
		entry.Seq.Truncate(shared)
		return entry.Seq, shared, nil
	}
	if entry != nil {
		entry.Seq.Release()
	}
	for {
		seq, err := e.NewSequence()
		if !errors.Is(err, engine.ErrNoCapacity) || cache.Len() == 0 {
			return seq, 0, err
		}
		cache.Shrink(cache.Tokens() - 1) // evicts at least the oldest entry
	}
}

// step runs one drafter pass (chained over the draft length) and one target
// pass over the running generations: those whose prompts are fed far
// enough draft and are verified; the others feed a chunk of prompt to
// whichever model is behind, within the pass's prefill budget.
func (r *runner) step(ctx context.Context) error {
	g := r.g
	chunk, budget := g.opts.PrefillChunk, g.opts.PrefillBudget
	var ready, filling []*gen
	var draftFill []*engine.Entry
	var targetFill []*engine.VerifyEntry
	for _, gn := range r.active {
		if gn.Canceled() {
			continue
		}
		tp, dp := gn.pendingTarget(), gn.pendingDraft()
		if gn.readsFeatures() {
			// A head drafts from the target's features of the context: the
			// target feeds the prompt, all but its last token, first; the
			// head then reads it all in its first draft.
			if len(tp) <= 1 {
				ready = append(ready, gn)
			} else if n := min(len(tp)-1, chunk, budget); n > 0 {
				budget -= n
				targetFill = append(targetFill, &engine.VerifyEntry{Seq: gn.target, Tokens: tp[:n], Out: 1})
				filling = append(filling, gn)
			}
			continue
		}
		if len(tp) <= chunk && len(dp) <= chunk {
			// The tails of prompts count against the budget; a pass takes one
			// at least.
			if cost := max(len(tp)-1, 0) + max(len(dp)-1, 0); cost <= budget || budget == g.opts.PrefillBudget {
				budget = max(budget-cost, 0)
				ready = append(ready, gn)
			}
			continue
		}
		fed := false
		if n := min(len(tp), chunk, budget); len(tp) > chunk && n > 0 {
			budget -= n
			targetFill = append(targetFill, &engine.VerifyEntry{Seq: gn.target, Tokens: tp[:n], Out: 1})
			fed = true
		}
		if n := min(len(dp), chunk, budget); len(dp) > chunk && n > 0 {
			budget -= n
			draftFill = append(draftFill, &engine.Entry{Seq: gn.draft, Tokens: dp[:n]})
			fed = true
		}
		if fed {
			filling = append(filling, gn)
		}
	}
	ready = r.remoteDrafts(ready)
	if len(ready) == 0 && len(filling) == 0 {
		r.idle = true
		r.retireCanceled()
		return nil
	}
	st := StepStats{Sequences: len(ready)}

	defer r.adapt(ready)()
	if r.chainsAlone(ready, draftFill, targetFill) {
		return r.alone(ctx, ready, st)
	}
	if solo, rest := r.splitAlone(ready, draftFill, targetFill); solo != nil {
		// Those that draft nothing run the target alone in a call of their
		// own, so that the others' steps still fuse and chain.
		if err := r.alone(ctx, solo, StepStats{Sequences: len(solo)}); err != nil {
			return err
		}
		ready = slices.DeleteFunc(rest, func(gn *gen) bool { return gn.retired }) // canceled meanwhile
		if len(ready) == 0 {
			return nil
		}
		st = StepStats{Sequences: len(ready)}
	}
	if steps := r.treeSteps(ready, draftFill, targetFill); steps != nil {
		start := time.Now()
		trees, verify, err := r.fusedTrees(ctx, steps)
		st.Verify, st.Fused = time.Since(start), true
		if err != nil {
			r.fail(ctx, ready, err)
			return err
		}
		return r.settleStep(ready, make([][]engine.Token, len(ready)), trees, verify, st)
	}
	if r.fuses(ready, draftFill, targetFill) {
		return r.fusedStep(ctx, ready, st)
	}
	start := time.Now()
	drafts, trees, err := r.drafts(ctx, ready, draftFill)
	st.Draft = time.Since(start)
	if err != nil {
		r.fail(ctx, append(ready, filling...), fmt.Errorf("drafter: %w", err))
		return err
	}
	verify := make([]*engine.VerifyEntry, len(ready), len(ready)+len(targetFill))
	for i, gn := range ready {
		if trees[i] != nil {
			verify[i] = gn.treeVerifyEntry(trees[i])
		} else {
			verify[i] = gn.verifyEntry(drafts[i])
		}
	}
	start = time.Now()
	err = g.target.Verify(ctx, append(verify, targetFill...))
	st.Verify = time.Since(start)
	if len(targetFill) == 0 {
		if slices.ContainsFunc(drafts, func(d []engine.Token) bool { return len(d) > 0 }) || slices.ContainsFunc(trees, func(t *draftTree) bool { return t != nil }) {
			r.spoke(len(ready), st.Draft+st.Verify)
		} else { // the target alone, a token a step (a target that does not chain)
			r.aloneTook(len(ready), st.Verify)
		}
	}
	if err != nil {
		r.fail(ctx, append(ready, filling...), fmt.Errorf("target: %w", err))
		return err
	}
	return r.settleStep(ready, drafts, trees, verify, st)
}

// fusedStep runs a speculative step of the ready generations, which fuse
// (runner.fuses): chained on the device where they chain, else one fused
// call.
func (r *runner) fusedStep(ctx context.Context, ready []*gen, st StepStats) error {
	if sc, n, m := r.specChain(ready); m > 1 {
		return r.chained(ctx, sc, ready, n, m)
	}
	start := time.Now()
	drafts, verify, err := r.fused(ctx, ready)
	st.Verify, st.Fused = time.Since(start), true
	r.specStep = st.Verify
	r.spoke(len(ready), st.Verify)
	if err != nil {
		r.fail(ctx, ready, err)
		return err
	}
	return r.settleStep(ready, drafts, make([]*draftTree, len(ready)), verify, st)
}

// settleStep accepts what the target's verification kept of each ready
// generation's draft (chain or tree), retires the finished ones and
// reports the step.
func (r *runner) settleStep(ready []*gen, drafts [][]engine.Token, trees []*draftTree, verify []*engine.VerifyEntry, st StepStats) error {
	g := r.g
	var err error
	now := time.Now()
	for i, gn := range ready {
		var a, emitted, drafted int
		if trees[i] != nil {
			a, emitted, err = gn.acceptTree(trees[i], verify[i], now, &st)
			if err != nil {
				gn.draft, gn.target = release(gn.draft), release(gn.target)
				r.retire(gn, err)
				continue
			}
			drafted = len(trees[i].kept)
		} else {
			a, emitted = gn.accept(drafts[i], verify[i].Rows, now, &st)
			drafted = len(drafts[i])
		}
		st.add(drafted, a, emitted)
		if gn.finishedWhy != "" {
			r.retire(gn, nil)
		}
	}
	if g.opts.OnStep != nil {
		g.opts.OnStep(st)
	}
	r.retireCanceled()
	return nil
}

// add counts a generation's part of a step: drafted tokens, a of them
// accepted, emitted tokens.
func (st *StepStats) add(drafted, a, emitted int) {
	if drafted > 0 {
		st.Drafts++
		st.DraftTokens += drafted
		st.Accepted += a
		for len(st.AcceptedAt) < a {
			st.AcceptedAt = append(st.AcceptedAt, 0)
		}
		for p := range a {
			st.AcceptedAt[p]++
		}
	}
	st.Emitted += emitted
}

// specChain returns the drafter as an engine.SpecChainer, the draft
// length and how many fused steps to chain on the device in one call
// (runner.chained) — as many as the last step's time fits in aloneSpan, up
// to aloneChunk, no more than the generation nearest its end is expected
// to need at the tokens a step it has had so far (a chain ends about when
// the first of them does, so that its place in the batch is not held for
// the chain's rest), and within every one's room in the context — where
// the ready generations chain (m > 1): chains of one k, greedy or sampled
// and keyed (gen.keyed: the device keys each row by the position it
// decides and accepts by the same rule as the host; each drafts all k,
// one near its end too, which may stop inside the chain), each holding
// all its context but the last token in the target, over a drafter that
// chains them (an EAGLE-3 head or a drafter on the target's WebGPU
// device). Fused steps the runner already chose (runner.fuses).
func (r *runner) specChain(ready []*gen) (sc engine.SpecChainer, n, m int) {
	sc, ok := r.g.drafter.(engine.SpecChainer)
	if !ok || r.specStep <= 0 || r.g.opts.Unchained {
		return nil, 0, 1
	}
	n = ready[0].k
	m = min(int(aloneSpan/r.specStep), aloneChunk)
	for _, gn := range ready {
		if gn.draft == nil || gn.k != n || len(gn.pendingTarget()) != 1 || !gn.req.Sampling.Greedy() && !gn.keyed {
			return nil, 0, 1
		}
		tau := 1.0 // tokens a step so far
		if gn.stats.Steps > 0 {
			tau = max(tau, float64(gn.stats.Tokens)/float64(gn.stats.Steps))
		}
		left := min(gn.req.MaxTokens-len(gn.out), gn.room())
		m = min(m, int(math.Ceil(float64(left)/tau)), gn.room()/(n+1))
	}
	return sc, n, m
}

// chained runs m fused speculative steps of the ready generations in one
// call, each accepted and the next planned on the device
// (engine.SpecChainer), and reads them back once: each step is then
// accepted as a fused step is — its tokens emitted, counted and handed to
// OnStep, the call's time shared out among its steps —, a generation that
// stops inside the chain dropping the steps after, and both caches cut
// back to the context. A sampled generation's steps take its next draws,
// n + 1 a step, those of steps the call did not run kept for the next.
func (r *runner) chained(ctx context.Context, sc engine.SpecChainer, ready []*gen, n, m int) error {
	g := r.g
	steps := make([]engine.ChainStep, len(ready))
	for i, gn := range ready {
		steps[i] = engine.ChainStep{
			Draft:  &engine.Entry{Seq: gn.draft, Target: gn.target, Tokens: gn.pendingDraft(), TopN: gn.req.DraftTopN},
			Verify: &engine.VerifyEntry{Seq: gn.target, Tokens: gn.pendingTarget(), Out: n + 1, TopN: gn.req.TopN, Sampling: gn.req.Sampling},
			Take:   n,
		}
		if !gn.req.Sampling.Greedy() {
			steps[i].Verify.Draws, steps[i].Keys = gn.draws(n+1), &gn.keys
		}
	}
	start := time.Now()
	out, err := sc.DraftVerifyN(ctx, g.target, steps, n, m)
	if err != nil {
		err = fmt.Errorf("drafter and target: %w", err)
		r.fail(ctx, ready, err)
		return err
	}
	now := time.Now()
	per := now.Sub(start) / time.Duration(len(out))
	r.specStep = per
	r.spoke(len(ready), per)
	for _, cs := range out {
		st := StepStats{Verify: per, Fused: true, Chained: true}
		for i, gn := range ready {
			if gn.finishedWhy != "" {
				continue
			}
			step, a := gn.verdict(cs.Drafts[i], cs.Rows[i], &st)
			st.Sequences++
			st.add(n, a, gn.count(&step, n, now))
		}
		if g.opts.OnStep != nil {
			g.opts.OnStep(st)
		}
	}
	for _, gn := range ready {
		for _, s := range []engine.Sequence{gn.target, gn.draft} {
			s.Truncate(min(s.Len(), len(gn.context)-1))
		}
		if gn.finishedWhy != "" {
			r.retire(gn, nil)
		}
	}
	r.retireCanceled()
	return nil
}

// A chained step of the target alone (runner.alone) generates as many
// tokens as the last one's rate fits in aloneSpan, at least one and at most
// aloneChunk: one read-back for them all, where a step a token waits for
// the round trip each time (on the H200 a third of the shipped target's
// step), while the tokens still stream every aloneSpan or so and a new
// request waits no longer than that to join the batch. A slow device (a
// software renderer) steps a token at a time, as before.
const aloneChunk = 16

var aloneSpan = 20 * time.Millisecond // a variable for tests

// adaptSteps is how many speculative steps an adaptive generation
// (Request.Adaptive) takes before the runner weighs its speculation.
const adaptSteps = 4

// adaptRetry is how many tokens an adaptive generation that went on alone
// emits before it speculates again, to be weighed anew (what a text
// drafts well may change as it goes): a variable for tests.
var adaptRetry = 256

// spoke notes what a speculative step of a batch of B took.
func (r *runner) spoke(B int, took time.Duration) {
	if r.specAt == nil {
		r.specAt = map[int]time.Duration{}
	}
	r.specAt[B] = took
}

// aloneTook notes what a token of the target alone took in a batch of B.
func (r *runner) aloneTook(B int, took time.Duration) {
	if r.aloneAt == nil {
		r.aloneAt = map[int]time.Duration{}
	}
	r.aloneAt[B] = took
}

// adapt weighs the speculation of each ready adaptive generation
// (Request.Adaptive) after its first adaptSteps speculative steps:
// where the tokens its steps emitted, over what a step of the generations
// that speculate together takes, fall short of the rate of the target
// alone in the batch it would join (a token a step, or a chained call's
// time a token where the target chains), it runs the target alone
// (Stats.Alone) for adaptRetry tokens, then speculates again and is
// weighed anew. Where that rate is not known yet, the generation
// drafts nothing for a step or two (on a chaining target a call of one
// token, then a chain; splitAlone runs it with the others that draft
// nothing) to measure it, adaptProbes steps at most before it takes the
// rate at the nearest batch size timed. adapt returns what ends this
// step's probing when the step is done.
func (r *runner) adapt(ready []*gen) (done func()) {
	for _, gn := range ready {
		if gn.req.Adaptive && gn.stats.Alone && gn.k == 0 && len(gn.out)-gn.aloneFrom >= adaptRetry {
			gn.k, gn.weighed, gn.specSteps, gn.specTokens, gn.probes = gn.speculateK, false, 0, 0, 0
		}
	}
	spec, alone := 0, 0 // the generations that speculate together, and those that do not
	var due []*gen
	for _, gn := range ready {
		switch {
		case gn.draftLen(r.g) == 0 && gn.remote == nil:
			alone++
		default:
			spec++
			if gn.req.Adaptive && !gn.weighed && gn.k > 0 && gn.remote == nil && gn.specSteps >= adaptSteps {
				due = append(due, gn)
			}
		}
	}
	var probing []*gen
	for _, gn := range due {
		a, s := r.aloneAt[alone+len(due)], nearest(r.specAt, spec)
		if a == 0 && gn.probes < adaptProbes {
			gn.probes++
			gn.probing = true
			probing = append(probing, gn)
			continue
		}
		if a == 0 {
			a = nearest(r.aloneAt, alone+1)
		}
		gn.weighed = true
		if tau := float64(gn.specTokens) / float64(gn.specSteps); a > 0 && s > 0 && tau*float64(a) < float64(s) {
			gn.speculateK, gn.k, gn.aloneFrom, gn.stats.Alone = gn.k, 0, len(gn.out), true
		}
	}
	return func() {
		for _, gn := range probing {
			gn.probing = false
		}
	}
}

// adaptProbes is how many steps an adaptive generation drafts nothing
// for, at most, to time the target alone (runner.adapt).
const adaptProbes = 3

// nearest is m's value at the key nearest b (the smaller on a tie); 0 for
// an empty m.
func nearest(m map[int]time.Duration, b int) time.Duration {
	best, at := time.Duration(0), -1
	for k, v := range m {
		if d, bd := abs(k-b), abs(at-b); at < 0 || d < bd || d == bd && k < at {
			best, at = v, k
		}
	}
	return best
}

func abs(x int) int { return max(x, -x) }

// splitAlone parts the ready generations into those that draft nothing
// and the rest, where both are there and the first could run the target
// alone chained on its device (chainsAlone) — a generation that went on
// alone (Request.Adaptive) or asked for no draft beside others that
// speculate; else solo is nil.
func (r *runner) splitAlone(ready []*gen, draftFill []*engine.Entry, targetFill []*engine.VerifyEntry) (solo, rest []*gen) {
	for _, gn := range ready {
		if gn.draftLen(r.g) == 0 && gn.remote == nil {
			solo = append(solo, gn)
		} else {
			rest = append(rest, gn)
		}
	}
	if len(solo) == 0 || len(rest) == 0 || !r.chainsAlone(solo, draftFill, targetFill) {
		return nil, ready
	}
	return solo, rest
}

// chainsAlone reports whether the ready generations run the target alone
// chained on its device (runner.alone), unless Options.Unchained: every
// one with nothing to draft and no prompt left to feed apart, all greedy
// over a target that chains greedy steps (engine.Chainer) or all sampled
// over one that chains sampled steps (engine.SampleChainer).
func (r *runner) chainsAlone(ready []*gen, draftFill []*engine.Entry, targetFill []*engine.VerifyEntry) bool {
	if r.g.opts.Unchained || len(draftFill) > 0 || len(targetFill) > 0 || len(ready) == 0 {
		return false
	}
	sampled := 0
	for _, gn := range ready {
		if gn.remote != nil || gn.draftLen(r.g) > 0 {
			return false
		}
		if !gn.req.Sampling.Greedy() {
			sampled++
		}
	}
	if sampled == 0 {
		return chains(r.g.target)
	}
	_, ok := r.g.target.(engine.SampleChainer)
	return ok && sampled == len(ready)
}

// alone generates the ready generations' next tokens with the target
// alone, chained on its device (engine.StepN, or SampleN at a
// temperature, each token drawn with the generation's next draw): as many
// as the closest to its end may still emit, up to what aloneSpan takes,
// read back once. Each token is a step of its own to the stats and
// OnStep, the chain's time shared out among them; a generation that stops
// early (a stop token, OnStep) drops the rest, its cache cut back to its
// context.
func (r *runner) alone(ctx context.Context, ready []*gen, st StepStats) error {
	g := r.g
	n := aloneChunk
	if r.aloneToken > 0 {
		n = max(1, min(n, int(aloneSpan/r.aloneToken)))
	} else {
		n = 1 // a first step measures the rate
	}
	for _, gn := range ready {
		n = min(n, gn.req.MaxTokens-len(gn.out), gn.room())
	}
	start := time.Now()
	var out [][]engine.Token
	var err error
	if ready[0].req.Sampling.Greedy() {
		batch := make([]*engine.Entry, len(ready))
		for i, gn := range ready {
			batch[i] = &engine.Entry{Seq: gn.target, Tokens: gn.pendingTarget(), TopN: gn.req.TopN}
		}
		out, err = engine.StepN(ctx, g.target, batch, n)
	} else { // chainsAlone: all sampled, over a SampleChainer
		batch := make([]*engine.VerifyEntry, len(ready))
		for i, gn := range ready {
			batch[i] = &engine.VerifyEntry{Seq: gn.target, Tokens: gn.pendingTarget(), Out: 1, Sampling: gn.req.Sampling, Draws: gn.draws(n), TopN: gn.req.TopN}
		}
		out, err = g.target.(engine.SampleChainer).SampleN(ctx, batch, n)
	}
	if err != nil {
		r.fail(ctx, ready, fmt.Errorf("target: %w", err))
		return err
	}
	now := time.Now()
	st.Verify = now.Sub(start) / time.Duration(n)
	r.aloneToken = st.Verify
	if n >= 2 {
		r.aloneTook(len(ready), st.Verify)
	}
	for j := range n {
		st.Sequences, st.Emitted = 0, 0
		for i, gn := range ready {
			if gn.finishedWhy != "" {
				continue
			}
			t := out[i][j]
			step := Step{Tokens: []Token{{ID: t.ID, Logprob: t.Logprob, Top: t.Top}}, VerifyTime: st.Verify}
			st.Sequences++
			st.Emitted += gn.count(&step, 0, now)
		}
		if g.opts.OnStep != nil {
			g.opts.OnStep(st)
		}
	}
	for _, gn := range ready {
		gn.target.Truncate(min(gn.target.Len(), len(gn.context)))
		if gn.finishedWhy != "" {
			r.retire(gn, nil)
		}
	}
	r.retireCanceled()
	return nil
}

// fuses reports whether a step drafts and verifies in one call
// (engine.DraftVerify): no prompt chunk is being fed, and every ready
// generation drafts a local chain cut by nothing the drafter's tokens
// decide (no p_min) — where the drafter is an EAGLE-3 head, over a target
// that holds a position —, with a drafter that fuses the target — one
// device, where the drafted tokens reach the target's pass without coming
// back.
func (r *runner) fuses(ready []*gen, draftFill []*engine.Entry, targetFill []*engine.VerifyEntry) bool {
	if f, ok := r.g.drafter.(engine.Fuser); !ok || !f.Fuses(r.g.target) || r.g.opts.Unfused || len(draftFill) > 0 || len(targetFill) > 0 || len(ready) == 0 {
		return false
	}
	for _, gn := range ready {
		if gn.remote != nil || gn.draftLen(r.g) == 0 || gn.treeWidth() > 1 || gn.sampled || gn.req.PMin > 0 || gn.head && gn.target.Len() == 0 {
			return false
		}
	}
	return true
}

// fused drafts each ready generation's chain and verifies it in one call
// (engine.DraftVerify): n drafter steps, n the longest draft, each
// generation's own length verified. It returns the drafts and the
// target's entries, as drafts and Verify leave them.
func (r *runner) fused(ctx context.Context, ready []*gen) ([][]engine.Token, []*engine.VerifyEntry, error) {
	d := r.g.drafter
	steps := make([]engine.ChainStep, len(ready))
	n := 0
	for i, gn := range ready {
		n = max(n, gn.draftLen(r.g))
		steps[i].Draft = &engine.Entry{Seq: gn.draft, Tokens: gn.pendingDraft(), TopN: gn.req.DraftTopN}
		if gn.head {
			steps[i].Draft.Target = gn.target
		}
	}
	for _, gn := range ready {
		n = min(n, d.Config().MaxPositionEmbeddings-len(gn.context)+1)
	}
	for i, gn := range ready {
		steps[i].Take = min(gn.draftLen(r.g), n)
		v := gn.verifyEntry(make([]engine.Token, steps[i].Take)) // the draft's places in Draws
		v.Tokens = v.Tokens[:len(v.Tokens)-steps[i].Take]
		steps[i].Verify = v
	}
	out, err := engine.DraftVerify(ctx, d, r.g.target, steps, n)
	if err != nil {
		return nil, nil, fmt.Errorf("drafter and target: %w", err)
	}
	drafts := make([][]engine.Token, len(ready))
	verify := make([]*engine.VerifyEntry, len(ready))
	for i, s := range steps {
		drafts[i], verify[i] = out[i][:s.Take], s.Verify
	}
	return drafts, verify, nil
}

// remoteDrafts takes the remote drafts of the ready generations that have
// one and asks for those not asked yet: it returns the generations ready
// for the target's pass (those with no remote, and those whose draft has
// come); the others wait, and a remote that failed, closed or ran out of
// time ends its generation.
func (r *runner) remoteDrafts(ready []*gen) []*gen {
	vocab := r.g.target.Config().VocabSize
	now := time.Now()
	kept := ready[:0]
	for _, gn := range ready {
		gn.remoteTokens, gn.remoteRTT, gn.remoteOwn = nil, 0, 0
		k := gn.draftLen(r.g)
		if gn.remote == nil || k == 0 {
			kept = append(kept, gn)
			continue
		}
		held := gn.target.Len()
		if gn.remote.features && (held == 0 || held < len(gn.context)-1) {
			// A head drafts once the target has fed the context but its
			// last token (a one-token prompt: none): this step is the
			// target's alone.
			kept = append(kept, gn)
			continue
		}
		var coupled *Coupling
		if gn.keyed {
			coupled = &Coupling{Keys: gn.keys, Sampling: gn.req.Sampling}
		}
		draft, ok, deadline, rtt, own, err := gn.remote.poll(gn.context, k, coupled, vocab, now, held, func(from, to int) ([]float32, int, error) {
			return r.g.targetFeatures(gn.target, from, to)
		})
		switch {
		case err != nil:
			gn.target = release(gn.target)
			r.retire(gn, err)
		case ok:
			gn.remoteTokens, gn.remoteRTT, gn.remoteOwn = draft, rtt, own
			kept = append(kept, gn)
		case r.until.IsZero() || deadline.Before(r.until):
			r.until = deadline
		}
	}
	return kept
}

// drafts runs the drafter: the prompt chunks of fill, then each ready
// generation's draft. Chains are chained in one StepN as long as the
// longest, each cut to its generation's own length and p_min; trees are
// drafted level by level (treeDrafts).
func (r *runner) drafts(ctx context.Context, ready []*gen, fill []*engine.Entry) ([][]engine.Token, []*draftTree, error) {
	d := r.g.drafter
	if len(fill) > 0 {
		if err := d.Step(ctx, fill); err != nil {
			return nil, nil, err
		}
	}
	drafts := make([][]engine.Token, len(ready))
	trees := make([]*draftTree, len(ready))
	var treeGens, coupled []*gen
	var treeWho, coupledWho []int
	var batch []*engine.Entry
	var who []int
	n, room := 0, math.MaxInt
	for i, gn := range ready {
		if gn.remote != nil {
			drafts[i] = gn.remoteTokens
			continue
		}
		if gn.head && gn.target.Len() == 0 {
			continue // no features yet: a one-token prompt's first step is the target's alone
		}
		if gn.draftLen(r.g) > 0 && (gn.treeWidth() > 1 || gn.sampled) {
			treeGens, treeWho = append(treeGens, gn), append(treeWho, i)
			continue
		}
		if gn.draftLen(r.g) > 0 && gn.keyed && engine.DraftsCoupled(d) {
			coupled, coupledWho = append(coupled, gn), append(coupledWho, i)
			continue
		}
		if k := gn.draftLen(r.g); k > 0 {
			en := &engine.Entry{Seq: gn.draft, Tokens: gn.pendingDraft(), TopN: gn.req.DraftTopN}
			if gn.head {
				en.Target = gn.target
			}
			batch = append(batch, en)
			who = append(who, i)
			n = max(n, k)
			room = min(room, d.Config().MaxPositionEmbeddings-len(gn.context)+1)
		}
	}
	if len(treeGens) > 0 {
		ts, err := r.treeDrafts(ctx, treeGens)
		if err != nil {
			return nil, nil, err
		}
		for b, i := range treeWho {
			trees[i] = ts[b]
		}
	}
	if len(coupled) > 0 {
		cd, err := r.coupledDrafts(ctx, coupled)
		if err != nil {
			return nil, nil, err
		}
		for b, i := range coupledWho {
			drafts[i] = cd[b]
		}
	}
	if len(batch) == 0 {
		return drafts, trees, nil
	}
	out, err := engine.StepN(ctx, d, batch, min(n, room))
	if err != nil {
		return nil, nil, err
	}
	for b, i := range who {
		gn := ready[i]
		k := min(gn.draftLen(r.g), len(out[b]))
		for _, t := range out[b][:k] {
			if gn.req.PMin > 0 && math.Exp(float64(t.Logprob)) < gn.req.PMin {
				break
			}
			drafts[i] = append(drafts[i], t)
		}
	}
	return drafts, trees, nil
}

// coupledDrafts drafts the chains of keyed generations over a drafter that
// drafts coupled draws (engine.DraftsCoupled): each draft the Gumbel-max
// draw from the drafter's distribution under the key of the position it
// is drafted for — the key the target's row for it draws under, so that
// the two agree about as often as the distributions overlap
// (1 − TV(p, q)). One SampleN (chained on the device where the drafter
// chains) as long as the longest, each cut to its generation's own length
// and p_min, as drafts' greedy chains are; the drafter's sequences then
// hold what StepN's would.
func (r *runner) coupledDrafts(ctx context.Context, gens []*gen) ([][]engine.Token, error) {
	d := r.g.drafter
	batch := make([]*engine.VerifyEntry, len(gens))
	want := make([]int, len(gens))
	n, room := 0, math.MaxInt
	for i, gn := range gens {
		want[i] = gn.draftLen(r.g)
		n = max(n, want[i])
		room = min(room, d.Config().MaxPositionEmbeddings-len(gn.context)+1)
	}
	if n = min(n, room); n <= 0 {
		return make([][]engine.Token, len(gens)), nil
	}
	for i, gn := range gens {
		en := &engine.VerifyEntry{Seq: gn.draft, Tokens: gn.pendingDraft(), Out: 1, Sampling: gn.req.Sampling, TopN: gn.req.DraftTopN,
			Draws: make([]sampling.Draw, n)}
		for j := range n {
			en.Draws[j] = gn.keys.At(len(gn.context) + j)
		}
		if gn.head {
			en.Target = gn.target
		}
		batch[i] = en
	}
	out, err := engine.SampleN(ctx, d, batch, n)
	if err != nil {
		return nil, err
	}
	drafts := make([][]engine.Token, len(gens))
	for i, gn := range gens {
		for _, t := range out[i][:min(want[i], n)] {
			if p := gn.req.PMin; p > 0 && math.Exp(float64(t.Logprob)) < p {
				break
			}
			drafts[i] = append(drafts[i], t)
		}
	}
	return drafts, nil
}

// fail ends generations after an engine error, releasing their sequences
// (their caches may be anywhere).
func (r *runner) fail(ctx context.Context, gens []*gen, err error) {
	if ctx.Err() != nil {
		err = jobqueue.StopError(ctx, nil)
	}
	for _, gn := range gens {
		gn.draft, gn.target = release(gn.draft), release(gn.target)
		r.retire(gn, err)
	}
}

func release(s engine.Sequence) engine.Sequence {
	if s != nil {
		s.Release()
	}
	return nil
}

// pendingTarget and pendingDraft are the tokens each model has yet to
// feed.
func (gn *gen) pendingTarget() []int { return gn.context[gn.target.Len():] }

func (gn *gen) pendingDraft() []int {
	if gn.draft == nil {
		return nil
	}
	return gn.context[gn.draft.Len():]
}

// draftLen is how many tokens gn drafts this step: its k, within what it
// may still emit (a step emits the accepted tokens and one more) and the
// target's context (which feeds them after the context).
func (gn *gen) draftLen(g *Generator) int {
	if gn.draft == nil && gn.remote == nil || gn.probing {
		return 0
	}
	return max(0, min(gn.k, gn.req.MaxTokens-len(gn.out)-1, g.target.Config().MaxPositionEmbeddings-len(gn.context)))
}

// treeNodes is how many nodes gn's tree may send to the target: its
// budget, within the target's context past gn's.
func (gn *gen) treeNodes(g *Generator) int {
	return max(0, min(gn.nodes, g.target.Config().MaxPositionEmbeddings-len(gn.context)))
}

// verifyEntry is gn's part of the target's pass: its pending tokens and
// the draft, read out at the draft's positions and one past it, with a
// draw for each of those rows when sampling.
func (gn *gen) verifyEntry(draft []engine.Token) *engine.VerifyEntry {
	v := &engine.VerifyEntry{
		Seq: gn.target, Tokens: append(slices.Clip(gn.pendingTarget()), engine.IDs(draft)...), Out: len(draft) + 1,
		Sampling: gn.req.Sampling, TopN: gn.req.TopN,
	}
	if !gn.req.Sampling.Greedy() {
		v.Draws = gn.draws(v.Out)
		for i, d := range draft {
			v.Draws[i].X = d.ID
		}
	}
	return v
}

// draws returns the draws, without proposals, of n rows deciding the
// positions from the context's end on: a keyed generation's, its keys of
// those positions; else the next from its seeded source, U then V.
func (gn *gen) draws(n int) []sampling.Draw {
	out := make([]sampling.Draw, n)
	for i := range out {
		if gn.keyed {
			out[i] = gn.keys.At(len(gn.context) + i)
		} else {
			out[i] = sampling.Draw{X: sampling.NoProposal, U: gn.rng.Float32(), V: gn.rng.Float32()}
		}
	}
	return out
}

// accept applies the target's verdict on a draft: the draft tokens kept
// and the target's own after them are emitted (up to a stop token or
// MaxTokens), both caches roll back to the context, and the step is
// counted. It returns how many draft tokens were accepted and how many
// tokens were emitted.
func (gn *gen) accept(draft []engine.Token, rows []engine.VerifyRow, now time.Time, st *StepStats) (int, int) {
	step, a := gn.verdict(draft, rows, st)
	// The target's cache holds the context and the draft: keep what was
	// accepted. The drafter's holds the context and all but the draft's
	// last token (or more, drafting for a longer draft): the same.
	kept := len(gn.context) + a
	for _, s := range []engine.Sequence{gn.target, gn.draft} {
		if s != nil {
			s.Truncate(min(s.Len(), kept))
		}
	}
	return a, gn.settle(&step, len(draft), now)
}

// verdict is the step the target's verdict on a draft makes: the draft
// tokens kept and the target's own after them, and how many draft tokens
// were accepted.
func (gn *gen) verdict(draft []engine.Token, rows []engine.VerifyRow, st *StepStats) (Step, int) {
	greedy := gn.req.Sampling.Greedy()
	a := 0
	for a < len(draft) && (greedy && rows[a].Argmax == draft[a].ID || !greedy && rows[a].Accept) {
		a++
	}
	step := Step{Draft: draft, Accepted: a, DraftTime: st.Draft, VerifyTime: st.Verify, Fused: st.Fused, Chained: st.Chained}
	if gn.remote != nil {
		step.Remote, step.DraftTime, step.NetworkTime = true, gn.remoteOwn, gn.remoteRTT-gn.remoteOwn
	}
	for i := range a + 1 {
		row := rows[i]
		t := Token{ID: row.Argmax, Logprob: row.ArgmaxLogprob, Top: row.Top, Drafted: i < a}
		switch {
		case i < a && !greedy:
			t.ID, t.Logprob = draft[i].ID, row.XLogprob
		case i == a && !greedy:
			t.ID, t.Logprob = row.Sample, row.SampleLogprob
		}
		step.Tokens = append(step.Tokens, t)
	}
	return step, a
}

// settle emits a verified step's tokens, cuts both caches back to the
// context where a stop cut the step short, and counts the step; it returns
// how many tokens were emitted.
func (gn *gen) settle(step *Step, drafted int, now time.Time) int {
	emitted := gn.count(step, drafted, now)
	for _, s := range []engine.Sequence{gn.target, gn.draft} {
		if s != nil {
			s.Truncate(min(s.Len(), len(gn.context)))
		}
	}
	return emitted
}

// count emits a step's tokens (cut at a stop or the end), counts the step
// in gn's stats and hands it to the request's OnStep; it returns how many
// tokens were emitted.
func (gn *gen) count(step *Step, drafted int, now time.Time) int {
	a := step.Accepted
	emitted := gn.emit(step)
	gn.stats.Steps++
	gn.stats.Tokens += emitted
	if drafted > 0 {
		gn.specSteps++
		gn.specTokens += emitted
	}
	gn.stats.Drafted += drafted
	gn.stats.Accepted += a
	for len(gn.stats.AcceptedAt) < a {
		gn.stats.AcceptedAt = append(gn.stats.AcceptedAt, 0)
	}
	for p := range a {
		gn.stats.AcceptedAt[p]++
	}
	if gn.first.IsZero() && emitted > 0 {
		gn.first = now
	}
	if gn.req.OnStep != nil && !gn.req.OnStep(*step) && gn.finishedWhy == "" {
		gn.finishedWhy = FinishStop
	}
	return emitted
}

// emit appends the step's tokens to the output, cutting the step at a
// stop token (not emitted) or at MaxTokens or the end of the context; it
// returns how many it emitted.
func (gn *gen) emit(step *Step) int {
	limit := min(gn.req.MaxTokens-len(gn.out), gn.room())
	for i, t := range step.Tokens {
		if slices.Contains(gn.req.Stop, t.ID) {
			step.Tokens, gn.finishedWhy = step.Tokens[:i], FinishStop
			break
		}
		if i == limit {
			step.Tokens, gn.finishedWhy = step.Tokens[:i], FinishLength
			break
		}
	}
	gn.out = append(gn.out, step.Tokens...)
	for _, t := range step.Tokens {
		gn.context = append(gn.context, t.ID)
	}
	if gn.finishedWhy == "" && (len(gn.out) == gn.req.MaxTokens || gn.room() == 0) {
		gn.finishedWhy = FinishLength
	}
	return len(step.Tokens)
}

// room is how many more tokens the context may take: each model must feed
// the last one emitted.
func (gn *gen) room() int {
	return gn.maxContext - len(gn.context)
}

// retire ends a generation: with err nil it succeeds and its sequences go
// to the prefix caches, else they are released (where fail left any).
func (r *runner) retire(gn *gen, err error) {
	if gn.retired {
		return
	}
	gn.retired = true
	if gn.remote != nil {
		gn.remote.Close(ErrStaleDraft) // its answers from now on are stale
	}
	r.reserve(-gn.targetNeed, -gn.draftNeed)
	gn.targetNeed, gn.draftNeed = 0, 0
	keep := err == nil || errors.Is(err, context.Canceled)
	for _, c := range []struct {
		seq   *engine.Sequence
		cache *prefixcache.Cache
	}{{&gn.target, r.targetCache}, {&gn.draft, r.draftCache}} {
		s := *c.seq
		if s == nil {
			continue
		}
		if keep && s.Len() > 0 {
			c.cache.Put(slices.Clone(gn.context[:s.Len()]), s)
		} else {
			s.Release()
		}
		*c.seq = nil
	}
	gn.Result = Result{Tokens: gn.out, Finish: gn.finishedWhy, Stats: gn.stats}
	if !gn.first.IsZero() {
		gn.Result.Stats.Prefill = gn.first.Sub(gn.started)
		gn.Result.Stats.Decode = time.Since(gn.first)
	}
	gn.Finish(err)
	r.compact()
}

// retireCanceled ends the generations whose clients left; their caches
// are kept for reuse.
func (r *runner) retireCanceled() {
	for _, gn := range slices.Clone(r.active) {
		if gn.Canceled() {
			r.retire(gn, context.Canceled)
		}
	}
}

// compact drops retired generations from the active list.
func (r *runner) compact() {
	r.active = slices.DeleteFunc(r.active, func(gn *gen) bool { return gn.retired })
}

// shutdown fails everything still queued or running with err and frees
// every sequence.
func (r *runner) shutdown(err error) {
	r.g.queue.Stop()
	r.waiting = r.g.queue.Drain(r.waiting)
	for _, j := range r.waiting {
		j.Finish(err)
	}
	for _, gn := range slices.Clone(r.active) {
		gn.draft, gn.target = release(gn.draft), release(gn.target)
		r.retire(gn, err)
	}
	r.active, r.waiting = nil, nil
	r.draftCache.Clear()
	r.targetCache.Clear()
	r.g.running.Store(0)
}
