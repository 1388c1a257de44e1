package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"webdraft/engine"
	"webdraft/engine/webgpu"
)

// decoding prefills batch sequences with context random tokens each and
// returns a function that runs one decode step of all of them, and one
// that releases them.
func decoding(ctx context.Context, e engine.Engine, batch, context int) (step func(n int) error, release func(), err error) {
	cfg := e.Config()
	rng := rand.New(rand.NewPCG(3, uint64(batch)))
	entries := make([]*engine.Entry, 0, batch)
	release = func() {
		for _, en := range entries {
			en.Seq.Release()
		}
	}
	for range batch {
		s, err := e.NewSequence()
		if err != nil {
			release()
			return nil, nil, err
		}
		en := &engine.Entry{Seq: s, Tokens: randomTokens(rng, context, cfg.VocabSize)}
		entries = append(entries, en)
		if err := e.Step(ctx, []*engine.Entry{en}); err != nil {
			release()
			return nil, nil, fmt.Errorf("prefill: %w", err)
		}
		en.Tokens = []int{en.Next}
	}
	// step runs n decode steps: one Step each, or, n > 1, chained on the
	// device (engine.StepN).
	step = func(n int) error {
		if n > 1 {
			if _, err := engine.StepN(ctx, e, entries, n); err != nil {
				return err
			}
		} else if err := e.Step(ctx, entries); err != nil {
			return err
		}
		for _, en := range entries {
			en.Tokens = []int{en.Next}
		}
		return nil
	}
	return step, release, nil
}

// Decode prefills batch sequences with context random tokens each, then
// times steps decode steps of all of them together, each its own Step (a
// round trip to the host per token); it returns the time per step.
func Decode(ctx context.Context, e engine.Engine, batch, context, steps int) (time.Duration, error) {
	return decode(ctx, e, batch, context, steps, 1)
}

// Drafts is Decode with the steps chained on the device, draft tokens at a
// time (engine.StepN, as the server drafts): the time per step of a draft.
func Drafts(ctx context.Context, e engine.Engine, batch, context, steps, draft int) (time.Duration, error) {
	return decode(ctx, e, batch, context, steps, draft)
}

func decode(ctx context.Context, e engine.Engine, batch, context, steps, chain int) (time.Duration, error) {
	step, release, err := decoding(ctx, e, batch, context)
	if err != nil {
		return 0, err
	}
	defer release()
	if err := step(chain); err != nil { // warm up
		return 0, err
	}
	rounds := max(1, steps/chain)
	start := time.Now()
	for range rounds {
		if err := step(chain); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(rounds*chain), nil
}

// Prefill times feeding a fresh sequence n random tokens in one Step: the
// mean of reps runs after a warm-up run.
func Prefill(ctx context.Context, e engine.Engine, n, reps int) (time.Duration, error) {
	if reps < 1 {
		return 0, fmt.Errorf("prefill: %d repetitions", reps)
	}
	var total time.Duration
	for i := range reps + 1 {
		d, err := prefillOnce(ctx, e, n)
		if err != nil {
			return 0, err
		}
		if i > 0 { // the first run warms up
			total += d
		}
	}
	return total / time.Duration(reps), nil
}

// randomTokens returns n token ids drawn uniformly from a vocabulary of
// vocab tokens by rng.
func randomTokens(rng *rand.Rand, n, vocab int) []int {
	p := make([]int, n)
	for j := range p {
		p[j] = rng.IntN(vocab)
	}
	return p
}

// prefillOnce feeds a fresh sequence n random tokens (the same ones for the
// same n) in one Step and releases it.
func prefillOnce(ctx context.Context, e engine.Engine, n int) (time.Duration, error) {
	p := randomTokens(rand.New(rand.NewPCG(4, uint64(n))), n, e.Config().VocabSize)
	s, err := e.NewSequence()
	if err != nil {
		return 0, err
	}
	defer s.Release()
	start := time.Now()
	if err := e.Step(ctx, []*engine.Entry{{Seq: s, Tokens: p}}); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// Kernel is one kernel's share of a profiled forward pass.
type Kernel struct {
	Name       string
	Dispatches int
	Time       time.Duration // GPU time, summed over its dispatches
}

// ProfileDecode times, kernel by kernel on the GPU, one decode step of
// batch sequences at the given context (after a warm-up step).
func ProfileDecode(ctx context.Context, e *webgpu.Engine, batch, context int, period float64) ([]Kernel, error) {
	step, release, err := decoding(ctx, e, batch, context)
	if err != nil {
		return nil, err
	}
	defer release()
	one := func() error { return step(1) }
	if err := one(); err != nil { // warm up
		return nil, err
	}
	return profile(e, one, period)
}

// ProfilePrefill times, kernel by kernel on the GPU, the prefill of an
// n-token prompt (after a warm-up prefill).
func ProfilePrefill(ctx context.Context, e *webgpu.Engine, n int, period float64) ([]Kernel, error) {
	one := func() error { _, err := prefillOnce(ctx, e, n); return err }
	if err := one(); err != nil {
		return nil, err
	}
	return profile(e, one, period)
}

// profile runs f with every dispatch timed, and sums the time per kernel.
func profile(e *webgpu.Engine, f func() error, period float64) ([]Kernel, error) {
	prof, err := e.Profile(f)
	if err != nil {
		return nil, err
	}
	var out []Kernel
	for _, name := range prof.Names() {
		out = append(out, Kernel{Name: name, Dispatches: prof.Count[name],
			Time: time.Duration(float64(prof.Ticks[name]) * period * 1e9)})
	}
	return out, nil
}

// Verify prefills a sequence with context random tokens, then times a
// verification of rows tokens — one Verify pass reading out every row, as
// a target checks rows−1 drafted tokens and its own next — the sequence
// cut back to its context after each. It returns the median of reps
// passes after a warm-up one.
func Verify(ctx context.Context, e engine.Engine, rows, context, reps int) (time.Duration, error) {
	if rows < 1 || reps < 1 {
		return 0, fmt.Errorf("verify: %d rows, %d repetitions", rows, reps)
	}
	pass, release, err := verifying(ctx, e, rows, context)
	if err != nil {
		return 0, err
	}
	defer release()
	times := make([]time.Duration, 0, reps)
	for i := range reps + 1 {
		start := time.Now()
		if err := pass(); err != nil {
			return 0, err
		}
		if i > 0 {
			times = append(times, time.Since(start))
		}
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// ProfileVerify times, kernel by kernel on the GPU, one verification of
// rows tokens after context random ones, as Verify times it (after a
// warm-up pass).
func ProfileVerify(ctx context.Context, e *webgpu.Engine, rows, context int, period float64) ([]Kernel, error) {
	if rows < 1 {
		return nil, fmt.Errorf("verify: %d rows", rows)
	}
	pass, release, err := verifying(ctx, e, rows, context)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := pass(); err != nil {
		return nil, err
	}
	return profile(e, pass, period)
}

// verifying prefills a sequence of e with context random tokens and
// returns a verification of rows random tokens after them, which cuts the
// sequence back to its context, and the sequence's release.
func verifying(ctx context.Context, e engine.Engine, rows, context int) (pass func() error, release func(), err error) {
	cfg := e.Config()
	rng := rand.New(rand.NewPCG(5, uint64(rows)))
	random := func(n int) []int { return randomTokens(rng, n, cfg.VocabSize) }
	s, err := e.NewSequence()
	if err != nil {
		return nil, nil, err
	}
	if err := e.Step(ctx, []*engine.Entry{{Seq: s, Tokens: random(context)}}); err != nil {
		s.Release()
		return nil, nil, fmt.Errorf("prefill: %w", err)
	}
	fed := random(rows)
	pass = func() error {
		if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: s, Tokens: fed, Out: rows}}); err != nil {
			return err
		}
		s.Truncate(context)
		return nil
	}
	return pass, s.Release, nil
}

// ProfileHeadDraft times, kernel by kernel on the GPU, one round of draft
// chained draft tokens of an EAGLE-3 head over target's features, as
// HeadDrafts drafts (after a warm-up round): the head's passes go through
// the target's submissions, so the target's profile holds them.
func ProfileHeadDraft(ctx context.Context, target *webgpu.Engine, head engine.Engine, context, draft int, period float64) ([]Kernel, error) {
	round, release, err := headRounds(ctx, target, head, context, draft)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := round(); err != nil {
		return nil, err
	}
	return profile(target, round, period)
}

// HeadDrafts times an EAGLE-3 head drafting as the server drafts with one:
// a target sequence of context random tokens, the head's over its
// features, then rounds of draft tokens chained on the device
// (engine.StepN), each after a token the target would have added and from
// the same context (the head truncated back after it). It returns the time
// per draft token.
func HeadDrafts(ctx context.Context, target, head engine.Engine, context, steps, draft int) (time.Duration, error) {
	round, release, err := headRounds(ctx, target, head, context, draft)
	if err != nil {
		return 0, err
	}
	defer release()
	if err := round(); err != nil { // warm up
		return 0, err
	}
	rounds := max(1, steps/draft)
	start := time.Now()
	for range rounds {
		if err := round(); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(rounds*draft), nil
}

// headRounds prefills a target sequence of context random tokens and the
// head's over its features (headPrefill), and returns a round of draft
// tokens chained on the device, each from the same context (the head cut
// back to it after the round), and what releases both sequences.
func headRounds(ctx context.Context, target, head engine.Engine, context, draft int) (round func() error, release func(), err error) {
	ts, hs, next, release, err := headPrefill(ctx, target, head, context)
	if err != nil {
		return nil, nil, err
	}
	h := &engine.Entry{Seq: hs, Target: ts}
	// The target holds the context and, after its prefill, knows the
	// token after it: each round drafts past that one.
	round = func() error {
		h.Tokens = []int{next}
		_, err := engine.StepN(ctx, head, []*engine.Entry{h}, draft)
		hs.Truncate(context)
		return err
	}
	return round, release, nil
}

// headPrefill prefills a target sequence with context random tokens and
// an EAGLE-3 head's sequence over its features, and returns both, the
// target's token after the context and what releases them.
func headPrefill(ctx context.Context, target, head engine.Engine, context int) (ts, hs engine.Sequence, next int, release func(), err error) {
	p := randomTokens(rand.New(rand.NewPCG(5, uint64(context))), context, target.Config().VocabSize)
	if ts, err = target.NewSequence(); err != nil {
		return nil, nil, 0, nil, err
	}
	t := &engine.Entry{Seq: ts, Tokens: p}
	if err := target.Step(ctx, []*engine.Entry{t}); err != nil {
		ts.Release()
		return nil, nil, 0, nil, fmt.Errorf("target prefill: %w", err)
	}
	if hs, err = head.NewSequence(); err != nil {
		ts.Release()
		return nil, nil, 0, nil, err
	}
	release = func() { hs.Release(); ts.Release() }
	if err := head.Step(ctx, []*engine.Entry{{Seq: hs, Target: ts, Tokens: p}}); err != nil {
		release()
		return nil, nil, 0, nil, fmt.Errorf("head prefill: %w", err)
	}
	return ts, hs, t.Next, release, nil
}

// SpecSteps times greedy speculative steps as the server runs them with a
// drafter that chains them on the device (engine.SpecChainer: an EAGLE-3
// head over target's features): m steps of n drafts and a verification of
// n + 1 rows in one call, each planned on the device from the verdict of
// the one before, after a context of random tokens. It returns the median
// time a step over reps calls, after a warm-up one. The work of a chained
// step does not depend on how many drafts the target accepts, so random
// weights time it as a trained head's.
func SpecSteps(ctx context.Context, target, drafter engine.Engine, context, n, m, reps int) (time.Duration, error) {
	if n < 1 || m < 2 || reps < 1 {
		return 0, fmt.Errorf("speculative steps: %d drafts, %d steps, %d repetitions", n, m, reps)
	}
	times := make([]time.Duration, 0, reps)
	for i := range reps + 1 {
		run, release, err := specRound(ctx, target, drafter, context, n, m)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		err = run()
		d := time.Since(start)
		release()
		if err != nil {
			return 0, err
		}
		if i > 0 {
			times = append(times, d/time.Duration(m))
		}
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// ProfileSpecSteps times, kernel by kernel on the GPU, one call of m
// chained speculative steps of n drafts (SpecSteps; after a warm-up
// call): the drafter's passes go through the target's submissions, so
// the target's profile holds the whole step.
func ProfileSpecSteps(ctx context.Context, target *webgpu.Engine, drafter engine.Engine, context, n, m int, period float64) ([]Kernel, error) {
	var out []Kernel
	for i := range 2 {
		run, release, err := specRound(ctx, target, drafter, context, n, m)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			err = run()
		} else {
			out, err = profile(target, run, period)
		}
		release()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// specRound prefills fresh sequences of both models (headPrefill) and
// returns a call of m speculative steps of n drafts chained on the
// device, and what releases the sequences. The call fails where the
// drafter ran fewer steps than m (the batch did not chain).
func specRound(ctx context.Context, target, drafter engine.Engine, context, n, m int) (run func() error, release func(), err error) {
	sc, ok := drafter.(engine.SpecChainer)
	if !ok {
		return nil, nil, fmt.Errorf("speculative steps: %T does not chain them on the device", drafter)
	}
	ts, hs, next, release, err := headPrefill(ctx, target, drafter, context)
	if err != nil {
		return nil, nil, err
	}
	run = func() error {
		steps := []engine.ChainStep{{
			Draft:  &engine.Entry{Seq: hs, Target: ts, Tokens: []int{next}},
			Verify: &engine.VerifyEntry{Seq: ts, Tokens: []int{next}, Out: n + 1},
			Take:   n,
		}}
		out, err := sc.DraftVerifyN(ctx, target, steps, n, m)
		if err != nil {
			return fmt.Errorf("speculative steps, %d drafts: %w", n, err)
		}
		if len(out) != m {
			return fmt.Errorf("speculative steps, %d drafts: %d of %d steps chained", n, len(out), m)
		}
		return nil
	}
	return run, release, nil
}
