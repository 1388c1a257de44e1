package webgpu

import (
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
)

// Sampled drafts (engine.SamplesDrafts) on the device. A drafter's Verify
// entry with Propose reads its rows out through sample.wgsl, then
// propose.wgsl draws each row's proposals and writes its distribution q
// into a slot of the group's Q store (qStore): the row's Q is a
// *DeviceDist naming the slot. A target's entry with a Tree reads its
// nodes' rows out through sample.wgsl, each drawn at its node's v, then
// tree_walk.wgsl walks the tree by the multi-draft rule, reading each
// node's q from its slot: only the path and the bonus come back. Both
// read the vocabulary-wide logits (a partial head's scattered among −∞),
// and come back in the pass's one read with its other read-out words
// (readLayout).

// SamplesDrafts: the engine draws sampled proposals and walks their trees
// on the device (engine.SamplesDrafts); a target reads the distributions
// of its own group's drafters and HostDists.
func (e *Engine) SamplesDrafts() bool { return true }

// DistDomain is the engine's group: the targets that read its Dists
// (engine.SampledPair).
func (e *Engine) DistDomain() any { return e.g }

// proposes reports whether p's rows draw proposals (VerifyEntry.Propose).
func (p *pending) proposes() bool {
	return p.verify != nil && p.verify.Propose != nil && !p.verify.Sampling.Greedy()
}

// walks reports whether p's rows are a tree of sampled proposals to walk
// (VerifyEntry.Tree): they are read out in one pass.
func (p *pending) walks() bool {
	return p.verify != nil && p.verify.Tree != nil && !p.verify.Sampling.Greedy()
}

// sampledDrafts takes the Q-store slots a Verify's sampled drafts need
// (qStore.take), after its checks and before its passes: one for each row
// that draws proposals, where propose.wgsl writes its q, and for each tree
// node with children the slot its q is read from — its drafter's, for a
// DeviceDist of the group, or one it is uploaded to, for a HostDist. It
// returns each entry's slots by read-out row (−1: none), nil for an entry
// without sampled drafts. A tree must fit one pass's read-out.
func (e *Engine) sampledDrafts(batch []*engine.VerifyEntry) ([][]int, error) {
	s := &e.g.q
	V := e.cfg.VocabSize
	any, consume := false, false
	keep := map[int]bool{}
	n := 0
	for i, v := range batch {
		switch {
		case v.Sampling.Greedy():
			continue
		case v.Propose != nil:
			any = true
			for _, us := range v.Propose {
				if len(us) > 0 {
					n++
				}
			}
		case v.Tree != nil:
			any, consume = true, true
			if most := min(e.act.maxLasts, e.opts.MaxRows); v.Out > most {
				return nil, fmt.Errorf("webgpu engine: batch entry %d: a tree of %d nodes: at most %d are walked, in one pass", i, v.Out, most)
			}
			for j, nd := range v.Tree.Nodes {
				if len(nd.Children) > kernels.WalkMaxChildren {
					return nil, fmt.Errorf("webgpu engine: batch entry %d node %d: %d children: at most %d", i, j, len(nd.Children), kernels.WalkMaxChildren)
				}
				if len(nd.Children) == 0 {
					continue
				}
				switch q := nd.Q.(type) {
				case *DeviceDist:
					slot, err := s.slot(q)
					if err != nil {
						return nil, fmt.Errorf("webgpu engine: batch entry %d node %d: %w", i, j, err)
					}
					keep[slot] = true
				case *engine.HostDist:
					n++
				default:
					return nil, fmt.Errorf("webgpu engine: batch entry %d node %d: a distribution the engine cannot read (%T)", i, j, nd.Q)
				}
			}
		}
	}
	if !any {
		return nil, nil
	}
	taken, err := s.take(n, V, consume, keep)
	if err != nil {
		return nil, err
	}
	if err := s.ensure(V); err != nil { // the kernels bind the store, slots or none
		return nil, err
	}
	out := make([][]int, len(batch))
	var dense []float64
	var q32 []float32
	for i, v := range batch {
		if v.Sampling.Greedy() || v.Propose == nil && v.Tree == nil {
			continue
		}
		out[i] = make([]int, v.Out)
		for j := range out[i] {
			out[i][j] = -1
		}
		if v.Propose != nil {
			for j, us := range v.Propose {
				if len(us) > 0 {
					out[i][j], taken = taken[0], taken[1:]
				}
			}
			continue
		}
		for j, nd := range v.Tree.Nodes {
			if len(nd.Children) == 0 {
				continue
			}
			switch q := nd.Q.(type) {
			case *DeviceDist:
				out[i][j] = q.slot
			case *engine.HostDist:
				slot := taken[0]
				taken = taken[1:]
				dense = q.Dense(dense, V)
				q32 = q32[:0]
				for _, p := range dense {
					q32 = append(q32, float32(p))
				}
				if err := s.buf.WriteF32(uint64(slot*V)*4, q32); err != nil {
					return nil, fmt.Errorf("webgpu engine: batch entry %d node %d: uploading its distribution: %w", i, j, err)
				}
				out[i][j] = slot
			}
		}
	}
	return out, nil
}

// ensure makes the store's buffer, for kernels that bind it.
func (s *qStore) ensure(V int) error {
	if s.buf != nil {
		return nil
	}
	return s.grow(0, V)
}

// readLayout is where a sampled pass's read-out words lie in the sampled
// buffer, read back at once: sample.wgsl's rows at 0, then (copied in
// after the pass's kernels, each at an aligned offset) the top-N, the
// proposals drawn and the walks' records.
type readLayout struct {
	top, drawn, walk uint64 // byte offsets (0: none)
	topBytes         uint64
	drawnBytes       uint64
	walkBytes        uint64
	size             uint64
}

// layout is ps's readLayout on e's device.
func (e *Engine) layout(ps pass) readLayout {
	align := uint64(max(16, e.dev.Limits().MinStorageBufferOffsetAlignment))
	up := func(n, a uint64) uint64 { return (n + a - 1) / a * a }
	var l readLayout
	at := uint64(ps.lasts * kernels.SampleWords * 4)
	place := func(off, bytes *uint64, n int) {
		at = up(at, align)
		*off, *bytes = at, up(uint64(n)*4, 16)
		at += *bytes
	}
	if ps.topN > 0 {
		place(&l.top, &l.topBytes, ps.lasts*ps.topN*2)
	}
	if ps.propose {
		place(&l.drawn, &l.drawnBytes, ps.lasts*kernels.ProposeDrawnWords)
	}
	if ps.trees > 0 {
		place(&l.walk, &l.walkBytes, ps.trees*kernels.WalkWords(ps.path))
	}
	l.size = up(at, 16)
	return l
}

// writeSampled writes the inputs of propose.wgsl (each read-out row's
// uniforms and slot; none for rows that draw nothing) and of
// tree_walk.wgsl (each tree's entry, its nodes' records by read-out row)
// for a pass that has them (their buffers made: ensureReadout).
func (e *Engine) writeSampled(ps pass) error {
	a := e.act
	if ps.propose {
		props := make([]uint32, ps.lasts*kernels.ProposeWords)
		for r := range ps.lasts {
			if err := kernels.PutProposeRow(props[r*kernels.ProposeWords:], nil, kernels.ProposeNoSlot); err != nil {
				return err
			}
		}
		for _, pe := range ps.entries {
			if !pe.p.proposes() {
				continue
			}
			for j := range pe.outs {
				jj := len(pe.p.rows) + j
				us := pe.p.verify.Propose[jj]
				if len(us) == 0 {
					continue
				}
				if err := kernels.PutProposeRow(props[(pe.out0+j)*kernels.ProposeWords:], us, pe.p.slots[jj]); err != nil {
					return err
				}
			}
		}
		if err := a.props.WriteU32(0, props); err != nil {
			return err
		}
	}
	if ps.trees == 0 {
		return nil
	}
	entries := make([]uint32, ps.trees*kernels.WalkEntryWords)
	nodes := make([]uint32, ps.lasts*kernels.WalkNodeWords)
	t := 0
	for _, pe := range ps.entries {
		if !pe.p.walks() || pe.outs == 0 {
			continue
		}
		v := pe.p.verify
		kernels.PutWalkEntry(entries[t*kernels.WalkEntryWords:], pe.out0, pe.out0, v.Out)
		first := len(v.Tokens) - v.Out
		for j, n := range v.Tree.Nodes {
			wn := kernels.WalkNode{Slot: pe.p.slots[j], Children: n.Children, U: n.U, V: n.V}
			for _, ch := range n.Children {
				wn.Tokens = append(wn.Tokens, v.Tokens[first+ch])
			}
			if err := kernels.PutWalkNode(nodes[(pe.out0+j)*kernels.WalkNodeWords:], wn); err != nil {
				return err
			}
		}
		t++
	}
	if err := a.walkEntries.WriteU32(0, entries); err != nil {
		return err
	}
	return a.walkNodes.WriteU32(0, nodes)
}

// sampledKernels are a sampled pass's steps after sample.wgsl: the
// proposals drawn, the trees walked, and the copies of the top-N, the
// proposals and the walks into the sampled buffer after the rows (l), so
// that one read takes them all.
func (e *Engine) sampledKernels(ps pass, l readLayout) []step {
	a, s, V := e.act, &e.g.q, e.cfg.VocabSize
	var steps []step
	if ps.propose {
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.Propose(b, a.drawn, s.buf, a.logits, a.sampled, a.temps, a.props, ps.lasts, V, len(s.stamp))
		})
	}
	if ps.trees > 0 {
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.TreeWalk(b, a.walk, a.logits, a.sampled, a.temps, s.buf, a.walkEntries, a.walkNodes, ps.trees, ps.lasts, V, len(s.stamp), ps.lasts, ps.path)
		})
	}
	for _, c := range []struct {
		src       *gpu.Buffer
		at, bytes uint64
	}{{a.top, l.top, l.topBytes}, {a.drawn, l.drawn, l.drawnBytes}, {a.walk, l.walk, l.walkBytes}} {
		if c.bytes > 0 {
			steps = append(steps, func(b *gpu.Batch) error { return kernels.CopyTo(b, a.sampled, c.at, c.src, c.bytes) })
		}
	}
	return steps
}

// readSampled fills pe's rows with what its sampled drafts read out: each
// proposing row's tokens drawn, their log q and its q (a DeviceDist); a
// tree's path, its log-probabilities and the bonus token, from the walk's
// record. drawn and walk are the pass's words (readLayout), t the entry's
// tree among the pass's.
func (e *Engine) readSampled(pe passEntry, rows []engine.VerifyRow, drawn, walk []uint32, ps pass, t int) error {
	p := pe.p
	switch {
	case p.proposes():
		for j := range pe.outs {
			jj := len(p.rows) + j
			if len(p.verify.Propose[jj]) == 0 {
				continue
			}
			tokens, logq := kernels.ProposeDrawn(drawn[(pe.out0+j)*kernels.ProposeDrawnWords:])
			for _, x := range tokens {
				if x >= e.cfg.VocabSize {
					return fmt.Errorf("proposals: token %d drawn outside the vocabulary", x)
				}
			}
			slot := p.slots[jj]
			rows[j].Drawn, rows[j].DrawnLogprob = tokens, logq
			rows[j].Q = &DeviceDist{s: &e.g.q, slot: slot, stamp: e.g.q.stamp[slot], v: e.g.q.V}
		}
	case p.walks() && pe.outs > 0:
		words := kernels.WalkWords(ps.path)
		path, lps, bonus, err := kernels.WalkResult(walk[t*words:(t+1)*words], ps.path)
		if err != nil {
			return fmt.Errorf("tree walk: %w", err)
		}
		if bonus.Token < 0 || bonus.Token >= e.cfg.VocabSize || math.IsNaN(float64(bonus.Logprob)) {
			return fmt.Errorf("tree walk: bonus token %d (log p %v)", bonus.Token, bonus.Logprob)
		}
		tr := p.verify.Tree
		tr.Path, tr.Logprobs, tr.Bonus = path, lps, bonus
	}
	return nil
}
