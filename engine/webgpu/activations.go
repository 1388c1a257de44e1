package webgpu

import (
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// activations are the pass's buffers, sized for MaxRows rows and maxLasts
// rows read out.
type activations struct {
	maxLasts int
	ids      *gpu.Buffer // (rows) u32
	// rows (rows, kernels.RowWords) u32: how each row sits in its
	// sequence's cache — table row, slot, position, mask (kernels.PutRow)
	rows *gpu.Buffer
	last *gpu.Buffer // (lasts) u32: the rows read out
	// next holds argmax.wgsl's greedy tokens (lasts) u32, and from nextLP
	// on (lp) their log-probabilities (lasts) f32 followed, after a pass's
	// lasts rounded up to whole 16-byte words (lseAt), by the rows'
	// log-sum-exps: one read takes the three, one copy into StepN's
	// results the first nextBytes, tokens and log-probabilities.
	next              *gpu.Buffer
	nextLP, nextBytes uint64
	// sample.wgsl's inputs and outputs: draws (lasts, 4) u32, temps
	// (lasts, 2) f32, sampled (lasts, 8) u32, top (lasts, MaxTopN, 2) u32.
	// sampled is the pass's read-out buffer too: the top-N, the proposals
	// drawn and the walks are copied in after the rows (readLayout) and
	// read back with them; it grows as passes need (ensureReadout).
	draws, temps, sampled, top *gpu.Buffer
	// Sampled drafts' buffers, made by the first pass that has them
	// (ensureReadout): props (lasts, ProposeWords) u32 and drawn (lasts,
	// ProposeDrawnWords) u32, propose.wgsl's; walkEntries (lasts,
	// WalkEntryWords) u32 and walkNodes (lasts, WalkNodeWords) u32,
	// tree_walk.wgsl's inputs (a node's record at its read-out row), and
	// walk its records, grown as passes need.
	props, drawn, walkEntries, walkNodes, walk *gpu.Buffer
	x                                          *gpu.Buffer // (rows, H): the hidden states
	q, attn                                    *gpu.Buffer // (rows, heads*D)
	qkv                                        *gpu.Buffer // (rows, (heads + 2·kv_heads)·D); unwritten when the projection splits along K
	gateUp                                     *gpu.Buffer // (rows, 2I)
	hNorm                                      *gpu.Buffer // (lasts, H): the rows read out, normalized
	logits                                     *gpu.Buffer // (lasts, vocab)
	// headLogits (lasts, head rows) holds the logits of a head over part of
	// the vocabulary, which Scatter places in logits; the other entries of
	// logits stay −∞ from the start. Nil for a head over the whole
	// vocabulary.
	headLogits *gpu.Buffer
	chained    *gpu.Buffer // StepN's greedy tokens, pass by pass, grown on demand
	// chainDraws holds a sampled chain's draws (sample.wgsl's draws words),
	// a region a pass, each copied into draws before the pass reads them;
	// grown on demand.
	chainDraws *gpu.Buffer
	// keys (lasts, kernels.ArgmaxCoupledWords) u32: the coupled drafts'
	// keys a pass's argmax.wgsl reads, copied in from chainKeys, which
	// holds a fused call's, a region a draft (draftKeys); grown on demand.
	keys, chainKeys *gpu.Buffer
	// idPairs (rows, 2) and drawPairs (lasts, 2) u32: where a fused
	// verification's drafted tokens go, in ids and in draws, and where in
	// the drafter's chained results each comes from (kernels.Gather).
	idPairs, drawPairs *gpu.Buffer
	// featPairs (rows, 2) u32: each row's pool row (kernels.KVSeq.PoolRow)
	// and the row, where the features it keeps go (GatherRows); nil
	// without features.
	featPairs *gpu.Buffer
	all       []*gpu.Buffer
}

// minReadOut is the fewest rows a pass reads out, whatever the sequences:
// a verification of 64 draft tokens in one pass.
const minReadOut = 65

func newActivations(d *gpu.Device, c *qwen3.Config, rows, seqs, headRows int, features bool) (_ *activations, err error) {
	a := &activations{}
	defer func() {
		if err != nil {
			a.release()
		}
	}()
	// Rows read out: one a sequence for a step, k+1 for a verification of
	// k draft tokens; their logits must fit one binding.
	a.maxLasts = min(max(seqs, minReadOut), rows, int(d.Limits().MaxStorageBufferBindingSize/uint64(4*c.VocabSize)))
	if a.maxLasts < 1 {
		return nil, fmt.Errorf("the vocabulary's logits (%d) do not fit one storage binding", c.VocabSize)
	}
	H, q, kv, I := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize
	words := (a.maxLasts + 3) &^ 3 // whole 16-byte words: copies move them
	align := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	a.nextLP = (uint64(words)*4 + align - 1) / align * align
	a.nextBytes = a.nextLP + uint64(words)*4
	for _, b := range []struct {
		dst   **gpu.Buffer
		name  string
		words int
	}{
		// ids and next in whole 16-byte words: copy.wgsl moves them.
		{&a.ids, "ids", (rows + 3) &^ 3}, {&a.rows, "rows", rows * kernels.RowWords},
		{&a.last, "last", a.maxLasts}, {&a.next, "next", int(a.nextBytes/4) + words},
		{&a.draws, "draws", a.maxLasts * kernels.SampleDrawWords}, {&a.temps, "temps", a.maxLasts * kernels.SampleTempWords},
		{&a.sampled, "sampled", a.maxLasts * kernels.SampleWords}, {&a.top, "top", a.maxLasts * engine.MaxTopN * 2},
		{&a.x, "hidden", rows * H},
		{&a.q, "q", rows * q}, {&a.attn, "attn", rows * q},
		{&a.qkv, "qkv", rows * (q + 2*kv)},
		{&a.gateUp, "gate_up", rows * 2 * I},
		{&a.hNorm, "hidden_last_normed", a.maxLasts * H}, {&a.logits, "logits", a.maxLasts * c.VocabSize},
		{&a.keys, "keys", a.maxLasts * kernels.ArgmaxCoupledWords},
		{&a.idPairs, "draft_id_pairs", rows * kernels.GatherPairWords}, {&a.drawPairs, "draft_draw_pairs", a.maxLasts * kernels.GatherPairWords},
	} {
		if *b.dst, err = d.NewBuffer(b.name, uint64(b.words)*4); err != nil {
			return nil, fmt.Errorf("activations: %w", err)
		}
		a.all = append(a.all, *b.dst)
	}
	if features {
		if a.featPairs, err = d.NewBuffer("feature_pairs", uint64(rows*kernels.GatherPairWords)*4); err != nil {
			return nil, fmt.Errorf("activations: %w", err)
		}
		a.all = append(a.all, a.featPairs)
	}
	if headRows != c.VocabSize {
		if a.headLogits, err = d.NewBuffer("head_logits", uint64(a.maxLasts*headRows)*4); err != nil {
			return nil, fmt.Errorf("activations: %w", err)
		}
		a.all = append(a.all, a.headLogits)
		if err := a.logits.Fill(math.Float32bits(float32(math.Inf(-1)))); err != nil {
			return nil, fmt.Errorf("activations: %w", err)
		}
	}
	return a, nil
}

// lp is where argmax.wgsl and sample.wgsl write the read-out rows'
// log-probabilities and log-sum-exps: next from nextLP on.
func (a *activations) lp() gpu.Binding { return a.next.Slice(a.nextLP, a.next.Size()-a.nextLP) }

// lseAt is where a pass of n rows read out puts their log-sum-exps in lp
// (argmax.wgsl's lse0): past their log-probabilities, in whole 16-byte
// words.
func lseAt(n int) int { return (n + 3) &^ 3 }

// nextWords splits a copy of next into tokens and the n f32 values at
// lpAt (log-probabilities, or log-sum-exps).
func nextWords(raw []byte, lpAt uint64, n int) ([]uint32, []float32) {
	ids := u32s(raw[:n*4])
	lp := u32s(raw[lpAt : lpAt+uint64(n)*4])
	lps := make([]float32, n)
	for i, w := range lp {
		lps[i] = math.Float32frombits(w)
	}
	return ids, lps
}

// ensureReadout makes the buffers a sampled pass ps needs that are not
// there yet, and grows the sampled buffer to hold its read-out (l) and
// walk its trees' records.
func (a *activations) ensureReadout(d *gpu.Device, ps pass, l readLayout) error {
	if ps.propose || ps.trees > 0 {
		for _, b := range []struct {
			dst   **gpu.Buffer
			name  string
			words int
		}{
			{&a.props, "props", a.maxLasts * kernels.ProposeWords}, {&a.drawn, "drawn", a.maxLasts * kernels.ProposeDrawnWords},
			{&a.walkEntries, "walk_entries", a.maxLasts * kernels.WalkEntryWords}, {&a.walkNodes, "walk_nodes", a.maxLasts * kernels.WalkNodeWords},
		} {
			if *b.dst != nil {
				continue
			}
			var err error
			if *b.dst, err = d.NewBuffer(b.name, uint64(b.words)*4); err != nil {
				return fmt.Errorf("activations: %w", err)
			}
			a.all = append(a.all, *b.dst)
		}
	}
	if err := a.grow(d, &a.walk, "walk", l.walkBytes); err != nil {
		return err
	}
	return a.grow(d, &a.sampled, "sampled", l.size)
}

// grow replaces *buf by a buffer of at least n bytes where it is smaller
// (or missing, n > 0).
func (a *activations) grow(d *gpu.Device, buf **gpu.Buffer, name string, n uint64) error {
	old := *buf
	if n == 0 || old != nil && old.Size() >= n {
		return nil
	}
	if old != nil {
		n = max(n, 2*old.Size())
	}
	b, err := d.NewBuffer(name, n)
	if err != nil {
		return fmt.Errorf("activations: %w", err)
	}
	for i, x := range a.all {
		if x == old {
			a.all = append(a.all[:i], a.all[i+1:]...)
			old.Release()
			break
		}
	}
	*buf = b
	a.all = append(a.all, b)
	return nil
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
	for _, b := range []*gpu.Buffer{a.chained, a.chainDraws, a.chainKeys} {
		if b != nil {
			b.Release()
		}
	}
	a.all, a.chained, a.chainDraws, a.chainKeys = nil, nil, nil, nil
}
