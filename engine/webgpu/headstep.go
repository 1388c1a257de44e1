package webgpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
	"webdraft/treemask"
)

// headFeed is one entry of a head step, planned: for each of its tokens the
// stage that computes its row (−1: token 0, no row) and whether the row
// reads the target's features (else the head's output at the row before).
type headFeed struct {
	seq    *headSequence
	target *kernels.KVSeq
	tokens []int
	L      int // the tokens the sequence held before the step
	stage  []int
	feat   []bool
}

// Step feeds each entry's tokens to its sequence, each row over its
// Target's features or the head's own output (engine.Head), and reads out
// the draft after each entry's last token, in the target's vocabulary.
//
// A row that reads the head's output at the row before cannot run in the
// pass that computes that row, so a step runs in stages, as cpu.Head's
// does: the first computes every row whose input is at hand (the rows over
// the target's features, or a first row over the sequence's last output),
// each later stage the next row of each entry that drafts past the target.
// A stage is one pass (several where its rows outnumber HeadOptions.
// MaxRows); the host writes each pass's inputs and submits it without
// waiting for the one before, the read-out is recorded after the last, and
// one read brings every entry's token back. The first pass makes the
// target's pending KV moves (its sequences' kept paths) first, so that the
// features it gathers are where the target's line has them. Nothing
// changes when the batch is refused.
func (h *Head) Step(ctx context.Context, batch []*engine.Entry) error {
	if err := engine.CheckBatch(&h.engCfg, batch); err != nil {
		return fmt.Errorf("webgpu head: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	return h.step(ctx, batch)
}

// step is Step over a checked, non-empty batch, the group's lock held.
func (h *Head) step(ctx context.Context, batch []*engine.Entry) error {
	feeds, err := h.feeds(batch)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	seqs, need := make([]*kernels.KVSeq, len(feeds)), make([]int, len(feeds))
	for i, f := range feeds {
		seqs[i], need[i] = f.seq.kv, f.L+len(f.tokens)-1
	}
	if err := h.kv.Reserve(seqs, need); err != nil {
		return fmt.Errorf("webgpu head: %w", kvError(err))
	}
	if submitted, err := h.run(feeds, batch); err != nil {
		for _, f := range feeds {
			f.seq.kv.Truncate(f.seq.rows())
			if submitted { // the store may hold rows of this step
				f.seq.outRow = -1
			}
		}
		return h.target.broken(err)
	}
	return nil
}

// Verify is refused: a head drafts (Step) for its target, whose text it
// reads through Entry.Target, which a Verify entry does not carry.
func (h *Head) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	return errors.New("webgpu head: an EAGLE-3 head drafts (Step) and does not verify")
}

// feeds checks every entry — a sequence of the head's once in the batch, a
// line, a Target sequence of the head's target, neither released, a row to
// compute — and returns its feed, planned.
func (h *Head) feeds(batch []*engine.Entry) ([]headFeed, error) {
	feeds := make([]headFeed, len(batch))
	for i, en := range batch {
		s, ok := en.Seq.(*headSequence)
		switch {
		case !ok || s.owner != h:
			return nil, fmt.Errorf("webgpu head: batch entry %d: a sequence of another engine (%T)", i, en.Seq)
		case s.released:
			return nil, fmt.Errorf("webgpu head: batch entry %d: a released sequence", i)
		case en.Parents != nil:
			return nil, fmt.Errorf("webgpu head: batch entry %d: tree nodes (Parents): an EAGLE-3 head drafts chains only", i)
		case en.Target == nil:
			return nil, fmt.Errorf("webgpu head: batch entry %d: no Target sequence: an EAGLE-3 head reads its target's features", i)
		case s.len == 0 && len(en.Tokens) == 1:
			return nil, fmt.Errorf("webgpu head: batch entry %d: token 0 alone: an EAGLE-3 head's first row is token 1's", i)
		}
		tq, ok := en.Target.(*kernels.KVSeq)
		switch {
		case ok && tq.Cache() == nil:
			return nil, fmt.Errorf("webgpu head: batch entry %d: a released Target sequence", i)
		case !ok || tq.Cache() != h.target.kv:
			return nil, fmt.Errorf("webgpu head: batch entry %d: the Target sequence (%T) is not of the head's target engine", i, en.Target)
		}
		for _, p := range feeds[:i] {
			if p.seq == s {
				return nil, fmt.Errorf("webgpu head: batch entry %d repeats a sequence of the batch", i)
			}
		}
		feeds[i] = headFeed{seq: s, target: tq, tokens: en.Tokens, L: s.len}
		if err := feeds[i].plan(i); err != nil {
			return nil, err
		}
	}
	return feeds, nil
}

// plan places entry i's rows (headFeed): token i ≥ 1 is row j = i−1 over
// the target's features at position j while the target holds it in its
// line (a token tree's nodes are no position of the text), else over the
// head's output at row j−1 — the row of the token before in this feed (a
// stage after it), or the sequence's last row, which the store must hold.
func (f *headFeed) plan(i int) error {
	held := f.target.Line()
	f.stage, f.feat = make([]int, len(f.tokens)), make([]bool, len(f.tokens))
	for t := range f.tokens {
		tok := f.L + t
		j := tok - 1 // the token's row and the position of its features
		switch {
		case tok == 0:
			f.stage[t] = -1
		case j < held:
			f.feat[t] = true
			if t > 0 {
				f.stage[t] = max(f.stage[t-1], 0)
			}
		case j == 0:
			return fmt.Errorf("webgpu head: batch entry %d: token 1 reads the target's features at position 0, which its Target sequence does not hold", i)
		case t > 0:
			f.stage[t] = f.stage[t-1] + 1
		case f.seq.outRow != j-1:
			return fmt.Errorf("webgpu head: batch entry %d: token %d reads the target's features at position %d (its Target sequence holds %d) or the head's output at row %d, which the sequence no longer holds", i, tok, j, held, j-1)
		}
	}
	return nil
}

// headPart is a run of one feed's rows in a head pass: its tokens t0 …
// t0+T−1, at the pass's rows row0 … row0+T−1; slot is its sequence's
// (table row and store row).
type headPart struct{ feed, slot, t0, T, row0 int }

// headPass is one pass of a head step: rows of one stage, a part a feed,
// the short parts first — rows 0 … decode−1 attend through decode
// attention, the longer parts through prefill tiles —; nfc of its rows
// read the target's features, and nsave parts keep their last output.
type headPass struct {
	parts       []headPart
	rows        int
	decode      int
	maxLen      int // the longest context a decode row sees
	nfc, nsave  int
	first, last bool // the step's first pass, and its last (the read-out's)
	// rowBuf holds the rows' places in the head's cache (nil: the
	// activations' rowBuf); a chained step's are its own (StepN).
	rowBuf *gpu.Buffer
}

// passes lays the feeds' rows out in passes, stage by stage, each of at
// most R rows (a stage's long run split over several).
func (h *Head) passes(feeds []headFeed) []headPass {
	var out []headPass
	for stage := 0; ; stage++ {
		var cur headPass
		for i := range feeds {
			f := &feeds[i]
			t0 := slices.Index(f.stage, stage)
			if t0 < 0 {
				continue
			}
			T := 1
			for t0+T < len(f.stage) && f.stage[t0+T] == stage {
				T++
			}
			for T > 0 {
				if cur.rows == h.act.R {
					out = append(out, h.lay(cur, feeds))
					cur = headPass{}
				}
				n := min(T, h.act.R-cur.rows)
				cur.parts = append(cur.parts, headPart{feed: i, slot: f.seq.kv.Slot(), t0: t0, T: n})
				cur.rows += n
				t0, T = t0+n, T-n
			}
		}
		if cur.rows == 0 {
			break
		}
		out = append(out, h.lay(cur, feeds))
	}
	out[0].first, out[len(out)-1].last = true, true
	return out
}

// lay orders a pass's parts — those that attend through decode attention
// (decodeEntryRows rows at most, or any where the prefill kernel does not
// take the head_dim) first — and places their rows.
func (h *Head) lay(ps headPass, feeds []headFeed) headPass {
	prefill := h.kv.PrefillSupported()
	long := func(p headPart) int {
		if prefill && p.T > decodeEntryRows {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(ps.parts, func(a, b headPart) int { return cmp.Compare(long(a), long(b)) })
	row := 0
	for i := range ps.parts {
		p := &ps.parts[i]
		p.row0, row = row, row+p.T
		if long(*p) == 0 {
			ps.decode = row
			ps.maxLen = max(ps.maxLen, feeds[p.feed].L+p.t0+p.T-1) // the last row's slot, plus one
		}
	}
	return ps
}

// run records and submits the step's passes and reads its read-out back:
// each entry's Next, Logprob and Top are set and its sequence holds the
// tokens fed. submitted reports whether any pass went to the device.
func (h *Head) run(feeds []headFeed, batch []*engine.Entry) (submitted bool, err error) {
	seqs := make([]*kernels.KVSeq, len(feeds))
	topN := 0
	for i, f := range feeds {
		seqs[i] = f.seq.kv
		topN = max(topN, min(batch[i].TopN, h.cfg.DraftVocabSize))
	}
	if err := h.kv.SyncTables(seqs); err != nil {
		return false, err
	}
	passes := h.passes(feeds)
	for k := range passes {
		ps := &passes[k]
		if err := h.writePass(feeds, ps, topN); err != nil {
			return submitted, err
		}
		submitted = true
		if err := h.target.submit(h.passSteps(ps, len(feeds), topN), submitEvery); err != nil {
			return true, fmt.Errorf("head pass %d of %d: %w", k+1, len(passes), err)
		}
	}
	if err := h.readOut(feeds, batch, topN); err != nil {
		return true, err
	}
	for _, f := range feeds {
		s := f.seq
		if n := f.L + len(f.tokens) - 1; n > 0 {
			if err := s.kv.Commit(n, nil); err != nil {
				return true, err
			}
		}
		for t := range f.tokens {
			if f.feat[t] && f.L+t-1 == s.targetRows {
				s.targetRows++
			}
		}
		s.len += len(f.tokens)
		s.outRow = s.rows() - 1
	}
	return true, nil
}

// writePass writes pass ps's inputs: its tokens, its rows' places in the
// head's cache, and the pairs of its gathers — the features of the rows
// over the target's (their pool rows in the target's cache), each row's
// hidden (fc's output, or the store's row of its sequence), the outputs
// kept (each part's last row into the store); after the last pass, the
// read-out's (each entry's store row), and its greedy draws where it reads
// top tokens.
func (h *Head) writePass(feeds []headFeed, ps *headPass, topN int) error {
	a := h.act
	ids, rows := make([]uint32, ps.rows), make([]uint32, ps.rows*kernels.RowWords)
	pairs := make([]uint32, a.regions.words)
	put := func(region uint64, i int, dst, src int) {
		w := region/4 + uint64(i*kernels.GatherPairWords)
		pairs[w], pairs[w+1] = uint32(dst), uint32(src)
	}
	nf := len(a.regions.features)
	ps.nfc, ps.nsave = 0, 0
	for _, p := range ps.parts {
		f, slot := &feeds[p.feed], p.slot
		for k := range p.T {
			t, r := p.t0+k, p.row0+k
			j := f.L + t - 1
			ids[r] = uint32(f.tokens[t])
			kernels.PutRow(rows[r*kernels.RowWords:], slot, j, treemask.LineRow(j))
			src := a.R + slot
			if f.feat[t] {
				pool, err := f.target.PoolRow(j)
				if err != nil {
					return fmt.Errorf("the target's features at position %d: %w", j, err)
				}
				for i, region := range a.regions.features {
					put(region, ps.nfc, ps.nfc*nf+i, pool)
				}
				src = ps.nfc
				ps.nfc++
			}
			put(a.regions.x, r, r, src)
		}
		put(a.regions.save, ps.nsave, a.R+slot, p.row0+p.T-1)
		ps.nsave++
	}
	if ps.last {
		for i, f := range feeds {
			put(a.regions.read, i, i, a.R+f.seq.kv.Slot())
		}
		if topN > 0 {
			draws := make([]uint32, len(feeds)*kernels.SampleDrawWords)
			temps := make([]float32, len(feeds)*kernels.SampleTempWords)
			for i := range feeds {
				kernels.PutSampleRow(draws[i*kernels.SampleDrawWords:], temps[i*kernels.SampleTempWords:], sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
			}
			if err := a.draws.WriteU32(0, draws); err != nil {
				return err
			}
			if err := a.temps.WriteF32(0, temps); err != nil {
				return err
			}
		}
	}
	for _, w := range []struct {
		buf *gpu.Buffer
		v   []uint32
	}{{a.ids, ids}, {a.rowBuf, rows}, {a.pairs, pairs}} {
		if err := w.buf.WriteU32(0, w.v); err != nil {
			return err
		}
	}
	return nil
}

// passSteps lists a head pass's operations — reference.Head.Forward, step
// by step — over its R rows, and after the last pass the read-out of n
// entries (their topN most likely tokens where topN > 0).
func (h *Head) passSteps(ps *headPass, n, topN int) []step {
	a, w, c, t := h.act, h.w, &h.cfg, h.target
	R, H, heads, eps := ps.rows, c.HiddenSize, c.NumAttentionHeads, c.RMSNormEps
	rowBuf := a.rowBuf
	if ps.rowBuf != nil {
		rowBuf = ps.rowBuf
	}
	pairs := func(region uint64, n int) gpu.Binding {
		return a.pairs.Slice(region, uint64(n*kernels.GatherPairWords)*4)
	}
	var steps []step
	if ps.first {
		// The target's sequences' kept paths, moved: the features read
		// below are where its line has them.
		steps = append(steps, func(b *gpu.Batch) error { return t.kv.RecordMoves(b) })
	}
	if ps.nfc > 0 {
		// hidden_states = fc(cat(the target's features)): (nfc, 3·Ht) → (nfc, H)
		for i, region := range a.regions.features {
			steps = append(steps, func(b *gpu.Batch) error {
				return kernels.GatherRows(b, a.fcIn, t.kv.Feature(i), pairs(region, ps.nfc), ps.nfc, c.TargetHiddenSize)
			})
		}
		steps = append(steps, func(b *gpu.Batch) error { return kernels.MatMul(b, a.hid, a.fcIn, w.fc, ps.nfc, false) })
	}
	steps = append(steps,
		// residual = hidden: fc's rows, or the row before's output (the store)
		func(b *gpu.Batch) error { return kernels.GatherRows(b, a.x, a.hid, pairs(a.regions.x, R), R, H) },
		// in = cat(input_layernorm(embed_tokens(ids)), hidden_norm(hidden)): (R, 2H)
		func(b *gpu.Batch) error { return kernels.Embed(b, a.emb, a.ids, w.embed, R) },
		func(b *gpu.Batch) error { return kernels.RMSNormCols(b, a.in, 2*H, 0, a.emb, w.inputNorm, R, H, eps) },
		func(b *gpu.Batch) error { return kernels.RMSNormCols(b, a.in, 2*H, H, a.x, w.hiddenNorm, R, H, eps) },
		// q | k | v = qkv_proj(in); RoPE at each row's position, no q/k norm
		// (a Llama layer); the keys and values into the head's cache
		func(b *gpu.Batch) error { return kernels.MatMul(b, a.qkv, a.in, w.qkv, R, false) },
		func(b *gpu.Batch) error {
			return kernels.QKVRopeKV(b, a.q, a.qkv, w.rope, h.kv, 0, rowBuf, R, heads, eps, false)
		},
		// attn = softmax(q·kᵀ/√D + causal mask)·v over the head's cache, GQA
		func(b *gpu.Batch) error {
			if ps.decode == 0 {
				return nil
			}
			return kernels.AttentionDecode(b, a.attn, a.q, h.kv, 0, rowBuf, ps.decode, heads, ps.maxLen)
		},
		func(b *gpu.Batch) error {
			for _, p := range ps.parts {
				if p.row0 >= ps.decode {
					if err := kernels.AttentionPrefill(b, a.attn, a.q, h.kv, 0, p.slot, rowBuf, p.row0, p.T, heads); err != nil {
						return err
					}
				}
			}
			return nil
		},
		// hidden = residual + o_proj(attn); hidden += down(silu(gate(x))·up(x)),
		// x = post_attention_layernorm(hidden): the output before norm
		func(b *gpu.Batch) error { return kernels.MatMul(b, a.x, a.attn, w.o, R, true) },
		func(b *gpu.Batch) error { return kernels.MatMulNorm(b, a.gateUp, a.x, w.postNorm, w.gateUp, R, eps) },
		func(b *gpu.Batch) error { return kernels.MatMulSwiGLU(b, a.x, a.gateUp, w.down, R, true) },
		// each part's last output into its sequence's store row
		func(b *gpu.Batch) error {
			return kernels.GatherRows(b, a.hid, a.x, pairs(a.regions.save, ps.nsave), ps.nsave, H)
		},
	)
	if !ps.last {
		return steps
	}
	// The read-out: logits = lm_head(norm(output)) at each entry's last
	// row, over the draft vocabulary; its argmax, log-probability and top
	// tokens.
	Vd := c.DraftVocabSize
	return append(steps,
		func(b *gpu.Batch) error { return kernels.GatherRows(b, a.hLast, a.hid, pairs(a.regions.read, n), n, H) },
		func(b *gpu.Batch) error { return kernels.RMSNorm(b, a.hNorm, a.hLast, w.norm, n, H, eps) },
		func(b *gpu.Batch) error { return kernels.MatMul(b, a.logits, a.hNorm, w.lmHead, n, false) },
		func(b *gpu.Batch) error {
			if topN > 0 {
				return kernels.Sample(b, a.sampled, a.top, a.next, a.lp, a.logits, a.draws, a.temps, n, Vd, topN)
			}
			return kernels.Argmax(b, a.next, a.lp, a.logits, n, Vd, lseAt(n))
		},
	)
}

// readOut reads the step's read-out back and sets each entry's Next (the
// argmax, the lowest draft token of a tie, as a target token), Logprob
// (its log-softmax over the draft vocabulary) and Top (its TopN most
// likely tokens, at most the draft vocabulary's).
func (h *Head) readOut(feeds []headFeed, batch []*engine.Entry, topN int) error {
	a, n := h.act, len(feeds)
	if topN == 0 {
		raw, err := gpu.ReadRanges(a.next.Slice(0, uint64(n)*4), a.lp.Slice(0, uint64(n)*4))
		if err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		ids, lps := u32s(raw[0]), u32s(raw[1])
		for i, en := range batch {
			if ids[i] == kernels.ArgmaxNaN || int(ids[i]) >= len(h.tokens) {
				return fmt.Errorf("batch entry %d: %w", i, sampling.ErrNaN)
			}
			en.Next, en.Logprob, en.Top = int(h.tokens[ids[i]]), math.Float32frombits(lps[i]), nil
		}
		return nil
	}
	raw, err := gpu.ReadRanges(a.sampled.Slice(0, uint64(n*kernels.SampleWords)*4), a.top.Slice(0, uint64(n*topN*2)*4))
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	words, top := u32s(raw[0]), u32s(raw[1])
	for i, en := range batch {
		row, err := kernels.SampleRow(words[i*kernels.SampleWords:])
		if err != nil {
			return fmt.Errorf("batch entry %d: %w", i, err)
		}
		if row.Argmax < 0 || row.Argmax >= len(h.tokens) {
			return fmt.Errorf("batch entry %d: %w", i, sampling.ErrNaN)
		}
		en.Next, en.Logprob, en.Top = int(h.tokens[row.Argmax]), row.ArgmaxLogprob, nil
		if k := min(en.TopN, topN); k > 0 {
			en.Top = kernels.SampleTop(top[i*topN*2:], k)
			for j := range en.Top {
				en.Top[j].Token = int(h.tokens[en.Top[j].Token])
			}
		}
	}
	return nil
}
