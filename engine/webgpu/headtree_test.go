package webgpu

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"

	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/sampling"
)

// TestHeadTree: enginetest.HeadTree, token trees drafted through Verify
// held to reference.Head (int4 weights, f32 KV cache) — levels of several
// children a node to depth 3, the tree in one call, a line past the
// target read out, KeepPath and a dropped tree.
func TestHeadTree(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadTree(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head, rig.oracle.lpTol)
}

// TestHeadTreePasses: the same in passes of five rows of which at most
// four are read out (MaxSequences 4), so that a level's rows, and the
// stages of a tree fed in one call, take several passes each.
func TestHeadTreePasses(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{KVBytes: 1 << 20, MaxSequences: 4, MaxRows: 5, KV: "f32"})
	enginetest.HeadTree(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head, rig.oracle.lpTol)
}

// TestHeadTreeBatch: enginetest.HeadTreeBatch, trees drafted in one batch
// against each drafted alone.
func TestHeadTreeBatch(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadTreeBatch(t, rig.head, rig.target, headLogprobTol)
}

// TestHeadTreeRefusals: enginetest.HeadTreeRefusals, what Verify refuses
// and that a refusal changes nothing.
func TestHeadTreeRefusals(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	plain, _, _ := tinyTarget(t, rig.target.g, enginetest.HeadLayers, nil)
	other := enginetest.NewSequence(t, plain)
	enginetest.TargetStep(t, plain, other, 1, 2, 3)
	enginetest.HeadTreeRefusals(t, rig.head, rig.target, other)
}

// headTreeGen is one generation of TestHeadDraftVerifyTree: DraftVerifyTree
// on the F sequences, the host's way on the S ones (the head's Verify a
// level at a time, the target's Verify of the tree).
type headTreeGen struct {
	headTwins
	width, depth, nodes int
}

// TestHeadDraftVerifyTree: a head's trees drafted level by level on the
// device and verified in the same submission, two generations side by
// side over three rounds, are the trees the host drafts through Verify:
// each explored node's children are the head's most likely tokens after
// its path — fed as tree nodes over the head's own output at their
// parents, in the target's vocabulary —, the frontiers and the verified
// nodes chosen as the host chooses them (checkDeviceTree), the target's
// rows its read-out after each verified path; and after the deepest
// verified path is kept and the target's token after it fed, the head's
// next draft is the host's.
func TestHeadDraftVerifyTree(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	gens := []*headTreeGen{
		{headTwins: newHeadTwins(t, h, target, []int{3, 17, 5, 9, 30, 200}), width: 2, depth: 3, nodes: 6},
		{headTwins: newHeadTwins(t, h, target, []int{8, 1, 250, 4}), width: 4, depth: 3, nodes: 12},
	}
	for round := range 3 {
		steps := make([]engine.TreeStep, len(gens))
		for i, g := range gens {
			steps[i] = engine.TreeStep{
				Draft:  &engine.Entry{Seq: g.hF, Target: g.tF, Tokens: slices.Clone(g.text[g.hF.Len():])},
				Verify: &engine.VerifyEntry{Seq: g.tF, Tokens: slices.Clone(g.text[g.tF.Len():])},
				Width:  g.width, Depth: g.depth, Nodes: g.nodes,
			}
		}
		if !h.FusesTree(target, steps) {
			t.Fatalf("round %d: FusesTree refused the steps", round)
		}
		if err := h.DraftVerifyTree(ctx, target, steps); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, g := range gens {
			s := steps[i]
			what := fmt.Sprintf("round %d, generation %d", round, i)
			tPend := len(g.text) - g.tS.Len()
			chosen := checkDeviceTree(t, what, s, len(g.text), tPend)
			tree := s.Tree
			L := len(g.text) // the tree's first token in the head's sequences
			if got, want := g.hF.Len(), L+(g.depth-1)*g.width; got != want {
				t.Errorf("%s: head Len %d, want %d", what, got, want)
			}
			// The host's way on the S sequences: the pending tokens, then
			// each level's fed nodes (in drafter-slot order) as tree nodes
			// under their parents, each row read out.
			explored := map[int]engine.VerifyRow{}
			root := &engine.VerifyEntry{Seq: g.hS, Target: g.tS, Tokens: slices.Clone(g.text[g.hS.Len():]), Out: 1, TopN: g.width + 2}
			if err := h.Verify(ctx, []*engine.VerifyEntry{root}); err != nil {
				t.Fatal(err)
			}
			explored[-1] = root.Rows[0]
			for d := 1; d < g.depth; d++ {
				var fed []int
				for k, nd := range tree {
					if nd.Depth == d && nd.DraftSlot >= 0 {
						fed = append(fed, k)
					}
				}
				sort.Slice(fed, func(a, b int) bool { return tree[fed[a]].DraftSlot < tree[fed[b]].DraftSlot })
				en := &engine.VerifyEntry{Seq: g.hS, Target: g.tS, Out: len(fed), TopN: g.width + 2}
				for _, k := range fed {
					parent := L - 1
					if p := tree[k].Parent; p >= 0 {
						parent = tree[p].DraftSlot
					}
					if tree[k].DraftSlot != g.hS.Len()+len(en.Tokens) {
						t.Fatalf("%s: node %d fed at token %d, the host's at %d", what, k, tree[k].DraftSlot, g.hS.Len()+len(en.Tokens))
					}
					en.Tokens, en.Parents = append(en.Tokens, tree[k].ID), append(en.Parents, parent)
				}
				if err := h.Verify(ctx, []*engine.VerifyEntry{en}); err != nil {
					t.Fatal(err)
				}
				for j, k := range fed {
					explored[k] = en.Rows[j]
				}
			}
			if g.hS.Len() != g.hF.Len() {
				t.Errorf("%s: head Len %d, the host's %d", what, g.hF.Len(), g.hS.Len())
			}
			for k, row := range explored {
				checkChildren(t, what, tree, k, row.Top, g.width, headLogprobTol)
			}
			// The target's rows: its Verify of the same tree on S.
			v := &engine.VerifyEntry{Seq: g.tS, Tokens: slices.Clone(s.Verify.Tokens), Parents: slices.Clone(s.Verify.Parents), Out: len(s.Verify.Rows), TopN: 2}
			if err := target.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
			for r, want := range v.Rows {
				got := s.Verify.Rows[r]
				nearTie := len(want.Top) == 2 && want.Top[0].Logprob-want.Top[1].Logprob < 1e-3
				if got.Argmax != want.Argmax && !nearTie || math.Abs(float64(got.ArgmaxLogprob-want.ArgmaxLogprob)) > 2e-3 {
					t.Errorf("%s row %d: argmax %d (%v), the host's %d (%v)", what, r, got.Argmax, got.ArgmaxLogprob, want.Argmax, want.ArgmaxLogprob)
				}
			}
			if t.Failed() {
				return
			}
			// The deepest verified path kept, as greedy acceptance would
			// keep it, and the target's token after it.
			last := chosen[len(chosen)-1]
			var tslots, dslots, keep []int
			for k := last; k >= 0; k = tree[k].Parent {
				tslots = append([]int{len(g.text) + tree[k].Row}, tslots...)
				keep = append([]int{tree[k].ID}, keep...)
				if tree[k].DraftSlot >= 0 {
					dslots = append([]int{tree[k].DraftSlot}, dslots...)
				} else {
					dslots = nil // only a fed prefix is kept
				}
			}
			for _, q := range []engine.Sequence{g.tF, g.tS} {
				if err := q.KeepPath(tslots); err != nil {
					t.Fatal(err)
				}
			}
			for _, q := range []engine.Sequence{g.hF, g.hS} {
				if err := q.KeepPath(dslots); err != nil {
					t.Fatal(err)
				}
			}
			g.text = append(append(g.text, keep...), s.Verify.Rows[tree[last].Row+1].Argmax)
		}
		// The head's next draft from what each way kept.
		for i, g := range gens {
			var next [2]*engine.Entry
			for j, q := range [][2]engine.Sequence{{g.hF, g.tF}, {g.hS, g.tS}} {
				next[j] = &engine.Entry{Seq: q[0], Target: q[1], Tokens: slices.Clone(g.text[q[0].Len():])}
				if err := h.Step(ctx, []*engine.Entry{next[j]}); err != nil {
					t.Fatal(err)
				}
				q[0].Truncate(len(g.text) - 1) // the draft's row goes: the next round feeds its token again
			}
			if next[0].Next != next[1].Next || math.Abs(float64(next[0].Logprob-next[1].Logprob)) > headLogprobTol {
				t.Errorf("round %d, generation %d: the head's next draft %d (%v), the host's %d (%v)", round, i, next[0].Next, next[0].Logprob, next[1].Next, next[1].Logprob)
			}
		}
	}
}

// TestHeadFusesTree: what a head's DraftVerifyTree refuses — a head entry
// without the target's sequence it verifies, a tree wider than the draft
// vocabulary, a sampling target, a token past the vocabulary — refused
// before anything changes; the same step, mended, runs.
func TestHeadFusesTree(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	h, target := rig.head, rig.target
	g := newHeadTwins(t, h, target, []int{3, 17, 5, 9, 30, 200})
	step := func() engine.TreeStep {
		return engine.TreeStep{
			Draft:  &engine.Entry{Seq: g.hF, Target: g.tF, Tokens: slices.Clone(g.text[g.hF.Len():])},
			Verify: &engine.VerifyEntry{Seq: g.tF, Tokens: slices.Clone(g.text[g.tF.Len():])},
			Width:  2, Depth: 3, Nodes: 6,
		}
	}
	for _, bad := range []struct {
		name  string
		spoil func(s *engine.TreeStep)
		fuses bool // FusesTree takes it: the call refuses it later
	}{
		{"no Target sequence", func(s *engine.TreeStep) { s.Draft.Target = nil }, false},
		{"another Target sequence", func(s *engine.TreeStep) { s.Draft.Target = g.tS }, false},
		{"wider than the draft vocabulary", func(s *engine.TreeStep) { s.Width = rig.cfg.DraftVocabSize + 1 }, false},
		{"a sampling target", func(s *engine.TreeStep) { s.Verify.Sampling = sampling.Params{Temperature: 0.7} }, false},
		{"a token past the vocabulary", func(s *engine.TreeStep) { s.Verify.Tokens[0] = target.cfg.VocabSize }, true},
	} {
		s := step()
		bad.spoil(&s)
		steps := []engine.TreeStep{s}
		if got := h.FusesTree(target, steps); got != bad.fuses {
			t.Errorf("%s: FusesTree %v", bad.name, got)
		}
		hl, tl := g.hF.Len(), g.tF.Len()
		if err := h.DraftVerifyTree(context.Background(), target, steps); err == nil || g.hF.Len() != hl || g.tF.Len() != tl {
			t.Errorf("%s: err %v, head Len %d → %d, target Len %d → %d", bad.name, err, hl, g.hF.Len(), tl, g.tF.Len())
		}
	}
	if err := h.Fault(); err != nil {
		t.Fatalf("a refused tree broke the group: %v", err)
	}
	steps := []engine.TreeStep{step()}
	if !h.FusesTree(target, steps) || h.FusesTree(h, steps) {
		t.Fatal("FusesTree: want the head's own target only")
	}
	if err := h.DraftVerifyTree(context.Background(), target, steps); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
}
