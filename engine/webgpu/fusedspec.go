package webgpu

import (
	"context"
	"errors"
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
)

var _ engine.SpecChainer = (*Engine)(nil)

// DraftVerifyN runs up to m speculative steps, greedy or sampled, of a
// standalone drafter in one call (engine.SpecChainer), each after the
// first planned on the device from the step before's verdict, as
// Head.DraftVerifyN does for a head. Step 0 is DraftVerify's. Each step
// j ≥ 1 then runs with no input from the host:
//   - spec_accept.wgsl takes the step before's verdict, moves each
//     sequence's state on and writes the bonus as the first of the
//     target's next ids and, for the drafter, its first pass's ids: the
//     bonus and the token before it;
//   - spec_draft_rows.wgsl places the target's n + 1 rows from L and the
//     drafter's first pass's two rows: the bonus at L, read out, and the
//     token before it at L − 1, which the drafter computes again (its chain
//     fed every draft but the last, so after a draft taken whole that
//     position is new to it, and else the same token there);
//   - its chained passes draft the n − 1 others, their rows placed on the
//     device and moved on pass by pass;
//   - the drafts are gathered into the target's ids, and the target
//     verifies the n + 1 rows, its rows copied into the results.
//
// Where the batch does not chain (its shape, a target that keeps features
// for a head, room in a pass, in the caches or the context for m steps)
// it runs one step, DraftVerify's. On an error every sequence is as it
// was before the call.
func (e *Engine) DraftVerifyN(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n, m int) ([]engine.ChainedStep, error) {
	if !e.Fuses(target) {
		return nil, errors.New("webgpu engine: draft and verify n: the target is not another engine of the drafter's group")
	}
	if n <= 0 || m <= 0 {
		return nil, fmt.Errorf("webgpu engine: draft and verify n: %d drafts, %d steps, want both > 0", n, m)
	}
	t := target.(*Engine)
	return chainOrStep(ctx, e, t, steps, n, m > 1 && e.specShape(t, steps, n), func(drafts []*engine.Entry, verify []*engine.VerifyEntry) ([]engine.ChainedStep, bool, error) {
		return e.draftVerifyN(ctx, t, steps, drafts, verify, n, m)
	})
}

// specShape reports whether steps have a chain's shape for the drafter
// and target t: chains (chainSteps), each taking all n drafts after one
// pending token, whose rows fit one pass of each model and its read-out,
// through decode attention, neither model keeping features (for a head:
// its own chains, Head.DraftVerifyN).
func (e *Engine) specShape(t *Engine, steps []engine.ChainStep, n int) bool {
	B := len(steps)
	rows := B * (n + 1)
	if B == 0 || 2*B > e.opts.MaxRows || B > e.act.maxLasts || rows > t.opts.MaxRows || rows > t.act.maxLasts || n+1 > decodeEntryRows || len(t.features) > 0 || len(e.features) > 0 {
		return false
	}
	return chainSteps(steps, n)
}

// draftVerifyN runs DraftVerifyN's chain of m steps over checked steps
// (specShape; draftPlaces done). chained false, with no error: the batch
// did not chain after all, and nothing changed.
func (e *Engine) draftVerifyN(ctx context.Context, t *Engine, steps []engine.ChainStep, drafts []*engine.Entry, verify []*engine.VerifyEntry, n, m int) (_ []engine.ChainedStep, chained bool, err error) {
	if err := engine.CheckBatch(&e.cfg, drafts); err != nil {
		return nil, false, err
	}
	if err := engine.CheckVerify(&t.cfg, verify); err != nil {
		return nil, false, err
	}
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return nil, false, err
	}
	if err := t.usable(); err != nil {
		return nil, false, err
	}
	B := len(steps)
	L0, m := chainRoom(verify, min(t.cfg.MaxPositionEmbeddings, e.cfg.MaxPositionEmbeddings), n, m)
	if m < 2 {
		return nil, false, nil
	}
	dwork, dlens, err := e.prepareSteps(drafts, n)
	if err != nil {
		return nil, false, err
	}
	twork, tlens, err := t.prepareVerify(verify)
	undo := func() {
		for i, p := range dwork {
			p.seq.Truncate(dlens[i])
		}
		for i, p := range twork {
			p.seq.Truncate(tlens[i])
		}
	}
	if err != nil {
		twork = nil
		undo()
		return nil, false, err
	}
	ps := t.plan(twork)
	if !e.chainable(dwork) || !gathersDrafts(ps, twork) || ps.rows != B*(n+1) || ps.decode != ps.rows || ps.lasts != ps.rows || ps.propose || ps.trees > 0 {
		undo()
		return nil, false, nil
	}
	dseqs, tseqs, need := make([]*kernels.KVSeq, B), make([]*kernels.KVSeq, B), make([]int, B)
	for i := range B {
		dseqs[i], tseqs[i], need[i] = dwork[i].seq, twork[i].seq, L0[i]+m*(n+1)
	}
	if e.kv.Reserve(dseqs, need) != nil || t.kv.Reserve(tseqs, need) != nil {
		undo()
		return nil, false, nil
	}
	out, err := e.specRun(ctx, t, steps, dwork, twork, ps, L0, n, m)
	if err != nil {
		undo()
		return nil, true, e.broken(err)
	}
	return out, true, nil
}

// specRun writes the chain's inputs, submits its m steps and reads them
// back (DraftVerifyN), then commits both models' sequences.
func (e *Engine) specRun(ctx context.Context, t *Engine, steps []engine.ChainStep, dwork, twork []pending, ps pass, L0 []int, n, m int) ([]engine.ChainedStep, error) {
	a := e.act
	B, rows := len(dwork), len(dwork)*(n+1)
	align := uint64(e.dev.Limits().MinStorageBufferOffsetAlignment)
	up := func(n uint64) uint64 { return (n + align - 1) / align * align }
	sb := &e.spec
	if sb.state == nil {
		var err error
		if sb.state, err = e.dev.NewBuffer("spec_state", uint64(e.act.maxLasts*kernels.SpecStateWords)*4); err != nil {
			return nil, err
		}
	}
	// The drafter's results: a chain's passes' (chainSubmit's layout), m·n
	// of them.
	topN := 0
	for _, p := range dwork {
		topN = max(topN, p.topN())
	}
	topBytes := uint64(B*topN*2*4+15) &^ 15
	stride := up(a.nextBytes) + up(topBytes)
	results, err := a.ensureChain(e.dev, uint64(m*n)*stride)
	if err != nil {
		return nil, err
	}
	tl := specLayoutOf(t, ps, rows)
	word := func(i, k int) int { return int(uint64(k)*stride/4) + i } // entry i's draft of the chain's pass k
	tslots, dslots := make([]int, B), make([]int, B)
	for i := range B {
		tslots[i], dslots[i] = twork[i].seq.Slot(), dwork[i].seq.Slot()
	}
	idStride, err := sb.start(e.dev, tl, B, n, m, word, L0, tslots, dslots)
	if err != nil {
		return nil, err
	}
	drawStride, err := sb.startDraws(e.dev, steps, n, m, word, idStride)
	if err != nil {
		return nil, err
	}

	// The drafts' keys where they are coupled: draft c of step j by key
	// region j·n + c (couple.go), put in place before each drafter pass.
	keys, err := e.coupleKeys(steps, n, m)
	if err != nil {
		return nil, err
	}
	dsample := topN > 0
	var keyBuf *gpu.Buffer // the drafts' keys, which each step keys by its positions
	if keys != nil {
		keyBuf = a.chainKeys
	}

	// Step 0: DraftVerify's submissions, the verification's rows copied
	// into the results.
	ch, err := e.chainSubmit(ctx, dwork, n, false, keys)
	if err != nil {
		return nil, err
	}
	if ch.stride != stride || ch.results != results {
		return nil, fmt.Errorf("chained speculative steps: the chain's results laid out at %d bytes a pass, want %d", ch.stride, stride)
	}
	pre, err := t.gatherDrafts(ps, twork, steps, ch.tokenWord, results)
	if err != nil {
		return nil, err
	}
	ps.outcome = true
	if _, err := t.forwardRead(ps, false, pre, sb.verifyCopies(t, tl, 0), submitEvery, nil); err != nil {
		return nil, fmt.Errorf("chained speculative step 1: %w", err)
	}
	// Every drafter pass from here reads out rows 0 … B−1: the bonus's, then
	// a chained row each (written after step 0's submissions: the queue
	// orders them).
	last := make([]uint32, B)
	for i := range last {
		last[i] = uint32(i)
	}
	if err := a.last.WriteU32(0, last); err != nil {
		return nil, err
	}

	// Steps 1 … m−1, planned on the device.
	maxLen := 0
	for i := range B {
		maxLen = max(maxLen, L0[i]+m*(n+1))
	}
	copies := func(k int) []step { // pass k's read-out into the results
		at := uint64(k) * stride
		cs := []step{func(b *gpu.Batch) error { return kernels.CopyTo(b, results, at, a.next, a.nextBytes) }}
		if topN > 0 {
			cs = append(cs, func(b *gpu.Batch) error { return kernels.CopyTo(b, results, at+up(a.nextBytes), a.top, topBytes) })
		}
		return cs
	}
	accept := func(j int) step { // step j's verdict
		return func(b *gpu.Batch) error {
			return kernels.SpecAccept(b, sb.state, results, t.act.next, t.act.ids, a.ids, true, B, n, word(0, j*n), int(stride/4))
		}
	}
	var raw [][]byte
	for j := 1; j < m; j++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		steps := []step{accept(j - 1), func(b *gpu.Batch) error {
			return kernels.SpecDraftRows(b, sb.state, a.rows, t.act.rows, B, n, true)
		}}
		steps = append(steps, sb.keyDraws(e.dev, keyBuf, j, B, n, drawStride)...)
		first := pass{rows: 2 * B, decode: 2 * B, lasts: B, maxLen: maxLen, sample: dsample, topN: topN, chained: true, sameLasts: true, coupled: keys != nil}
		kernelSteps, keep := e.passKernels(first)
		keeps := []func(){keep}
		steps = append(append(append(steps, e.keyStep(keys, j*n)...), kernelSteps...), copies(j*n)...)
		if n > 1 {
			steps = append(steps, func(b *gpu.Batch) error { return kernels.SpecDraftRows(b, sb.state, a.rows, t.act.rows, B, n, false) })
		}
		for c := 1; c < n; c++ {
			if c > 1 {
				steps = append(steps, func(b *gpu.Batch) error { return kernels.AdvanceRows(b, a.rows, B) })
			}
			cp := pass{rows: B, decode: B, lasts: B, maxLen: maxLen, sample: dsample, topN: topN, chained: true, fromNext: true, sameLasts: true, coupled: keys != nil}
			kernelSteps, keep := e.passKernels(cp)
			keeps = append(keeps, keep)
			steps = append(append(append(steps, e.keyStep(keys, j*n+c)...), kernelSteps...), copies(j*n+c)...)
		}
		tp := pass{rows: rows, decode: rows, lasts: rows, maxLen: maxLen, sample: ps.sample, topN: ps.topN, chained: true, sameLasts: true}
		verifySteps, keep := sb.verification(t, tp, tl, results, j, B, n, idStride, drawStride)
		keeps = append(keeps, keep)
		steps = append(steps, verifySteps...)
		var ranges []gpu.Binding
		if j == m-1 {
			steps = append(steps, accept(m-1))
			ranges = []gpu.Binding{results.Slice(0, uint64(m*n)*stride), sb.results.Slice(0, uint64(m)*tl.stride), sb.state.Slice(0, uint64(B*kernels.SpecStateWords)*4)}
		}
		if raw, err = e.submitRead(steps, e.chainedEvery(), ranges...); err != nil {
			return nil, fmt.Errorf("chained speculative step %d: %w", j+1, err)
		}
		for _, keep := range keeps {
			keep()
		}
	}
	out, lastL, err := e.specRead(t, raw, stride, topN, tl, dwork, twork, L0, n, m)
	if err != nil {
		return nil, err
	}
	for i := range B { // as after the last step's DraftVerify alone
		if err := dwork[i].seq.Commit(lastL[i]+n, nil); err != nil {
			return nil, err
		}
		if err := twork[i].seq.Commit(lastL[i]+n+1, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// specRead decodes a drafter's chain read back (raw: its drafts, the
// target's rows, the final states; readChain), each draft with the top
// tokens its entry asks for.
func (e *Engine) specRead(t *Engine, raw [][]byte, stride uint64, topN int, tl specLayout, dwork, twork []pending, L0 []int, n, m int) ([]engine.ChainedStep, []int, error) {
	align := uint64(e.dev.Limits().MinStorageBufferOffsetAlignment)
	topAt := (e.act.nextBytes + align - 1) / align * align
	words := u32s(raw[0])
	return readChain(t, u32s(raw[1]), u32s(raw[2]), tl, twork, L0, n, m, func(j, i int) ([]engine.Token, error) {
		out := make([]engine.Token, n)
		for c := range out {
			k := uint64(j*n+c) * stride / 4
			id, err := e.token(words[k+uint64(i)])
			if err != nil {
				return nil, fmt.Errorf("draft %d: %w", c+1, err)
			}
			out[c] = engine.Token{ID: id, Logprob: math.Float32frombits(words[k+e.act.nextLP/4+uint64(i)])}
			if nt := dwork[i].topN(); nt > 0 {
				out[c].Top = kernels.SampleTop(words[k+topAt/4+uint64(i*topN*2):], nt)
			}
		}
		return out, nil
	})
}
