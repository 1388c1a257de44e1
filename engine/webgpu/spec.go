package webgpu

import (
	"context"
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
)

// Chains of speculative steps (engine.SpecChainer): what a head's
// (headspec.go) and a standalone drafter's (fusedspec.go) share — their
// buffers, the target's side of each step, and the decoding of a chain
// read back.

// specBuffers are a chain's own buffers (DraftVerifyN), made by its first
// call and grown as calls need; a drafter uses state, ids and results:
//
//	state   (S, kernels.SpecStateWords) u32: each entry's state
//	rows    (R, kernels.RowWords) u32: the head's first pass's rows
//	chain   (S, kernels.RowWords) u32: its chained passes' rows, moved on
//	        pass by pass (kernels.AdvanceRows)
//	pairs   the head's first pass's gathers, laid out as the activations'
//	        pairs (pairRegions): its store pairs the device's, its read-out
//	        pairs the host's
//	keep    the target's feature copies' pairs, (row·features + f, row),
//	        a region of R pairs a feature f at keepAt[f]
//	ids     the drafts' gathers into the target's ids, a region a step
//	results the target's read-out words, a region a step (specLayout)
//	unused  what spec_accept.wgsl binds for a standalone drafter's ids
//	        and does not write (a head's chain)
//	draws   a sampled chain's draws (sample.wgsl's draws words) of the
//	        target's rows, a region a step, copied into place before
//	        its verification
//	xs      the drafts' gathers into those draws' proposals, a region
//	        a step
type specBuffers struct {
	state, rows, chain, pairs, keep *gpu.Buffer
	keepAt                          []uint64
	ids, results, unused            *gpu.Buffer
	draws, xs                       *gpu.Buffer
}

func (s *specBuffers) release() {
	for _, b := range []*gpu.Buffer{s.state, s.rows, s.chain, s.pairs, s.keep, s.ids, s.results, s.unused, s.draws, s.xs} {
		if b != nil {
			b.Release()
		}
	}
	*s = specBuffers{}
}

// specLayout is where a chain's results hold each step's verification:
// at step j's offset j·stride, a copy of the target's next buffer (its
// greedy tokens, their log-probabilities and log-sum-exps); where its
// rows list top tokens (topN > 0, sample.wgsl's read-out), from sampledAt
// sample.wgsl's words and from topAt its top tokens (rows, topN, 2).
type specLayout struct {
	stride, sampledAt, topAt uint64
	sampledBytes, topBytes   uint64
	topN                     int
}

// specLayoutOf lays out the results of target t's verifications of rows
// rows read out by pass ps's read-out.
func specLayoutOf(t *Engine, ps pass, rows int) specLayout {
	align := uint64(t.dev.Limits().MinStorageBufferOffsetAlignment)
	up := func(n uint64) uint64 { return (n + align - 1) / align * align }
	l := specLayout{stride: up(t.act.next.Size())}
	if ps.sample {
		l.topN = ps.topN
		l.sampledAt, l.sampledBytes = l.stride, uint64(rows*kernels.SampleWords)*4
		l.stride += up(l.sampledBytes)
		if l.topN > 0 {
			l.topAt, l.topBytes = l.stride, min(uint64(rows*l.topN*2*4+15)&^15, t.act.top.Size())
			l.stride += up(l.topBytes)
		}
	}
	return l
}

// grow returns *b, made anew where it holds fewer than bytes.
func grow(d *gpu.Device, b **gpu.Buffer, name string, bytes uint64) error {
	if *b != nil && (*b).Size() >= bytes {
		return nil
	}
	nb, err := d.NewBuffer(name, bytes)
	if err != nil {
		return err
	}
	if *b != nil {
		(*b).Release()
	}
	*b = nb
	return nil
}

// chainOrStep is DraftVerifyN's frame: where chains (the batch's shape
// allows), run — the chain over steps' drafter and Verify entries, the
// drafts' places after each Verify entry's tokens (draftPlaces), taken off
// again after —, else or where run did not chain after all, one step.
func chainOrStep(ctx context.Context, f engine.Fuser, t *Engine, steps []engine.ChainStep, n int, chains bool,
	run func(drafts []*engine.Entry, verify []*engine.VerifyEntry) ([]engine.ChainedStep, bool, error)) ([]engine.ChainedStep, error) {
	if chains {
		drafts, verify, pending := draftPlaces(steps)
		out, chained, err := run(drafts, verify)
		for i, s := range steps {
			s.Verify.Tokens = s.Verify.Tokens[:pending[i]]
		}
		if chained || err != nil {
			return out, err
		}
	}
	return oneStep(ctx, f, t, steps, n)
}

// chainSteps reports whether every step is a chain taking all n drafts
// after one pending token (engine.SpecChainer): greedy, or sampled with
// its first step's draws and its generation's keys for the steps after.
func chainSteps(steps []engine.ChainStep, n int) bool {
	for _, s := range steps {
		d, v := s.Draft, s.Verify
		if d == nil || v == nil || s.Take != n || len(v.Tokens) != 1 || v.Out != n+1 ||
			v.Propose != nil || v.Tree != nil || v.Parents != nil || d.Parents != nil {
			return false
		}
		if v.Sampling.Greedy() && (v.Draws != nil || s.Keys != nil) ||
			!v.Sampling.Greedy() && (len(v.Draws) != n+1 || s.Keys == nil) {
			return false
		}
	}
	return true
}

// oneStep is DraftVerifyN's single step: f's DraftVerify, the Verify
// entries then restored.
func oneStep(ctx context.Context, f engine.Fuser, target *Engine, steps []engine.ChainStep, n int) ([]engine.ChainedStep, error) {
	pending := make([]int, len(steps))
	for i, s := range steps {
		pending[i] = len(s.Verify.Tokens)
	}
	out, err := f.DraftVerify(ctx, target, steps, n)
	if err != nil {
		return nil, err
	}
	cs := engine.ChainedStep{Drafts: make([][]engine.Token, len(steps)), Rows: make([][]engine.VerifyRow, len(steps)), Accepted: make([]int, len(steps))}
	for i, s := range steps {
		cs.Drafts[i], cs.Rows[i] = out[i][:s.Take], s.Verify.Rows
		cs.Accepted[i] = agreed(cs.Drafts[i], cs.Rows[i], !s.Verify.Sampling.Greedy())
		s.Verify.Tokens, s.Verify.Rows = s.Verify.Tokens[:pending[i]], nil
	}
	return []engine.ChainedStep{cs}, nil
}

// agreed is how many of a step's drafts its verified rows accept: the
// drafts up to the first that is not the target's greedy token, or,
// sampled, the first its row does not accept.
func agreed(drafts []engine.Token, rows []engine.VerifyRow, sampled bool) int {
	a := 0
	for a < len(drafts) && a < len(rows) && (!sampled && drafts[a].ID == rows[a].Argmax || sampled && rows[a].Accept) {
		a++
	}
	return a
}

// verification records step j ≥ 1's verification of a chain's drafts:
// the drafts (at word(i, j·n + c) of results) gathered into the target's
// ids and, where it samples, the step's draws put in place with the drafts
// as their proposals; the target's pass tp (its rows placed by the
// device), whose sampled rows write their outcome for spec_accept.wgsl;
// its read-out copied into the results. keep keeps the pass's
// recordings once submitted.
func (s *specBuffers) verification(t *Engine, tp pass, tl specLayout, results *gpu.Buffer, j, B, n int, idStride, drawStride uint64) (steps []step, keep func()) {
	pairs := func(buf *gpu.Buffer, stride uint64) gpu.Binding {
		return buf.Slice(uint64(j)*stride, uint64(B*n*kernels.GatherPairWords)*4)
	}
	steps = []step{func(b *gpu.Batch) error {
		return kernels.GatherRows(b, t.act.ids, results, pairs(s.ids, idStride), B*n, 1)
	}}
	if drawStride > 0 {
		rows := B * (n + 1)
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.CopyRange(b, t.act.draws, 0, s.draws.Slice(uint64(j)*drawStride, uint64(rows*kernels.SampleDrawWords)*4))
		}, func(b *gpu.Batch) error {
			return kernels.GatherRows(b, t.act.draws, results, pairs(s.xs, idStride), B*n, 1)
		})
	}
	tp.outcome = true
	kernelSteps, keep := t.passKernels(tp)
	return append(append(steps, kernelSteps...), s.verifyCopies(t, tl, j)...), keep
}

// keyDraws keys step j ≥ 1's coupled rows (startDraws: drawStride apart)
// by the positions the step reaches, from the state the step before left
// (kernels.SpecKeys), and with them its n coupled drafts' keys where keys
// (draftKeys' buffer, B rows a draft) is not nil; none for a greedy chain.
func (s *specBuffers) keyDraws(dev *gpu.Device, keys *gpu.Buffer, j, B, n int, drawStride uint64) []step {
	if drawStride == 0 {
		return nil
	}
	draws := s.draws.Slice(uint64(j)*drawStride, uint64(B*(n+1)*kernels.SampleDrawWords)*4)
	stride := int(draftKeyStride(dev, B) / 4)
	if keys == nil {
		stride = 0
	}
	return []step{func(b *gpu.Batch) error {
		return kernels.SpecKeys(b, s.state, draws, keys, B, n, j*n*stride, stride)
	}}
}

// verifyCopies copies step j's verification's read-out into the results
// (specLayout).
func (s *specBuffers) verifyCopies(t *Engine, tl specLayout, j int) []step {
	at := uint64(j) * tl.stride
	steps := []step{func(b *gpu.Batch) error { return kernels.CopyTo(b, s.results, at, t.act.next, t.act.next.Size()) }}
	if tl.sampledBytes > 0 {
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.CopyTo(b, s.results, at+tl.sampledAt, t.act.sampled, tl.sampledBytes)
		})
	}
	if tl.topBytes > 0 {
		steps = append(steps, func(b *gpu.Batch) error { return kernels.CopyTo(b, s.results, at+tl.topAt, t.act.top, tl.topBytes) })
	}
	return steps
}

// start readies the buffers of a chain of m steps of n drafts over B
// entries, the target's results laid out as tl: the results and the
// drafts' gathers grown as they need, then written before the submissions
// that read them — each entry's state (its first verification at L0[i],
// its table rows in the target's cache and the drafter's) and each step
// j ≥ 1's gathers of its drafts into the target's ids (entry i's draft c,
// at word(i, j·n + c) of the drafter's results, to row i·(n+1) + 1 + c), a
// region of the returned stride a step.
func (s *specBuffers) start(d *gpu.Device, tl specLayout, B, n, m int, word func(i, k int) int, L0, tslots, dslots []int) (idStride uint64, err error) {
	align := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	idStride = (uint64(B*n*kernels.GatherPairWords)*4 + align - 1) / align * align
	if err := grow(d, &s.results, "spec_results", uint64(m)*tl.stride); err != nil {
		return 0, err
	}
	if err := grow(d, &s.ids, "spec_id_pairs", uint64(m)*idStride); err != nil {
		return 0, err
	}
	state := make([]uint32, B*kernels.SpecStateWords)
	for i := range B {
		kernels.PutSpecState(state[i*kernels.SpecStateWords:], L0[i], 0, tslots[i], dslots[i])
	}
	ids := make([]uint32, uint64(m)*idStride/4)
	for j := 1; j < m; j++ {
		at := uint64(j) * idStride / 4
		for i := range B {
			for c := range n {
				w := at + uint64((i*n+c)*kernels.GatherPairWords)
				ids[w], ids[w+1] = uint32(i*(n+1)+1+c), uint32(word(i, j*n+c))
			}
		}
	}
	if err := s.state.WriteU32(0, state); err != nil {
		return 0, err
	}
	return idStride, s.ids.WriteU32(0, ids)
}

// startDraws readies a sampled chain's draws (chainSteps): each step j ≥ 1's
// rows' draws — a greedy entry's rows greedy, a sampled one's coupled,
// holding its generation's seed words for keyDraws (kernels.SpecKeys) to
// key them by the positions the step reaches —, each marked to write its
// outcome, a region of the returned stride a step; and the gathers of
// step j's drafts into their rows' proposals
// (entry i's draft c, at word(i, j·n + c), to row i·(n+1) + c's X), laid
// out as start's gathers into ids (idStride). For a greedy chain it
// writes nothing and returns 0.
func (s *specBuffers) startDraws(d *gpu.Device, steps []engine.ChainStep, n, m int, word func(i, k int) int, idStride uint64) (uint64, error) {
	sampled := false
	for _, st := range steps {
		sampled = sampled || !st.Verify.Sampling.Greedy()
	}
	if !sampled || m < 2 {
		return 0, nil
	}
	rows := len(steps) * (n + 1)
	align := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	stride := (uint64(rows*kernels.SampleDrawWords)*4 + align - 1) / align * align
	if err := grow(d, &s.draws, "spec_draws", uint64(m)*stride); err != nil {
		return 0, err
	}
	if err := grow(d, &s.xs, "spec_draft_x_pairs", uint64(m)*idStride); err != nil {
		return 0, err
	}
	draws := make([]uint32, uint64(m)*stride/4)
	xs := make([]uint32, uint64(m)*idStride/4)
	temps := make([]float32, kernels.SampleTempWords) // the first step writes the temperatures
	for j := 1; j < m; j++ {
		for i, st := range steps {
			v := st.Verify
			for c := range n + 1 {
				r := i*(n+1) + c
				w := draws[uint64(j)*stride/4+uint64(r*kernels.SampleDrawWords):]
				kernels.PutSampleRow(w, temps, v.Sampling, sampling.Draw{X: sampling.NoProposal, Coupled: !v.Sampling.Greedy()})
				kernels.SetSampleOutcome(w)
				if !v.Sampling.Greedy() {
					kernels.PutSampleSeed(w, *st.Keys)
				}
				if c < n {
					p := uint64(j)*idStride/4 + uint64((i*n+c)*kernels.GatherPairWords)
					xs[p], xs[p+1] = uint32(r*kernels.SampleDrawWords), uint32(word(i, j*n+c))
				}
			}
		}
	}
	if err := s.draws.WriteU32(0, draws); err != nil {
		return 0, err
	}
	if err := s.xs.WriteU32(0, xs); err != nil {
		return 0, err
	}
	return stride, nil
}

// chainRoom returns the steps of n drafts a chain of up to m may take
// from the verify entries' sequences, within maxPos positions, and each
// sequence's length, its first verification's first position; 0 where a
// sequence is not a target's.
func chainRoom(verify []*engine.VerifyEntry, maxPos, n, m int) ([]int, int) {
	L0 := make([]int, len(verify))
	for i, v := range verify {
		tq, ok := v.Seq.(*kernels.KVSeq)
		if !ok {
			return nil, 0
		}
		L0[i] = tq.Len()
		m = min(m, (maxPos-L0[i])/(n+1))
	}
	return L0, m
}

// readChain decodes a chain's results read back into its steps: each
// entry's drafts (draft(j, i)), the target's rows from its results
// (twords, laid out as tl) with the top tokens each entry asks for, each
// step's acceptance the host's own rule; it checks that the device
// accepted as much (states, its final states) and returns the steps and
// each entry's last verification's first position.
func readChain(t *Engine, twords, states []uint32, tl specLayout, twork []pending, L0 []int, n, m int, draft func(j, i int) ([]engine.Token, error)) ([]engine.ChainedStep, []int, error) {
	B, rows := len(L0), len(L0)*(n+1)
	f32 := func(w uint32) float32 { return math.Float32frombits(w) }
	out := make([]engine.ChainedStep, m)
	L := append([]int(nil), L0...)
	last := make([]int, B)
	for j := range out {
		cs := &out[j]
		cs.Drafts, cs.Rows, cs.Accepted = make([][]engine.Token, B), make([][]engine.VerifyRow, B), make([]int, B)
		at := uint64(j) * tl.stride / 4
		lp, lse := at+t.act.nextLP/4, at+t.act.nextLP/4+uint64(lseAt(rows))
		for i := range B {
			var err error
			if cs.Drafts[i], err = draft(j, i); err != nil {
				return nil, nil, fmt.Errorf("chained speculative step %d, batch entry %d: %w", j+1, i, err)
			}
			cs.Rows[i] = make([]engine.VerifyRow, n+1)
			for r := range n + 1 {
				w := uint64(i*(n+1) + r)
				row := &cs.Rows[i][r]
				if tl.sampledBytes > 0 {
					if row.Row, err = kernels.SampleRow(twords[at+tl.sampledAt/4+w*kernels.SampleWords:]); err != nil {
						return nil, nil, fmt.Errorf("chained speculative step %d, batch entry %d, row %d: %w", j+1, i, r, err)
					}
					if nt := twork[i].topN(); nt > 0 {
						row.Top = kernels.SampleTop(twords[at+tl.topAt/4+w*uint64(tl.topN*2):], min(nt, tl.topN))
					}
				} else {
					row.ArgmaxLogprob, row.LogSumExp = f32(twords[lp+w]), f32(twords[lse+w])
					row.Argmax = int(twords[at+w])
				}
				if _, err := t.token(uint32(row.Argmax)); err != nil {
					return nil, nil, fmt.Errorf("chained speculative step %d, batch entry %d, row %d: %w", j+1, i, r, err)
				}
			}
			cs.Accepted[i] = agreed(cs.Drafts[i], cs.Rows[i], !twork[i].verify.Sampling.Greedy())
			last[i] = L[i]
			L[i] += cs.Accepted[i] + 1
		}
	}
	for i := range B {
		if got := int(states[i*kernels.SpecStateWords]); got != L[i] {
			return nil, nil, fmt.Errorf("chained speculative steps, batch entry %d: the device accepted up to position %d, the host %d", i, got, L[i])
		}
	}
	return out, last, nil
}
