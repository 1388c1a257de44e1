package cpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"webdraft/engine"
	"webdraft/engine/cpu/ops"
	"webdraft/engine/enginetest"
	"webdraft/sampling"
	"webdraft/treemask"
)

// headTree is a token tree drafted by a head sequence past its line: node
// i's token, its parent (−1: a root, the line's last token's child) and
// its slot in the head's cache.
type headTree struct {
	line   []int
	tok    []int
	parent []int
	slot   []int
}

// add records the nodes a Verify fed after the head's slots so far.
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

// checkRows holds a Verify entry's rows to the oracle — row j the last row
// of a fresh reference sequence fed texts[j] as a chain (the line over the
// target's features, past them the head's own output) — its logits being
// the pass's read-out rows from k0 on.
func checkRows(rig *headRig, what string, v *engine.VerifyEntry, k0 int, texts [][]int, targetText []int, tol float64) {
	rig.oracle.t.Helper()
	h, o := rig.head, rig.oracle
	if len(v.Rows) != len(texts) {
		o.t.Fatalf("%s: %d rows, want %d", what, len(v.Rows), len(texts))
	}
	Vd := h.cfg.DraftVocabSize
	for j, text := range texts {
		rows := o.rows(text, targetText)
		k := k0 + j
		r := v.Rows[j]
		o.compare(fmt.Sprintf("%s, row %d", what, j), h.pass.logits[k*Vd:(k+1)*Vd], r.Argmax, r.ArgmaxLogprob, r.Top, v.TopN, rows[len(rows)-1], tol)
	}
}

// TestHeadTree holds a token tree drafted through Verify to the oracle:
// level 0 the line (the prompt over the target's features, Out 1, TopN 3),
// level 1 the root's three children as nodes, level 2 two children each
// of two of them; every node's row is what a fresh reference sequence
// computes for the path to it fed as a chain past the target. The same
// tree fed in one call (stages: each node after its parent) and levels 1
// and 2 in one call give the same rows; a line whose last rows read the
// head's own output reads them all out (Out 3). Then KeepPath: paths that
// are not the tree's are refused and change nothing; a path of it drops
// every node, and the next step computes the accepted tokens from the
// target's features, as a fresh head fed the same line.
func TestHeadTree(t *testing.T) {
	testHeadTree(t, newHeadRig(t, false), 1e-4)
}

// TestHeadTreeInt4: the same over a head quantized to int4, on both
// kernels.
func TestHeadTreeInt4(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			defer ops.SetFixed(ops.SetFixed(fixed))
			testHeadTree(t, newHeadRig(t, true), 1e-4)
		})
	}
}

func testHeadTree(t *testing.T, rig *headRig, tol float64) {
	ctx := context.Background()
	h, target, o := rig.head, rig.target, rig.oracle
	verify := func(what string, vs ...*engine.VerifyEntry) {
		t.Helper()
		if err := h.Verify(ctx, vs); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	tseq, _ := target.NewSequence()
	defer tseq.Release()
	prompt := []int{3, 17, 5, 9, 30, 200}
	next := enginetest.TargetStep(t, target, tseq, prompt...)
	tr := &headTree{line: append(slices.Clone(prompt), next)}
	L := len(tr.line)
	hseq, _ := h.NewSequence()
	defer hseq.Release()

	// Level 0: the line, its last row read out.
	v0 := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: tr.line, Out: 1, TopN: 3}
	verify("level 0", v0)
	checkRows(rig, "level 0", v0, 0, [][]int{tr.line}, prompt, tol)
	// Level 1: the root's three children, over the line's last row.
	roots := children(v0.Rows[0], 3)
	v1 := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: roots, Parents: []int{L - 1, L - 1, L - 1}, Out: 3, TopN: 3}
	verify("level 1", v1)
	tr.add(L, roots, []int{-1, -1, -1})
	checkRows(rig, "level 1", v1, 0, [][]int{tr.path(0), tr.path(1), tr.path(2)}, prompt, tol)
	// Level 2: two children of roots 0 and 2 each.
	kids := append(children(v1.Rows[0], 2), children(v1.Rows[2], 2)...)
	v2 := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: kids, Parents: []int{L, L, L + 2, L + 2}, Out: 4, TopN: 3}
	verify("level 2", v2)
	tr.add(L+3, kids, []int{0, 0, 2, 2})
	checkRows(rig, "level 2", v2, 0, [][]int{tr.path(3), tr.path(4), tr.path(5), tr.path(6)}, prompt, tol)
	if hseq.Len() != L+7 {
		t.Fatalf("the head holds %d tokens, want %d (the line and 7 nodes)", hseq.Len(), L+7)
	}
	if s := hseq.(*headSequence); s.targetRows != L-1 || s.outRow != L-2 {
		t.Errorf("the tree moved the line: %d rows over the target's features, the last output row %d; want %d, %d", s.targetRows, s.outRow, L-1, L-2)
	}
	var nodeTexts [][]int
	var parents []int
	for i := range tr.tok {
		nodeTexts = append(nodeTexts, tr.path(i))
		parents = append(parents, tr.parentSlot(i))
	}

	// The whole tree in one call: the line, the roots over its last row
	// (a stage after it), their children a stage later.
	one, _ := h.NewSequence()
	defer one.Release()
	lineParents := make([]int, L)
	for i := range lineParents {
		lineParents[i] = treemask.Line
	}
	all := &engine.VerifyEntry{Seq: one, Target: tseq, Tokens: append(slices.Clone(tr.line), tr.tok...),
		Parents: append(lineParents, parents...), Out: 1 + len(tr.tok), TopN: 3}
	verify("one call", all)
	checkRows(rig, "one call", all, 0, append([][]int{tr.line}, nodeTexts...), prompt, tol)
	// Levels 1 and 2 in one call over a cached line: the roots over the
	// line's last row, their children over the roots' rows.
	two, _ := h.NewSequence()
	defer two.Release()
	verify("two calls, the line", &engine.VerifyEntry{Seq: two, Target: tseq, Tokens: tr.line, Out: 1})
	nodes := &engine.VerifyEntry{Seq: two, Target: tseq, Tokens: tr.tok, Parents: parents, Out: len(tr.tok), TopN: 3}
	verify("two calls, the nodes", nodes)
	checkRows(rig, "levels 1 and 2 in one call", nodes, 0, nodeTexts, prompt, tol)

	// A line past the target: tokens 7 and 8 read the head's own output
	// (stages), every one of the last three rows read out.
	three, _ := h.NewSequence()
	defer three.Release()
	past := append(slices.Clone(tr.line), 60, 61)
	vp := &engine.VerifyEntry{Seq: three, Target: tseq, Tokens: past, Out: 3, TopN: 4}
	verify("a line past the target", vp)
	checkRows(rig, "a line past the target", vp, 0, [][]int{past[:L], past[:L+1], past[:L+2]}, prompt, tol)

	// KeepPath refuses what is not a path of the tree, changing nothing.
	for _, bad := range [][]int{{L + 3}, {L, L + 5}, {L + 1, L + 3}, {L, L + 3, L + 4}, {L - 1}} {
		if err := hseq.KeepPath(bad); !errors.Is(err, treemask.ErrPath) {
			t.Errorf("KeepPath(%v): %v, want treemask.ErrPath", bad, err)
		}
		if hseq.Len() != L+7 {
			t.Fatalf("a refused KeepPath(%v) left %d tokens, want %d", bad, hseq.Len(), L+7)
		}
	}
	// The target accepts root 0 and its first child, and adds its token:
	// the head keeps none of the tree and computes them again from the
	// target's features.
	if err := hseq.KeepPath([]int{L, L + 3}); err != nil {
		t.Fatalf("KeepPath of a path of the tree: %v", err)
	}
	if hseq.Len() != L {
		t.Fatalf("KeepPath left %d tokens, want the line's %d", hseq.Len(), L)
	}
	accepted := []int{tr.tok[0], tr.tok[3]}
	b := enginetest.TargetStep(t, target, tseq, append([]int{next}, accepted...)...)
	ttext := append(slices.Clone(tr.line), accepted...)
	text := append(slices.Clone(ttext), b)
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: append(slices.Clone(accepted), b), TopN: 3}
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatalf("a step after KeepPath: %v", err)
	}
	o.check("a step after KeepPath", h, en, 0, text, ttext, tol)
	if s := hseq.(*headSequence); s.targetRows != len(text)-1 || s.tree.Len() != 0 || len(s.nodeOut) != 0 {
		t.Errorf("after KeepPath and a step: %d rows over the target's features (want %d), a tree of %d nodes, %d node outputs",
			s.targetRows, len(text)-1, s.tree.Len(), len(s.nodeOut))
	}
	fresh, _ := h.NewSequence()
	defer fresh.Release()
	fen := &engine.Entry{Seq: fresh, Target: tseq, Tokens: text, TopN: 3}
	if err := h.Step(ctx, []*engine.Entry{fen}); err != nil {
		t.Fatal(err)
	}
	if fen.Next != en.Next || math.Abs(float64(fen.Logprob-en.Logprob)) > 1e-5 || !sameTop(fen.Top, en.Top) || fresh.Len() != hseq.Len() {
		t.Errorf("after KeepPath the head drafts %d (%g) %v holding %d tokens; a fresh head fed the line %d (%g) %v holding %d",
			en.Next, en.Logprob, en.Top, hseq.Len(), fen.Next, fen.Logprob, fen.Top, fresh.Len())
	}
}

// sameTop reports whether two Tops list the same tokens with
// log-probabilities within 1e-5.
func sameTop(a, b []sampling.TokenLogprob) bool {
	return slices.EqualFunc(a, b, func(x, y sampling.TokenLogprob) bool {
		return x.Token == y.Token && math.Abs(float64(x.Logprob-y.Logprob)) <= 1e-5
	})
}

// sameRows reports whether two read-outs agree: argmaxes and Top tokens
// equal, log-probabilities within 1e-5.
func sameRows(a, b []engine.VerifyRow) bool {
	return slices.EqualFunc(a, b, func(x, y engine.VerifyRow) bool {
		return x.Argmax == y.Argmax && math.Abs(float64(x.ArgmaxLogprob-y.ArgmaxLogprob)) <= 1e-5 &&
			math.Abs(float64(x.LogSumExp-y.LogSumExp)) <= 1e-5 && sameTop(x.Top, y.Top)
	})
}

// TestHeadTreeDropped: an empty path, and Truncate, drop the tree (Len the
// line's); the tree drafted again over the line gives the same rows.
func TestHeadTreeDropped(t *testing.T) {
	rig := newHeadRig(t, false)
	ctx := context.Background()
	h, target := rig.head, rig.target
	tseq, _ := target.NewSequence()
	line := []int{4, 8, 15, 16, 23}
	line = append(line, enginetest.TargetStep(t, target, tseq, line...))
	L := len(line)
	hseq, _ := h.NewSequence()
	v0 := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: line, Out: 1, TopN: 2}
	if err := h.Verify(ctx, []*engine.VerifyEntry{v0}); err != nil {
		t.Fatal(err)
	}
	roots := children(v0.Rows[0], 2)
	level := func() []engine.VerifyRow {
		t.Helper()
		v := &engine.VerifyEntry{Seq: hseq, Target: tseq, Tokens: roots, Parents: []int{L - 1, L - 1}, Out: 2, TopN: 4}
		if err := h.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
			t.Fatal(err)
		}
		return v.Rows
	}
	want := level()
	for _, drop := range []string{"KeepPath(nil)", "Truncate"} {
		if drop == "Truncate" {
			hseq.Truncate(hseq.Len())
		} else if err := hseq.KeepPath(nil); err != nil {
			t.Fatal(err)
		}
		if hseq.Len() != L {
			t.Fatalf("%s left %d tokens, want %d", drop, hseq.Len(), L)
		}
		if got := level(); !sameRows(got, want) {
			t.Errorf("after %s the tree's rows are %v, were %v", drop, got, want)
		}
	}
	// A step onto a sequence holding a tree: refused (a line token after
	// the tree's nodes).
	if err := h.Step(ctx, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{1}}}); err == nil {
		t.Error("a step after the tree's nodes: accepted")
	}
	if hseq.Len() != L+2 {
		t.Errorf("a refused step changed the sequence: %d tokens, want %d", hseq.Len(), L+2)
	}
}

// TestHeadTreeBatch: trees drafted in one Verify batch equal each drafted
// alone, the two entries a level apart (a line beside nodes, nodes beside
// nodes).
func TestHeadTreeBatch(t *testing.T) {
	rig := newHeadRig(t, false)
	ctx := context.Background()
	h, target := rig.head, rig.target
	prompts := [][]int{{3, 17, 5, 9, 30, 200}, {8, 1, 250, 4}}
	type side struct {
		tseq, alone, batched engine.Sequence
		line                 []int
		frontier             []int // the slots of the last level's nodes (the line's last before)
		rows                 []engine.VerifyRow
	}
	var sides []*side
	for _, p := range prompts {
		tseq, _ := target.NewSequence()
		line := append(slices.Clone(p), enginetest.TargetStep(t, target, tseq, p...))
		a, _ := h.NewSequence()
		b, _ := h.NewSequence()
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
	for round := range 4 {
		var who []int
		var alone, batch []*engine.VerifyEntry
		for i, s := range sides {
			if round < i || round > i+2 { // side i drafts levels 0 … 2 from round i
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
			if !sameRows(b.Rows, a.Rows) {
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
		if want := len(s.line) + 2 + 4; s.alone.Len() != want {
			t.Errorf("side %d holds %d tokens, want %d (the line, 2 and 4 nodes)", i, s.alone.Len(), want)
		}
	}
}

// TestHeadTreeRefusals: Verify refuses sampled read-outs (Sampling, Draws,
// Propose, Tree), an entry without its Target or with another engine's, an
// Out outside 1 … len(Tokens) or one that reads token 0, a TopN past
// engine.MaxTopN, a node over token 0, a parent that is neither the line's
// last slot nor a node, a line token after nodes, and a root over a line
// row whose output the sequence no longer holds; a refused batch changes
// none of its sequences. A released sequence is refused, and so is its
// KeepPath.
func TestHeadTreeRefusals(t *testing.T) {
	rig := newHeadRig(t, false)
	ctx := context.Background()
	h, target := rig.head, rig.target
	tseq, _ := target.NewSequence()
	enginetest.TargetStep(t, target, tseq, 1, 2, 3)
	plain, _, _, _ := tinyTarget(t, enginetest.HeadLayers, nil)
	other, _ := plain.NewSequence()
	enginetest.TargetStep(t, plain, other, 1, 2, 3)
	sampled := sampling.Params{Temperature: 0.8}
	draw := sampling.Draw{X: sampling.NoProposal, U: 0.5, V: 0.5}
	line := []int{1, 2, 3, 9} // rows 0 … 2 over the target's features
	for _, tc := range []struct {
		name, want string
		fed        bool // the sequence holds line before the entry
		v          engine.VerifyEntry
	}{
		{"sampling", "temperature", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Sampling: sampled, Draws: []sampling.Draw{draw}}},
		{"greedy draws", "draws", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Draws: []sampling.Draw{draw}}},
		{"proposals", "", true, engine.VerifyEntry{Tokens: []int{7}, Parents: []int{3}, Out: 1, Sampling: sampled, Propose: [][]float32{{0.5}}}},
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
		{"a token outside the vocabulary", "vocabulary", true, engine.VerifyEntry{Tokens: []int{256}, Parents: []int{3}, Out: 1}},
	} {
		seq, _ := h.NewSequence()
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
		if seq.Len() != n || seq.(*headSequence).tree.Len() != 0 {
			t.Errorf("%s: refused, but the sequence holds %d tokens (was %d), a tree of %d nodes", tc.name, seq.Len(), n, seq.(*headSequence).tree.Len())
		}
	}

	// A root over the line's last row, whose output Truncate dropped: row
	// 3 read the head's own output, and the line's last row (2) is no
	// longer the one held.
	seq, _ := h.NewSequence()
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
	a, _ := h.NewSequence()
	b, _ := h.NewSequence()
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
		if s.Len() != len(line) || s.(*headSequence).tree.Len() != 0 {
			t.Errorf("a refused batch changed sequence %d: %d tokens, a tree of %d", i, s.Len(), s.(*headSequence).tree.Len())
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
