package webgpu

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"

	"webdraft/engine"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
	"webdraft/treemask"
)

// treeCase is a generation's context and shape for DraftVerifyTree: the
// drafter's cache holds all of the context but dPend tokens, the
// target's all but tPend.
type treeCase struct {
	ctx                 []int
	dPend, tPend        int
	width, depth, nodes int
}

func (p *sampledPair) treeSteps(cases []treeCase) []engine.TreeStep {
	steps := make([]engine.TreeStep, len(cases))
	for i, c := range cases {
		steps[i] = engine.TreeStep{
			Draft:  &engine.Entry{Seq: p.seq(p.drafter, c.ctx[:len(c.ctx)-c.dPend]), Tokens: slices.Clone(c.ctx[len(c.ctx)-c.dPend:])},
			Verify: &engine.VerifyEntry{Seq: p.seq(p.target, c.ctx[:len(c.ctx)-c.tPend]), Tokens: slices.Clone(c.ctx[len(c.ctx)-c.tPend:])},
			Width:  c.width, Depth: c.depth, Nodes: c.nodes,
		}
	}
	return steps
}

// path is node k's tokens from the root down.
func path(tree []engine.TreeNode, k int) []int {
	var out []int
	for ; k >= 0; k = tree[k].Parent {
		out = append([]int{tree[k].ID}, out...)
	}
	return out
}

// TestDraftVerifyTree: trees drafted level by level on the device and
// verified in the same submission, for steps of several shapes side by
// side, are the trees the host would draft: each explored node's children
// are the drafter's most likely tokens after its path (as a plain Step
// reads them), each level's frontier the best-scored of its new nodes, the
// verified nodes the best-scored of all, parents first, and each verified
// node's row the target's read-out after its path; both caches hold the
// pending tokens and the tree, so that a kept path continues as its line.
func TestDraftVerifyTree(t *testing.T) {
	ctx := context.Background()
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{KVBytes: 64 << 20, MaxSequences: 256})
	cases := []treeCase{
		{ctx: p.tokens(6), dPend: 1, tPend: 1, width: 2, depth: 3, nodes: 5},
		{ctx: p.tokens(9), dPend: 2, tPend: 1, width: 4, depth: 2, nodes: 16},
		{ctx: p.tokens(4), dPend: 1, tPend: 3, width: 3, depth: 4, nodes: 64},
		// 40 fed nodes: masks past a word.
		{ctx: p.tokens(7), dPend: 1, tPend: 1, width: 8, depth: 6, nodes: 64},
	}
	steps := p.treeSteps(cases)
	if !p.drafter.FusesTree(p.target, steps) {
		t.Fatal("FusesTree refused the steps")
	}
	lens := make([][2]int, len(steps))
	for i, s := range steps {
		lens[i] = [2]int{s.Draft.Seq.Len(), s.Verify.Seq.Len()}
	}
	if err := p.drafter.DraftVerifyTree(ctx, p.target, steps); err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		c := cases[i]
		tree := s.Tree
		n := min(c.nodes, len(tree))
		chosen := checkDeviceTree(t, fmt.Sprintf("step %d", i), s, len(c.ctx), c.tPend)
		if got, want := s.Draft.Seq.Len(), lens[i][0]+c.dPend+(c.depth-1)*c.width; got != want {
			t.Errorf("step %d: drafter Len %d, want %d", i, got, want)
		}
		if got, want := s.Verify.Seq.Len(), lens[i][1]+c.tPend+n; got != want {
			t.Errorf("step %d: target Len %d, want %d", i, got, want)
		}
		// Children: the drafter's most likely tokens after each explored
		// node's path (the root's: after the context).
		explored := []int{-1}
		for k, nd := range tree {
			if nd.DraftSlot >= 0 {
				explored = append(explored, k)
			}
		}
		for _, k := range explored {
			prefix := c.ctx
			if k >= 0 {
				prefix = append(slices.Clone(c.ctx), path(tree, k)...)
			}
			en := &engine.Entry{Seq: p.seq(p.drafter, prefix[:len(prefix)-1]), Tokens: prefix[len(prefix)-1:], TopN: c.width + 2}
			if err := p.drafter.Step(ctx, []*engine.Entry{en}); err != nil {
				t.Fatal(err)
			}
			checkChildren(t, fmt.Sprintf("step %d", i), tree, k, en.Top, c.width, 2e-3)
		}
		// The target's rows: its read-out after each verified path.
		for r := -1; r < n; r++ {
			prefix := c.ctx
			if r >= 0 {
				prefix = append(slices.Clone(c.ctx), path(tree, chosen[r])...)
			}
			v := &engine.VerifyEntry{Seq: p.seq(p.target, prefix[:len(prefix)-1]), Tokens: prefix[len(prefix)-1:], Out: 1, TopN: 2}
			if err := p.target.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
			got, want := s.Verify.Rows[r+1], v.Rows[0]
			nearTie := len(want.Top) == 2 && want.Top[0].Logprob-want.Top[1].Logprob < 1e-3
			if got.Argmax != want.Argmax && !nearTie || math.Abs(float64(got.ArgmaxLogprob-want.ArgmaxLogprob)) > 2e-3 {
				t.Errorf("step %d row %d: argmax %d (%v), alone %d (%v)", i, r+1, got.Argmax, got.ArgmaxLogprob, want.Argmax, want.ArgmaxLogprob)
			}
		}
		// The deepest verified node's path kept in both caches continues as
		// its line does.
		last := chosen[n-1]
		keep := path(tree, last)
		var tslots, dslots []int
		for k := last; k >= 0; k = tree[k].Parent {
			tslots = append([]int{len(c.ctx) + tree[k].Row}, tslots...)
			if tree[k].DraftSlot >= 0 {
				dslots = append([]int{tree[k].DraftSlot}, dslots...)
			} else {
				dslots = nil // only a fed prefix is kept
			}
		}
		if err := s.Verify.Seq.KeepPath(tslots); err != nil {
			t.Fatal(err)
		}
		line := append(slices.Clone(c.ctx), keep...)
		next := &engine.VerifyEntry{Seq: s.Verify.Seq, Tokens: []int{s.Verify.Rows[n].Argmax}, Out: 1, Sampling: sampling.Params{}}
		fresh := &engine.VerifyEntry{Seq: p.seq(p.target, line), Tokens: []int{s.Verify.Rows[n].Argmax}, Out: 1}
		if err := p.target.Verify(ctx, []*engine.VerifyEntry{next}); err != nil {
			t.Fatal(err)
		}
		if err := p.target.Verify(ctx, []*engine.VerifyEntry{fresh}); err != nil {
			t.Fatal(err)
		}
		if math.Abs(float64(next.Rows[0].ArgmaxLogprob-fresh.Rows[0].ArgmaxLogprob)) > 2e-3 {
			t.Errorf("step %d: after the kept path the target reads %+v, its line %+v", i, next.Rows[0], fresh.Rows[0])
		}
		if err := s.Draft.Seq.KeepPath(dslots); err != nil {
			t.Fatal(err)
		}
		if got, want := s.Draft.Seq.Len(), len(c.ctx)+len(dslots); got != want {
			t.Errorf("step %d: drafter Len %d after keeping %d nodes, want %d", i, got, len(dslots), want)
		}
	}
}

// checkChildren checks node k's children in a tree drafted on the device
// (k = −1: the root's) against the top tokens the drafter reads out after
// its path when asked alone: width of them, each among top with its
// log-probability within tol, in descending order.
func checkChildren(t *testing.T, what string, tree []engine.TreeNode, k int, top []sampling.TokenLogprob, width int, tol float64) {
	t.Helper()
	want := map[int]float32{}
	for _, tl := range top {
		want[tl.Token] = tl.Logprob
	}
	var kids []engine.TreeNode
	for _, nd := range tree {
		if nd.Parent == k {
			kids = append(kids, nd)
		}
	}
	if len(kids) != width {
		t.Fatalf("%s node %d: %d children, want %d", what, k, len(kids), width)
	}
	for j, kid := range kids {
		lp, ok := want[kid.ID]
		if !ok || math.Abs(float64(lp-kid.Logprob)) > tol || j > 0 && kid.Logprob > kids[j-1].Logprob {
			t.Errorf("%s node %d: child %d token %d log-probability %v; the drafter's top %v", what, k, j, kid.ID, kid.Logprob, top)
		}
	}
}

// checkDeviceTree checks a step's tree drafted on the device (its Tree and
// its target entry as DraftVerifyTree leaves them; ctxLen the context's
// tokens, tPend the target's pending ones) for what the host's drafting
// would choose — Width + (Depth−1)·Width² nodes; at each depth below
// Depth the Width best-scored nodes fed (ties to the lower index); the
// Nodes best-scored verified (by score, then depth), rows parents first
// (by depth, then index), each row's token and parent in the target's
// entry — and returns the verified nodes by row.
func checkDeviceTree(t *testing.T, what string, s engine.TreeStep, ctxLen, tPend int) []int {
	t.Helper()
	tree := s.Tree
	if want := s.Width + (s.Depth-1)*s.Width*s.Width; len(tree) != want {
		t.Fatalf("%s: %d nodes, want %d", what, len(tree), want)
	}
	n := min(s.Nodes, len(tree))
	if len(s.Verify.Rows) != n+1 || len(s.Verify.Tokens) != tPend+n {
		t.Fatalf("%s: %d rows and %d tokens verified, want %d and %d", what, len(s.Verify.Rows), len(s.Verify.Tokens), n+1, tPend+n)
	}
	for d := 1; d < s.Depth; d++ {
		var level []int
		for k, nd := range tree {
			if nd.Depth == d {
				level = append(level, k)
			}
		}
		sort.SliceStable(level, func(a, b int) bool { return tree[level[a]].Score > tree[level[b]].Score })
		for j, k := range level {
			if fed := tree[k].DraftSlot >= 0; fed != (j < s.Width) {
				t.Errorf("%s depth %d: node %d (rank %d, score %v) fed %v", what, d, k, j, tree[k].Score, fed)
			}
		}
	}
	order := make([]int, len(tree))
	for k := range order {
		order[k] = k
	}
	sort.SliceStable(order, func(a, b int) bool {
		x, y := tree[order[a]], tree[order[b]]
		if x.Score != y.Score {
			return x.Score > y.Score
		}
		return x.Depth < y.Depth
	})
	chosen := slices.Clone(order[:n])
	sort.SliceStable(chosen, func(a, b int) bool {
		if x, y := tree[chosen[a]], tree[chosen[b]]; x.Depth != y.Depth {
			return x.Depth < y.Depth
		}
		return chosen[a] < chosen[b]
	})
	for r, k := range chosen {
		if tree[k].Row != r {
			t.Fatalf("%s: node %d verified as row %d, want %d", what, k, tree[k].Row, r)
		}
		parent := ctxLen - 1
		if q := tree[k].Parent; q >= 0 {
			parent = ctxLen + tree[q].Row
		}
		if s.Verify.Tokens[tPend+r] != tree[k].ID || s.Verify.Parents[tPend+r] != parent || s.Verify.Parents[0] != treemask.Line {
			t.Errorf("%s row %d: token %d parent %d, want %d under %d", what, r, s.Verify.Tokens[tPend+r], s.Verify.Parents[tPend+r], tree[k].ID, parent)
		}
	}
	return chosen
}

// TestFusesTree: what DraftVerifyTree refuses, before changing anything.
func TestFusesTree(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{MaxRows: 16})
	ok := treeCase{ctx: p.tokens(5), dPend: 1, tPend: 1, width: 2, depth: 3, nodes: 8}
	for _, bad := range []struct {
		name  string
		c     treeCase
		spoil func(s *engine.TreeStep)
	}{
		{"17 children a node", treeCase{ctx: ok.ctx, dPend: 1, tPend: 1, width: 17, depth: 2, nodes: 8}, nil},
		{"a drafter tree past 64 slots", treeCase{ctx: ok.ctx, dPend: 1, tPend: 1, width: 8, depth: 10, nodes: 8}, nil},
		{"a node table past 1,024 rows", treeCase{ctx: ok.ctx, dPend: 1, tPend: 1, width: 16, depth: 5, nodes: 8}, nil},
		{"a sampling target", ok, func(s *engine.TreeStep) { s.Verify.Sampling = sampling.Params{Temperature: 0.7} }},
		{"more rows than a pass", treeCase{ctx: ok.ctx, dPend: 1, tPend: 1, width: 4, depth: 2, nodes: 16}, nil},
		{"no nodes", treeCase{ctx: ok.ctx, dPend: 1, tPend: 1, width: 2, depth: 3, nodes: 0}, nil},
	} {
		steps := p.treeSteps([]treeCase{bad.c})
		if bad.spoil != nil {
			bad.spoil(&steps[0])
		}
		if p.drafter.FusesTree(p.target, steps) {
			t.Errorf("%s: fused", bad.name)
		}
		n := steps[0].Verify.Seq.Len()
		if err := p.drafter.DraftVerifyTree(context.Background(), p.target, steps); err == nil || steps[0].Verify.Seq.Len() != n {
			t.Errorf("%s: DraftVerifyTree err %v, target Len %d → %d", bad.name, err, n, steps[0].Verify.Seq.Len())
		}
	}
	if !p.drafter.FusesTree(p.target, p.treeSteps([]treeCase{ok})) || p.drafter.FusesTree(p.drafter, p.treeSteps([]treeCase{ok})) {
		t.Error("FusesTree: want the group's target only")
	}
}
