package speculative

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/treemask"
)

// Token trees. With TopK b > 1 a generation drafts a tree instead of a
// chain, as EAGLE-2's dynamic tree does: the drafter expands it level by
// level, each level one drafter pass over every drafting generation's
// frontier (rows = the frontier's nodes, each attending to the context and
// its own ancestors). A node's children are its b most likely next tokens,
// scored by the path's cumulative log-probability under the drafter; the
// next frontier is the b best-scored of them. After k levels the
// TreeNodes best-scored nodes (an ancestor-closed set, as a child never
// scores above its parent) go to the target, which verifies them all in
// one pass with a tree mask. The target keeps the longest root path whose
// every token is its own greedy token after the path before it, and adds
// its own token after that: the output is token for token the target's
// greedy output, as with chains. Both caches then keep the accepted path's
// keys and values (Sequence.KeepPath), moved into place.
//
// A keyed sampled generation's tree (gen.keyed) is walked the same way,
// each row's greedy token replaced by its coupled draw: every row, the
// drafter's and the target's, draws under the key of the position it
// decides (sampling.Keys), so the target's row at a node on the context's
// true path draws the target alone's token there. A node's children are
// the Gumbel-top-b of the drafter's row under that key (gumbelTop): its
// coupled draw — the token the target draws with probability close to
// 1 − TV(p, q) — then the likeliest others under the same noise, so that
// a child is the target's draw as often as the drafter's b best guesses
// at it allow. The output is the target alone's for the seed, whatever the
// tree.

// MaxTopK bounds a request's TopK (the read-out's engine.MaxTopN).
const MaxTopK = engine.MaxTopN

// MaxTreeNodes bounds a request's TreeNodes: a tree's nodes in one
// sequence's cache (treemask.MaxNodes).
const MaxTreeNodes = treemask.MaxNodes

// DefaultTreeNodes is a tree's node budget where neither the request nor
// the options say.
const DefaultTreeNodes = 16

// DraftNode is one node of a drafted tree.
type DraftNode struct {
	engine.Token     // the drafter's token, its log-probability and alternatives
	Parent       int // index of the parent node; −1 for a root (after the context)
	Depth        int // 1 for a root
	// Verified: the node went to the target (else the drafter explored it
	// and the budget left it out). Accepted: it is on the accepted path.
	Verified, Accepted bool
}

// draftTree is a generation's tree in the making, then verified.
type draftTree struct {
	nodes  []DraftNode
	score  []float64 // per node: the path's Σ log-probability under the drafter
	dslot  []int     // per node: its slot in the drafter's cache, −1 if not fed
	kept   []int     // the verified nodes, parents before children (verification order)
	row    []int     // per node: its index in kept (−1: not verified)
	fresh  []int     // the last level's new nodes
	pmin   float64
	drafts int // drafter slots the tree took
	// keyed: the rows draw coupled under keys (the generation's), each
	// at the position it decides, at the generation's sampling; ctx is
	// the context's length, the position a root decides.
	keyed  bool
	keys   sampling.Keys
	params sampling.Params
	ctx    int
	// A sampled tree's children were drawn from the drafter's
	// distribution: rootQ at the root, q[n] at node n (nil where it has
	// none), for the target's rule.
	sampled bool
	rootQ   engine.Dist
	q       []engine.Dist
}

// add appends the children a row of the drafter gave parent (−1: the
// context's last token), skipping those below p_min; each scores its
// log-probability, or where scores is set (a keyed tree's) scores[i].
func (t *draftTree) add(parent int, top []sampling.TokenLogprob, scores []float64) {
	base, depth := 0.0, 1
	if parent >= 0 {
		base, depth = t.score[parent], t.nodes[parent].Depth+1
	}
	for i, c := range top {
		if !t.sampled && t.pmin > 0 && math.Exp(float64(c.Logprob)) < t.pmin {
			continue
		}
		s := float64(c.Logprob)
		if scores != nil {
			s = scores[i]
		}
		t.nodes = append(t.nodes, DraftNode{Token: engine.Token{ID: c.Token, Logprob: c.Logprob}, Parent: parent, Depth: depth})
		t.score = append(t.score, base+s)
		t.dslot = append(t.dslot, -1)
		t.fresh = append(t.fresh, len(t.nodes)-1)
	}
}

// frontier is the b best-scored of the last level's new nodes. A sampled
// tree does not expand a node the drafter gave less than p_min (a greedy
// tree never added one).
func (t *draftTree) frontier(b int) []int {
	f := slices.Clone(t.fresh)
	if t.sampled && t.pmin > 0 {
		f = slices.DeleteFunc(f, func(n int) bool { return math.Exp(float64(t.nodes[n].Logprob)) < t.pmin })
	}
	sort.SliceStable(f, func(i, j int) bool { return t.score[f[i]] > t.score[f[j]] })
	return f[:min(b, len(f))]
}

// choose keeps the n best-scored nodes whose ancestors are kept too,
// ordered parents first, and marks them Verified.
func (t *draftTree) choose(n int) {
	order := make([]int, len(t.nodes))
	for i := range order {
		order[i] = i
	}
	// Best score first; a shallower node first on a tie, so that a child
	// that scores as its parent (probability 1) never comes before it.
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if t.score[a] != t.score[b] {
			return t.score[a] > t.score[b]
		}
		return t.nodes[a].Depth < t.nodes[b].Depth
	})
	t.row = make([]int, len(t.nodes))
	for i := range t.row {
		t.row[i] = -1
	}
	var chosen []int
	for _, i := range order {
		if len(chosen) == n {
			break
		}
		if p := t.nodes[i].Parent; p >= 0 && !t.nodes[p].Verified {
			continue
		}
		t.nodes[i].Verified = true
		chosen = append(chosen, i)
	}
	// Parents first: by depth, then by node index (the drafter's order).
	sort.SliceStable(chosen, func(i, j int) bool {
		a, b := chosen[i], chosen[j]
		if t.nodes[a].Depth != t.nodes[b].Depth {
			return t.nodes[a].Depth < t.nodes[b].Depth
		}
		return a < b
	})
	t.kept = chosen
	for r, i := range chosen {
		t.row[i] = r
	}
}

// treeWidth is the b a generation drafts with (1: a chain).
func (gn *gen) treeWidth() int {
	if gn.remote != nil || !gn.req.Sampling.Greedy() && !gn.sampled && !gn.keyed {
		return 1
	}
	return gn.topK
}

// expand asks the drafter for the children of the nodes of f (−1: the
// root) in one pass entry: greedily their b most likely next tokens;
// keyed, each row's coupled draw and its keyedList most likely tokens,
// for gumbelTop; sampled, m distinct draws from the drafter's
// distribution with m fixed before drawing (what the node budget leaves),
// all of them kept.
func (t *draftTree) expand(gn *gen, f []int, b, budget int) *engine.VerifyEntry {
	en := &engine.VerifyEntry{Seq: gn.draft, Out: len(f)}
	if gn.head {
		en.Target = gn.target
	}
	if f[0] < 0 {
		en.Tokens = gn.pendingDraft()
	} else {
		line := len(gn.context) - 1 // the drafter's last line slot
		for j, n := range f {
			en.Tokens = append(en.Tokens, t.nodes[n].ID)
			parent := line
			if p := t.nodes[n].Parent; p >= 0 {
				parent = t.dslot[p]
			}
			en.Parents = append(en.Parents, parent)
			t.dslot[n] = gn.draft.Len() + j
		}
		t.drafts += len(f)
	}
	if t.keyed {
		en.TopN, en.Sampling, en.Draws = keyedList(b), t.params, make([]sampling.Draw, len(f))
		for j, n := range f {
			en.Draws[j] = t.keys.At(t.position(n))
		}
		return en
	}
	if !t.sampled {
		en.TopN = b
		return en
	}
	en.Sampling = gn.req.Sampling
	en.Propose = make([][]float32, len(f))
	for j := range f {
		m := min(b, budget)
		budget -= m
		for range m {
			en.Propose[j] = append(en.Propose[j], gn.rng.Float32())
		}
	}
	return en
}

// position is the position the row of node n decides (−1: the root's,
// the context's end): a keyed row's key.
func (t *draftTree) position(n int) int {
	if n < 0 {
		return t.ctx
	}
	return t.ctx + t.nodes[n].Depth
}

// keyedList is how many of its most likely tokens a keyed tree's drafter
// row lists for gumbelTop to rank under the row's noise: twice the
// children a node, at least 8, within the read-out's MaxTopN.
func keyedList(b int) int { return min(engine.MaxTopN, max(2*b, 8)) }

// gumbelTop is a keyed row's b children: its coupled draw (row.Sample, the
// Gumbel-max draw from the drafter's distribution under key d, over the
// whole vocabulary), then the tokens of its Top list with the largest
// log-probability/T + Gumbel noise under the same key — the Gumbel-top-b
// of the list, a draw without replacement from the drafter's distribution
// there — best first. Each child scores the log-softmax of its noisy
// value among the children's: how likely it is to be the target's draw
// under that key where p is q give or take a Gumbel's scale, so that the
// coupled draw leads its siblings however likely they are.
func gumbelTop(row engine.VerifyRow, b int, T float32, d sampling.Draw) ([]sampling.TokenLogprob, []float64) {
	k0, k1 := d.Key()
	noisy := func(c sampling.TokenLogprob) float64 { return float64(c.Logprob/T + sampling.Gumbel(k0, k1, c.Token)) }
	first := sampling.TokenLogprob{Token: row.Sample, Logprob: row.SampleLogprob}
	rest := slices.DeleteFunc(slices.Clone(row.Top), func(c sampling.TokenLogprob) bool { return c.Token == first.Token })
	slices.SortStableFunc(rest, func(a, c sampling.TokenLogprob) int {
		switch va, vc := noisy(a), noisy(c); {
		case va > vc:
			return -1
		case va < vc:
			return 1
		}
		return a.Token - c.Token
	})
	out := append([]sampling.TokenLogprob{first}, rest[:min(b-1, len(rest))]...)
	v := make([]float64, len(out))
	for i, c := range out {
		v[i] = noisy(c)
	}
	v[0] = max(v[0], slices.Max(v)) // the draw is the row's largest (a listed token's f32 value may round past it)
	lse := v[0] + math.Log(sumExp(v, v[0]))
	for i := range v {
		v[i] -= lse
	}
	return out, v
}

// sumExp is Σ exp(v[i] − m).
func sumExp(v []float64, m float64) float64 {
	var s float64
	for _, x := range v {
		s += math.Exp(x - m)
	}
	return s
}

// grow adds the children a pass gave the nodes of f.
func (t *draftTree) grow(f []int, rows []engine.VerifyRow, b int) {
	for j, n := range f {
		if t.keyed {
			top, scores := gumbelTop(rows[j], b, t.params.Temperature, t.keys.At(t.position(n)))
			t.add(n, top, scores)
			continue
		}
		if !t.sampled {
			t.add(n, rows[j].Top, nil)
			continue
		}
		r := rows[j]
		first := len(t.nodes)
		top := make([]sampling.TokenLogprob, len(r.Drawn))
		for k, x := range r.Drawn {
			top[k] = sampling.TokenLogprob{Token: x, Logprob: r.DrawnLogprob[k]}
		}
		t.add(n, top, nil)
		if n < 0 {
			t.rootQ = r.Q
		} else {
			t.q[n] = r.Q
		}
		for c := first; c < len(t.nodes); c++ {
			t.q = append(t.q, nil)
		}
	}
}

// treeDrafts drafts a tree for each of gens, level by level: level 0 feeds
// each generation's pending tokens and reads the children of the root
// (the context's last token); each later level feeds every generation's
// frontier — its best-scored new nodes — as tree nodes and reads their
// children. A greedy tree then keeps its TreeNodes best-scored nodes; a
// sampled one keeps every node it drew, the budget having bounded the
// draws (pruning a drawn child by its value would bias the rule).
func (r *runner) treeDrafts(ctx context.Context, gens []*gen) ([]*draftTree, error) {
	d := r.g.drafter
	trees := make([]*draftTree, len(gens))
	batch := make([]*engine.VerifyEntry, len(gens))
	root := []int{-1}
	for i, gn := range gens {
		trees[i] = &draftTree{pmin: gn.req.PMin, sampled: gn.sampled, keyed: gn.keyed, keys: gn.keys, params: gn.req.Sampling, ctx: len(gn.context)}
		batch[i] = trees[i].expand(gn, root, gn.treeWidth(), gn.treeNodes(r.g))
	}
	if err := d.Verify(ctx, batch); err != nil {
		return nil, err
	}
	for i, v := range batch {
		trees[i].grow(root, v.Rows, gens[i].treeWidth())
	}
	for level := 1; ; level++ {
		batch, who := batch[:0], []int(nil)
		var frontiers [][]int
		for i, gn := range gens {
			t := trees[i]
			b, budget := gn.treeWidth(), gn.treeNodes(r.g)-len(t.nodes)
			room := min(MaxTreeNodes-t.drafts, d.Config().MaxPositionEmbeddings-gn.draft.Len())
			width := min(b, room)
			if t.sampled {
				width = min(width, (budget+b-1)/b) // whole sets of children, the last cut to the budget
			}
			f := t.frontier(width)
			t.fresh = t.fresh[:0]
			if level >= gn.draftLen(r.g) || len(f) == 0 || t.sampled && budget <= 0 {
				continue
			}
			batch, who, frontiers = append(batch, t.expand(gn, f, b, budget)), append(who, i), append(frontiers, f)
		}
		if len(batch) == 0 {
			break
		}
		if err := d.Verify(ctx, batch); err != nil {
			return nil, err
		}
		for b, i := range who {
			trees[i].grow(frontiers[b], batch[b].Rows, gens[i].treeWidth())
		}
	}
	for i, gn := range gens {
		n := gn.treeNodes(r.g)
		if trees[i].sampled {
			n = len(trees[i].nodes)
		}
		trees[i].choose(n)
	}
	return trees, nil
}

// treeVerifyEntry is gn's part of the target's pass for a tree: its
// pending tokens, then the kept nodes, every node and the last pending
// token read out.
func (gn *gen) treeVerifyEntry(t *draftTree) *engine.VerifyEntry {
	pending := gn.pendingTarget()
	v := &engine.VerifyEntry{Seq: gn.target, Tokens: slices.Clip(slices.Clone(pending)), Out: len(t.kept) + 1, TopN: gn.req.TopN}
	v.Parents = make([]int, len(pending), len(pending)+len(t.kept))
	for i := range v.Parents {
		v.Parents[i] = treemask.Line
	}
	line := len(gn.context) - 1 // the target's last line slot once pending is fed
	for _, n := range t.kept {
		v.Tokens = append(v.Tokens, t.nodes[n].ID)
		parent := line
		if p := t.nodes[n].Parent; p >= 0 {
			parent = line + 1 + t.row[p]
		}
		v.Parents = append(v.Parents, parent)
	}
	switch {
	case t.keyed:
		v.Sampling, v.Draws = t.params, make([]sampling.Draw, v.Out)
		v.Draws[0] = t.keys.At(t.position(-1))
		for r, n := range t.kept {
			v.Draws[1+r] = t.keys.At(t.position(n))
		}
	case t.sampled:
		v.Sampling = gn.req.Sampling
		v.Tree = t.sampledTree(gn)
	}
	return v
}

// sampledTree is the tree for the target's rule: read-out row 0 the root,
// row 1 + r the r-th kept node; each node's children in draw order (the
// order add appended them), the drafter's distribution there, and fresh
// uniforms.
func (t *draftTree) sampledTree(gn *gen) *engine.SampledTree {
	st := &engine.SampledTree{Nodes: make([]engine.SampledNode, len(t.kept)+1)}
	for n := range t.nodes {
		if t.row[n] < 0 {
			continue
		}
		at := 0 // the parent's row
		if p := t.nodes[n].Parent; p >= 0 {
			at = 1 + t.row[p]
		}
		node := &st.Nodes[at]
		node.Children = append(node.Children, 1+t.row[n])
		node.U = append(node.U, gn.rng.Float32())
	}
	for j := range st.Nodes {
		st.Nodes[j].V = gn.rng.Float32()
		if len(st.Nodes[j].Children) == 0 {
			continue
		}
		if j == 0 {
			st.Nodes[j].Q = t.rootQ
		} else {
			st.Nodes[j].Q = t.q[t.kept[j-1]]
		}
	}
	return st
}

// acceptTree applies the target's verdict on a tree (draftTree.walk): both
// caches keep the accepted path, moved into place, and the step is
// emitted and counted as a chain's (settle). It returns how many draft
// tokens were accepted and how many tokens were emitted.
func (gn *gen) acceptTree(t *draftTree, v *engine.VerifyEntry, now time.Time, st *StepStats) (int, int, error) {
	var tokens []Token
	var path []int
	if t.sampled {
		tokens, path = sampledPath(t, v)
	} else {
		tokens, path = t.walk(v.Rows)
	}
	first := len(gn.context) // the target's slot of the first kept node
	target := make([]int, len(path))
	var draft []int
	for i, n := range path {
		target[i] = first + t.row[n]
		if t.dslot[n] >= 0 && len(draft) == i { // the drafter fed a prefix of the path
			draft = append(draft, t.dslot[n])
		}
	}
	if err := gn.target.KeepPath(target); err != nil {
		return 0, 0, fmt.Errorf("target: %w", err)
	}
	if err := gn.draft.KeepPath(draft); err != nil {
		return 0, 0, fmt.Errorf("drafter: %w", err)
	}
	step := Step{Draft: t.chainOf(path), Accepted: len(path), Tree: t.nodes, Tokens: tokens, DraftTime: st.Draft, VerifyTime: st.Verify, Fused: st.Fused}
	return len(path), gn.settle(&step, len(t.kept), now), nil
}

// walk walks a verified tree from the root: while the target's token
// after the path so far — its greedy token, or a keyed tree's coupled
// draw — is a kept child, that child is accepted. It returns the step's
// tokens (the accepted path's and the target's own after it) and the
// accepted nodes.
func (t *draftTree) walk(rows []engine.VerifyRow) ([]Token, []int) {
	var tokens []Token
	var path []int
	at, row := -1, 0 // the current node (−1: the root) and its row
	for {
		want := rows[row]
		id, lp := want.Argmax, want.ArgmaxLogprob
		if t.keyed {
			id, lp = want.Sample, want.SampleLogprob
		}
		next := -1
		for _, n := range t.kept {
			if t.nodes[n].Parent == at && t.nodes[n].ID == id {
				next = n
				break
			}
		}
		if next < 0 {
			tokens = append(tokens, Token{ID: id, Logprob: lp, Top: want.Top})
			return tokens, path
		}
		t.nodes[next].Accepted = true
		tokens = append(tokens, Token{ID: id, Logprob: lp, Top: want.Top, Drafted: true})
		path = append(path, next)
		at, row = next, 1+t.row[next]
	}
}

// sampledPath is the path the target's rule accepted in a sampled tree
// (engine.SampledTree) as draftTree.walk gives a greedy one: the accepted
// tokens, then the token drawn after them.
func sampledPath(t *draftTree, v *engine.VerifyEntry) ([]Token, []int) {
	var tokens []Token
	var path []int
	for i, row := range v.Tree.Path {
		n := t.kept[row-1]
		t.nodes[n].Accepted = true
		tokens = append(tokens, Token{ID: t.nodes[n].ID, Logprob: v.Tree.Logprobs[i], Top: v.Rows[rowBefore(v.Tree, i)].Top, Drafted: true})
		path = append(path, n)
	}
	b := v.Tree.Bonus
	tokens = append(tokens, Token{ID: b.Token, Logprob: b.Logprob, Top: v.Rows[rowBefore(v.Tree, len(v.Tree.Path))].Top})
	return tokens, path
}

// rowBefore is the read-out row whose distribution gave the i-th token of
// an accepted path (the bonus token when i is the path's length).
func rowBefore(st *engine.SampledTree, i int) int {
	if i == 0 {
		return 0
	}
	return st.Path[i-1]
}

// chainOf is the tree's accepted path followed by the drafter's best-scored
// continuation below it among the verified nodes: what the step shows as
// its draft, so that Draft[:Accepted] is the accepted tokens and
// Draft[Accepted] the first the target refused.
func (t *draftTree) chainOf(path []int) []engine.Token {
	var out []engine.Token
	at := -1
	for _, n := range path {
		out = append(out, t.nodes[n].Token)
		at = n
	}
	for {
		best := -1
		for _, n := range t.kept {
			if t.nodes[n].Parent == at && (best < 0 || t.score[n] > t.score[best]) {
				best = n
			}
		}
		if best < 0 {
			return out
		}
		out = append(out, t.nodes[best].Token)
		at = best
	}
}

// treeSteps are the ready generations' steps for a tree drafted on the
// device and verified in one submission (engine.TreeFuser), or nil where
// the step does not fuse: a prompt chunk being fed, a generation that
// drafts no greedy tree of its own (a chain, a remote draft, a keyed or
// sampled tree) or cuts it by p_min, an EAGLE-3 head's over a target that holds
// no position yet, a tree past either model's context, or shapes the
// drafter does not fuse.
func (r *runner) treeSteps(ready []*gen, draftFill []*engine.Entry, targetFill []*engine.VerifyEntry) []engine.TreeStep {
	g := r.g
	f, ok := g.drafter.(engine.TreeFuser)
	if !ok || g.opts.Unfused || len(draftFill) > 0 || len(targetFill) > 0 || len(ready) == 0 {
		return nil
	}
	steps := make([]engine.TreeStep, len(ready))
	for i, gn := range ready {
		k, b, n := gn.draftLen(g), gn.treeWidth(), gn.treeNodes(g)
		switch {
		case gn.remote != nil || !gn.req.Sampling.Greedy() || b < 2 || k == 0 || n == 0 || gn.req.PMin > 0 || gn.head && gn.target.Len() == 0:
			return nil
		case len(gn.context)+(k-1)*b > g.drafter.Config().MaxPositionEmbeddings:
			return nil
		}
		steps[i] = engine.TreeStep{
			Draft:  &engine.Entry{Seq: gn.draft, Tokens: gn.pendingDraft()},
			Verify: &engine.VerifyEntry{Seq: gn.target, Tokens: slices.Clone(gn.pendingTarget()), TopN: gn.req.TopN},
			Width:  b, Depth: k, Nodes: n,
		}
		if gn.head {
			steps[i].Draft.Target = gn.target
		}
	}
	if !f.FusesTree(g.target, steps) {
		return nil
	}
	return steps
}

// fusedTrees drafts and verifies the steps' trees in one call and returns
// them as treeDrafts and the target's Verify leave them.
func (r *runner) fusedTrees(ctx context.Context, steps []engine.TreeStep) ([]*draftTree, []*engine.VerifyEntry, error) {
	if err := r.g.drafter.(engine.TreeFuser).DraftVerifyTree(ctx, r.g.target, steps); err != nil {
		return nil, nil, fmt.Errorf("drafter and target: %w", err)
	}
	trees := make([]*draftTree, len(steps))
	verify := make([]*engine.VerifyEntry, len(steps))
	for i, s := range steps {
		trees[i], verify[i] = deviceTree(s.Tree), s.Verify
	}
	return trees, verify, nil
}

// deviceTree is a tree drafted on the device as the host's drafting would
// leave it, verified.
func deviceTree(nodes []engine.TreeNode) *draftTree {
	t := &draftTree{row: make([]int, len(nodes))}
	var kept []int
	for k, n := range nodes {
		t.nodes = append(t.nodes, DraftNode{Token: n.Token, Parent: n.Parent, Depth: n.Depth, Verified: n.Row >= 0})
		t.score = append(t.score, n.Score)
		t.dslot = append(t.dslot, n.DraftSlot)
		t.row[k] = n.Row
		if n.Row >= 0 {
			kept = append(kept, k)
		}
		if n.DraftSlot >= 0 {
			t.drafts++
		}
	}
	sort.Slice(kept, func(i, j int) bool { return t.row[kept[i]] < t.row[kept[j]] })
	t.kept = kept
	return t
}
