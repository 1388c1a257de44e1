package webgpu

import (
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
)

// pending is an entry's tokens not yet fed.
type pending struct {
	entry  *engine.Entry
	seq    *kernels.KVSeq
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

// pass is one forward pass.
type pass struct {
	entries []passEntry
	rows    int
	decode  int // rows 0 … decode-1 are single-token entries (decode attention)
	lasts   int // rows read out: each complete entry's last
	maxLen  int // the longest context a decode-attention row sees
}

// plan picks the next forward pass from what is pending: single-token
// entries first (they share one decode-attention dispatch), then chunks of
// prompts, within MaxRows rows and the last-row buffers.
func (e *Engine) plan(work []pending) pass {
	var ps pass
	rows := e.opts.MaxRows
	add := func(p *pending, T int) {
		pe := passEntry{p: p, row0: ps.rows, T: T, P: p.seq.Len(), last: -1, complete: T == len(p.tokens)}
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
	e.attentionRows(&ps)
	return ps
}

// decodePass is the j-th pass of a chain of m over work: every entry one
// row, at its length plus j, fed first[i] (the passes after the first take
// their ids from the device). Every pass of the chain attends as if to the
// longest context of its last, so that all of them run the same kernels.
func decodePass(work []pending, first []int, j, m int) pass {
	ps := pass{rows: len(work), decode: len(work), lasts: len(work)}
	for i := range work {
		p := &work[i]
		p.tokens = first[i : i+1]
		pe := passEntry{p: p, row0: i, T: 1, P: p.seq.Len() + j, last: i, complete: true}
		ps.entries = append(ps.entries, pe)
		ps.maxLen = max(ps.maxLen, p.seq.Len()+m)
	}
	return ps
}

// attentionRows sets the pass's decode rows and longest context: where
// the prefill kernel does not take the head_dim, every row goes through
// decode attention.
func (e *Engine) attentionRows(ps *pass) {
	if !e.kv.PrefillSupported() {
		ps.decode = ps.rows
	}
	for _, pe := range ps.entries {
		if pe.row0 < ps.decode {
			ps.maxLen = max(ps.maxLen, pe.P+pe.T)
		}
	}
}

// forward records and submits one pass: its block tables and per-row
// inputs — only the positions when it continues a chain (its token ids are
// those the pass before it wrote, its rows that pass's) — then its kernels
// and after them extra, in command buffers of about every dispatches.
func (e *Engine) forward(ps pass, continues bool, extra []step, every int) error {
	a := e.act
	seqs := make([]*kernels.KVSeq, len(ps.entries))
	ids, slots, pos := make([]uint32, ps.rows), make([]uint32, ps.rows), make([]uint32, ps.rows)
	lasts := make([]uint32, ps.lasts)
	for i, pe := range ps.entries {
		seqs[i] = pe.p.seq
		for t := range pe.T {
			r := pe.row0 + t
			ids[r], slots[r], pos[r] = uint32(pe.p.tokens[t]), uint32(pe.p.seq.Slot()), uint32(pe.P+t)
		}
		if pe.complete {
			lasts[pe.last] = uint32(pe.row0 + pe.T - 1)
		}
	}
	if err := e.kv.SyncTables(seqs); err != nil {
		return err
	}
	// Queue writes are ordered with submissions: this pass reads these
	// inputs, the passes before it theirs.
	for _, up := range []struct {
		buf  *gpu.Buffer
		v    []uint32
		skip bool
	}{{a.ids, ids, continues}, {a.seq, slots, continues}, {a.pos, pos, false}, {a.last, lasts, continues}} {
		if len(up.v) > 0 && !up.skip {
			if err := up.buf.WriteU32(0, up.v); err != nil {
				return err
			}
		}
	}
	if err := e.submit(append(e.kernels(ps), extra...), every); err != nil {
		return fmt.Errorf("forward pass: %w", err)
	}
	return nil
}

// readNext reads back a submitted pass's greedy tokens: each entry's
// sequence now holds the positions it fed, its pending tokens advance, and
// a complete entry's Next is its greedy token.
func (e *Engine) readNext(ps pass) error {
	var next []uint32
	if ps.lasts > 0 {
		raw, err := e.act.next.Read(0, uint64(ps.lasts)*4)
		if err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		next = u32s(raw)
	}
	for _, pe := range ps.entries {
		if err := pe.p.seq.Commit(pe.P + pe.T); err != nil {
			return err
		}
		pe.p.tokens = pe.p.tokens[pe.T:]
		if pe.complete {
			id, err := e.token(next[pe.last])
			if err != nil {
				return fmt.Errorf("forward pass: %w", err)
			}
			pe.p.entry.Next = id
		}
	}
	return nil
}

// token checks a greedy token read back: argmax.wgsl writes ArgmaxNaN for
// logits that hold a NaN.
func (e *Engine) token(id uint32) (int, error) {
	if id == kernels.ArgmaxNaN || int(id) >= e.cfg.VocabSize {
		return 0, fmt.Errorf("the logits hold NaN (token %d)", id)
	}
	return int(id), nil
}

// submitEvery is how many dispatches a pass the host waits for records
// before it submits them: the GPU starts on the first layers while the
// host records the rest (on the H200 host recording costs several µs of
// CPU a dispatch). chainedSubmitEvery is the same for the passes a chain
// records while the GPU still runs the ones before (StepN): fewer, longer
// command buffers, since each submission boundary costs the GPU time,
// while a single step waited for is quicker in shorter ones. Both keep
// command buffers within what lavapipe handles.
const (
	submitEvery        = 48
	chainedSubmitEvery = 512
)

// step records one operation into a batch.
type step func(b *gpu.Batch) error

// submit records steps into batches of about every dispatches, submitting
// each as soon as it is full; the queue runs them in order.
func (e *Engine) submit(steps []step, every int) error {
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
			if err := e.submitBatch(b); err != nil {
				return err
			}
			if b, err = e.newBatch(); err != nil {
				return err
			}
		}
	}
	return e.submitBatch(b)
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

func (e *Engine) submitBatch(b *gpu.Batch) error {
	if err := b.Submit(); err != nil || e.profile == nil {
		return err
	}
	p, err := b.Results()
	e.profile.Add(p)
	return err
}

// kernels lists the forward pass's operations: modeling_qwen3.py, step by
// step. R = rows of the pass, H hidden, D head_dim.
func (e *Engine) kernels(ps pass) []step {
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
				return kernels.AttentionDecode(b, a.attn, a.q, e.kv, l, a.seq, a.pos, ps.decode, heads, ps.maxLen)
			},
			func(b *gpu.Batch) error {
				for _, pe := range ps.entries {
					if pe.row0 >= ps.decode {
						if err := kernels.AttentionPrefill(b, a.attn, a.q, e.kv, l, pe.p.seq.Slot(), a.pos, pe.row0, pe.T, heads); err != nil {
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
			// workgroups would each normalize the rows again.
			func(b *gpu.Batch) error {
				return kernels.RMSNorm(b, a.hNorm, a.hLast, w.norm, ps.lasts, c.HiddenSize, eps)
			},
			func(b *gpu.Batch) error { return kernels.MatMul(b, a.logits, a.hNorm, w.head, ps.lasts, false) },
			func(b *gpu.Batch) error { return kernels.Argmax(b, a.next, a.logits, ps.lasts, c.VocabSize) },
		)
	}
	return steps
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
	}
	return out
}
