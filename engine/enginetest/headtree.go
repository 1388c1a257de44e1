package enginetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"webdraft/engine"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/treemask"
)

// headTree is a token tree a head sequence drafted past its line: node
// i's token, its parent (−1: a root, the line's last token's child) and
// its slot in the head's cache.
type headTree struct {
	line   []int
	tok    []int
	parent []int
	slot   []int
}

// add records the nodes a Verify fed at slots at, at+1, …
func (tr *headTree) add(at int, toks, parents []int) {
	for j, tok := range toks {
		tr.tok, tr.parent, tr.slot = append(tr.tok, tok), append(tr.parent, parents[j]), append(tr.slot, at+j)
	}
}

// parentSlot is node i's parent slot: the line's last for a root.
func (tr *headTree) parentSlot(i int) int {
	if p := tr.parent[i]; p >= 0 {
		return tr.slot[p]
	}
	return len(tr.line) - 1
}

// path is the text that reaches node i as a chain: the line, then the
// node's ancestors, root first, and the node.
func (tr *headTree) path(i int) []int {
	var up []int
	for n := i; n >= 0; n = tr.parent[n] {
		up = append(up, tr.tok[n])
	}
	slices.Reverse(up)
	return append(slices.Clone(tr.line), up...)
}

// children returns the first k tokens of a row's Top.
func children(row engine.VerifyRow, k int) []int {
	var out []int
	for _, tl := range row.Top[:k] {
		out = append(out, tl.Token)
	}
	return out
}

// SameHeadRows reports whether two read-outs agree: argmaxes and Top
// tokens equal, log-probabilities and log-sum-exps within tol.
func SameHeadRows(a, b []engine.VerifyRow, tol float64) bool {
	near := func(x, y float32) bool { return math.Abs(float64(x-y)) <= tol }
	return slices.EqualFunc(a, b, func(x, y engine.VerifyRow) bool {
		return x.Argmax == y.Argmax && near(x.ArgmaxLogprob, y.ArgmaxLogprob) && near(x.LogSumExp, y.LogSumExp) &&
			slices.EqualFunc(x.Top, y.Top, func(p, q sampling.TokenLogprob) bool { return p.Token == q.Token && near(p.Logprob, q.Logprob) })
	})
}

// HeadTree holds a token tree an EAGLE-3 head h drafts through Verify
// (engine.Head's rules) to the reference head rh over ref, h's target
// being target: level 0 the line (the prompt over the target's features,
// Out 1, TopN 3), level 1 the root's three children as nodes, level 2 two
// children each of two of them, level 3 two children each of two of
// those; every node's row is the reference's last row of the path to it
// fed as a chain past the target (Argmax, ArgmaxLogprob, LogSumExp and Top
// within tol, near ties aside). The same tree fed in one call (stages:
// each node after its parent) and levels 1 to 3 in one call give the same
// rows; a line whose last rows read the head's own output reads them all
// out (Out 3). Then KeepPath: paths that are not the tree's are refused
// and change nothing; a path of it drops every node, and the next step
// computes the accepted tokens from the target's features, as the
// reference does. An empty path and Truncate drop the tree too, which
// drafted again gives the same rows, and a step onto a tree is refused.
func HeadTree(t *testing.T, h, target engine.Engine, ref *reference.Model, rh *reference.Head, tol float64) {
	t.Helper()
	ctx := context.Background()
	verify := func(what string, vs ...*engine.VerifyEntry) {
		t.Helper()
		if err := h.Verify(ctx, vs); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	tseq := NewSequence(t, target)
	defer tseq.Release()
	prompt := []int{3, 17, 5, 9, 30, 200}
	next := TargetStep(t, target, tseq, prompt...)
	// check holds v's rows to the reference's rows after texts, one a row.
	check := func(what string, v *engine.VerifyEntry, texts [][]int) {
		t.Helper()
		if len(v.Rows) != len(texts) {
			t.Fatalf("%s: %d rows, want %d", what, len(v.Rows), len(texts))
		}
		for j, text := range texts {
			rows := HeadRows(t, ref, rh, text, prompt)
			want, r, row := rows[len(rows)-1], v.Rows[j], fmt.Sprintf("%s, row %d", what, j)
			CheckHeadRead(t, row, rh, want, r.Argmax, r.ArgmaxLogprob, r.Top, v.TopN, tol)
			if lse := LogSumExp(want.Logits); math.Abs(float64(r.LogSumExp-lse)) > tol {
				t.Errorf("%s: LogSumExp %g, the reference's %g", row, r.LogSumExp, lse)
			}
		}
	}
	tr := &headTree{line: append(slices.Clone(prompt), next)}
	L := len(tr.line)
	hseq := NewSequence(t, h)
	defer hseq.Release()

	// Level 0: the line, its last row read out.
	v0 := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: tr.line, Out: 1, TopN: 3}
	verify("level 0", v0)
	check("level 0", v0, [][]int{tr.line})
	// Levels 1 … 3: each fed as the children of some of the level before's
	// nodes (their indices in the tree), read out.
	level := []int{-1}
	rows := v0.Rows
	for l, pick := range [][]int{{-1}, {0, 2}, {3, 5}} {
		n := map[int]int{} // node → its row in the level before
		for j, nd := range level {
			n[nd] = j
		}
		v := &engine.VerifyEntry{Seq: hseq, Target: tseq, TopN: 3}
		var parents []int
		var paths [][]int
		k := 3 // the root's children
		if l > 0 {
			k = 2
		}
		for _, nd := range pick {
			for _, tok := range children(rows[n[nd]], k) {
				slot := L - 1
				if nd >= 0 {
					slot = tr.slot[nd]
				}
				v.Tokens, v.Parents, parents = append(v.Tokens, tok), append(v.Parents, slot), append(parents, nd)
			}
		}
		v.Out = len(v.Tokens)
		what := fmt.Sprintf("level %d", l+1)
		verify(what, v)
		first := len(tr.tok)
		tr.add(hseq.Len()-len(v.Tokens), v.Tokens, parents)
		level = level[:0]
		for i := first; i < len(tr.tok); i++ {
			paths, level = append(paths, tr.path(i)), append(level, i)
		}
		check(what, v, paths)
		rows = v.Rows
	}
	nodes := len(tr.tok)
	if hseq.Len() != L+nodes {
		t.Fatalf("the head holds %d tokens, want %d (the line and %d nodes)", hseq.Len(), L+nodes, nodes)
	}
	var nodeTexts [][]int
	var parents []int
	for i := range tr.tok {
		nodeTexts = append(nodeTexts, tr.path(i))
		parents = append(parents, tr.parentSlot(i))
	}

	// The whole tree in one call: the line, the roots over its last row
	// (a stage after it), each level a stage after the one before.
	one := NewSequence(t, h)
	defer one.Release()
	lineParents := make([]int, L)
	for i := range lineParents {
		lineParents[i] = treemask.Line
	}
	all := &engine.VerifyEntry{Seq: one, Target: tseq, Tokens: append(slices.Clone(tr.line), tr.tok...),
		Parents: append(lineParents, parents...), Out: 1 + nodes, TopN: 3}
	verify("one call", all)
	check("one call", all, append([][]int{tr.line}, nodeTexts...))
	// Levels 1 to 3 in one call over a cached line.
	two := NewSequence(t, h)
	defer two.Release()
	verify("two calls, the line", &engine.VerifyEntry{Seq: two, Target: tseq, Tokens: tr.line, Out: 1})
	v := &engine.VerifyEntry{Seq: two, Target: tseq, Tokens: tr.tok, Parents: parents, Out: nodes, TopN: 3}
	verify("two calls, the nodes", v)
	check("levels 1 to 3 in one call", v, nodeTexts)

	// A line past the target: its last two tokens read the head's own
	// output (stages), every one of the last three rows read out.
	three := NewSequence(t, h)
	defer three.Release()
	past := append(slices.Clone(tr.line), 60, 61)
	vp := &engine.VerifyEntry{Seq: three, Target: tseq, Tokens: past, Out: 3, TopN: 4}
	verify("a line past the target", vp)
	check("a line past the target", vp, [][]int{past[:L], past[:L+1], past[:L+2]})

	// KeepPath refuses what is not a path of the tree, changing nothing.
	for _, bad := range [][]int{{L + 3}, {L, L + 5}, {L + 1, L + 3}, {L, L + 3, L + 4}, {L - 1}} {
		if err := hseq.KeepPath(bad); !errors.Is(err, treemask.ErrPath) {
			t.Errorf("KeepPath(%v): %v, want treemask.ErrPath", bad, err)
		}
		if hseq.Len() != L+nodes {
			t.Fatalf("a refused KeepPath(%v) left %d tokens, want %d", bad, hseq.Len(), L+nodes)
		}
	}
	// The target accepts root 0, its first child and that one's first,
	// and adds its token: the head keeps none of the tree and computes
	// them again from the target's features.
	path := []int{tr.slot[0], tr.slot[3], tr.slot[7]}
	if err := hseq.KeepPath(path); err != nil {
		t.Fatalf("KeepPath(%v), a path of the tree: %v", path, err)
	}
	if hseq.Len() != L {
		t.Fatalf("KeepPath left %d tokens, want the line's %d", hseq.Len(), L)
	}
	accepted := []int{tr.tok[0], tr.tok[3], tr.tok[7]}
	b := TargetStep(t, target, tseq, append([]int{next}, accepted...)...)
	ttext := append(slices.Clone(tr.line), accepted...)
	text := append(slices.Clone(ttext), b)
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: append(slices.Clone(accepted), b), TopN: 3}
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatalf("a step after KeepPath: %v", err)
	}
	want := HeadRows(t, ref, rh, text, ttext)
	CheckHeadRead(t, "a step after KeepPath", rh, want[len(want)-1], en.Next, en.Logprob, en.Top, en.TopN, tol)

	// An empty path, and Truncate, drop a tree: drafted again, it gives
	// the same rows.
	hL := hseq.Len()
	level1 := func() []engine.VerifyRow {
		t.Helper()
		v := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: []int{en.Top[0].Token, en.Top[1].Token}, Parents: []int{hL - 1, hL - 1}, Out: 2, TopN: 4}
		verify("roots after the kept path", v)
		return v.Rows
	}
	first := level1()
	for _, drop := range []string{"KeepPath(nil)", "Truncate"} {
		if drop == "Truncate" {
			hseq.Truncate(hseq.Len())
		} else if err := hseq.KeepPath(nil); err != nil {
			t.Fatal(err)
		}
		if hseq.Len() != hL {
			t.Fatalf("%s left %d tokens, want %d", drop, hseq.Len(), hL)
		}
		if got := level1(); !SameHeadRows(got, first, tol) {
			t.Errorf("after %s the tree's rows are %v, were %v", drop, got, first)
		}
	}
	// A step onto a sequence holding a tree: refused (a line token after
	// the tree's nodes).
	if err := h.Step(ctx, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{1}}}); err == nil {
		t.Error("a step after the tree's nodes: accepted")
	}
	if hseq.Len() != hL+2 {
		t.Errorf("a refused step changed the sequence: %d tokens, want %d", hseq.Len(), hL+2)
	}
}

// HeadTreeBatch checks that token trees a head h drafts in one Verify
// batch equal each drafted alone (SameHeadRows within tol), the two
// entries a level apart (a line beside nodes, nodes beside nodes).
func HeadTreeBatch(t *testing.T, h, target engine.Engine, tol float64) {
	t.Helper()
	ctx := context.Background()
	prompts := [][]int{{3, 17, 5, 9, 30, 200}, {8, 1, 250, 4}}
	type side struct {
		tseq, alone, batched engine.Sequence
		line                 []int
		frontier             []int // the slots of the last level's nodes (the line's last before)
		rows                 []engine.VerifyRow
	}
	var sides []*side
	for _, p := range prompts {
		tseq := NewSequence(t, target)
		line := append(slices.Clone(p), TargetStep(t, target, tseq, p...))
		a := NewSequence(t, h)
		b := NewSequence(t, h)
		sides = append(sides, &side{tseq: tseq, alone: a, batched: b, line: line, frontier: []int{len(line) - 1}})
	}
	// level is side s's next level: its line, else two children each of
	// the last level's first two nodes.
	level := func(s *side, seq engine.Sequence) *engine.VerifyEntry {
		if s.rows == nil {
			return &engine.VerifyEntry{Seq: seq, Target: s.tseq, Tokens: s.line, Out: 1, TopN: 2}
		}
		v := &engine.VerifyEntry{Seq: seq, Target: s.tseq, TopN: 2}
		for j, slot := range s.frontier[:min(2, len(s.frontier))] {
			for _, tok := range children(s.rows[j], 2) {
				v.Tokens, v.Parents = append(v.Tokens, tok), append(v.Parents, slot)
			}
		}
		v.Out = len(v.Tokens)
		return v
	}
	for round := range 5 {
		var who []int
		var alone, batch []*engine.VerifyEntry
		for i, s := range sides {
			if round < i || round > i+3 { // side i drafts levels 0 … 3 from round i
				continue
			}
			a := level(s, s.alone)
			if err := h.Verify(ctx, []*engine.VerifyEntry{a}); err != nil {
				t.Fatalf("round %d, side %d alone: %v", round, i, err)
			}
			who, alone, batch = append(who, i), append(alone, a), append(batch, level(s, s.batched))
		}
		if err := h.Verify(ctx, batch); err != nil {
			t.Fatalf("round %d batched: %v", round, err)
		}
		for k, i := range who {
			s, a, b := sides[i], alone[k], batch[k]
			if !SameHeadRows(b.Rows, a.Rows, tol) {
				t.Errorf("round %d, side %d: batched %v, alone %v", round, i, b.Rows, a.Rows)
			}
			if s.alone.Len() != s.batched.Len() {
				t.Errorf("round %d, side %d: %d tokens batched, %d alone", round, i, s.batched.Len(), s.alone.Len())
			}
			// The next level's parents: the slots of the rows read out.
			s.frontier, s.rows = s.frontier[:0], a.Rows
			for j := range a.Out {
				s.frontier = append(s.frontier, s.alone.Len()-a.Out+j)
			}
		}
	}
	for i, s := range sides {
		if want := len(s.line) + 2 + 4 + 4; s.alone.Len() != want {
			t.Errorf("side %d holds %d tokens, want %d (the line, 2, 4 and 4 nodes)", i, s.alone.Len(), want)
		}
	}
}

// HeadTreeRefusals checks that a head h's Verify refuses the read-outs a
// drafter has no use for (Draws, a Tree, Sampling without Propose — a
// head that samples its drafts takes Propose), an entry without its Target
// or with other (a sequence of another engine) as its Target, an Out
// outside 1 … len(Tokens) or one that reads token 0, a TopN past
// engine.MaxTopN, a node over token 0, a parent that is neither the
// line's last slot nor a node, a line token after nodes, and a root over
// a line row whose output the sequence no longer holds, each with an
// error naming the cause; a refused batch changes none of its sequences.
// A released sequence is refused, and so is its KeepPath.
func HeadTreeRefusals(t *testing.T, h, target engine.Engine, other engine.Sequence) {
	t.Helper()
	ctx := context.Background()
	tseq := NewSequence(t, target)
	defer tseq.Release()
	TargetStep(t, target, tseq, 1, 2, 3)
	sampled := sampling.Params{Temperature: 0.8}
	draw := sampling.Draw{X: sampling.NoProposal, U: 0.5, V: 0.5}
	line := []int{1, 2, 3, 9} // rows 0 … 2 over the target's features
	for _, tc := range []struct {
		name, want string
		fed        bool // the sequence holds line before the entry
		v          engine.VerifyEntry
	}{
		{"sampling without proposals", "draws", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Sampling: sampled}},
		{"sampled draws", "draws", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Sampling: sampled, Draws: []sampling.Draw{draw}}},
		{"greedy draws", "draws", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Draws: []sampling.Draw{draw}}},
		{"a sampled tree", "", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Sampling: sampled,
			Tree: &engine.SampledTree{Nodes: []engine.SampledNode{{V: 0.5}}}}},
		{"no Target", "Target", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1}},
		{"another engine's Target", "target engine", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1}},
		{"Out 0", "reads out", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}}},
		{"Out past the tokens", "reads out", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 2}},
		{"TopN past MaxTopN", "top", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, TopN: engine.MaxTopN + 1}},
		{"reads out token 0", "token 0", false, engine.VerifyEntry{Tokens: []int{1, 2}, Out: 2}},
		{"token 0 alone", "token 0", false, engine.VerifyEntry{Tokens: []int{1}, Out: 1}},
		{"a node over token 0", "token 0", false, engine.VerifyEntry{Tokens: []int{1, 2}, Parents: []int{treemask.Line, 0}, Out: 1}},
		{"a parent inside the line", "parent slot", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{2}, Out: 1}},
		{"a parent past the node", "parent slot", true, engine.VerifyEntry{Tokens: []int{7, 8}, Parents: []int{3, 5}, Out: 1}},
		{"a line token after a node", "line token", true, engine.VerifyEntry{Tokens: []int{7, 8}, Parents: []int{3, treemask.Line}, Out: 1}},
		{"a token outside the vocabulary", "vocabulary", true, engine.VerifyEntry{Tokens: []int{h.Config().VocabSize}, Parents: []int{3}, Out: 1}},
	} {
		seq := NewSequence(t, h)
		if tc.fed {
			if err := h.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Target: tseq, Tokens: line, Out: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		n := seq.Len()
		v := tc.v
		v.Seq, v.Target = seq, tseq
		switch tc.name {
		case "no Target":
			v.Target = nil
		case "another engine's Target":
			v.Target = other
		}
		err := h.Verify(ctx, []*engine.VerifyEntry{&v})
		switch {
		case err == nil:
			t.Errorf("%s: accepted", tc.name)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
		if seq.Len() != n {
			t.Errorf("%s: refused, but the sequence holds %d tokens (was %d)", tc.name, seq.Len(), n)
		}
		if err := seq.KeepPath([]int{n}); !errors.Is(err, treemask.ErrPath) {
			t.Errorf("%s: refused, but the sequence holds a tree: KeepPath of its first slot: %v", tc.name, err)
		}
		seq.Release()
	}

	// A root over the line's last row, whose output Truncate dropped: row
	// 3 read the head's own output, and the line's last row (2) is no
	// longer the one held.
	seq := NewSequence(t, h)
	defer seq.Release()
	if _, err := engine.StepN(ctx, h, []*engine.Entry{{Seq: seq, Target: tseq, Tokens: line}}, 2); err != nil {
		t.Fatal(err)
	}
	seq.Truncate(100)
	if seq.Len() != 4 {
		t.Fatalf("Truncate kept %d tokens, want 4", seq.Len())
	}
	if err := h.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Target: tseq, Tokens: []int{7}, Parents: []int{3}, Out: 1}}); err == nil {
		t.Error("a root over a line row whose output is gone: accepted")
	} else if !strings.Contains(err.Error(), "no longer holds") {
		t.Errorf("a root over a line row whose output is gone: %v", err)
	}

	// A batch whose second entry is refused changes neither sequence.
	a := NewSequence(t, h)
	b := NewSequence(t, h)
	defer b.Release()
	for _, s := range []engine.Sequence{a, b} {
		if err := h.Verify(ctx, []*engine.VerifyEntry{{Seq: s, Target: tseq, Tokens: line, Out: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	good := &engine.VerifyEntry{Seq: a, Target: tseq, Tokens: []int{7, 8}, Parents: []int{3, 4}, Out: 2}
	bad := &engine.VerifyEntry{Seq: b, Target: tseq, Tokens: []int{7, 8}, Parents: []int{3, 2}, Out: 2}
	if err := h.Verify(ctx, []*engine.VerifyEntry{good, bad}); err == nil {
		t.Error("a batch with a refused entry: accepted")
	}
	for i, s := range []engine.Sequence{a, b} {
		if s.Len() != len(line) {
			t.Errorf("a refused batch changed sequence %d: %d tokens", i, s.Len())
		}
	}
	if err := h.Verify(ctx, []*engine.VerifyEntry{good}); err != nil {
		t.Errorf("the batch's good entry alone: %v", err)
	}
	if err := a.KeepPath([]int{5}); !errors.Is(err, treemask.ErrPath) {
		t.Errorf("KeepPath of a node that is no root: %v, want treemask.ErrPath", err)
	}
	// Step still takes no tree nodes.
	if err := h.Step(ctx, []*engine.Entry{{Seq: b, Target: tseq, Tokens: []int{7}, Parents: []int{3}}}); err == nil {
		t.Error("tree nodes in a step: accepted")
	}
	if err := h.Verify(ctx, nil); err != nil {
		t.Errorf("an empty batch: %v", err)
	}
	a.Release()
	if err := h.Verify(ctx, []*engine.VerifyEntry{{Seq: a, Target: tseq, Tokens: []int{7}, Out: 1}}); err == nil {
		t.Error("a released sequence: accepted")
	}
	if err := a.KeepPath(nil); err == nil {
		t.Error("KeepPath of a released sequence: accepted")
	}
}
