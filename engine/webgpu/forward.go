package webgpu

import (
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// pending is an entry's tokens not yet fed.
type pending struct {
	entry  *engine.Entry
	seq    *sequence
	tokens []int
}

// passEntry is one sequence's part of a forward pass: rows row0 … row0+T-1
// hold its positions P … P+T-1.
type passEntry struct {
	p        *pending
	row0, T  int
	P        int
	last     int // index into the pass's last rows, or -1 while the entry is incomplete
	complete bool
}

type pass struct {
	entries []passEntry
	rows    int
	decode  int // rows 0 … decode-1 are single-token entries (decode attention)
	lasts   int
}

// plan picks the next forward pass from what is pending: single-token
// entries first (they share one decode-attention dispatch), then chunks of
// prompts, within MaxRows rows and the last-row buffers.
func (e *Engine) plan(work []pending) pass {
	var ps pass
	rows := e.opts.MaxRows
	add := func(p *pending, T int) {
		pe := passEntry{p: p, row0: ps.rows, T: T, P: p.seq.len, last: -1, complete: T == len(p.tokens)}
		if pe.complete {
			pe.last = ps.lasts
			ps.lasts++
		}
		ps.entries = append(ps.entries, pe)
		ps.rows += T
		rows -= T
	}
	for i := range work {
		if p := &work[i]; len(p.tokens) == 1 && rows > 0 && ps.lasts < e.act.maxLasts {
			add(p, 1)
		}
	}
	ps.decode = ps.rows
	for i := range work {
		p := &work[i]
		if len(p.tokens) <= 1 || rows == 0 {
			continue
		}
		T := min(len(p.tokens), rows)
		if T == len(p.tokens) && ps.lasts == e.act.maxLasts {
			T-- // no last-row room: leave its last token for the next pass
		}
		if T > 0 {
			add(p, T)
		}
	}
	return ps
}

// forward records, submits and reads back one pass.
func (e *Engine) forward(ps pass) error {
	c, a := &e.cfg, e.act
	ids := make([]uint32, ps.rows)
	slots := make([]uint32, ps.rows)
	pos := make([]uint32, ps.rows)
	lasts := make([]uint32, ps.lasts)
	maxLen := 0
	for _, pe := range ps.entries {
		s := pe.p.seq
		if s.dirty {
			if err := e.kv.SetBlocks(s.slot, s.blocks); err != nil {
				return err
			}
			s.dirty = false
		}
		for t := range pe.T {
			r := pe.row0 + t
			ids[r], slots[r], pos[r] = uint32(pe.p.tokens[t]), uint32(s.slot), uint32(pe.P+t)
		}
		if pe.complete {
			lasts[pe.last] = uint32(pe.row0 + pe.T - 1)
		}
		if pe.row0 < ps.decode || !e.kv.PrefillSupported() {
			maxLen = max(maxLen, pe.P+pe.T)
		}
	}
	if !e.kv.PrefillSupported() {
		ps.decode = ps.rows // every row through decode attention (see record)
	}
	for _, up := range []struct {
		buf *gpu.Buffer
		v   []uint32
	}{{a.ids, ids}, {a.seq, slots}, {a.pos, pos}, {a.last, lasts}} {
		if len(up.v) > 0 {
			if err := up.buf.WriteU32(0, up.v); err != nil {
				return err
			}
		}
	}
	if err := e.run(e.steps(ps, maxLen), submitEvery); err != nil {
		return fmt.Errorf("forward pass: %w", err)
	}
	var next []uint32
	if ps.lasts > 0 {
		raw, err := a.next.Read(0, uint64(ps.lasts)*4)
		if err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		next = u32s(raw)
	}
	for _, pe := range ps.entries {
		pe.p.seq.len += pe.T
		pe.p.tokens = pe.p.tokens[pe.T:]
		if pe.complete {
			id := next[pe.last]
			if id == kernels.ArgmaxNaN || int(id) >= c.VocabSize {
				return fmt.Errorf("forward pass: the logits hold NaN (token %d)", id)
			}
			pe.p.entry.Next = int(id)
		}
	}
	return nil
}

// submitEvery is how many dispatches a pass the host waits for records
// before it submits them: the GPU starts on the first layers while the
// host records the rest (on the H200 host recording costs several µs of
// CPU a dispatch). chainedSubmitEvery is the same for the passes a chain
// records while the GPU still runs the ones before (StepN): fewer, longer
// command buffers, since each submission boundary costs the GPU time (on
// the H200 chained steps at batch 1 and 8 took 4 % less with whole passes
// a submission, while a single step waited for took 19 % more). Both keep
// command buffers within what lavapipe handles.
const (
	submitEvery        = 48
	chainedSubmitEvery = 512
)

// step records one operation into a batch.
type step func(b *gpu.Batch) error

// run records steps into batches of about every dispatches, submitting
// each as soon as it is full; the queue runs them in order.
func (e *Engine) run(steps []step, every int) error {
	b, err := e.newBatch()
	if err != nil {
		return err
	}
	for _, st := range steps {
		if err := st(b); err != nil {
			b.Discard()
			return err
		}
		if b.Len() >= every {
			if err := e.submit(b); err != nil {
				return err
			}
			if b, err = e.newBatch(); err != nil {
				return err
			}
		}
	}
	return e.submit(b)
}

func (e *Engine) newBatch() (*gpu.Batch, error) {
	b, err := e.dev.NewBatch("forward")
	if err != nil || e.profile == nil {
		return b, err
	}
	if err := b.Profile(chainedSubmitEvery + 1024); err != nil { // a step may record many dispatches (a prompt's attention each)
		b.Discard()
		return nil, err
	}
	return b, nil
}

func (e *Engine) submit(b *gpu.Batch) error {
	if err := b.Submit(); err != nil || e.profile == nil {
		return err
	}
	p, err := b.Results()
	e.profile.Add(p)
	return err
}

// steps lists the forward pass's operations: modeling_qwen3.py, step by
// step. R = rows of the pass, H hidden, D head_dim.
func (e *Engine) steps(ps pass, maxLen int) []step {
	c, a, w := &e.cfg, e.act, e.w
	R := ps.rows
	heads, eps := c.NumAttentionHeads, c.RMSNormEps
	steps := []step{
		// hidden = embed_tokens(input_ids): (R, H)
		func(b *gpu.Batch) error { return kernels.Embed(b, a.x, a.ids, w.embed, R) },
	}
	for l := range w.layers {
		lw := &w.layers[l]
		steps = append(steps,
			// q | k | v = qkv_proj(input_layernorm(hidden)): (R, (heads + 2·kv_heads)·D);
			// q = rope(q_norm(q)); past_key_values.update(rope(k_norm(k)), v)
			func(b *gpu.Batch) error {
				return kernels.QKVProjRopeKV(b, a.q, a.qkv, a.x, lw.inputNorm, lw.qkv, lw.qkNormRope, e.kv, l, a.seq, a.pos, R, heads, eps)
			},
			// attn = softmax(q·kᵀ/√D + causal mask)·v: decode rows together, prompts tiled
			func(b *gpu.Batch) error {
				if ps.decode == 0 {
					return nil
				}
				return kernels.AttentionDecode(b, a.attn, a.q, e.kv, l, a.seq, a.pos, ps.decode, heads, maxLen)
			},
			func(b *gpu.Batch) error {
				for _, pe := range ps.entries {
					if pe.row0 >= ps.decode {
						if err := kernels.AttentionPrefill(b, a.attn, a.q, e.kv, l, pe.p.seq.slot, a.pos, pe.row0, pe.T, heads); err != nil {
							return err
						}
					}
				}
				return nil
			},
			// hidden += o_proj(attn)
			func(b *gpu.Batch) error { return kernels.MatMul(b, a.x, a.attn, lw.o, R, true) },
			// hidden += down_proj(silu(gate_proj(h)) * up_proj(h)), h = post_attention_layernorm(hidden)
			func(b *gpu.Batch) error { return kernels.MatMulNorm(b, a.gateUp, a.x, lw.postNorm, lw.gateUp, R, eps) },
			func(b *gpu.Batch) error { return kernels.MatMulSwiGLU(b, a.x, a.gateUp, lw.down, R, true) },
		)
	}
	if ps.lasts > 0 {
		steps = append(steps,
			// The last row of each complete entry: norm, lm_head, argmax.
			func(b *gpu.Batch) error { return kernels.Embed(b, a.hLast, a.last, a.hiddenRows, ps.lasts) },
			// The vocabulary-sized head normalizes first: its thousands of
			// workgroups would each normalize the rows again (on lavapipe a
			// batch-1 step 1.4× slower).
			func(b *gpu.Batch) error {
				return kernels.RMSNorm(b, a.hNorm, a.hLast, w.norm, ps.lasts, c.HiddenSize, eps)
			},
			func(b *gpu.Batch) error { return kernels.MatMul(b, a.logits, a.hNorm, w.head, ps.lasts, false) },
			func(b *gpu.Batch) error { return kernels.Argmax(b, a.next, a.logits, ps.lasts, c.VocabSize) },
		)
	}
	return steps
}

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

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
	}
	return out
}
