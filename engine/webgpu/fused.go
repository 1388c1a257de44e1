package webgpu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
)

// Fuses reports whether target is another engine of the drafter's group:
// one device, so that DraftVerify can hand the drafted tokens over on it.
func (e *Engine) Fuses(target engine.Engine) bool {
	t, ok := target.(*Engine)
	return ok && t != e && t.g == e.g
}

// DraftVerify drafts a chain for each step and verifies it with target
// (engine.DraftVerify) in one submission: the drafter's chained passes
// (chainSubmit), then the target's verification pass, whose drafted input
// ids — and, where a step samples, its rows' proposals — kernels.Gather
// copies from the chain's results on the device. The host records the
// target's pass while the device drafts, and reads the drafts and the
// verification back once the device is done. A batch that the target
// cannot verify in one pass, or whose drafter entries do not chain, runs
// as StepN and Verify would, under one hold of the group.
func (e *Engine) DraftVerify(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n int) ([][]engine.Token, error) {
	if !e.Fuses(target) {
		return nil, errors.New("webgpu engine: draft and verify: the target is not another engine of the drafter's group")
	}
	drafts, verify, pending := draftPlaces(steps)
	out, err := e.draftVerify(ctx, target.(*Engine), steps, drafts, verify, n)
	settleDrafts(steps, pending, out, err)
	return out, err
}

// draftPlaces returns the drafter's and the target's entries of steps,
// each Verify entry's Tokens followed by its draft's places — held by
// token 0 until the device writes them, and so checked as tokens like
// any other —, and how many tokens each held before them.
func draftPlaces(steps []engine.ChainStep) (drafts []*engine.Entry, verify []*engine.VerifyEntry, pending []int) {
	drafts = make([]*engine.Entry, len(steps))
	verify = make([]*engine.VerifyEntry, len(steps))
	pending = make([]int, len(steps))
	for i, s := range steps {
		drafts[i], verify[i], pending[i] = s.Draft, s.Verify, len(s.Verify.Tokens)
		s.Verify.Tokens = append(s.Verify.Tokens[:pending[i]:pending[i]], make([]int, s.Take)...)
	}
	return drafts, verify, pending
}

// settleDrafts takes draftPlaces' places off the Verify entries again and,
// where the call succeeded, appends the drafts (engine.AppendDraft).
func settleDrafts(steps []engine.ChainStep, pending []int, out [][]engine.Token, err error) {
	for i, s := range steps {
		s.Verify.Tokens = s.Verify.Tokens[:pending[i]]
		if err == nil {
			engine.AppendDraft(s.Verify, out[i][:s.Take])
		}
	}
}

func (e *Engine) draftVerify(ctx context.Context, t *Engine, steps []engine.ChainStep, drafts []*engine.Entry, verify []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	if err := engine.CheckBatch(&e.cfg, drafts); err != nil {
		return nil, err
	}
	if err := engine.CheckVerify(&t.cfg, verify); err != nil {
		return nil, err
	}
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return nil, err
	}
	if err := t.usable(); err != nil {
		return nil, err
	}
	dwork, dlens, err := e.prepareSteps(drafts, n)
	if err != nil {
		return nil, err
	}
	twork, tlens, err := t.prepareVerify(verify)
	if err != nil {
		for i, p := range dwork { // undoes the drafter's Reserve
			p.seq.Truncate(dlens[i])
		}
		return nil, err
	}
	out, err := e.fused(ctx, t, steps, dwork, twork, n)
	if err != nil {
		for i, p := range dwork {
			p.seq.Truncate(dlens[i])
		}
		for i, p := range twork {
			p.seq.Truncate(tlens[i])
		}
		return nil, e.broken(err)
	}
	for i, v := range verify {
		v.Rows = twork[i].rows
	}
	return out, nil
}

// fused runs the drafter's work and then the target's, the drafted tokens
// gathered into the target's inputs on the device when the drafter's
// entries chain and the target's pass holds its whole batch; else the
// drafts come back first and the target's passes run as Verify's.
func (e *Engine) fused(ctx context.Context, t *Engine, steps []engine.ChainStep, dwork, twork []pending, n int) ([][]engine.Token, error) {
	ps := t.plan(twork)
	if !e.chainable(dwork) || !gathersDrafts(ps, twork) {
		out, err := e.run(ctx, dwork, n)
		if err != nil {
			return nil, err
		}
		return out, t.verifyDrafts(ctx, twork, steps, out)
	}
	keys, err := e.coupleKeys(steps, n, 1)
	if err != nil {
		return nil, err
	}
	ch, err := e.chainSubmit(ctx, dwork, n, false, keys)
	if err != nil {
		return nil, err
	}
	pre, err := t.gatherDrafts(ps, twork, steps, ch.tokenWord, e.act.chained)
	if err != nil {
		return nil, err
	}
	// The drafts and the verification's rows in one read, with the pass.
	raw, err := t.forwardRead(ps, false, pre, nil, submitEvery, func() []gpu.Binding {
		return []gpu.Binding{ch.resultsRange(), t.rowsRange(ps)}
	})
	if err != nil {
		return nil, fmt.Errorf("verification and read back: %w", err)
	}
	out, err := e.chainRead(dwork, ch, raw[0])
	if err != nil {
		return nil, err
	}
	if err := t.readOut(ps, raw[1]); err != nil {
		return nil, fmt.Errorf("verification: %w", err)
	}
	for i, p := range dwork { // the drafter's entries, as StepN leaves them
		last := out[i][n-1]
		p.entry.Next, p.entry.Logprob, p.entry.Top = last.ID, last.Logprob, last.Top
	}
	return out, nil
}

// gathersDrafts reports whether the target's pass ps over work can take
// a chain's drafts on the device (gatherDrafts): it holds the whole batch,
// and nothing in it asks for what a chain cannot give (proposals, trees).
func gathersDrafts(ps pass, work []pending) bool {
	return ps.rows == pendingRows(work) && !ps.propose && ps.trees == 0
}

// verifyDrafts puts the drafts (out, read back) in their places in work —
// the rows after each step's pending tokens, the proposals of its draws —
// and runs the target's passes over work, as Verify does.
func (e *Engine) verifyDrafts(ctx context.Context, work []pending, steps []engine.ChainStep, out [][]engine.Token) error {
	for i, s := range steps {
		for j := range s.Take {
			work[i].tokens[len(work[i].tokens)-s.Take+j] = out[i][j].ID
		}
		if d := s.Verify.Draws; d != nil {
			for j := range s.Take {
				d[j].X = out[i][j].ID
			}
		}
	}
	return e.feed(ctx, work)
}

// gatherDrafts writes where each step's drafted tokens go in the pass ps
// over work — the rows after its pending tokens, and the proposals of its
// read-out rows' draws where it samples — and where in the drafter's
// results they come from (word(i, j): the u32 word of step i's draft j),
// and returns the gathers that put them there.
func (e *Engine) gatherDrafts(ps pass, work []pending, steps []engine.ChainStep, word func(i, j int) int, results *gpu.Buffer) ([]step, error) {
	a := e.act
	var ids, draws []uint32
	for _, pe := range ps.entries {
		i := slices.IndexFunc(work, func(p pending) bool { return p.seq == pe.p.seq })
		take := steps[i].Take
		for j := range take {
			from := uint32(word(i, j))
			ids = append(ids, uint32(pe.row0+pe.T-take+j), from)
			if steps[i].Verify.Draws != nil {
				draws = append(draws, uint32((pe.out0+j)*kernels.SampleDrawWords), from)
			}
		}
	}
	var pre []step
	for _, g := range []struct {
		pairs []uint32
		buf   *gpu.Buffer
		dst   *gpu.Buffer
	}{{ids, a.idPairs, a.ids}, {draws, a.drawPairs, a.draws}} {
		if len(g.pairs) == 0 {
			continue
		}
		if err := g.buf.WriteU32(0, g.pairs); err != nil {
			return nil, err
		}
		pre = append(pre, func(b *gpu.Batch) error {
			return kernels.Gather(b, g.dst, results, g.buf, len(g.pairs)/kernels.GatherPairWords)
		})
	}
	return pre, nil
}

// pendingRows is how many tokens work has yet to feed.
func pendingRows(work []pending) int {
	n := 0
	for _, p := range work {
		n += len(p.tokens)
	}
	return n
}
