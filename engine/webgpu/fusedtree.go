package webgpu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
	"webdraft/sampling"
	"webdraft/treemask"
)

// treeBuffers are a drafter's buffers for trees drafted on the device
// (kernels.TreeExpand, kernels.TreeSelect), grown as calls need: shape,
// state, nodes and feed for seqs sequences of node tables of c rows, and
// the gathers' pairs: a pass's token ids, its rows' words and (a head's)
// its rows' parents.
type treeBuffers struct {
	seqs, c                        int
	shape, state, nodes, feed      *gpu.Buffer
	idPairs, rowPairs, parentPairs *gpu.Buffer
	rows                           int // pairs' capacity in rows
}

func (tb *treeBuffers) release() {
	for _, b := range []*gpu.Buffer{tb.shape, tb.state, tb.nodes, tb.feed, tb.idPairs, tb.rowPairs, tb.parentPairs} {
		if b != nil {
			b.Release()
		}
	}
	*tb = treeBuffers{}
}

// ensure grows the buffers to seqs sequences of c nodes and passes of rows
// rows.
func (tb *treeBuffers) ensure(d *gpu.Device, seqs, c, rows int) error {
	if tb.shape != nil && seqs <= tb.seqs && c <= tb.c && rows <= tb.rows {
		return nil
	}
	seqs, c, rows = max(seqs, tb.seqs), max(c, tb.c), max(rows, tb.rows)
	tb.release()
	*tb = treeBuffers{seqs: seqs, c: c, rows: rows}
	for _, b := range []struct {
		dst   **gpu.Buffer
		name  string
		words int
	}{
		{&tb.shape, "tree_shape", seqs * kernels.TreeShapeWords}, {&tb.state, "tree_state", seqs * kernels.TreeStateWords},
		{&tb.nodes, "tree_nodes", seqs * c * kernels.TreeNodeWords}, {&tb.feed, "tree_feed", seqs * kernels.TreeFeedRows * kernels.TreeFeedWords},
		{&tb.idPairs, "tree_id_pairs", rows * kernels.GatherPairWords}, {&tb.rowPairs, "tree_row_pairs", 3 * rows * kernels.GatherPairWords},
		{&tb.parentPairs, "tree_parent_pairs", rows * kernels.GatherPairWords},
	} {
		var err error
		if *b.dst, err = d.NewBuffer(b.name, uint64(b.words)*4); err != nil {
			tb.release()
			return fmt.Errorf("tree buffers: %w", err)
		}
	}
	return nil
}

// treeTable is the node-table rows a step needs.
func treeTable(s engine.TreeStep) int { return kernels.TreeTable(s.Width, s.Depth) }

// verified is how many nodes a step's target verifies.
func verified(s engine.TreeStep) int { return min(s.Nodes, treeTable(s)) }

// FusesTree reports whether DraftVerifyTree takes target and steps: another
// engine of the group; trees of 1 to kernels.MaxTreeWidth children a node
// whose node tables fit kernels.MaxTreeTable rows and whose drafter and
// target trees fit treemask.MaxNodes slots; lines of pending tokens, a
// greedy target; and each model's rows within one pass.
func (e *Engine) FusesTree(target engine.Engine, steps []engine.TreeStep) bool {
	if !e.Fuses(target) || len(steps) == 0 {
		return false
	}
	t := target.(*Engine)
	var dRows, dLasts, tRows, tLasts int
	for _, s := range steps {
		if !treeShapeFuses(s, kernels.MaxTreeWidth) || len(s.Draft.Tokens) > decodeEntryRows {
			return false
		}
		dRows += max(len(s.Draft.Tokens), s.Width)
		dLasts += s.Width
		tRows += len(s.Verify.Tokens) + verified(s)
		tLasts += verified(s) + 1
	}
	return dRows <= e.opts.MaxRows && dLasts <= e.act.maxLasts && tRows <= t.opts.MaxRows && tLasts <= t.act.maxLasts
}

// treeShapeFuses reports whether a step's tree drafts on the device: 1 to
// maxWidth children a node, a node table within kernels.MaxTreeTable
// rows, its fed and verified nodes within treemask.MaxNodes slots; lines
// of pending tokens for both models, and a greedy target.
func treeShapeFuses(s engine.TreeStep, maxWidth int) bool {
	switch v := s.Verify; {
	case s.Draft == nil || v == nil || s.Width < 1 || s.Width > maxWidth || s.Depth < 1 || s.Nodes < 1:
		return false
	case treeTable(s) > kernels.MaxTreeTable || (s.Depth-1)*s.Width > treemask.MaxNodes || verified(s) > treemask.MaxNodes:
		return false
	case s.Draft.Parents != nil || v.Parents != nil || v.Propose != nil || v.Tree != nil || v.Draws != nil || !v.Sampling.Greedy():
		return false
	}
	return len(s.Draft.Tokens) > 0 && len(s.Verify.Tokens) > 0
}

// DraftVerifyTree drafts a token tree for each step and verifies it with
// target in one submission (engine.TreeFuser): level 0, a drafter pass over
// the pending tokens, reads out the root's Width most likely tokens; each
// level after it feeds the frontier that tree_expand.wgsl chose from the
// level before — its tokens and masks gathered into the pass's inputs on
// the device — and reads out their children; tree_select.wgsl then picks
// the Nodes best-scored nodes, gathered into the target's pass as tree
// nodes after its pending tokens. The host records every pass ahead and
// reads back, once the device is done, the node tables and the target's
// rows; both caches are then committed as the device placed them.
func (e *Engine) DraftVerifyTree(ctx context.Context, target engine.Engine, steps []engine.TreeStep) error {
	if !e.FusesTree(target, steps) {
		return errors.New("webgpu engine: draft and verify a tree: the target or the steps do not fuse (FusesTree)")
	}
	t := target.(*Engine)
	drafts, verify, err := treeEntries(&e.cfg, &t.cfg, steps)
	if err != nil {
		return err
	}
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return err
	}
	if err := t.usable(); err != nil {
		return err
	}
	dwork, dlens, err := e.prepareTree(steps, drafts)
	if err != nil {
		return err
	}
	twork, tlens, err := t.prepareVerify(verify)
	if err != nil {
		for i, p := range dwork {
			p.seq.Truncate(dlens[i])
		}
		return err
	}
	if err := e.fusedTree(ctx, t, steps, dwork, twork); err != nil {
		for i, p := range dwork {
			p.seq.Truncate(dlens[i])
		}
		for i, p := range twork {
			p.seq.Truncate(tlens[i])
		}
		return e.broken(err)
	}
	return nil
}

// treeEntries are a tree call's entries, checked: the drafter's, each
// step's pending tokens reading out the root's Width most likely tokens
// (over the Target's features, for a head), against draftCfg, and the
// target's (treeVerifyEntries) against targetCfg.
func treeEntries(draftCfg, targetCfg *qwen3.Config, steps []engine.TreeStep) ([]*engine.Entry, []*engine.VerifyEntry, error) {
	drafts := make([]*engine.Entry, len(steps))
	for i, s := range steps {
		drafts[i] = &engine.Entry{Seq: s.Draft.Seq, Target: s.Draft.Target, Tokens: s.Draft.Tokens, TopN: s.Width}
	}
	if err := engine.CheckBatch(draftCfg, drafts); err != nil {
		return nil, nil, err
	}
	verify := treeVerifyEntries(steps)
	if err := engine.CheckVerify(targetCfg, verify); err != nil {
		return nil, nil, err
	}
	return drafts, verify, nil
}

// treeVerifyEntries are the target's entries of a tree call: each step's
// pending tokens, then the verified nodes' places, held by token 0 in line
// until the device writes their tokens and rows (gatherTree) — the
// commit places them as the device did —, each of them and the last
// pending token read out.
func treeVerifyEntries(steps []engine.TreeStep) []*engine.VerifyEntry {
	verify := make([]*engine.VerifyEntry, len(steps))
	for i, s := range steps {
		v := *s.Verify
		n := verified(s)
		v.Tokens = append(slices.Clip(v.Tokens), make([]int, n)...)
		v.Out = n + 1
		verify[i] = &v
	}
	return verify
}

// prepareTree readies the drafter's part (checked, the group's lock held):
// each step's pending tokens placed, and the blocks for them and the
// tree's fed nodes reserved.
func (e *Engine) prepareTree(steps []engine.TreeStep, drafts []*engine.Entry) ([]pending, []int, error) {
	seqs, err := e.sequences(len(drafts), func(i int) engine.Sequence { return drafts[i].Seq })
	if err != nil {
		return nil, nil, err
	}
	place, err := placeAll(seqs, func(i int) ([]int, []int) { return drafts[i].Tokens, nil })
	if err != nil {
		return nil, nil, err
	}
	lens, need := make([]int, len(drafts)), make([]int, len(drafts))
	for i, s := range steps {
		lens[i] = seqs[i].Len()
		need[i] = lens[i] + len(drafts[i].Tokens) + (s.Depth-1)*s.Width
		if need[i] > e.cfg.MaxPositionEmbeddings {
			return nil, nil, fmt.Errorf("batch entry %d: %d positions: %w (max_position_embeddings %d)", i, need[i], engine.ErrContextFull, e.cfg.MaxPositionEmbeddings)
		}
	}
	if err := e.kv.Reserve(seqs, need); err != nil {
		return nil, nil, kvError(err)
	}
	work := make([]pending, len(drafts))
	for i, en := range drafts {
		work[i] = pending{entry: en, seq: seqs[i], tokens: en.Tokens, place: place[i], out: 1}
	}
	return work, lens, nil
}

// fusedTree records the drafter's levels and the target's verification,
// then reads back and commits.
func (e *Engine) fusedTree(ctx context.Context, t *Engine, steps []engine.TreeStep, dwork, twork []pending) error {
	C, depth := 0, 0
	for _, s := range steps {
		C, depth = max(C, treeTable(s)), max(depth, s.Depth)
	}
	tb := &e.tree
	if err := tb.ensure(e.dev, len(steps), C, max(e.opts.MaxRows, t.opts.MaxRows)); err != nil {
		return err
	}
	base := make([]int, len(steps)) // the drafter's first tree slot
	for i, p := range dwork {
		base[i] = p.seq.Len() + len(p.tokens)
	}
	for level := range depth {
		if err := ctx.Err(); err != nil {
			return err
		}
		ps, pre, err := e.treeLevel(steps, dwork, base, level)
		if err != nil {
			return err
		}
		expand := func(b *gpu.Batch) error {
			return kernels.TreeExpand(b, tb.shape, e.act.top, tb.state, tb.nodes, tb.feed, len(steps), level, C, ps.topN)
		}
		every := t.chainedEvery()
		if level == 0 {
			every = submitEvery
		}
		if err := e.forward(ps, false, pre, []step{expand}, every); err != nil {
			return fmt.Errorf("drafter level %d: %w", level, err)
		}
	}
	return t.verifyTree(tb, steps, twork, C, func(i int, nodes []kernels.TreeNode) error {
		return e.commitTree(&steps[i], &dwork[i], &twork[i], nodes, base[i])
	})
}

// verifyTree runs the target's pass over the trees drafted into tb —
// tree_select.wgsl choosing each step's verified nodes, gathered into the
// pass after its pending tokens —, reads the node tables and the
// verification's rows back in one read, hands each step's nodes to commit
// and sets its rows.
func (t *Engine) verifyTree(tb *treeBuffers, steps []engine.TreeStep, twork []pending, C int, commit func(i int, nodes []kernels.TreeNode) error) error {
	ps := t.plan(twork)
	if ps.rows != pendingRows(twork) {
		return fmt.Errorf("verification: %d rows do not fit one pass of %d", pendingRows(twork), t.opts.MaxRows)
	}
	pre, err := tb.gatherTree(t.act, ps, twork, steps, C)
	if err != nil {
		return err
	}
	// The node tables and the verification's rows in one read, with the
	// pass.
	raw, err := t.forwardRead(ps, false, pre, nil, submitEvery, func() []gpu.Binding {
		return []gpu.Binding{tb.state.Slice(0, uint64(len(steps)*kernels.TreeStateWords)*4),
			tb.nodes.Slice(0, uint64(len(steps)*C*kernels.TreeNodeWords)*4), t.rowsRange(ps)}
	})
	if err != nil {
		return fmt.Errorf("verification and read back: %w", err)
	}
	stateWords, nodeWords := u32s(raw[0]), u32s(raw[1])
	rows, _, _, err := t.readRows(ps, raw[2])
	if err != nil {
		return fmt.Errorf("verification: %w", err)
	}
	for i := range steps {
		count := int(stateWords[i*kernels.TreeStateWords])
		if count != treeTable(steps[i]) {
			return fmt.Errorf("batch entry %d: the device drafted %d nodes, want %d", i, count, treeTable(steps[i]))
		}
		if err := commit(i, kernels.ReadTreeNodes(nodeWords[i*C*kernels.TreeNodeWords:], count)); err != nil {
			return fmt.Errorf("batch entry %d: %w", i, err)
		}
	}
	for _, pe := range ps.entries {
		i := slices.IndexFunc(twork, func(p pending) bool { return p.seq == pe.p.seq })
		steps[i].Verify.Rows = rows[pe.out0 : pe.out0+pe.outs]
	}
	return nil
}

// treeLevel is the drafter's pass of a level and the gathers that feed it:
// level 0 feeds each step's pending tokens and reads out the last; level ℓ
// feeds the Width frontier nodes of the steps at least ℓ+1 deep, at tree
// slots base + (ℓ−1)·Width + j, position base − 1 + ℓ, their ids and masks
// gathered from the feed, and reads them all out. The steps' shapes go to
// the device with the pass.
func (e *Engine) treeLevel(steps []engine.TreeStep, work []pending, base []int, level int) (pass, []step, error) {
	tb := &e.tree
	ps := pass{chained: true}
	shape := make([]uint32, len(steps)*kernels.TreeShapeWords)
	var ids, words []uint32
	for i := range work {
		s, p := steps[i], &work[i]
		out0 := -1
		if level < s.Depth {
			out0 = ps.lasts
			pe := passEntry{p: p, row0: ps.rows, complete: true}
			if level == 0 {
				pe.T, pe.P, pe.outs = len(p.tokens), p.seq.Len(), 1
			} else {
				pe.T, pe.P, pe.outs = s.Width, base[i]+(level-1)*s.Width, s.Width
				p.tokens = make([]int, s.Width)
				p.place = make([]treemask.Row, s.Width)
				for j := range p.place {
					p.place[j] = treemask.Row{Pos: base[i] - 1 + level, Base: base[i], Parent: treemask.Line}
					feed := uint32((i*kernels.TreeFeedRows + j) * kernels.TreeFeedWords)
					row := uint32(ps.rows + j)
					ids = append(ids, row, feed)
					words = append(words, row*kernels.RowWords+4, feed+2, row*kernels.RowWords+5, feed+3)
				}
			}
			pe.out0 = ps.lasts
			p.out = pe.outs
			ps.readsOutWith(p, pe.outs)
			ps.entries = append(ps.entries, pe)
			ps.rows += pe.T
			ps.lasts += pe.outs
			ps.maxLen = max(ps.maxLen, pe.P+pe.T)
		}
		kernels.PutTreeShape(shape[i*kernels.TreeShapeWords:], s.Width, s.Depth, verified(s), out0, 0)
	}
	ps.decode = ps.rows
	if err := tb.shape.WriteU32(0, shape); err != nil {
		return pass{}, nil, err
	}
	pre, err := tb.gathers(e.act, ids, words)
	return ps, pre, err
}

// gathers writes the pairs of a pass's gathers from the feed — token ids
// into a's ids, row words into its rows — and returns the gathers.
func (tb *treeBuffers) gathers(a *activations, ids, words []uint32) ([]step, error) {
	var pre []step
	for _, g := range []struct {
		pairs     []uint32
		buf, into *gpu.Buffer
	}{{ids, tb.idPairs, a.ids}, {words, tb.rowPairs, a.rows}} {
		if len(g.pairs) == 0 {
			continue
		}
		if err := g.buf.WriteU32(0, g.pairs); err != nil {
			return nil, err
		}
		pre = append(pre, func(b *gpu.Batch) error {
			return kernels.Gather(b, g.into, tb.feed, g.buf, len(g.pairs)/kernels.GatherPairWords)
		})
	}
	return pre, nil
}

// gatherTree is what the target's pass ps over work runs first: the
// steps' shapes (the positions of their last line tokens) written,
// tree_select.wgsl, and the gathers of the chosen nodes' ids, positions
// and masks into a's rows after each entry's pending tokens; the rows the
// host places hold their slots and the tree's base.
func (tb *treeBuffers) gatherTree(a *activations, ps pass, work []pending, steps []engine.TreeStep, C int) ([]step, error) {
	shape := make([]uint32, len(steps)*kernels.TreeShapeWords)
	var ids, words []uint32
	for _, pe := range ps.entries {
		i := slices.IndexFunc(work, func(p pending) bool { return p.seq == pe.p.seq })
		s := steps[i]
		n := verified(s)
		pend := pe.T - n
		line := pe.P + pend // the tree's first slot
		kernels.PutTreeShape(shape[i*kernels.TreeShapeWords:], s.Width, s.Depth, n, 0, line-1)
		for r := range n {
			t := pend + r
			pe.p.place[t] = treemask.Row{Pos: line, Base: line, Parent: line - 1}
			feed := uint32((i*kernels.TreeFeedRows + r) * kernels.TreeFeedWords)
			row := uint32(pe.row0 + t)
			ids = append(ids, row, feed)
			words = append(words, row*kernels.RowWords+2, feed+1, row*kernels.RowWords+4, feed+2, row*kernels.RowWords+5, feed+3)
		}
	}
	if err := tb.shape.WriteU32(0, shape); err != nil {
		return nil, err
	}
	pre := []step{func(b *gpu.Batch) error {
		return kernels.TreeSelect(b, tb.shape, tb.state, tb.nodes, tb.feed, len(steps), C)
	}}
	g, err := tb.gathers(a, ids, words)
	return append(pre, g...), err
}

// commitTree checks the nodes the device left for step s and commits both
// caches as the device placed them — the drafter's pending tokens and the
// nodes it fed (d), the target's pending tokens and the verified nodes
// (t) — and sets the step's Tree and its target entry's Tokens, Parents
// and Out. base is the drafter's first tree slot.
func (e *Engine) commitTree(s *engine.TreeStep, d, t *pending, nodes []kernels.TreeNode, base int) error {
	rows, fed, err := treeOrder(*s, nodes, e.cfg.VocabSize)
	if err != nil {
		return err
	}
	// The drafter: its pending tokens, then the fed nodes, each under its
	// parent's slot (the context's last for a child of the root).
	dslot := func(n kernels.TreeNode) int { return n.DSlot }
	if err := commitPlaced(d.seq, treeParents(len(s.Draft.Tokens), nodes, fed, base, dslot)); err != nil {
		return fmt.Errorf("drafter: %w", err)
	}
	return commitVerified(s, t, nodes, rows, base)
}

// treeOrder checks the nodes the device left for step s — each under a
// parent before it, one level deeper, a token of the vocabulary (of vocab
// tokens), the verified and the fed nodes closed under their parents and
// as many as the step's shape makes — and returns them in order: the
// verified by target row, the fed by drafter slot.
func treeOrder(s engine.TreeStep, nodes []kernels.TreeNode, vocab int) (rows, fed []int, err error) {
	n := verified(s)
	rows = make([]int, n)                  // verified node by row
	fed = make([]int, (s.Depth-1)*s.Width) // fed node by drafter tree index
	for _, idx := range [][]int{rows, fed} {
		for i := range idx {
			idx[i] = -1
		}
	}
	for k, nd := range nodes {
		var parent *kernels.TreeNode
		if nd.Parent >= 0 {
			if nd.Parent >= k {
				return nil, nil, fmt.Errorf("tree node %d: parent %d not before it", k, nd.Parent)
			}
			parent = &nodes[nd.Parent]
		}
		switch {
		case nd.Token < 0 || nd.Token >= vocab:
			return nil, nil, fmt.Errorf("tree node %d: token %d: %w", k, nd.Token, sampling.ErrNaN)
		case parent == nil && nd.Depth != 1 || parent != nil && nd.Depth != parent.Depth+1:
			return nil, nil, fmt.Errorf("tree node %d: depth %d under its parent's", k, nd.Depth)
		case nd.Row >= n || nd.Row >= 0 && (rows[nd.Row] >= 0 || parent != nil && parent.Row < 0):
			return nil, nil, fmt.Errorf("tree node %d: target row %d of %d, or its parent's unverified", k, nd.Row, n)
		case nd.DSlot >= len(fed) || nd.DSlot >= 0 && (fed[nd.DSlot] >= 0 || parent != nil && parent.DSlot < 0):
			return nil, nil, fmt.Errorf("tree node %d: drafter slot %d of %d, or its parent's unfed", k, nd.DSlot, len(fed))
		}
		if nd.Row >= 0 {
			rows[nd.Row] = k
		}
		if nd.DSlot >= 0 {
			fed[nd.DSlot] = k
		}
	}
	if slices.Contains(rows, -1) || slices.Contains(fed, -1) {
		return nil, nil, fmt.Errorf("the device verified or fed fewer nodes than %d and %d", n, len(fed))
	}
	return rows, fed, nil
}

// commitVerified commits the target's part of step s (t): its pending
// tokens, then the verified nodes by row (rows, treeOrder's) — and sets
// the step's Tree, each fed node's DraftSlot dbase past its drafter slot,
// and its target entry's Tokens, Parents and Out.
func commitVerified(s *engine.TreeStep, t *pending, nodes []kernels.TreeNode, rows []int, dbase int) error {
	pendT := s.Verify.Tokens
	line := t.seq.Len() + len(pendT) // the target's first tree slot
	tparents := treeParents(len(pendT), nodes, rows, line, func(n kernels.TreeNode) int { return n.Row })
	tokens := slices.Clip(slices.Clone(pendT))
	for _, k := range rows {
		tokens = append(tokens, nodes[k].Token)
	}
	if err := commitPlaced(t.seq, tparents); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	s.Verify.Tokens, s.Verify.Parents, s.Verify.Out = tokens, tparents, len(rows)+1
	s.Tree = make([]engine.TreeNode, len(nodes))
	for k, nd := range nodes {
		slot := -1
		if nd.DSlot >= 0 {
			slot = dbase + nd.DSlot
		}
		s.Tree[k] = engine.TreeNode{Token: engine.Token{ID: nd.Token, Logprob: nd.Logprob}, Parent: nd.Parent, Depth: nd.Depth,
			Score: float64(nd.Score), DraftSlot: slot, Row: nd.Row}
	}
	return nil
}

// treeParents are the parents of pending line tokens followed by the
// nodes of order, each under its parent's slot, first + slot(parent), or
// first − 1 (the line's last slot) for a child of the root.
func treeParents(pending int, nodes []kernels.TreeNode, order []int, first int, slot func(kernels.TreeNode) int) []int {
	parents := make([]int, pending, pending+len(order))
	for i := range parents {
		parents[i] = treemask.Line
	}
	for _, k := range order {
		parent := first - 1
		if p := nodes[k].Parent; p >= 0 {
			parent = first + slot(nodes[p])
		}
		parents = append(parents, parent)
	}
	return parents
}

// commitPlaced commits tokens fed after seq's line under parents (Line or
// a slot), placed as KVSeq.Place places them — as the device placed them.
func commitPlaced(seq *kernels.KVSeq, parents []int) error {
	place, err := seq.Place(len(parents), parents)
	if err != nil {
		return err
	}
	return seq.Commit(seq.Len()+len(parents), place)
}
