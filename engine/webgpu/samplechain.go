package webgpu

import (
	"context"
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
	"webdraft/treemask"
)

var _ engine.SampleChainer = (*Engine)(nil)

// SampleN is n sampled steps in one (engine.SampleChainer): the first feeds
// each entry's tokens, each after it the token the step before drew. Where
// every entry feeds one token and the batch fits a pass, the passes chain
// on the device as StepN's do: each pass's read-out, through sample.wgsl
// with the pass's draws (copied into place on the device from a buffer the
// host wrote once), writes the token it drew where the next pass embeds
// it (kernels.SetSampleOutcome) and into the results, read back once at
// the end. Otherwise a pass is fed and read back as Verify does until the
// rest chains. On an error every sequence is as it was before the call.
func (e *Engine) SampleN(ctx context.Context, batch []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	if err := engine.CheckSampleN(&e.cfg, batch, n); err != nil {
		return nil, fmt.Errorf("webgpu engine: %w", err)
	}
	return e.locked(func() ([]pending, []int, error) { return e.prepareVerifyMore(batch, n-1) },
		func(work []pending) ([][]engine.Token, error) { return e.runSampled(ctx, work, n) })
}

// runSampled feeds work its pending tokens and then n−1 drawn tokens (n in
// all), chained on the device where the batch allows (chainable); the
// blocks are reserved.
func (e *Engine) runSampled(ctx context.Context, work []pending, n int) ([][]engine.Token, error) {
	out := make([][]engine.Token, len(work))
	for ; n > 0 && (n == 1 || !e.chainable(work)); n-- {
		// A pass (or a prompt's passes) read back: the draw is the row's.
		if err := e.feed(ctx, work); err != nil {
			return nil, err
		}
		for i := range work {
			p := &work[i]
			row := p.rows[len(p.rows)-1]
			out[i] = append(out[i], engine.Token{ID: row.Sample, Logprob: row.SampleLogprob, Top: row.Top})
			p.tokens, p.place, p.out = []int{row.Sample}, []treemask.Row{treemask.LineRow(p.seq.Len())}, 1
		}
	}
	if n == 0 {
		return out, nil
	}
	chained, err := e.chainTokens(ctx, work, n)
	if err != nil {
		return nil, err
	}
	for i := range work {
		out[i] = append(out[i], chained[i]...)
	}
	return out, nil
}

// samples reports whether chain c draws its tokens (stageDraws).
func (c *chainRun) samples() bool { return c.drawSteps != nil }

// draws are the steps that put pass j's draws in place: none for a greedy
// chain.
func (c *chainRun) draws(j int) []step {
	if c.drawSteps == nil {
		return nil
	}
	return c.drawSteps(j)
}

// stageDraws writes the draws of a sampled chain of m passes over work —
// each entry's Verify draws from its next one on (the first len(rows)
// were its passes' before the chain) — into the activations' chainDraws,
// a region a pass, and returns the steps that put pass j's where
// sample.wgsl reads them (j ≥ 1: the first pass's the host writes), each
// row marked to write its outcome. For a greedy chain (Step entries) it
// writes nothing and returns nil.
func (e *Engine) stageDraws(work []pending, m int) (func(j int) []step, error) {
	sampled := false
	for _, p := range work {
		sampled = sampled || p.verify != nil && !p.verify.Sampling.Greedy()
	}
	if !sampled {
		return nil, nil
	}
	a := e.act
	align := uint64(e.dev.Limits().MinStorageBufferOffsetAlignment)
	bytes := uint64(len(work)*kernels.SampleDrawWords) * 4
	stride := (bytes + align - 1) / align * align
	if err := grow(e.dev, &a.chainDraws, "chain_draws", uint64(m)*stride); err != nil {
		return nil, err
	}
	words := make([]uint32, uint64(m)*stride/4)
	temps := make([]float32, kernels.SampleTempWords) // written with the first pass
	for j := 1; j < m; j++ {
		for i, p := range work {
			w := words[uint64(j)*stride/4+uint64(i*kernels.SampleDrawWords):]
			var sp sampling.Params
			d := sampling.Draw{X: sampling.NoProposal}
			if v := p.verify; v != nil && !v.Sampling.Greedy() {
				sp, d = v.Sampling, v.Draws[len(p.rows)+j]
			}
			kernels.PutSampleRow(w, temps, sp, d)
			kernels.SetSampleOutcome(w)
		}
	}
	if err := a.chainDraws.WriteU32(0, words); err != nil {
		return nil, err
	}
	return func(j int) []step {
		return []step{func(b *gpu.Batch) error {
			return kernels.CopyRange(b, a.draws, 0, a.chainDraws.Slice(uint64(j)*stride, bytes))
		}}
	}, nil
}
