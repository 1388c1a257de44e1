package webgpu

import (
	"context"
	"errors"
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
)

// Fuses reports whether target is the head's own target (engine.Fuser):
// DraftVerify then drafts and verifies in one submission.
func (h *Head) Fuses(target engine.Engine) bool {
	t, ok := target.(*Engine)
	return ok && t == h.target
}

// DraftVerify drafts n greedy tokens for each step and has the head's
// target verify each step's first Take (engine.DraftVerify) in one
// submission: the head's chain (StepN's passes, each step's argmax also
// mapped to the target's vocabulary into the chain's results on the
// device), then the target's verification pass, which gathers the drafted
// ids from there (Engine.gatherDrafts). The host records the target's
// pass while the device drafts; one read brings the drafts and the
// verification's rows back. Where the steps do not chain on the device
// (StepN) or the target's pass cannot hold the batch, the head's steps and
// the verification run as StepN and Verify would, under one hold of the
// group. On an error every sequence is as it was before the call.
func (h *Head) DraftVerify(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n int) ([][]engine.Token, error) {
	if !h.Fuses(target) {
		return nil, errors.New("webgpu head: draft and verify: the target is not the head's")
	}
	if n <= 0 {
		return nil, fmt.Errorf("webgpu head: draft and verify: n = %d, want > 0", n)
	}
	drafts, verify, pending := draftPlaces(steps)
	out, err := h.draftVerify(ctx, steps, drafts, verify, n)
	settleDrafts(steps, pending, out, err)
	return out, err
}

func (h *Head) draftVerify(ctx context.Context, steps []engine.ChainStep, drafts []*engine.Entry, verify []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	t := h.target
	if err := engine.CheckBatch(&h.engCfg, drafts); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	if err := engine.CheckVerify(&t.cfg, verify); err != nil {
		return nil, err
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, err
	}
	if err := t.usable(); err != nil {
		return nil, err
	}
	feeds, err := h.prepareChain(ctx, drafts, n)
	if err != nil {
		return nil, err
	}
	twork, tlens, err := t.prepareVerify(verify)
	if err != nil {
		h.unchain(feeds, false)
		return nil, err
	}
	out, err := h.fused(ctx, steps, feeds, drafts, twork, n)
	if err != nil {
		for i, p := range twork {
			p.seq.Truncate(tlens[i])
		}
		for _, f := range feeds { // the steps the head committed, and its blocks reserved
			f.seq.Truncate(f.L)
			f.seq.kv.Truncate(f.seq.rows())
		}
		return nil, err
	}
	for i, v := range verify {
		v.Rows = twork[i].rows
	}
	return out, nil
}

// fused runs the head's chain and then the target's verification, the
// drafted tokens gathered into the target's inputs on the device when the
// steps chain and the target's pass holds its whole batch; else the
// drafts come back first and the target's passes run as Verify's.
func (h *Head) fused(ctx context.Context, steps []engine.ChainStep, feeds []headFeed, drafts []*engine.Entry, twork []pending, n int) ([][]engine.Token, error) {
	t := h.target
	ps := t.plan(twork)
	if n == 1 || !h.chains(feeds) || !gathersDrafts(ps, twork) {
		out, err := h.runChain(ctx, feeds, drafts, n)
		if err != nil {
			return nil, err
		}
		return out, t.verifyDrafts(ctx, twork, steps, out)
	}
	keys, err := h.coupleKeys(steps, n, 1)
	if err != nil {
		h.unchain(feeds, false)
		return nil, t.broken(err)
	}
	lay, submitted, err := h.chainSubmit(ctx, feeds, drafts, n, true, keys)
	if err != nil {
		h.unchain(feeds, submitted)
		return nil, t.broken(err)
	}
	pre, err := t.gatherDrafts(ps, twork, steps, lay.targetWord, h.act.results)
	if err == nil {
		var raw [][]byte
		// The drafts and the verification's rows in one read, with the pass.
		raw, err = t.forwardRead(ps, false, pre, nil, submitEvery, func() []gpu.Binding {
			return []gpu.Binding{h.act.results.Slice(0, lay.bytes()), t.rowsRange(ps)}
		})
		if err != nil {
			err = fmt.Errorf("verification and read back: %w", err)
		} else {
			var out [][]engine.Token
			if out, err = h.chainDone(feeds, drafts, lay, raw[0]); err == nil {
				if err = t.readOut(ps, raw[1]); err == nil {
					return out, nil
				}
				err = fmt.Errorf("verification: %w", err)
			}
		}
	}
	h.unchain(feeds, true)
	return nil, t.broken(err)
}
