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

var _ engine.SpecChainer = (*Head)(nil)

// DraftVerifyN runs up to m speculative steps, greedy or sampled, in one
// call (engine.SpecChainer), each after the first planned on the device
// from the step before's verdict, so that the host records the whole
// chain without waiting for the device and reads it back once.
//
// Step 0 is DraftVerify's: the head's chain, then the target's
// verification of the n drafts after each entry's pending token, with the
// verification's rows copied into a results buffer and its feature
// layers' rows also copied to where the head's next pass reads them
// (pass.keep). Each step j ≥ 1 then runs with no input from the host:
//   - spec_accept.wgsl takes the step before's verdict — the drafts the
//     target's tokens agree with, n (its greedy tokens, or what its
//     sampled rows drew: each step's draws, their proposals the drafts,
//     are put in place on the device, specBuffers.verification) — moves
//     each sequence's state on (L, its next verification's first
//     position) and writes the
//     target's token after the accepted drafts, the bonus, as the first of
//     its next verification's ids;
//   - spec_rows.wgsl places the step's rows from that state: the target's
//     n + 1 rows from L and their features' pool rows, the head's first
//     pass's rows, the store pair that keeps that pass's output at the
//     bonus token's row and the head's first chained row;
//   - the head's first pass runs over all n + 1 rows the step before
//     verified, their tokens the target's there (which equal the accepted
//     drafts and, after them, the bonus), their features those the
//     verification kept: its row at the bonus token drafts the first
//     token, and the rows past it, whose tokens were never accepted, sit at
//     positions the later passes overwrite before anything reads them;
//   - its chained passes draft the n − 1 others, as StepN's do;
//   - the drafts are gathered into the target's ids, and the target
//     verifies the n + 1 rows, its rows copied into the results.
//
// Where the batch does not chain (engine.SpecChainer: its shape, or room
// in a pass, in the caches or the context for m steps) it runs one step,
// DraftVerify's. On an error every sequence is as it was before the call.
func (h *Head) DraftVerifyN(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n, m int) ([]engine.ChainedStep, error) {
	if !h.Fuses(target) {
		return nil, errors.New("webgpu head: draft and verify n: the target is not the head's")
	}
	if n <= 0 || m <= 0 {
		return nil, fmt.Errorf("webgpu head: draft and verify n: %d drafts, %d steps, want both > 0", n, m)
	}
	return chainOrStep(ctx, h, h.target, steps, n, m > 1 && h.specShape(steps, n), func(drafts []*engine.Entry, verify []*engine.VerifyEntry) ([]engine.ChainedStep, bool, error) {
		return h.draftVerifyN(ctx, steps, drafts, verify, n, m)
	})
}

// specShape reports whether steps have a chain's shape: chains
// (chainSteps: greedy, or sampled with their draws) over the head's own
// target's sequences, each taking all n drafts after one pending token,
// whose n + 1 rows an entry fit one pass of each model and its read-out,
// through decode attention.
func (h *Head) specShape(steps []engine.ChainStep, n int) bool {
	t, B := h.target, len(steps)
	rows := B * (n + 1)
	if B == 0 || B > h.act.S || rows > h.act.R || rows > t.opts.MaxRows || rows > t.act.maxLasts || n+1 > decodeEntryRows || len(t.features) == 0 {
		return false
	}
	for _, s := range steps {
		if s.Draft != nil && s.Verify != nil && s.Draft.Target != s.Verify.Seq {
			return false
		}
	}
	return chainSteps(steps, n)
}

// ensureSpec makes the chain's fixed buffers on first use.
func (h *Head) ensureSpec() (*specBuffers, error) {
	if h.spec.state != nil {
		return &h.spec, nil
	}
	a, s := h.act, &h.spec
	align := uint64(h.dev.Limits().MinStorageBufferOffsetAlignment)
	var keepBytes uint64
	for range a.regions.features {
		s.keepAt = append(s.keepAt, keepBytes)
		keepBytes += (uint64(a.R*kernels.GatherPairWords)*4 + align - 1) / align * align
	}
	for _, b := range []struct {
		dst   **gpu.Buffer
		name  string
		bytes uint64
	}{
		{&s.state, "head.spec_state", uint64(a.S*kernels.SpecStateWords) * 4},
		{&s.rows, "head.spec_rows", uint64(a.R*kernels.RowWords) * 4},
		{&s.chain, "head.spec_chain_rows", uint64(a.S*kernels.RowWords) * 4},
		{&s.pairs, "head.spec_pairs", uint64(a.regions.words) * 4},
		{&s.keep, "head.spec_keep_pairs", keepBytes},
		{&s.unused, "head.spec_unused", 16},
	} {
		var err error
		if *b.dst, err = h.dev.NewBuffer(b.name, b.bytes); err != nil {
			s.release()
			return nil, fmt.Errorf("webgpu head: %w", err)
		}
	}
	return s, nil
}

// draftVerifyN runs DraftVerifyN's chain of m steps over checked steps
// (specShape; draftPlaces done). chained false, with no error: the batch
// did not chain after all (room in the caches or the context), and
// nothing changed.
func (h *Head) draftVerifyN(ctx context.Context, steps []engine.ChainStep, drafts []*engine.Entry, verify []*engine.VerifyEntry, n, m int) (_ []engine.ChainedStep, chained bool, err error) {
	t := h.target
	if err := engine.CheckBatch(&h.engCfg, drafts); err != nil {
		return nil, false, fmt.Errorf("webgpu head: %w", err)
	}
	if err := engine.CheckVerify(&t.cfg, verify); err != nil {
		return nil, false, err
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, false, err
	}
	if err := t.usable(); err != nil {
		return nil, false, err
	}
	B := len(steps)
	// The positions the chain may reach: m verifications of n + 1 rows
	// from each entry's pending token on.
	L0, m := chainRoom(verify, min(t.cfg.MaxPositionEmbeddings, h.engCfg.MaxPositionEmbeddings), n, m)
	if m < 2 {
		return nil, false, nil
	}
	need := make([]int, B)
	tseqs, hseqs := make([]*kernels.KVSeq, B), make([]*kernels.KVSeq, B)
	feeds, err := h.prepareChain(ctx, drafts, n)
	if err != nil {
		return nil, false, err
	}
	twork, tlens, err := t.prepareVerify(verify)
	if err != nil {
		h.unchain(feeds, false)
		return nil, false, err
	}
	undo := func(submitted bool) {
		for i, p := range twork {
			p.seq.Truncate(tlens[i])
		}
		for _, f := range feeds {
			f.seq.Truncate(f.L)
			f.seq.kv.Truncate(f.seq.rows())
			if submitted {
				f.seq.outRow = -1
			}
		}
	}
	ps := t.plan(twork)
	if !h.chains(feeds) || !gathersDrafts(ps, twork) || ps.rows != B*(n+1) || ps.decode != ps.rows || ps.lasts != ps.rows || ps.propose || ps.trees > 0 {
		undo(false)
		return nil, false, nil
	}
	for i := range B {
		tseqs[i], hseqs[i] = twork[i].seq, feeds[i].seq.kv
		need[i] = L0[i] + m*(n+1)
	}
	if err := t.kv.Reserve(tseqs, need); err != nil {
		undo(false)
		return nil, false, nil
	}
	if err := h.kv.Reserve(hseqs, need); err != nil {
		undo(false)
		return nil, false, nil
	}
	out, err := h.specRun(ctx, steps, feeds, drafts, twork, ps, L0, n, m)
	if err != nil {
		undo(true)
		return nil, true, t.broken(err)
	}
	return out, true, nil
}

// specRun writes the chain's inputs, submits its m steps and reads them
// back (DraftVerifyN), then commits both models' sequences.
func (h *Head) specRun(ctx context.Context, steps []engine.ChainStep, feeds []headFeed, drafts []*engine.Entry, twork []pending, ps pass, L0 []int, n, m int) ([]engine.ChainedStep, error) {
	t, a := h.target, h.act
	B, rows := len(feeds), len(feeds)*(n+1)
	sb, err := h.ensureSpec()
	if err != nil {
		return nil, err
	}
	topN := 0 // as chainSubmit reckons it
	for _, d := range drafts {
		topN = max(topN, min(d.TopN, h.cfg.DraftVocabSize))
	}
	keys, err := h.coupleKeys(steps, n, m)
	if err != nil {
		return nil, err
	}
	lay := h.chainLayout(B, topN, n, true, keys != nil)
	if err := a.ensureChain(h.dev, n-1, uint64(m)*lay.bytes()); err != nil {
		return nil, err
	}
	tl := specLayoutOf(t, ps, rows)
	tslots, hslots := make([]int, B), make([]int, B)
	for i, f := range feeds {
		tslots[i], hslots[i] = twork[i].seq.Slot(), f.seq.kv.Slot()
	}
	idStride, err := sb.start(h.dev, tl, B, n, m, lay.targetWord, L0, tslots, hslots)
	if err != nil {
		return nil, err
	}
	drawStride, err := sb.startDraws(h.dev, steps, n, m, lay.targetWord, idStride)
	if err != nil {
		return nil, err
	}

	// The head's own inputs, written before the submissions that read
	// them: the first pass's read-out pairs, the feature copies' pairs.
	pairs := make([]uint32, a.regions.words)
	for i, f := range feeds {
		w := a.regions.read/4 + uint64(i*kernels.GatherPairWords)
		pairs[w], pairs[w+1] = uint32(i), uint32(a.R+f.seq.kv.Slot())
	}
	nf := len(sb.keepAt)
	keep := make([]uint32, sb.keep.Size()/4)
	keepFor := &featureKeep{buf: a.fcIn}
	for f, at := range sb.keepAt {
		for r := range rows {
			w := at/4 + uint64(r*kernels.GatherPairWords)
			keep[w], keep[w+1] = uint32(r*nf+f), uint32(r)
		}
		keepFor.pairs = append(keepFor.pairs, sb.keep.Slice(at, uint64(rows*kernels.GatherPairWords)*4))
	}
	for _, w := range []struct {
		buf *gpu.Buffer
		v   []uint32
	}{{sb.pairs, pairs}, {sb.keep, keep}} {
		if err := w.buf.WriteU32(0, w.v); err != nil {
			return nil, err
		}
	}

	// Step 0: DraftVerify's submissions, the verification's features kept
	// for the head and its rows copied into the results.
	lay0, _, err := h.chainSubmit(ctx, feeds, drafts, n, true, keys)
	if err != nil {
		return nil, err
	}
	pre, err := t.gatherDrafts(ps, twork, steps, lay0.targetWord, a.results)
	if err != nil {
		return nil, err
	}
	ps.keep, ps.outcome = keepFor, true
	if _, err := t.forwardRead(ps, false, pre, sb.verifyCopies(t, tl, 0), submitEvery, nil); err != nil {
		return nil, fmt.Errorf("chained speculative step 1: %w", err)
	}

	// Steps 1 … m−1, planned on the device.
	maxLen := 0
	for i := range B {
		maxLen = max(maxLen, L0[i]+m*(n+1))
	}
	accept := func(j int) step { // step j's verdict
		return func(b *gpu.Batch) error {
			return kernels.SpecAccept(b, sb.state, a.results, t.act.next, t.act.ids, sb.unused, false, B, n, lay.targetWord(0, j*n), int(lay.stride/4))
		}
	}
	first := make([]headPart, B)
	chain := make([]headPart, B)
	for i, f := range feeds {
		first[i] = headPart{feed: i, slot: f.seq.kv.Slot(), T: n + 1, row0: i * (n + 1)}
		chain[i] = headPart{feed: i, slot: f.seq.kv.Slot(), T: 1, row0: i}
	}
	// A pass drafting chain step k: mapped, its read-out goes straight into
	// the results and a chained pass embeds the step before's ids from
	// there; else its tail copies the read-out and maps its drafts to the
	// target's tokens, in ids, which the next pass embeds. Its tail copies
	// its top tokens where it lists them.
	draftPass := func(ps *headPass, k int) []step {
		if lay.mapped {
			at := uint64(k) * lay.stride
			if keys != nil {
				ps.keys = keys(k)
			}
			ps.readIDs = a.results.Slice(at, lay.idBytes)
			ps.readLP = a.results.Slice(at+lay.lpAt, lay.topAt-lay.lpAt)
			if ps.fromNext {
				ps.fromIDs = a.results.Slice(at-lay.stride, lay.idBytes)
			}
		}
		return append(h.passSteps(ps, B, topN), h.chainTail(lay, k, true)...)
	}
	var keyBuf *gpu.Buffer // the drafts' keys, which each step keys by its positions
	if keys != nil {
		keyBuf = a.chainKeys
	}
	var raw [][]byte
	for j := 1; j < m; j++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		steps := []step{accept(j - 1), func(b *gpu.Batch) error {
			return kernels.SpecRows(b, sb.state, t.kv, kernels.SpecRowsOut{
				TargetRows: t.act.rows, TargetFeatures: t.act.featPairs, HeadRows: sb.rows,
				HeadSave: sb.pairs.Slice(a.regions.save, uint64(B*kernels.GatherPairWords)*4), HeadChain: sb.chain,
			}, B, n, a.R)
		}}
		steps = append(steps, sb.keyDraws(h.dev, keyBuf, j, B, n, drawStride)...)
		hp := headPass{parts: first, rows: rows, decode: rows, maxLen: maxLen, nfc: rows, featsIn: true, nsave: B, last: true,
			mapped: lay.mapped, rowBuf: sb.rows, pairs: sb.pairs, fromIDs: t.act.next.Slice(0, uint64((rows+3)&^3)*4)}
		steps = append(steps, draftPass(&hp, j*n)...)
		for c := 1; c < n; c++ {
			if c > 1 {
				steps = append(steps, func(b *gpu.Batch) error { return kernels.AdvanceRows(b, sb.chain, B) })
			}
			cp := headPass{parts: chain, rows: B, decode: B, maxLen: maxLen, nx: B, nsave: B, last: true, rowBuf: sb.chain,
				mapped: lay.mapped, fromNext: lay.mapped, xHeld: c > 1, noSave: c < n-1, readX: true}
			steps = append(steps, draftPass(&cp, j*n+c)...)
		}
		tp := pass{rows: rows, decode: rows, lasts: rows, maxLen: maxLen, sample: ps.sample, topN: ps.topN, chained: true, sameLasts: true, keep: keepFor}
		verifySteps, kept := sb.verification(t, tp, tl, a.results, j, B, n, idStride, drawStride)
		steps = append(steps, verifySteps...)
		var ranges []gpu.Binding
		if j == m-1 {
			steps = append(steps, accept(m-1))
			ranges = []gpu.Binding{a.results.Slice(0, uint64(m)*lay.bytes()), sb.results.Slice(0, uint64(m)*tl.stride), sb.state.Slice(0, uint64(B*kernels.SpecStateWords)*4)}
		}
		if raw, err = t.submitRead(steps, t.chainedEvery(), ranges...); err != nil {
			return nil, fmt.Errorf("chained speculative step %d: %w", j+1, err)
		}
		kept()
	}
	out, last, err := h.specRead(raw, lay, tl, drafts, twork, L0, n, m)
	if err != nil {
		return nil, err
	}
	return out, h.specCommit(feeds, twork, last, n)
}

// specRead decodes a head's chain read back (raw: its drafts, the
// target's rows, the final states; readChain), each draft with the top
// tokens its entry asks for, in the target's vocabulary.
func (h *Head) specRead(raw [][]byte, lay chainLayout, tl specLayout, drafts []*engine.Entry, twork []pending, L0 []int, n, m int) ([]engine.ChainedStep, []int, error) {
	t, words := h.target, u32s(raw[0])
	return readChain(t, u32s(raw[1]), u32s(raw[2]), tl, twork, L0, n, m, func(j, i int) ([]engine.Token, error) {
		out := make([]engine.Token, n)
		for c := range out {
			k := uint64(j*n + c)
			id, err := t.token(words[lay.targetWord(i, int(k))])
			if err != nil {
				return nil, fmt.Errorf("draft %d: %w", c+1, err)
			}
			out[c] = engine.Token{ID: id, Logprob: math.Float32frombits(words[(k*lay.stride+lay.lpAt)/4+uint64(i)])}
			if nt := min(drafts[i].TopN, lay.topN); nt > 0 {
				out[c].Top = kernels.SampleTop(words[(k*lay.stride+lay.topAt)/4+uint64(i*lay.topN*2):], nt)
				for q := range out[c].Top {
					out[c].Top[q].Token = int(h.tokens[out[c].Top[q].Token])
				}
			}
		}
		return out, nil
	})
}

// specCommit records what a chain left in the sequences, as after its
// last step's DraftVerify alone: the target holds its last verification's
// n + 1 rows from last[i] on; the head its rows through the last step's
// chain, those up to last[i] over the target's features, its store
// holding its last chained row.
func (h *Head) specCommit(feeds []headFeed, twork []pending, last []int, n int) error {
	if err := h.commit(feeds, n-1); err != nil { // step 0's, then moved on
		return err
	}
	for i, f := range feeds {
		s := f.seq
		s.len = last[i] + n
		if err := s.kv.Commit(s.len-1, nil); err != nil {
			return err
		}
		s.targetRows = last[i]
		s.outRow = s.len - 2
		if err := twork[i].seq.Commit(last[i]+n+1, nil); err != nil {
			return err
		}
	}
	return nil
}
