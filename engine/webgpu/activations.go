package webgpu

import (
	"fmt"

	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// activations are the pass's buffers, sized for MaxRows rows and maxLasts
// complete entries.
type activations struct {
	maxLasts      int
	ids, seq, pos *gpu.Buffer // (rows) u32
	last, next    *gpu.Buffer // (lasts) u32: rows to read out, greedy tokens
	x             *gpu.Buffer // (rows, H): the hidden states
	q, attn       *gpu.Buffer // (rows, heads*D)
	qkv           *gpu.Buffer // (rows, (heads + 2·kv_heads)·D); unwritten when the projection splits along K
	gateUp        *gpu.Buffer // (rows, 2I)
	hLast, hNorm  *gpu.Buffer // (lasts, H): the complete entries' last rows, and normalized
	logits        *gpu.Buffer // (lasts, vocab)
	chained       *gpu.Buffer // StepN's greedy tokens, pass by pass, grown on demand
	hiddenRows    *kernels.Matrix
	all           []*gpu.Buffer
}

func newActivations(d *gpu.Device, c *qwen3.Config, rows, seqs int) (_ *activations, err error) {
	a := &activations{}
	defer func() {
		if err != nil {
			a.release()
		}
	}()
	// Logits of all complete entries must fit one binding.
	a.maxLasts = min(seqs, rows, int(d.Limits().MaxStorageBufferBindingSize/uint64(4*c.VocabSize)))
	if a.maxLasts < 1 {
		return nil, fmt.Errorf("the vocabulary's logits (%d) do not fit one storage binding", c.VocabSize)
	}
	H, q, kv, I := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize
	for _, b := range []struct {
		dst   **gpu.Buffer
		name  string
		words int
	}{
		// ids and next in whole 16-byte words: StepN copies one to the other.
		{&a.ids, "ids", (rows + 3) &^ 3}, {&a.seq, "seq", rows}, {&a.pos, "pos", rows},
		{&a.last, "last", a.maxLasts}, {&a.next, "next", (a.maxLasts + 3) &^ 3},
		{&a.x, "hidden", rows * H},
		{&a.q, "q", rows * q}, {&a.attn, "attn", rows * q},
		{&a.qkv, "qkv", rows * (q + 2*kv)},
		{&a.gateUp, "gate_up", rows * 2 * I},
		{&a.hLast, "hidden_last", a.maxLasts * H}, {&a.hNorm, "hidden_last_normed", a.maxLasts * H}, {&a.logits, "logits", a.maxLasts * c.VocabSize},
	} {
		if *b.dst, err = d.NewBuffer(b.name, uint64(b.words)*4); err != nil {
			return nil, fmt.Errorf("activations: %w", err)
		}
		a.all = append(a.all, *b.dst)
	}
	// The hidden states seen as an f32 matrix, so Embed can gather rows.
	a.hiddenRows = &kernels.Matrix{Name: "hidden", Format: kernels.F32, N: rows, K: H, W: a.x}
	return a, nil
}

// ensureChain returns StepN's results buffer, grown to at least n bytes.
func (a *activations) ensureChain(d *gpu.Device, n uint64) (*gpu.Buffer, error) {
	if a.chained != nil && a.chained.Size() >= n {
		return a.chained, nil
	}
	if a.chained != nil {
		n = max(n, 2*a.chained.Size())
	}
	buf, err := d.NewBuffer("chained_tokens", n)
	if err != nil {
		return nil, err
	}
	if a.chained != nil {
		a.chained.Release()
	}
	a.chained = buf
	return buf, nil
}

func (a *activations) release() {
	for _, b := range a.all {
		b.Release()
	}
	if a.chained != nil {
		a.chained.Release()
	}
	a.all, a.chained = nil, nil
}
