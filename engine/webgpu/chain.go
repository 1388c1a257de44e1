package webgpu

import (
	"context"
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
)

// StepN is n Steps in one (engine.Chainer): decode passes chained on the
// GPU, each pass's greedy tokens copied into the next pass's input ids and
// into a results buffer, positions written to the queue ahead of each pass,
// and the results read back once at the end — so the host records pass
// j+1 while the GPU runs pass j, instead of waiting for each token. When
// every entry feeds one token, all n passes chain; otherwise the first is
// an ordinary Step (prompts, read back) and the n-1 after it chain. On an
// error the sequences hold what the steps before it fed.
func (e *Engine) StepN(ctx context.Context, batch []*engine.Entry, n int) ([][]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("webgpu engine: step n: n = %d, want > 0", n)
	}
	if n > 1 && decodeOnly(batch) && len(batch) <= e.opts.MaxRows && len(batch) <= e.act.maxLasts {
		return e.chainAll(ctx, batch, n)
	}
	if err := e.Step(ctx, batch); err != nil {
		return nil, err
	}
	out := make([][]int, len(batch))
	for i, en := range batch {
		out[i] = append(make([]int, 0, n), en.Next)
	}
	if n == 1 {
		return out, nil
	}
	var next [][]int
	var err error
	if len(batch) > e.opts.MaxRows || len(batch) > e.act.maxLasts {
		// More entries than one pass holds: one Step at a time.
		next, err = engine.StepN(ctx, stepsOnly{e}, withNext(batch), n-1)
	} else {
		first := make([]int, len(batch))
		for i, en := range batch {
			first[i] = en.Next
		}
		e.mu.Lock()
		next, err = e.chain(ctx, batch, first, n-1)
		e.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	for i, en := range batch {
		out[i] = append(out[i], next[i]...)
		en.Next = out[i][n-1]
	}
	return out, nil
}

// decodeOnly reports whether every entry feeds exactly one token.
func decodeOnly(batch []*engine.Entry) bool {
	for _, en := range batch {
		if len(en.Tokens) != 1 {
			return false
		}
	}
	return len(batch) > 0
}

// chainAll is StepN for a batch of single tokens: n chained passes, the
// first feeding each entry's token.
func (e *Engine) chainAll(ctx context.Context, batch []*engine.Entry, n int) ([][]int, error) {
	if err := engine.CheckBatch(&e.cfg, batch); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errReleased
	}
	if _, err := e.sequences(batch); err != nil {
		return nil, err
	}
	first := make([]int, len(batch))
	for i, en := range batch {
		first[i] = en.Tokens[0]
	}
	out, err := e.chain(ctx, batch, first, n)
	if err != nil {
		return nil, err
	}
	for i, en := range batch {
		en.Next = out[i][n-1]
	}
	return out, nil
}

// chain runs m decode passes: entry i feeds first[i], then its own greedy
// tokens. It returns each entry's m new tokens; on an error the sequences
// are as they were. The batch's sequences must have been checked (Step,
// chainAll).
func (e *Engine) chain(ctx context.Context, batch []*engine.Entry, first []int, m int) ([][]int, error) {
	if e.closed {
		return nil, errReleased
	}
	c, a, B := &e.cfg, e.act, len(batch)
	seqs := make([]*sequence, B)
	lens := make([]int, B)
	maxLen := 0
	for i, en := range batch {
		s := en.Seq.(*sequence) // checked by the caller
		seqs[i], lens[i] = s, s.len
		if s.len+m > c.MaxPositionEmbeddings {
			return nil, fmt.Errorf("batch entry %d: %d positions: %w (max_position_embeddings %d)", i, s.len+m, engine.ErrContextFull, c.MaxPositionEmbeddings)
		}
		maxLen = max(maxLen, s.len+m)
	}
	undo := func() {
		for i, s := range seqs {
			s.shrinkTo(lens[i])
		}
	}
	for i, s := range seqs {
		if err := s.grow(lens[i] + m); err != nil {
			for _, s := range seqs[:i+1] {
				s.shrinkTo(s.len)
			}
			return nil, err
		}
	}
	// Rows are entries; each pass reads entry i's token from ids[i] and
	// writes its greedy token to next[i], which is copied to ids and to the
	// pass's slot of the results.
	ids, slots, lasts := make([]uint32, B), make([]uint32, B), make([]uint32, B)
	for i, s := range seqs {
		if s.dirty {
			if err := e.kv.SetBlocks(s.slot, s.blocks); err != nil {
				undo()
				return nil, err
			}
			s.dirty = false
		}
		ids[i], slots[i], lasts[i] = uint32(first[i]), uint32(s.slot), uint32(i)
	}
	words := (B + 3) &^ 3 // copies move 16-byte words
	align := uint64(e.dev.Limits().MinStorageBufferOffsetAlignment)
	stride := (uint64(words)*4 + align - 1) / align * align // each pass's results at an aligned offset
	results, err := a.ensureChain(e.dev, uint64(m)*stride)
	if err != nil {
		undo()
		return nil, err
	}
	for _, up := range []struct {
		buf *gpu.Buffer
		v   []uint32
	}{{a.ids, ids}, {a.seq, slots}, {a.last, lasts}} {
		if err := up.buf.WriteU32(0, up.v); err != nil {
			undo()
			return nil, err
		}
	}
	pos := make([]uint32, B)
	ps := pass{rows: B, decode: B, lasts: B}
	for j := range m {
		if err := ctx.Err(); err != nil {
			undo()
			return nil, err
		}
		// Queue writes are ordered with submissions: pass j reads these
		// positions, the passes before it theirs.
		for i := range seqs {
			pos[i] = uint32(lens[i] + j)
		}
		if err := a.pos.WriteU32(0, pos); err != nil {
			undo()
			return nil, err
		}
		at := uint64(j) * stride
		steps := append(e.steps(ps, maxLen),
			func(b *gpu.Batch) error { return kernels.CopyTo(b, results, at, a.next, uint64(words)*4) },
			func(b *gpu.Batch) error { return kernels.Copy(b, a.ids, a.next, uint64(words)*4) },
		)
		every := chainedSubmitEvery
		if j == 0 { // nothing runs yet: start the GPU early
			every = submitEvery
		}
		if err := e.run(steps, every); err != nil {
			undo()
			return nil, fmt.Errorf("chained pass %d: %w", j+1, err)
		}
	}
	raw, err := results.Read(0, uint64(m)*stride)
	if err != nil {
		undo()
		return nil, fmt.Errorf("read back: %w", err)
	}
	all := u32s(raw)
	out := make([][]int, B)
	for i := range out {
		out[i] = make([]int, m)
		for j := range m {
			id := all[uint64(j)*stride/4+uint64(i)]
			if id == kernels.ArgmaxNaN || int(id) >= c.VocabSize {
				undo()
				return nil, fmt.Errorf("chained pass %d: the logits hold NaN (token %d)", j+1, id)
			}
			out[i][j] = int(id)
		}
	}
	for i, s := range seqs {
		s.len = lens[i] + m
	}
	return out, nil
}

// stepsOnly is an engine seen through the Engine interface alone, so that
// engine.StepN runs it one Step at a time.
type stepsOnly struct{ engine.Engine }

// withNext returns entries for the same sequences that feed each entry's Next.
func withNext(batch []*engine.Entry) []*engine.Entry {
	out := make([]*engine.Entry, len(batch))
	for i, en := range batch {
		out[i] = &engine.Entry{Seq: en.Seq, Tokens: []int{en.Next}}
	}
	return out
}
