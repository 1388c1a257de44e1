package webgpu

import (
	"context"
	"fmt"
	"slices"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
)

// Coupled drafts (sampling's coupled draws). Where a fused step's
// verification rows draw coupled (their Draws' Coupled), the drafter — an
// Engine or a Head — drafts each token by the key of the row that
// verifies it, draft c of a step by its row c, through argmax.wgsl's
// coupled rows (kernels.ArgmaxOfCoupled, ArgmaxCoupled): the Gumbel-max
// draw from its own distribution at the request's temperature, which the
// target's coupled draw equals with probability near 1 − TV(p, q), where
// a greedy draft's is p(x). The keys of a call's drafts are written once,
// a region a draft (draftKeys). A chain that lists its drafts' top tokens
// (the live page's) lists them through sample.wgsl — over the draft
// vocabulary for a head — and draws its drafts through argmax.wgsl's
// coupled rows after it, keyed by the target's tokens; a head's chain
// then keeps its drafts as the target's tokens (chainLayout.mapped).

// CouplesDrafts reports that the engine drafts by coupled draws in its
// fused steps (engine.CouplesDrafts).
func (e *Engine) CouplesDrafts() bool { return true }

// CouplesDrafts reports that the head drafts by coupled draws in its
// fused steps (engine.CouplesDrafts).
func (h *Head) CouplesDrafts() bool { return true }

// draftKeys writes the keys of the coupled drafts of steps — each step's
// m chained speculative steps of n drafts: draft k = j·n + c by row c of
// step j's verification (Verify.Draws for j = 0; for j ≥ 1 its
// generation's seed words, which kernels.SpecKeys replaces by the key of
// the position the step reaches: specBuffers.keyDraws) — into *buf (keyRegions),
// a region a draft, and returns draft k's region; nil where no draw is
// coupled.
func draftKeys(dev *gpu.Device, buf **gpu.Buffer, label string, steps []engine.ChainStep, n, m int) (func(k int) gpu.Binding, error) {
	coupled := false
	for _, s := range steps {
		if v := s.Verify; v != nil && !v.Sampling.Greedy() && len(v.Draws) > 0 && v.Draws[0].Coupled {
			coupled = true
		}
	}
	if !coupled {
		return nil, nil
	}
	return keyRegions(dev, buf, label, len(steps), m*n, func(w []uint32, k, i int) {
		v, j, c := steps[i].Verify, k/n, k%n
		switch {
		case v == nil || v.Sampling.Greedy():
		case j == 0 && c < len(v.Draws):
			kernels.PutCoupledKey(w, v.Sampling.Temperature, v.Draws[c])
		case j > 0 && steps[i].Keys != nil:
			kernels.PutCoupledKey(w, v.Sampling.Temperature, sampling.Draw{Coupled: true})
			w[0], w[1] = steps[i].Keys.S0, steps[i].Keys.S1
		}
	})
}

// sampleKeys writes the keys of SampleN's coupled draws — entry i's token
// of step j drawn under batch[i].Draws[j] at the entry's temperature —
// into *buf (keyRegions), a region a step, and returns step j's region.
func sampleKeys(dev *gpu.Device, buf **gpu.Buffer, label string, batch []*engine.VerifyEntry, n int) (func(j int) gpu.Binding, error) {
	return keyRegions(dev, buf, label, len(batch), n, func(w []uint32, j, i int) {
		kernels.PutCoupledKey(w, batch[i].Sampling.Temperature, batch[i].Draws[j])
	})
}

// keyRegions writes regions regions of argmax.wgsl's coupled keys, B rows
// each (put fills row i of region k; a row it leaves is greedy), into *buf
// (grown as needed, labelled label), draftKeyStride(B) bytes apart, and
// returns region k.
func keyRegions(dev *gpu.Device, buf **gpu.Buffer, label string, B, regions int, put func(w []uint32, k, i int)) (func(k int) gpu.Binding, error) {
	bytes := uint64(B*kernels.ArgmaxCoupledWords) * 4
	stride := draftKeyStride(dev, B)
	if err := grow(dev, buf, label, uint64(regions)*stride); err != nil {
		return nil, err
	}
	words := make([]uint32, uint64(regions)*stride/4)
	for k := range regions {
		for i := range B {
			put(words[uint64(k)*stride/4+uint64(i*kernels.ArgmaxCoupledWords):], k, i)
		}
	}
	if err := (*buf).WriteU32(0, words); err != nil {
		return nil, err
	}
	keys := *buf
	return func(k int) gpu.Binding { return keys.Slice(uint64(k)*stride, bytes) }, nil
}

// draftKeyStride is the bytes from one draft's keys to the next's in
// draftKeys' buffer, for B rows a draft.
func draftKeyStride(dev *gpu.Device, B int) uint64 {
	align := uint64(dev.Limits().MinStorageBufferOffsetAlignment)
	return (uint64(B*kernels.ArgmaxCoupledWords)*4 + align - 1) / align * align
}

// verifyKeys writes the keys of a Verify's coupled draws (headFeed.draws)
// into the head's activations' chainKeys (keyRegions), a region a pass
// (its read-out rows in order; a row of a feed without draws greedy),
// and returns pass k's region; nil where no feed draws.
func (h *Head) verifyKeys(feeds []headFeed, passes []headPass) (func(k int) gpu.Binding, error) {
	if !slices.ContainsFunc(feeds, func(f headFeed) bool { return f.draws != nil }) {
		return nil, nil
	}
	reads := make([][]headRead, len(passes))
	for k := range passes {
		reads[k] = passes[k].readOrder(feeds)
	}
	return keyRegions(h.dev, &h.act.chainKeys, "head.chain_keys", h.act.S, len(passes), func(w []uint32, k, i int) {
		if i >= len(reads[k]) {
			return
		}
		rd := reads[k][i]
		if f := &feeds[rd.feed]; f.draws != nil {
			kernels.PutCoupledKey(w, f.params.Temperature, f.draws[rd.j])
		}
	})
}

// coupleKeys is draftKeys into the head's activations' chainKeys.
func (h *Head) coupleKeys(steps []engine.ChainStep, n, m int) (func(k int) gpu.Binding, error) {
	return draftKeys(h.dev, &h.act.chainKeys, "head.chain_keys", steps, n, m)
}

// coupleKeys is draftKeys into the activations' chainKeys.
func (e *Engine) coupleKeys(steps []engine.ChainStep, n, m int) (func(k int) gpu.Binding, error) {
	return draftKeys(e.dev, &e.act.chainKeys, "chain_keys", steps, n, m)
}

// keyStep puts draft k's keys (keys(k); none where keys is nil) where
// the drafter's read-out reads them: the activations' keys, B rows.
func (e *Engine) keyStep(keys func(k int) gpu.Binding, k int) []step {
	if keys == nil {
		return nil
	}
	return []step{func(b *gpu.Batch) error { return kernels.CopyRange(b, e.act.keys, 0, keys(k)) }}
}

// DraftsCoupled reports that the engine drafts coupled draws outside fused
// steps (engine.DraftsCoupled): its SampleN draws each token under its
// coupled draw's key, as the target alone's keyed rows do.
func (e *Engine) DraftsCoupled() bool { return true }

// DraftsCoupled reports that the head drafts coupled draws outside fused
// steps (engine.DraftsCoupled): through its SampleN.
func (h *Head) DraftsCoupled() bool { return true }

var _ engine.SampleChainer = (*Head)(nil)

// SampleN drafts coupled draws (engine.SampleChainer; coupled draws only):
// n steps as StepN's, entry i's token of step j the Gumbel-max draw from
// the head's distribution over its draft vocabulary at the entry's
// temperature under batch[i].Draws[j]'s key (argmax.wgsl's coupled rows,
// as its fused steps draft), in the target's vocabulary, with its
// log-probability at temperature 1 and the entry's TopN most likely
// tokens. The steps chain on the device where StepN's do, else run a step
// a call, each read back. On an error every sequence is as it was.
func (h *Head) SampleN(ctx context.Context, batch []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	if err := engine.CheckSampleN(&h.engCfg, batch, n); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	ones := make([]*engine.VerifyEntry, len(batch)) // a step's entries: a draw each
	for i, en := range batch {
		one := *en
		one.Draws = en.Draws[:1]
		ones[i] = &one
	}
	if err := engine.CheckHeadVerify(&h.engCfg, ones); err != nil {
		return nil, fmt.Errorf("webgpu head: sample n: %w", err)
	}
	entries := make([]*engine.Entry, len(batch))
	lens := make([]int, len(batch))
	for i, en := range batch {
		entries[i] = &engine.Entry{Seq: en.Seq, Target: en.Target, Tokens: en.Tokens, TopN: en.TopN}
		lens[i] = en.Seq.Len()
	}
	out := make([][]engine.Token, len(batch))
	if len(batch) == 0 {
		return out, nil
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, err
	}
	keys, err := sampleKeys(h.dev, &h.act.chainKeys, "head.chain_keys", batch, n)
	if err != nil {
		return nil, fmt.Errorf("webgpu head: sample n: %w", err)
	}
	// m steps from step j on, each entry fed its tokens: chained, or one.
	run := func(j, m int) ([][]engine.Token, error) {
		feeds, err := h.prepareChain(ctx, entries, m)
		if err != nil {
			return nil, err
		}
		if m > 1 && !h.chains(feeds) {
			h.unchain(feeds, false)
			return nil, nil
		}
		return h.chainTokens(ctx, feeds, entries, m, func(k int) gpu.Binding { return keys(j + k) })
	}
	toks, err := run(0, n)
	if err == nil && toks == nil { // the steps do not chain: a step a call
		for j := 0; j < n && err == nil; j++ {
			var one [][]engine.Token
			if one, err = run(j, 1); err == nil {
				for i, en := range entries {
					out[i] = append(out[i], one[i][0])
					en.Tokens = []int{one[i][0].ID}
				}
			}
		}
		toks = out
	}
	if err != nil {
		for i, en := range batch {
			en.Seq.Truncate(min(lens[i], en.Seq.Len()))
		}
		return nil, fmt.Errorf("webgpu head: sample n: %w", err)
	}
	return toks, nil
}
