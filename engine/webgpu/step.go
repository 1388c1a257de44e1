package webgpu

import (
	"context"
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/treemask"
)

// Step runs one forward pass over every entry of the batch — several where
// the batch holds more rows than a pass — appending each entry's tokens to
// its sequence (as its line, or as nodes of its token tree: Entry.Parents)
// and setting entry.Next to the greedy token after its last.
func (e *Engine) Step(ctx context.Context, batch []*engine.Entry) error {
	_, err := e.steps(ctx, batch, 1)
	return err
}

// StepN is n Steps in one (engine.Chainer): the first feeds each entry's
// tokens, each after it the entry's own greedy token. Where every entry
// feeds one token and the batch fits a pass, the passes chain on the
// device — each pass's greedy tokens copied into the next pass's input ids
// and into a results buffer, its rows moved one position on by the device,
// the passes after the first submitted together and the results read back
// once at the end — so the host never waits for a token. Where
// entries feed prompts, the first step runs as Step does and the n−1 after
// it chain. Every token continues its sequence's line: tree nodes
// (Entry.Parents) do not chain. On an error every sequence is as it was
// before the call.
func (e *Engine) StepN(ctx context.Context, batch []*engine.Entry, n int) ([][]engine.Token, error) {
	if n <= 0 {
		return nil, fmt.Errorf("webgpu engine: step n: n = %d, want > 0", n)
	}
	for i, en := range batch {
		if en.Parents != nil && n > 1 {
			return nil, fmt.Errorf("webgpu engine: step n: batch entry %d: tree nodes (Parents) do not chain", i)
		}
	}
	return e.steps(ctx, batch, n)
}

// steps runs n greedy steps over batch (Step is n = 1) and returns each
// entry's n tokens; entry.Next is the last of them, and entry.Tokens is
// left as it was.
func (e *Engine) steps(ctx context.Context, batch []*engine.Entry, n int) ([][]engine.Token, error) {
	c := &e.cfg
	if err := engine.CheckBatch(c, batch); err != nil {
		return nil, err
	}
	return e.locked(func() ([]pending, []int, error) { return e.prepareSteps(batch, n) },
		func(work []pending) ([][]engine.Token, error) { return e.run(ctx, work, n) })
}

// locked runs work, readied by prepare, under the group's lock: where run
// fails, each sequence is cut back to its length before and the engine's
// fault is noted (broken).
func (e *Engine) locked(prepare func() ([]pending, []int, error), run func(work []pending) ([][]engine.Token, error)) ([][]engine.Token, error) {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return nil, err
	}
	work, lens, err := prepare()
	if err != nil {
		return nil, err
	}
	out, err := run(work)
	if err != nil {
		for i, p := range work {
			p.seq.Truncate(lens[i])
		}
		return nil, e.broken(err)
	}
	return out, nil
}

// prepareSteps readies n greedy steps over batch (checked, the group's lock
// held): each entry's tokens placed in its sequence and every block the
// call needs reserved — so that a bad tree, a full pool or a full context
// changes nothing — and returns the work with each sequence's length
// before it.
func (e *Engine) prepareSteps(batch []*engine.Entry, n int) ([]pending, []int, error) {
	c := &e.cfg
	seqs, err := e.sequences(len(batch), func(i int) engine.Sequence { return batch[i].Seq })
	if err != nil {
		return nil, nil, err
	}
	place, err := placeAll(seqs, func(i int) ([]int, []int) { return batch[i].Tokens, batch[i].Parents })
	if err != nil {
		return nil, nil, err
	}
	lens, need := make([]int, len(batch)), make([]int, len(batch))
	for i, en := range batch {
		lens[i] = seqs[i].Len()
		need[i] = lens[i] + len(en.Tokens) + n - 1
		if need[i] > c.MaxPositionEmbeddings {
			return nil, nil, fmt.Errorf("batch entry %d: %d positions: %w (max_position_embeddings %d)", i, need[i], engine.ErrContextFull, c.MaxPositionEmbeddings)
		}
	}
	if err := e.kv.Reserve(seqs, need); err != nil {
		return nil, nil, kvError(err)
	}
	work := make([]pending, len(batch))
	for i, en := range batch {
		work[i] = pending{entry: en, seq: seqs[i], tokens: en.Tokens, place: place[i], out: 1}
	}
	return work, lens, nil
}

// run feeds work its pending tokens and then n−1 greedy tokens (n in all),
// chained on the device where the batch allows (chainable); the blocks
// are reserved.
func (e *Engine) run(ctx context.Context, work []pending, n int) ([][]engine.Token, error) {
	out := make([][]engine.Token, len(work))
	if n == 1 || !e.chainable(work) {
		// Prompts (or a batch no one pass holds): a step of passes as the
		// rows allow, each read back.
		if err := e.feed(ctx, work); err != nil {
			return nil, err
		}
		for i, p := range work {
			out[i] = append(make([]engine.Token, 0, n), next(p))
			p := &work[i]
			p.tokens, p.place, p.out = []int{p.entry.Next}, []treemask.Row{treemask.LineRow(p.seq.Len())}, 1
		}
		n--
	}
	if n == 0 {
		return out, nil
	}
	if !e.chainable(work) {
		for range n {
			if err := e.feed(ctx, work); err != nil {
				return nil, err
			}
			for i, p := range work {
				out[i] = append(out[i], next(p))
				p := &work[i]
				p.tokens, p.place, p.out = []int{p.entry.Next}, []treemask.Row{treemask.LineRow(p.seq.Len())}, 1
			}
		}
		return out, nil
	}
	chained, err := e.chainTokens(ctx, work, n)
	if err != nil {
		return nil, err
	}
	for i, p := range work {
		out[i] = append(out[i], chained[i]...)
		last := chained[i][n-1]
		p.entry.Next, p.entry.Logprob, p.entry.Top = last.ID, last.Logprob, last.Top
	}
	return out, nil
}

// chainTokens runs a chain of n passes over work (chainSubmit) and returns
// each entry's n tokens, read back once (chainRead).
func (e *Engine) chainTokens(ctx context.Context, work []pending, n int) ([][]engine.Token, error) {
	ch, err := e.chainSubmit(ctx, work, n, true, nil)
	if err != nil {
		return nil, err
	}
	return e.chainRead(work, ch, ch.raw[0])
}

// chainable reports whether work's pending tokens open a chain: every entry
// one pass's short entry (decode attention), and their rows and read-out
// rows within a pass.
func (e *Engine) chainable(work []pending) bool {
	rows := 0
	for _, p := range work {
		if len(p.tokens) == 0 || len(p.tokens) > decodeEntryRows || p.out != 1 {
			return false
		}
		rows += len(p.tokens)
	}
	return len(work) > 0 && rows <= e.opts.MaxRows && len(work) <= e.act.maxLasts
}

// next is a fed Step entry's greedy token.
func next(p pending) engine.Token {
	return engine.Token{ID: p.entry.Next, Logprob: p.entry.Logprob, Top: p.entry.Top}
}

// feed runs passes until every entry's pending tokens are fed, reading each
// pass's greedy tokens back: entry.Next is set after the last.
func (e *Engine) feed(ctx context.Context, work []pending) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		ps := e.plan(work)
		if ps.rows == 0 {
			return nil
		}
		var read func() []gpu.Binding // a pass that reads nothing out is not waited for
		if ps.lasts > 0 {
			read = func() []gpu.Binding { return []gpu.Binding{e.rowsRange(ps)} }
		}
		raw, err := e.forwardRead(ps, false, nil, nil, submitEvery, read)
		if err != nil {
			return err
		}
		var rows []byte
		if raw != nil {
			rows = raw[0]
		}
		if err := e.readOut(ps, rows); err != nil {
			return err
		}
	}
}

// chainRun is a chain of passes submitted (chainSubmit): each pass's
// read-out rows — the batch's entries, in order — have their greedy tokens
// and log-probabilities at the pass's offset of results, followed, when
// entries ask for their most likely tokens, by sample.wgsl's top.
type chainRun struct {
	results  *gpu.Buffer
	m        int    // passes
	stride   uint64 // bytes from one pass's results to the next's
	topAt    uint64 // a pass's top-N from its results' offset
	topN     int
	topBytes uint64
	base     []int // entry i's pass j token sits at slot base[i] + j
	// drawSteps(j) puts pass j's draws where sample.wgsl reads them, for a
	// sampled chain (stageDraws); nil for a greedy one.
	drawSteps func(j int) []step
	// keys(j) are pass j's coupled drafts' keys (couple.go); nil: greedy.
	keys func(k int) gpu.Binding
	// raw holds the results read back with the chain's last submission,
	// where chainSubmit was asked to read them.
	raw [][]byte
}

// resultsRange is the part of results the chain wrote.
func (c *chainRun) resultsRange() gpu.Binding { return c.results.Slice(0, uint64(c.m)*c.stride) }

// ranges is what the submission that ends with pass j reads back: the
// results when it is the chain's last and the chain reads them (read).
func (c *chainRun) ranges(j int, read bool) []gpu.Binding {
	if !read || j != c.m-1 {
		return nil
	}
	return []gpu.Binding{c.resultsRange()}
}

// readAfter is ranges for forwardRead.
func (c *chainRun) readAfter(j int, read bool) func() []gpu.Binding {
	if !read || j != c.m-1 {
		return nil
	}
	return func() []gpu.Binding { return c.ranges(j, read) }
}

// tokenWord is the u32 word of results that holds entry i's greedy token
// of pass j.
func (c *chainRun) tokenWord(i, j int) int { return int(uint64(j)*c.stride/4) + i }

// chainSubmit submits m passes over work (chainable) on the device: the
// first feeds each entry's pending tokens, reading out its last row, and
// each after it one row an entry, the greedy token of the pass before.
// Each pass after the first embeds the greedy tokens of the pass before
// where it wrote them (pass.fromNext), and each pass's are copied into its
// part of the results — and, where entries ask for them, its most likely
// tokens —, so that no pass waits for the host (chainRest).
// With read, the chain's last submission reads the results back (raw).
// Where keys is not nil, pass j's greedy rows are coupled drafts by
// keys(j) (couple.go). The sequences are committed by chainRead.
func (e *Engine) chainSubmit(ctx context.Context, work []pending, m int, read bool, keys func(k int) gpu.Binding) (*chainRun, error) {
	a, B := e.act, len(work)
	align := uint64(e.dev.Limits().MinStorageBufferOffsetAlignment)
	up := func(n uint64) uint64 { return (n + align - 1) / align * align }
	c := &chainRun{m: m, base: make([]int, B)}
	for i := range work {
		c.topN = max(c.topN, work[i].topN())
		c.base[i] = work[i].seq.Len() + len(work[i].tokens) - 1
	}
	c.topBytes = uint64(B*c.topN*2*4+15) &^ 15
	c.topAt = up(a.nextBytes)
	c.stride = c.topAt + up(c.topBytes) // each pass's results at an aligned offset
	var err error
	if c.results, err = a.ensureChain(e.dev, uint64(m)*c.stride); err != nil {
		return nil, err
	}
	copies := func(j int) []step {
		at := uint64(j) * c.stride
		cs := []step{
			func(b *gpu.Batch) error { return kernels.CopyTo(b, c.results, at, a.next, a.nextBytes) },
		}
		if c.topN > 0 {
			cs = append(cs, func(b *gpu.Batch) error { return kernels.CopyTo(b, c.results, at+c.topAt, a.top, c.topBytes) })
		}
		return cs
	}
	if c.drawSteps, err = e.stageDraws(work, m); err != nil {
		return nil, err
	}
	if c.drawSteps == nil {
		c.keys = keys
	}
	// The first pass, submitted early: nothing runs yet.
	ps := e.plan(work)
	ps.chained, ps.outcome, ps.coupled = true, c.samples(), c.keys != nil
	if c.raw, err = e.forwardRead(ps, false, e.keyStep(c.keys, 0), copies(0), submitEvery, c.readAfter(0, read)); err != nil {
		return nil, fmt.Errorf("chained pass 1: %w", err)
	}
	if m == 1 {
		return c, nil
	}
	if len(e.features) == 0 {
		return c, e.chainRest(ctx, work, c, copies, read)
	}
	// Feature rows lie where each position's pool row is, which the host
	// writes: a pass a submission.
	for j := 1; j < m; j++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ps := decodePass(work, c.base, j, m)
		ps.sameLasts, ps.outcome, ps.coupled = j > 1, c.samples(), c.keys != nil
		if c.raw, err = e.forwardRead(ps, true, append(c.draws(j), e.keyStep(c.keys, j)...), copies(j), e.chainedEvery(), c.readAfter(j, read)); err != nil {
			return nil, fmt.Errorf("chained pass %d: %w", j+1, err)
		}
	}
	return c, nil
}

// chainRest records the passes of chain c after its first: the host writes
// the second pass's inputs, and every pass after it moves the rows one
// position on, on the device (kernels.AdvanceRows), and records the same
// kernels — replayed, once their shape has been recorded — so a pass costs
// the host its dispatches and nothing else: no queue writes, no command
// buffer of its own. The second pass is submitted alone, so that the GPU
// has it while the host records the others, which go in as few
// submissions as their dispatches allow (chainedSubmitEvery). copies(j)
// copies pass j's read-out into its part of the results.
func (e *Engine) chainRest(ctx context.Context, work []pending, c *chainRun, copies func(j int) []step, read bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ps := decodePass(work, c.base, 1, c.m)
	ps.outcome, ps.coupled = c.samples(), c.keys != nil
	if err := e.writeInputs(ps, true); err != nil {
		return fmt.Errorf("chained pass 2: %w", err)
	}
	kernelSteps, keep := e.passKernels(ps)
	var err error
	if c.raw, err = e.submitRead(append(append(append(c.draws(1), e.keyStep(c.keys, 1)...), kernelSteps...), copies(1)...), e.chainedEvery(), c.ranges(1, read)...); err != nil {
		return fmt.Errorf("chained pass 2: %w", err)
	}
	keep()
	if c.m == 2 {
		return nil
	}
	kernelSteps, keep = e.passKernels(ps) // replayed now, where the shape's recording could be kept
	advance := func(b *gpu.Batch) error { return kernels.AdvanceRows(b, e.act.rows, ps.rows) }
	var steps []step
	for j := 2; j < c.m; j++ {
		steps = append(append(append(append(append(steps, advance), c.draws(j)...), e.keyStep(c.keys, j)...), kernelSteps...), copies(j)...)
	}
	if c.raw, err = e.submitRead(steps, e.chainedEvery(), c.ranges(c.m-1, read)...); err != nil {
		return fmt.Errorf("chained passes 3–%d: %w", c.m, err)
	}
	keep()
	return nil
}

// chainRead decodes a submitted chain's results, read back (raw: its
// resultsRange's bytes), and returns each entry's m tokens; the sequences
// hold what the chain fed.
func (e *Engine) chainRead(work []pending, c *chainRun, raw []byte) ([][]engine.Token, error) {
	var err error
	out := make([][]engine.Token, len(work))
	for i := range out {
		out[i] = make([]engine.Token, c.m)
	}
	for j := range c.m {
		at := uint64(j) * c.stride
		ids, lps := nextWords(raw[at:], e.act.nextLP, len(work))
		var top []uint32
		if c.topN > 0 {
			top = u32s(raw[at+c.topAt : at+c.topAt+c.topBytes])
		}
		for i := range out {
			if out[i][j].ID, err = e.token(ids[i]); err != nil {
				return nil, fmt.Errorf("chained pass %d: %w", j+1, err)
			}
			out[i][j].Logprob = lps[i]
			if n := work[i].topN(); n > 0 {
				out[i][j].Top = kernels.SampleTop(top[i*c.topN*2:], n)
			}
		}
	}
	for i, p := range work {
		if err := p.seq.Commit(c.base[i]+c.m, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Verify runs forward passes over every entry's tokens, as Step does — a
// line, or a token tree's nodes (VerifyEntry.Parents) — and reads out each
// entry's last Out positions (engine.Engine): through argmax.wgsl where
// the whole pass is greedy without a top-N, else sample.wgsl, and for
// sampled drafts (Propose, Tree) propose.wgsl and tree_walk.wgsl after it
// (sampled.go). Only the read-out words come back, in one read a pass. On
// an error every sequence is as it was before the call.
func (e *Engine) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	c := &e.cfg
	if err := engine.CheckVerify(c, batch); err != nil {
		return err
	}
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return err
	}
	work, lens, err := e.prepareVerify(batch)
	if err != nil {
		return err
	}
	if err := e.feed(ctx, work); err != nil {
		for i, p := range work {
			p.seq.Truncate(lens[i])
		}
		return e.broken(err)
	}
	for i, v := range batch {
		v.Rows = work[i].rows
	}
	return nil
}

// prepareVerify readies a verification of batch (checked, the group's lock
// held) as prepareSteps readies steps, with the Q-store slots of its
// sampled drafts.
func (e *Engine) prepareVerify(batch []*engine.VerifyEntry) ([]pending, []int, error) {
	return e.prepareVerifyMore(batch, 0)
}

// prepareVerifyMore is prepareVerify with the blocks of more positions
// after each entry's tokens reserved too (a chain's).
func (e *Engine) prepareVerifyMore(batch []*engine.VerifyEntry, more int) ([]pending, []int, error) {
	seqs, err := e.sequences(len(batch), func(i int) engine.Sequence { return batch[i].Seq })
	if err != nil {
		return nil, nil, err
	}
	place, err := placeAll(seqs, func(i int) ([]int, []int) { return batch[i].Tokens, batch[i].Parents })
	if err != nil {
		return nil, nil, err
	}
	slots, err := e.sampledDrafts(batch)
	if err != nil {
		return nil, nil, err
	}
	lens, need := make([]int, len(batch)), make([]int, len(batch))
	for i, v := range batch {
		lens[i] = seqs[i].Len()
		need[i] = lens[i] + len(v.Tokens) + more
		if need[i] > e.cfg.MaxPositionEmbeddings {
			return nil, nil, fmt.Errorf("batch entry %d: %d positions: %w (max_position_embeddings %d)", i, need[i], engine.ErrContextFull, e.cfg.MaxPositionEmbeddings)
		}
	}
	if err := e.kv.Reserve(seqs, need); err != nil {
		return nil, nil, kvError(err)
	}
	work := make([]pending, len(batch))
	for i, v := range batch {
		work[i] = pending{verify: v, seq: seqs[i], tokens: v.Tokens, place: place[i], out: v.Out, rows: make([]engine.VerifyRow, 0, v.Out)}
		if slots != nil {
			work[i].slots = slots[i]
		}
	}
	return work, lens, nil
}

// placeAll places each batch entry's tokens in its sequence (KVSeq.Place:
// a line, or its token tree's nodes), changing nothing; an entry's tree
// that treemask refuses is the batch's error.
func placeAll(seqs []*kernels.KVSeq, entry func(i int) (tokens, parents []int)) ([][]treemask.Row, error) {
	place := make([][]treemask.Row, len(seqs))
	for i, s := range seqs {
		tokens, parents := entry(i)
		var err error
		if place[i], err = s.Place(len(tokens), parents); err != nil {
			return nil, fmt.Errorf("webgpu engine: batch entry %d: %w", i, err)
		}
	}
	return place, nil
}
