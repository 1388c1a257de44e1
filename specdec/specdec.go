// Package specdec measures speculative decoding offline with greedy drafts:
// how many tokens per verification step a drafter saves its target, with
// the target's continuation computed first (package speculative runs the
// live loop, the target verifying).
//
// For each prompt the target's greedy continuation is computed once. Then,
// step by step, the drafter drafts k tokens from the context so far; the
// longest prefix equal to the target's continuation is accepted and the
// target's own next token appended — exactly what a verifier keeps when it
// checks the k draft tokens in one forward pass. τ, the mean acceptance
// length, is the tokens gained per step (accepted + 1).
package specdec

import (
	"context"
	"fmt"

	"webdraft/engine"
)

// Options shape a measurement.
type Options struct {
	K         int // draft length per step
	NewTokens int // length of the target's continuation per prompt
	// Batch is how many prompts run side by side, each in its own sequence
	// of a batched forward pass (default 32). The result does not depend on
	// it: prompts never see each other.
	Batch int
	// Progress, when set, is called with the number of prompts finished.
	Progress func(done int)
}

// Result accumulates a measurement over prompts.
type Result struct {
	K       int
	Prompts int
	Steps   int // verification steps
	Gained  int // tokens gained, the target's continuation lengths in all
	// Hist[a] counts the steps that accepted a draft tokens (0 … K).
	Hist []int
	// Reached[i] counts the steps that compared draft token i (all before
	// it accepted); Accepted[i] those that accepted it.
	Reached, Accepted []int
	// Continuations are the target's greedy continuations, one per prompt
	// in order (for measures of the text itself, such as package
	// textstats).
	Continuations [][]int
}

// Tau is the mean acceptance length: tokens gained per verification step.
func (r *Result) Tau() float64 {
	if r.Steps == 0 {
		return 0
	}
	return float64(r.Gained) / float64(r.Steps)
}

// AcceptRate is the rate at which draft token i (0-based) was accepted when
// compared.
func (r *Result) AcceptRate(i int) float64 {
	if r.Reached[i] == 0 {
		return 0
	}
	return float64(r.Accepted[i]) / float64(r.Reached[i])
}

// Run measures drafter against target on prompts.
func Run(ctx context.Context, target, drafter engine.Engine, prompts [][]int, o Options) (*Result, error) {
	if o.K < 1 || o.NewTokens < 1 {
		return nil, fmt.Errorf("specdec: k = %d, new tokens = %d: want both ≥ 1", o.K, o.NewTokens)
	}
	tc, dc := target.Config(), drafter.Config()
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, fmt.Errorf("specdec: prompt %d is empty", i)
		}
		if need := len(p) + o.NewTokens + o.K; need > tc.MaxPositionEmbeddings || need > dc.MaxPositionEmbeddings {
			return nil, fmt.Errorf("specdec: prompt %d: %d tokens + %d new + %d drafted exceed a model's context", i, len(p), o.NewTokens, o.K)
		}
		for j, t := range p {
			if t >= tc.VocabSize || t >= dc.VocabSize || t < 0 {
				return nil, fmt.Errorf("specdec: prompt %d: token %d at %d is outside a model's vocabulary", i, t, j)
			}
		}
	}
	batch := o.Batch
	if batch <= 0 {
		batch = 32
	}
	r := &Result{K: o.K, Hist: make([]int, o.K+1), Reached: make([]int, o.K), Accepted: make([]int, o.K)}
	for lo := 0; lo < len(prompts); lo += batch {
		group := prompts[lo:min(lo+batch, len(prompts))]
		conts, err := continuations(ctx, target, group, o.NewTokens)
		if err != nil {
			return nil, fmt.Errorf("target, prompts %d…%d: %w", lo, lo+len(group)-1, err)
		}
		if err := r.verify(ctx, target, drafter, group, conts); err != nil {
			return nil, fmt.Errorf("drafter, prompts %d…%d: %w", lo, lo+len(group)-1, err)
		}
		r.Continuations = append(r.Continuations, conts...)
		r.Prompts += len(group)
		if o.Progress != nil {
			o.Progress(r.Prompts)
		}
	}
	return r, nil
}

// continuations are the target's n greedy tokens after each prompt,
// decoded side by side.
func continuations(ctx context.Context, target engine.Engine, prompts [][]int, n int) ([][]int, error) {
	entries, release, err := newEntries(target, len(prompts))
	defer release()
	if err != nil {
		return nil, err
	}
	for i, p := range prompts {
		entries[i].Tokens = p
	}
	conts, err := engine.StepN(ctx, target, entries, n)
	if err != nil {
		return nil, err
	}
	ids := make([][]int, len(conts))
	for i, c := range conts {
		ids[i] = engine.IDs(c)
	}
	return ids, nil
}

// newEntries makes n batch entries, each with a fresh sequence of e;
// release frees them (also after an error).
func newEntries(e engine.Engine, n int) ([]*engine.Entry, func(), error) {
	entries := make([]*engine.Entry, 0, n)
	release := func() {
		for _, en := range entries {
			en.Seq.Release()
		}
	}
	for range n {
		seq, err := e.NewSequence()
		if err != nil {
			return nil, release, err
		}
		entries = append(entries, &engine.Entry{Seq: seq})
	}
	return entries, release, nil
}

// game is one prompt's verification: the context so far (prompt and
// accepted continuation) and how far into the target's continuation it is.
type game struct {
	entry   *engine.Entry
	target  *engine.Entry // a head's: the target's sequence of the context, for its features
	context []int
	cont    []int
	pos     int
	draft   []int
}

// verify plays the verification steps of a group of prompts side by side:
// each step, every unfinished prompt's drafter sequence drafts K tokens
// (one batched forward pass per token), then each keeps the prefix its
// target agrees with. Drafter KV caches persist across steps, rolled back
// to what was accepted.
//
// A drafter that reads its target (an EAGLE-3 head, engine.ReadsTarget)
// drafts from the target's features of the context as the live loop has
// them — every position but the last token's, which the target has not
// fed yet — so each step the target first feeds the context so far (one
// batched pass), and a one-token context drafts nothing.
func (r *Result) verify(ctx context.Context, target, drafter engine.Engine, prompts, conts [][]int) error {
	entries, release, err := newEntries(drafter, len(prompts))
	defer release()
	if err != nil {
		return err
	}
	head := engine.ReadsTarget(drafter) != nil
	var targets []*engine.Entry
	if head {
		var releaseTargets func()
		targets, releaseTargets, err = newEntries(target, len(prompts))
		defer releaseTargets()
		if err != nil {
			return err
		}
	}
	games := make([]*game, len(prompts))
	for i, p := range prompts {
		games[i] = &game{entry: entries[i], context: append([]int(nil), p...), cont: conts[i], draft: make([]int, 0, r.K)}
		if head {
			games[i].target = targets[i]
		}
	}
	for {
		var batch, feed []*engine.Entry
		var playing, drafting []*game
		for _, g := range games {
			if g.pos >= len(g.cont) {
				continue
			}
			g.draft = g.draft[:0]
			playing = append(playing, g)
			if head {
				t := g.target
				if t.Tokens = g.context[t.Seq.Len() : len(g.context)-1]; len(t.Tokens) > 0 {
					feed = append(feed, t)
				}
				if len(g.context) == 1 {
					continue // no features yet: the target's own token
				}
				g.entry.Target = t.Seq
			}
			g.entry.Tokens = g.context[g.entry.Seq.Len():]
			batch = append(batch, g.entry)
			drafting = append(drafting, g)
		}
		if len(playing) == 0 {
			return nil
		}
		if len(feed) > 0 {
			if err := target.Step(ctx, feed); err != nil {
				return fmt.Errorf("the target's features: %w", err)
			}
		}
		if len(batch) > 0 {
			drafts, err := engine.StepN(ctx, drafter, batch, r.K)
			if err != nil {
				return err
			}
			for i, g := range drafting {
				g.draft = append(g.draft, engine.IDs(drafts[i])...)
			}
		}
		for _, g := range playing {
			r.accept(g)
		}
	}
}

// accept compares a game's draft with the target's continuation, counts the
// step and moves the game on.
func (r *Result) accept(g *game) {
	left := len(g.cont) - g.pos
	a := 0
	for a < len(g.draft) && a < left && g.draft[a] == g.cont[g.pos+a] {
		r.Reached[a]++
		r.Accepted[a]++
		a++
	}
	if a < len(g.draft) && a < left {
		r.Reached[a]++
	}
	gained := min(a+1, left) // the accepted tokens and the target's own
	r.Hist[a]++
	r.Steps++
	r.Gained += gained
	// The cache holds the old context and draft[:K-1]; keep the context
	// and the accepted draft tokens, leaving at least one token to feed.
	seq := g.entry.Seq
	seq.Truncate(min(seq.Len(), len(g.context)+a, len(g.context)+gained-1))
	g.context = append(g.context, g.cont[g.pos:g.pos+gained]...)
	g.pos += gained
}
