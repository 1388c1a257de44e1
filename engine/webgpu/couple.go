package webgpu

import (
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
// the position the step reaches: specBuffers.keyDraws) — into *buf (grown
// as needed, labelled label), a region of B rows a draft,
// draftKeyStride(B) bytes apart, and returns draft k's region; nil where
// no draw is coupled.
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
	B := len(steps)
	bytes := uint64(B*kernels.ArgmaxCoupledWords) * 4
	stride := draftKeyStride(dev, B)
	if err := grow(dev, buf, label, uint64(m*n)*stride); err != nil {
		return nil, err
	}
	words := make([]uint32, uint64(m*n)*stride/4)
	for i, s := range steps {
		v := s.Verify
		if v == nil || v.Sampling.Greedy() {
			continue
		}
		for j := range m {
			for c := range n {
				w := words[uint64(j*n+c)*stride/4+uint64(i*kernels.ArgmaxCoupledWords):]
				switch {
				case j == 0 && c < len(v.Draws):
					kernels.PutCoupledKey(w, v.Sampling.Temperature, v.Draws[c])
				case j > 0 && s.Keys != nil:
					kernels.PutCoupledKey(w, v.Sampling.Temperature, sampling.Draw{Coupled: true})
					w[0], w[1] = s.Keys.S0, s.Keys.S1
				}
			}
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
