// Package specdec measures speculative decoding with greedy drafts: how many
// tokens per verification step a drafter saves its target.
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
	// Progress, when set, is called after each prompt.
	Progress func()
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
	r := &Result{K: o.K, Hist: make([]int, o.K+1), Reached: make([]int, o.K), Accepted: make([]int, o.K)}
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
		cont, err := continuation(ctx, target, p, o.NewTokens)
		if err != nil {
			return nil, fmt.Errorf("target, prompt %d: %w", i, err)
		}
		if err := r.prompt(ctx, drafter, p, cont); err != nil {
			return nil, fmt.Errorf("drafter, prompt %d: %w", i, err)
		}
		r.Prompts++
		if o.Progress != nil {
			o.Progress()
		}
	}
	return r, nil
}

// continuation is the target's n greedy tokens after p.
func continuation(ctx context.Context, target engine.Engine, p []int, n int) ([]int, error) {
	seq, err := target.NewSequence()
	if err != nil {
		return nil, err
	}
	defer seq.Release()
	return engine.Draft(ctx, target, seq, p, n)
}

// prompt plays the verification steps of one prompt, keeping the drafter's
// KV cache across steps and rolling it back to what was accepted.
func (r *Result) prompt(ctx context.Context, drafter engine.Engine, p, cont []int) error {
	seq, err := drafter.NewSequence()
	if err != nil {
		return err
	}
	defer seq.Release()
	ctxTokens := append([]int(nil), p...) // prompt + accepted continuation
	pos := 0
	for pos < len(cont) {
		draft, err := engine.Draft(ctx, drafter, seq, ctxTokens[seq.Len():], r.K)
		if err != nil {
			return err
		}
		left := len(cont) - pos
		a := 0
		for a < r.K && a < left && draft[a] == cont[pos+a] {
			r.Reached[a]++
			r.Accepted[a]++
			a++
		}
		if a < r.K && a < left {
			r.Reached[a]++
		}
		gained := min(a+1, left) // the accepted tokens and the target's own
		r.Hist[a]++
		r.Steps++
		r.Gained += gained
		// The cache holds the old context and draft[:K-1]; keep the context
		// and the accepted draft tokens, leaving at least one token to feed.
		seq.Truncate(min(seq.Len(), len(ctxTokens)+a, len(ctxTokens)+gained-1))
		ctxTokens = append(ctxTokens, cont[pos:pos+gained]...)
		pos += gained
	}
	return nil
}
