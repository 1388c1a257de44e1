package webgpu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/treemask"
)

// headTree is a head's buffers for trees drafted on the device: the
// drafter's (treeBuffers), and the pairs of the two gathers that map a
// level's top tokens to the target's vocabulary in place (mapSrc: pair k
// is (2k+1, 2k), gathering top token k's draft id into the odd word of
// mapPairs' pair k, whose even word is 2k, so that mapPairs gathers
// headWeights.targetIDs into top), maps pairs of each.
type headTree struct {
	treeBuffers
	mapSrc, mapPairs *gpu.Buffer
	maps             int
}

func (ht *headTree) release() {
	ht.treeBuffers.release()
	for _, b := range []*gpu.Buffer{ht.mapSrc, ht.mapPairs} {
		if b != nil {
			b.Release()
		}
	}
	*ht = headTree{}
}

// ensure grows the buffers to seqs sequences of c nodes, passes of rows
// rows and maps top tokens mapped at once.
func (ht *headTree) ensure(d *gpu.Device, seqs, c, rows, maps int) error {
	if err := ht.treeBuffers.ensure(d, seqs, c, rows); err != nil {
		return err
	}
	if ht.mapSrc != nil && maps <= ht.maps {
		return nil
	}
	for _, b := range []*gpu.Buffer{ht.mapSrc, ht.mapPairs} {
		if b != nil {
			b.Release()
		}
	}
	ht.mapSrc, ht.mapPairs, ht.maps = nil, nil, maps
	src, pairs := make([]uint32, maps*kernels.GatherPairWords), make([]uint32, maps*kernels.GatherPairWords)
	for k := range maps {
		src[2*k], src[2*k+1], pairs[2*k] = uint32(2*k+1), uint32(2*k), uint32(2*k)
	}
	var err error
	if ht.mapSrc, err = d.UploadU32("head.tree_map_src", src); err != nil {
		return fmt.Errorf("tree buffers: %w", err)
	}
	if ht.mapPairs, err = d.UploadU32("head.tree_map_pairs", pairs); err != nil {
		return fmt.Errorf("tree buffers: %w", err)
	}
	return nil
}

// FusesTree reports whether DraftVerifyTree takes target and steps: the
// head's own target; each step's head entry over the target's sequence it
// verifies, with no token tree of its own (the last one kept or dropped);
// trees the device drafts (treeShapeFuses), no wider than the draft
// vocabulary; a level's rows within one head pass and its read-out, and
// the target's within one pass.
func (h *Head) FusesTree(target engine.Engine, steps []engine.TreeStep) bool {
	if !h.Fuses(target) || len(steps) == 0 || len(steps) > h.act.S {
		return false
	}
	t := h.target
	var level, tRows, tLasts int
	for _, s := range steps {
		if !treeShapeFuses(s, min(kernels.MaxTreeWidth, h.cfg.DraftVocabSize)) || s.Draft.Target == nil || s.Draft.Target != s.Verify.Seq {
			return false
		}
		if hs, ok := s.Draft.Seq.(*headSequence); !ok || hs.tree.Len() > 0 {
			return false
		}
		level += s.Width
		tRows += len(s.Verify.Tokens) + verified(s)
		tLasts += verified(s) + 1
	}
	return level <= min(h.act.R, h.act.S) && tRows <= t.opts.MaxRows && tLasts <= t.act.maxLasts
}

// DraftVerifyTree drafts a token tree for each step and has the head's
// target verify it in one submission (engine.TreeFuser), as
// Engine.DraftVerifyTree does for a drafter: level 0, the head's passes
// over the pending tokens (Step's), reads out the root's Width most likely
// tokens; each level after it feeds the frontier tree_expand.wgsl chose
// from the level before, each node over the head's own output at its
// parent — the store's row of the line's last token for a child of the
// root, else the parent's row of the node store, which the feed names —
// and reads out their children. Each level's top tokens are mapped to the
// target's vocabulary on the device before tree_expand.wgsl takes them,
// so that the nodes and the target's gathered tokens are the target's.
// The head's cache then holds the pending tokens and the fed nodes (as a
// Verify that fed them as tree nodes leaves it), the target's the pending
// tokens and the verified nodes. On an error every sequence is as it was.
func (h *Head) DraftVerifyTree(ctx context.Context, target engine.Engine, steps []engine.TreeStep) error {
	if !h.FusesTree(target, steps) {
		return errors.New("webgpu head: draft and verify a tree: the target or the steps do not fuse (FusesTree)")
	}
	t := h.target
	drafts, verify, err := treeEntries(&h.engCfg, &t.cfg, steps)
	if err != nil {
		return fmt.Errorf("webgpu head: %w", err)
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	if err := t.usable(); err != nil {
		return err
	}
	feeds, err := h.prepareTree(steps, drafts)
	if err != nil {
		return err
	}
	twork, tlens, err := t.prepareVerify(verify)
	if err != nil {
		h.unchain(feeds, false)
		return err
	}
	if submitted, err := h.fusedTree(ctx, steps, feeds, twork); err != nil {
		for i, p := range twork {
			p.seq.Truncate(tlens[i])
		}
		for _, f := range feeds {
			f.seq.Truncate(f.L)
		}
		h.unchain(feeds, submitted)
		return t.broken(err)
	}
	return nil
}

// prepareTree plans the head's level 0 (Step's feeds, reading out Width
// top tokens) and reserves its blocks for the pending tokens and the fed
// nodes, the group's lock held; nothing changes when it fails.
func (h *Head) prepareTree(steps []engine.TreeStep, drafts []*engine.Entry) ([]headFeed, error) {
	feeds, err := h.stepFeeds(drafts)
	if err != nil {
		return nil, err
	}
	seqs, need := make([]*kernels.KVSeq, len(feeds)), make([]int, len(feeds))
	for i, f := range feeds {
		fed := (steps[i].Depth - 1) * steps[i].Width
		if p := f.L + len(f.tokens) + fed; p > h.engCfg.MaxPositionEmbeddings {
			return nil, fmt.Errorf("webgpu head: batch entry %d: %d positions: %w (max_position_embeddings %d)", i, p, engine.ErrContextFull, h.engCfg.MaxPositionEmbeddings)
		}
		seqs[i], need[i] = f.seq.kv, f.L+len(f.tokens)-1+fed
	}
	if err := h.act.ensureNodes(h.dev, h.cfg.HiddenSize); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	if err := h.kv.Reserve(seqs, need); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", kvError(err))
	}
	return feeds, nil
}

// fusedTree records the head's levels and the target's verification, then
// reads back and commits. submitted reports whether any of the head's
// passes went to the device.
func (h *Head) fusedTree(ctx context.Context, steps []engine.TreeStep, feeds []headFeed, twork []pending) (submitted bool, err error) {
	a, ht := h.act, &h.tree
	C, depth, topN := 0, 0, 0
	seqs := make([]*kernels.KVSeq, len(feeds))
	for i, s := range steps {
		C, depth, topN = max(C, treeTable(s)), max(depth, s.Depth), max(topN, s.Width)
		seqs[i] = feeds[i].seq.kv
	}
	if err := ht.ensure(h.dev, len(steps), C, max(a.R, h.target.opts.MaxRows), a.S*topN); err != nil {
		return false, err
	}
	if err := h.kv.SyncTables(seqs); err != nil {
		return false, err
	}
	// Level 0: Step's passes, the last reading out each entry's root.
	shape := make([]uint32, len(steps)*kernels.TreeShapeWords)
	for i, s := range steps {
		kernels.PutTreeShape(shape[i*kernels.TreeShapeWords:], s.Width, s.Depth, verified(s), i, 0)
		kernels.PutTreeParentRows(shape[i*kernels.TreeShapeWords:], feeds[i].seq.kv.Slot()*treemask.MaxNodes)
	}
	if err := ht.shape.WriteU32(0, shape); err != nil {
		return false, err
	}
	passes := h.passes(feeds)
	for k := range passes {
		if err := ctx.Err(); err != nil {
			return submitted, err
		}
		ps := &passes[k]
		if err := h.writePass(feeds, ps); err != nil {
			return submitted, err
		}
		kernelSteps := h.passSteps(ps, len(feeds), topN)
		if ps.last {
			kernelSteps = append(kernelSteps, h.expandSteps(len(feeds), topN, 0, C, len(steps))...)
		}
		submitted = true
		if err := h.target.submit(kernelSteps, submitEvery); err != nil {
			return true, fmt.Errorf("head pass %d of %d: %w", k+1, len(passes), err)
		}
	}
	// Levels 1 … depth−1: each step's frontier, a node a row.
	for level := 1; level < depth; level++ {
		if err := ctx.Err(); err != nil {
			return true, err
		}
		ps, pre, err := h.treeLevel(steps, feeds, level)
		if err != nil {
			return true, err
		}
		kernelSteps := h.passSteps(&ps, len(feeds), topN)
		kernelSteps = append(append(pre, kernelSteps...), h.expandSteps(ps.rows, topN, level, C, len(steps))...)
		if err := h.target.submit(kernelSteps, h.target.chainedEvery()); err != nil {
			return true, fmt.Errorf("head level %d: %w", level, err)
		}
	}
	return true, h.target.verifyTree(&ht.treeBuffers, steps, twork, C, func(i int, nodes []kernels.TreeNode) error {
		return h.commitTree(&steps[i], &feeds[i], &twork[i], nodes)
	})
}

// expandSteps are what follows a level's read-out of n rows (topN top
// tokens each): the top tokens mapped to the target's vocabulary, then
// tree_expand.wgsl over seqs sequences.
func (h *Head) expandSteps(n, topN, level, C, seqs int) []step {
	a, ht, k := h.act, &h.tree, n*topN
	return []step{
		func(b *gpu.Batch) error { return kernels.Gather(b, ht.mapPairs, a.top, ht.mapSrc, k) },
		func(b *gpu.Batch) error { return kernels.Gather(b, a.top, h.w.targetIDs, ht.mapPairs, k) },
		func(b *gpu.Batch) error {
			return kernels.TreeExpand(b, ht.shape, a.top, ht.state, ht.nodes, ht.feed, seqs, level, C, topN)
		},
	}
}

// treeLevel is the head's pass of a level ℓ ≥ 1 and the gathers that feed
// it: the Width frontier nodes of each step at least ℓ+1 deep, fed at
// tokens L + P + (ℓ−1)·Width + j (P pending tokens) — their rows a slot
// before, at position L + P + ℓ − 2 —, their ids and masks gathered from
// the feed; each row's hidden the store's row of its sequence at level 1
// (the line's last output: the root's), else its parent's row of the node
// store, the pair's source row gathered from the feed; each output kept in
// the node store at its drafter slot; every row read out, in order. The
// steps' shapes go to the device with the pass.
func (h *Head) treeLevel(steps []engine.TreeStep, feeds []headFeed, level int) (headPass, []step, error) {
	a, ht := h.act, &h.tree
	ps := headPass{treeLevel: true}
	shape := make([]uint32, len(steps)*kernels.TreeShapeWords)
	for i, s := range steps {
		out0 := -1
		f := &feeds[i]
		if level < s.Depth {
			out0 = ps.rows
			P := len(f.tokens)
			ps.parts = append(ps.parts, headPart{feed: i, slot: f.seq.kv.Slot(), t0: P + (level-1)*s.Width, T: s.Width, node: true, row0: ps.rows})
			ps.rows += s.Width
		}
		kernels.PutTreeShape(shape[i*kernels.TreeShapeWords:], s.Width, s.Depth, verified(s), out0, 0)
		kernels.PutTreeParentRows(shape[i*kernels.TreeShapeWords:], f.seq.kv.Slot()*treemask.MaxNodes)
	}
	ps.decode = ps.rows
	ids, rows := make([]uint32, ps.rows), make([]uint32, ps.rows*kernels.RowWords)
	pairs := make([]uint32, a.regions.words)
	put := func(region uint64, i int, dst, src int) {
		w := region/4 + uint64(i*kernels.GatherPairWords)
		pairs[w], pairs[w+1] = uint32(dst), uint32(src)
	}
	var idPairs, wordPairs, parentPairs []uint32
	for _, p := range ps.parts {
		f := &feeds[p.feed]
		first := f.L + len(f.tokens) // the tree's first token
		for j := range p.T {
			r := p.row0 + j
			tok := f.L + p.t0 + j
			// The row of a node at depth ℓ: its token's position L+P−1+ℓ,
			// less one, as the head's rows are; its mask gathered.
			kernels.PutRow(rows[r*kernels.RowWords:], p.slot, tok-1, treemask.Row{Pos: first + level - 2, Base: first - 1})
			ps.maxLen = max(ps.maxLen, tok)
			feed := uint32((p.feed*kernels.TreeFeedRows + j) * kernels.TreeFeedWords)
			idPairs = append(idPairs, uint32(r), feed)
			wordPairs = append(wordPairs, uint32(r*kernels.RowWords+4), feed+2, uint32(r*kernels.RowWords+5), feed+3)
			if level == 1 {
				put(a.regions.x, ps.nx, r, a.R+p.slot)
				ps.nx++
			} else {
				put(a.regions.nodeX, ps.nnx, r, 0) // the source row gathered from the feed
				parentPairs = append(parentPairs, uint32(a.regions.nodeX/4)+uint32(ps.nnx*kernels.GatherPairWords)+1, feed+1)
				ps.nnx++
			}
			put(a.regions.nodeSave, ps.nnsave, p.slot*treemask.MaxNodes+tok-first, r)
			ps.nnsave++
			put(a.regions.read, r, r, r)
		}
	}
	for _, w := range []struct {
		buf *gpu.Buffer
		v   []uint32
	}{{a.ids, ids}, {a.rowBuf, rows}, {a.pairs, pairs}, {ht.shape, shape}} {
		if err := w.buf.WriteU32(0, w.v); err != nil {
			return headPass{}, nil, err
		}
	}
	var pre []step
	for _, g := range []struct {
		pairs     []uint32
		buf, into *gpu.Buffer
	}{{idPairs, ht.idPairs, a.ids}, {wordPairs, ht.rowPairs, a.rowBuf}, {parentPairs, ht.parentPairs, a.pairs}} {
		if len(g.pairs) == 0 {
			continue
		}
		if err := g.buf.WriteU32(0, g.pairs); err != nil {
			return headPass{}, nil, err
		}
		pre = append(pre, func(b *gpu.Batch) error {
			return kernels.Gather(b, g.into, ht.feed, g.buf, len(g.pairs)/kernels.GatherPairWords)
		})
	}
	return ps, pre, nil
}

// commitTree checks the nodes the device left for step s and commits both
// caches as the device placed them: the head's pending tokens and the
// nodes it fed (f: as a Verify feeding them as tree nodes commits them),
// the target's pending tokens and the verified nodes (t); it sets the
// step's Tree — each fed node's DraftSlot its token in the head's
// sequence — and its target entry's Tokens, Parents and Out.
func (h *Head) commitTree(s *engine.TreeStep, f *headFeed, t *pending, nodes []kernels.TreeNode) error {
	rows, fed, err := treeOrder(*s, nodes, h.engCfg.VocabSize)
	if err != nil {
		return err
	}
	first := f.L + len(f.tokens) // the tree's first token
	parents := treeParents(len(f.tokens), nodes, fed, first, func(n kernels.TreeNode) int { return n.DSlot })
	tokens := slices.Clip(slices.Clone(f.tokens))
	for _, k := range fed {
		tokens = append(tokens, nodes[k].Token)
	}
	place, err := f.seq.tree.Place(f.L, len(tokens), parents)
	if err != nil {
		return fmt.Errorf("head: %w", err)
	}
	f.tokens, f.parents, f.place, f.base = tokens, parents, place, first
	for range fed {
		f.stage, f.feat = append(f.stage, 0), append(f.feat, false)
	}
	if err := h.commit([]headFeed{*f}, 0); err != nil {
		return fmt.Errorf("head: %w", err)
	}
	return commitVerified(s, t, nodes, rows, first)
}
