package webgpu

import (
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
)

// A head's sampled drafts (engine.SamplesDrafts): a Verify entry with
// Sampling and Propose draws each row's proposals from the head's own
// distribution there, as a drafter engine's do (sampled.go): the pass's
// rows read out over the draft vocabulary are scattered into the
// vocabulary among −∞ (scatter.wgsl, by d2t), sample.wgsl reads them out
// at each row's temperature and top_p, and propose.wgsl draws the row's
// tokens and writes its q into a slot of the group's Q store, for the
// target's tree walk: the row's Q is a *DeviceDist naming the slot. Such
// a pass's argmax and top tokens are then the target's tokens. A chain's
// steps (StepN, DraftVerifyN) stay greedy.

// SamplesDrafts: the head draws sampled proposals on the device
// (engine.SamplesDrafts).
func (h *Head) SamplesDrafts() bool { return true }

// DistDomain is the head's group: the targets that read its Dists
// (engine.SampledPair).
func (h *Head) DistDomain() any { return h.g }

// proposes reports whether the feed draws proposals at some row.
func (f *headFeed) proposes() bool {
	if f.propose == nil || f.params.Greedy() {
		return false
	}
	for _, us := range f.propose {
		if len(us) > 0 {
			return true
		}
	}
	return false
}

// takeSlots takes a Q-store slot for each row of the feeds that draws
// proposals (headFeed.slots, by read-out row; −1: none) and reports
// whether any does.
func (h *Head) takeSlots(feeds []headFeed) (bool, error) {
	n := 0
	for _, f := range feeds {
		if f.proposes() {
			for _, us := range f.propose {
				if len(us) > 0 {
					n++
				}
			}
		}
	}
	if n == 0 {
		return false, nil
	}
	s, V := &h.g.q, h.engCfg.VocabSize
	taken, err := s.take(n, V, false, nil)
	if err != nil {
		return false, err
	}
	if err := s.ensure(V); err != nil {
		return false, err
	}
	for i := range feeds {
		f := &feeds[i]
		if !f.proposes() {
			continue
		}
		f.slots = make([]int, f.read)
		for j, us := range f.propose {
			f.slots[j] = -1
			if len(us) > 0 {
				f.slots[j], taken = taken[0], taken[1:]
			}
		}
	}
	return true, h.act.ensurePropose(h.g.dev, V)
}

// ensurePropose allocates the buffers of proposals drawn over V tokens
// for S rows, the first time a Verify draws them; the scattered logits
// start at −∞.
func (a *headActivations) ensurePropose(d *gpu.Device, V int) error {
	if a.logitsV != nil {
		return nil
	}
	limit := d.Limits().MaxStorageBufferBindingSize
	for _, b := range []struct {
		dst   **gpu.Buffer
		name  string
		words int
	}{
		{&a.logitsV, "head.logits_vocab", a.S * V}, {&a.props, "head.props", a.S * kernels.ProposeWords},
		{&a.drawn, "head.drawn", a.S * kernels.ProposeDrawnWords},
	} {
		if uint64(b.words)*4 > limit {
			return fmt.Errorf("proposals: %s takes %d bytes, more than one binding (%d): fewer sequences (MaxSequences)", b.name, b.words*4, limit)
		}
		buf, err := d.NewBuffer(b.name, uint64(b.words)*4)
		if err != nil {
			return fmt.Errorf("proposals: %w", err)
		}
		*b.dst = buf
		a.all = append(a.all, buf)
	}
	// The tokens the draft vocabulary leaves out stay at −∞: scatter.wgsl
	// writes only the draft tokens' columns.
	if err := a.logitsV.Fill(math.Float32bits(float32(math.Inf(-1)))); err != nil {
		return fmt.Errorf("proposals: %w", err)
	}
	return nil
}

// writeProposals writes a proposing pass's sample.wgsl and propose.wgsl
// inputs for its rows read out (ps.reads): a row that draws its
// temperature, top_p, uniforms and slot; every other row greedy, drawing
// nothing.
func (h *Head) writeProposals(feeds []headFeed, ps *headPass) error {
	a, k := h.act, len(ps.reads)
	draws, temps := make([]uint32, k*kernels.SampleDrawWords), make([]float32, k*kernels.SampleTempWords)
	props := make([]uint32, k*kernels.ProposeWords)
	for r, rd := range ps.reads {
		f := &feeds[rd.feed]
		p, us, slot := sampling.Params{}, []float32(nil), kernels.ProposeNoSlot
		if f.slots != nil && f.slots[rd.j] >= 0 {
			p, us, slot = f.params, f.propose[rd.j], f.slots[rd.j]
		}
		kernels.PutSampleRow(draws[r*kernels.SampleDrawWords:], temps[r*kernels.SampleTempWords:], p, sampling.Draw{X: sampling.NoProposal})
		if err := kernels.PutProposeRow(props[r*kernels.ProposeWords:], us, slot); err != nil {
			return err
		}
	}
	if err := a.draws.WriteU32(0, draws); err != nil {
		return err
	}
	if err := a.temps.WriteF32(0, temps); err != nil {
		return err
	}
	return a.props.WriteU32(0, props)
}

// proposeSteps are a proposing pass's read-out of its k rows after
// lm_head (logits over the draft vocabulary): scattered into the
// vocabulary, read out by sample.wgsl at each row's temperature, the
// proposals drawn and q kept, the drawn tokens copied into the results
// after the pass's rows and top tokens (l.drawnAt).
func (h *Head) proposeSteps(ps *headPass, k, topN int) []step {
	a, w, s := h.act, h.w, &h.g.q
	V, Vd := h.engCfg.VocabSize, h.cfg.DraftVocabSize
	return []step{
		func(b *gpu.Batch) error { return kernels.Scatter(b, a.logitsV, a.logits, w.targetIDs, k, Vd, V) },
		func(b *gpu.Batch) error {
			return kernels.Sample(b, a.sampled, a.top, a.next, a.lp(), a.logitsV, a.draws, a.temps, k, V, topN)
		},
		func(b *gpu.Batch) error {
			return kernels.Propose(b, a.drawn, s.buf, a.logitsV, a.sampled, a.temps, a.props, k, V, len(s.stamp))
		},
		func(b *gpu.Batch) error {
			return kernels.CopyTo(b, a.results, ps.resultsAt+ps.out.drawnAt, a.drawn, uint64(k*kernels.ProposeDrawnWords)*4)
		},
	}
}

// readProposals fills row r, read-out row k of a proposing pass whose
// words are at words (the pass's results), with the tokens feed f drew
// there, their log q and q (a DeviceDist), where it drew.
func (h *Head) readProposals(f *headFeed, j int, r *engine.VerifyRow, drawn []uint32, k int) error {
	if f.slots == nil || f.slots[j] < 0 {
		return nil
	}
	V := h.engCfg.VocabSize
	tokens, logq := kernels.ProposeDrawn(drawn[k*kernels.ProposeDrawnWords:])
	for _, x := range tokens {
		if x < 0 || x >= V {
			return fmt.Errorf("proposals: token %d drawn outside the vocabulary", x)
		}
	}
	s := &h.g.q
	slot := f.slots[j]
	r.Drawn, r.DrawnLogprob = tokens, logq
	r.Q = &DeviceDist{s: s, slot: slot, stamp: s.stamp[slot], v: s.V}
	return nil
}
