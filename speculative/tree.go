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
}

// add appends the children a row of the drafter gave parent (−1: the
// context's last token), skipping those below p_min.
func (t *draftTree) add(parent int, top []sampling.TokenLogprob) {
	base, depth := 0.0, 1
	if parent >= 0 {
		base, depth = t.score[parent], t.nodes[parent].Depth+1
	}
	for _, c := range top {
		if t.pmin > 0 && math.Exp(float64(c.Logprob)) < t.pmin {
			continue
		}
		t.nodes = append(t.nodes, DraftNode{Token: engine.Token{ID: c.Token, Logprob: c.Logprob}, Parent: parent, Depth: depth})
		t.score = append(t.score, base+float64(c.Logprob))
		t.dslot = append(t.dslot, -1)
		t.fresh = append(t.fresh, len(t.nodes)-1)
	}
}

// frontier is the b best-scored of the last level's new nodes.
func (t *draftTree) frontier(b int) []int {
	f := slices.Clone(t.fresh)
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
	if gn.remote != nil || !gn.req.Sampling.Greedy() {
		return 1
	}
	return gn.topK
}

// treeDrafts drafts a tree for each of gens (every one drafting, b > 1):
// level 0 feeds each generation's pending tokens and reads the b most
// likely tokens after them; each later level feeds every generation's
// frontier as tree nodes and reads each node's b most likely children.
func (r *runner) treeDrafts(ctx context.Context, gens []*gen) ([]*draftTree, error) {
	d := r.g.drafter
	trees := make([]*draftTree, len(gens))
	batch := make([]*engine.VerifyEntry, len(gens))
	for i, gn := range gens {
		trees[i] = &draftTree{pmin: gn.req.PMin}
		batch[i] = &engine.VerifyEntry{Seq: gn.draft, Tokens: gn.pendingDraft(), Out: 1, TopN: gn.topK}
	}
	if err := d.Verify(ctx, batch); err != nil {
		return nil, err
	}
	for i, v := range batch {
		trees[i].add(-1, v.Rows[0].Top)
	}
	for level := 1; ; level++ {
		batch, who := batch[:0], []int(nil)
		var frontiers [][]int
		for i, gn := range gens {
			t := trees[i]
			k := gn.draftLen(r.g)
			b := gn.topK
			room := min(MaxTreeNodes-t.drafts, d.Config().MaxPositionEmbeddings-gn.draft.Len())
			f := t.frontier(min(b, room))
			t.fresh = t.fresh[:0]
			if level >= k || len(f) == 0 {
				continue
			}
			line := len(gn.context) - 1 // the drafter's last line slot
			en := &engine.VerifyEntry{Seq: gn.draft, Out: len(f), TopN: b}
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
			batch, who, frontiers = append(batch, en), append(who, i), append(frontiers, f)
		}
		if len(batch) == 0 {
			break
		}
		if err := d.Verify(ctx, batch); err != nil {
			return nil, err
		}
		for b, i := range who {
			for j, n := range frontiers[b] {
				trees[i].add(n, batch[b].Rows[j].Top)
			}
		}
	}
	for i, gn := range gens {
		trees[i].choose(gn.treeNodes(r.g))
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
	return v
}

// acceptTree applies the target's verdict on a tree (walkTree): both
// caches keep the accepted path, moved into place, and the step is
// emitted and counted as a chain's (settle). It returns how many draft
// tokens were accepted and how many tokens were emitted.
func (gn *gen) acceptTree(t *draftTree, rows []engine.VerifyRow, now time.Time, draftTime, verifyTime time.Duration) (int, int, error) {
	tokens, path := walkTree(t, rows)
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
	step := Step{Draft: t.chainOf(path), Accepted: len(path), Tree: t.nodes, Tokens: tokens, DraftTime: draftTime, VerifyTime: verifyTime}
	return len(path), gn.settle(&step, len(t.kept), now), nil
}

// walkTree walks a verified tree from the root: while the target's greedy
// token after the path so far is a kept child, that child is accepted. It
// returns the step's tokens (the accepted path's and the target's own
// after it) and the accepted nodes.
func walkTree(t *draftTree, rows []engine.VerifyRow) ([]Token, []int) {
	var tokens []Token
	var path []int
	at, row := -1, 0 // the current node (−1: the root) and its row
	for {
		want := rows[row]
		next := -1
		for _, n := range t.kept {
			if t.nodes[n].Parent == at && t.nodes[n].ID == want.Argmax {
				next = n
				break
			}
		}
		if next < 0 {
			tokens = append(tokens, Token{ID: want.Argmax, Logprob: want.ArgmaxLogprob, Top: want.Top})
			return tokens, path
		}
		t.nodes[next].Accepted = true
		tokens = append(tokens, Token{ID: want.Argmax, Logprob: want.ArgmaxLogprob, Top: want.Top, Drafted: true})
		path = append(path, next)
		at, row = next, 1+t.row[next]
	}
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
