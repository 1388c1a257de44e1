package enginetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"webdraft/engine"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/treemask"
)

// randomTree returns the parents of n tree nodes fed after a line whose
// last slot is base−1: node i's parent is base−1 (a root) or an earlier
// node, each with the given chance of being a root.
func randomTree(rng *rand.Rand, base, n int, roots float64) []int {
	parents := make([]int, n)
	for i := range parents {
		if i == 0 || rng.Float64() < roots {
			parents[i] = base - 1
		} else {
			parents[i] = base + rng.IntN(i)
		}
	}
	return parents
}

// rootPath is node i's root-first path of tokens through a tree fed at
// slot base (parents as slots).
func rootPath(tokens, parents []int, base, i int) []int {
	var path []int
	for s := base + i; s >= base; s = parents[s-base] {
		path = append([]int{tokens[s-base]}, path...)
	}
	return path
}

// runTrees checks token trees (Parents, KeepPath) against the reference
// fed the same tokens as lines: each node's row equals the row after its
// root path, alone and batched with line entries, fed in one pass or level
// by level; KeepPath leaves what feeding the path as a line would; bad
// trees and paths are refused and change nothing.
func runTrees(t *testing.T, e engine.Engine, c qwen3.Config, ref *reference.Model, prompt func(int) []int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(c.VocabSize), 21))
	newSeq := func() engine.Sequence {
		s, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Release)
		return s
	}
	// lineRow is the reference's row after feeding tokens as a line.
	lineRow := func(tokens []int) []float32 {
		logits, err := ref.Forward(ref.NewSequence(), tokens)
		if err != nil {
			t.Fatal(err)
		}
		return logits
	}
	check := func(t *testing.T, what string, got engine.VerifyRow, tokens []int) {
		t.Helper()
		logits := lineRow(tokens)
		want, err := sampling.Choose(logits, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
		if err != nil {
			t.Fatal(err)
		}
		if !sameArgmax(logits, got.Argmax, want.Argmax) || !logprobClose(got.ArgmaxLogprob, want.ArgmaxLogprob, want.LogSumExp) ||
			!logprobClose(got.LogSumExp, want.LogSumExp, want.LogSumExp) {
			t.Errorf("%s: %+v, the line's %+v", what, got.Row, want)
		}
	}
	// treeEntry feeds context to a new sequence and returns a verification
	// of line (line tokens) then a random tree of n nodes.
	treeEntry := func(context []int, line, n int, roots float64) (*engine.VerifyEntry, []int) {
		seq := newSeq()
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
			t.Fatal(err)
		}
		base := len(context) + line
		parents := randomTree(rng, base, n, roots)
		v := &engine.VerifyEntry{Seq: seq, Tokens: prompt(line + n), Out: n + 1, TopN: 3}
		v.Parents = make([]int, line+n)
		for i := range line {
			v.Parents[i] = treemask.Line
		}
		copy(v.Parents[line:], parents)
		return v, parents
	}
	// checkTree holds a verified tree's rows to the line along each node's
	// root path.
	checkTree := func(t *testing.T, context []int, v *engine.VerifyEntry, parents []int) {
		t.Helper()
		n := len(parents)
		line := len(v.Tokens) - n
		base := len(context) + line
		prefix := append(append([]int(nil), context...), v.Tokens[:line]...)
		check(t, "the line's last row", v.Rows[0], prefix)
		for i := range n {
			path := rootPath(v.Tokens[line:], parents, base, i)
			check(t, "node", v.Rows[i+1], append(append([]int(nil), prefix...), path...))
		}
	}

	t.Run("tree rows equal their paths", func(t *testing.T) {
		for _, n := range []int{4, 16, treemask.MaxNodes} {
			for _, roots := range []float64{0.1, 0.5} {
				context := prompt(5 + rng.IntN(20))
				v, parents := treeEntry(context, 1+rng.IntN(2), n, roots)
				if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
					t.Fatal(err)
				}
				if v.Seq.Len() != len(context)+len(v.Tokens) || len(v.Rows) != n+1 {
					t.Fatalf("%d nodes: Len %d, %d rows", n, v.Seq.Len(), len(v.Rows))
				}
				checkTree(t, context, v, parents)
			}
		}
	})

	t.Run("trees batched with lines", func(t *testing.T) {
		c1, c2, c3 := prompt(9), prompt(3), prompt(14)
		v1, p1 := treeEntry(c1, 1, 12, 0.3)
		v3, p3 := treeEntry(c3, 2, 7, 0.6)
		seq := newSeq()
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: c2}}); err != nil {
			t.Fatal(err)
		}
		v2 := &engine.VerifyEntry{Seq: seq, Tokens: prompt(6), Out: 6}
		if err := e.Verify(ctx, []*engine.VerifyEntry{v1, v2, v3}); err != nil {
			t.Fatal(err)
		}
		checkTree(t, c1, v1, p1)
		checkTree(t, c3, v3, p3)
		for j := range 6 {
			check(t, "line entry", v2.Rows[j], append(append([]int(nil), c2...), v2.Tokens[:j+1]...))
		}
	})

	t.Run("a tree fed level by level", func(t *testing.T) {
		// As a drafter expands its frontier: the roots, then children of
		// some of them, then grandchildren, one pass each.
		context := prompt(11)
		seq := newSeq()
		base := len(context)
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
			t.Fatal(err)
		}
		var tokens, parents []int
		levels := [][]int{{base - 1, base - 1, base - 1}, {base, base, base + 2}, {base + 3, base + 5}}
		for l, level := range levels {
			fed := prompt(len(level))
			v := &engine.VerifyEntry{Seq: seq, Tokens: fed, Parents: level, Out: len(level)}
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatalf("level %d: %v", l, err)
			}
			tokens, parents = append(tokens, fed...), append(parents, level...)
			for j := range fed {
				i := len(tokens) - len(fed) + j
				check(t, "level node", v.Rows[j], append(append([]int(nil), context...), rootPath(tokens, parents, base, i)...))
			}
		}
	})

	t.Run("keep path equals the line", func(t *testing.T) {
		for _, depth := range []int{0, 1, 3} {
			context := prompt(8)
			seq := newSeq()
			base := len(context)
			if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
				t.Fatal(err)
			}
			// Two roots; the kept path runs through the second root and
			// nodes fed after siblings, so that its slots must move.
			parents := []int{base - 1, base - 1, base, base + 1, base + 1, base + 4, base + 3, base + 5}
			fed := prompt(len(parents))
			if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: fed, Parents: parents, Out: 1}}); err != nil {
				t.Fatal(err)
			}
			path := []int{base + 1, base + 4, base + 5, base + 7}[:depth]
			if err := seq.KeepPath(path); err != nil {
				t.Fatal(err)
			}
			if seq.Len() != base+depth {
				t.Fatalf("depth %d: Len %d after keeping the path, want %d", depth, seq.Len(), base+depth)
			}
			line := append([]int(nil), context...)
			for _, s := range path {
				line = append(line, fed[s-base])
			}
			next := prompt(3)
			v := &engine.VerifyEntry{Seq: seq, Tokens: next, Out: 3}
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
			for j := range next {
				check(t, "after the kept path", v.Rows[j], append(append([]int(nil), line...), next[:j+1]...))
			}
		}
	})

	t.Run("bad trees change nothing", func(t *testing.T) {
		context := prompt(6)
		seq := newSeq()
		base := len(context)
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
			t.Fatal(err)
		}
		many := make([]int, treemask.MaxNodes+1)
		for i := range many {
			many[i] = base - 1
		}
		for _, bad := range [][]int{
			{base - 1, base + 1},               // a parent at or after its node
			{base - 1, treemask.Line},          // a line token after a node
			{base - 2, base},                   // a root below the line's last slot
			{base - 1},                         // one parent for two tokens
			many,                               // too many nodes
			{base - 1, base - 1, base + 5, -7}, // out of range
		} {
			tokens := prompt(max(len(bad), 2))
			if len(bad) == 1 {
				tokens = prompt(2)
			}
			v := &engine.VerifyEntry{Seq: seq, Tokens: tokens, Parents: bad, Out: 1}
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err == nil {
				t.Errorf("parents %v: accepted", bad)
			}
			if seq.Len() != base {
				t.Fatalf("parents %v: Len %d after a refused pass, want %d", bad, seq.Len(), base)
			}
		}
		// A path that is not the tree's.
		parents := []int{base - 1, base - 1, base}
		if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: prompt(3), Parents: parents, Out: 1}}); err != nil {
			t.Fatal(err)
		}
		// Line tokens after the tree's nodes.
		if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: prompt(2), Out: 1}}); err == nil {
			t.Error("line tokens after a tree's nodes: accepted")
		}
		for _, path := range [][]int{{base + 2}, {base, base + 1}, {base + 1, base + 2}, {base + 9}} {
			if err := seq.KeepPath(path); !errors.Is(err, treemask.ErrPath) {
				t.Errorf("path %v: %v, want treemask.ErrPath", path, err)
			}
		}
		if seq.Len() != base+3 {
			t.Fatalf("Len %d after refused paths, want %d", seq.Len(), base+3)
		}
		if _, err := engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: prompt(1), Parents: []int{base}}}, 2); err == nil {
			t.Error("StepN took tree nodes")
		}
		// The tree still verifies after the refusals: the kept path is right.
		if err := seq.KeepPath([]int{base, base + 2}); err != nil {
			t.Fatal(err)
		}
		if seq.Len() != base+2 {
			t.Fatalf("Len %d after the path, want %d", seq.Len(), base+2)
		}
	})
}
