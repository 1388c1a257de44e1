package webgpu

import (
	"context"
	"slices"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/gpu/gputest"
	"webdraft/reference"
	"webdraft/sampling"
)

// tinyTarget writes a tiny random f32 target of the given layers (synth's
// "tiny": 64 wide, 256 tokens) and opens it in g as an engine keeping the
// features of layers (f32 KV cache), beside the reference model, the
// oracle, and the checkpoint.
func tinyTarget(t *testing.T, g *Group, layers int, features []int) (*Engine, *reference.Model, *checkpoint.Model) {
	t.Helper()
	m := enginetest.TinyModel(t, layers)
	e, err := g.New(m.Config, m.Weights, Options{KVBytes: 16 << 20, MaxSequences: 16, KV: "f32", FeatureLayers: features})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	return e, ref, m
}

// featureTol is how far the device's f32 features may be from the
// reference's: f32 math (docs/reference.md, "Tolerances"), its sums in
// another order over a few layers.
const featureTol = 1e-5

// checkFeatures holds the features a sequence keeps to the reference's
// over its text.
func checkFeatures(t *testing.T, what string, e *Engine, seq engine.Sequence, ref *reference.Model, text []int) {
	t.Helper()
	if seq.Len() != len(text) {
		t.Fatalf("%s: the sequence holds %d positions, want %d", what, seq.Len(), len(text))
	}
	worst := 0.0
	all, err := e.Features(seq, 0, len(text))
	if err != nil {
		t.Fatal(err)
	}
	F := e.FeatureWidth()
	for i, want := range enginetest.Features(t, ref, text, e.features) {
		got := all[i*F : (i+1)*F]
		if len(got) != len(want) {
			t.Fatalf("%s: position %d: %d floats of features, want %d", what, i, len(got), len(want))
		}
		if d := enginetest.RelErr(got, want); d > featureTol {
			t.Errorf("%s: position %d: features %.2g from the reference's", what, i, d)
		} else {
			worst = max(worst, d)
		}
	}
	t.Logf("%s: %d positions, features within %.2g of the reference's", what, len(text), worst)
}

// TestFeatures: a sequence of an engine with FeatureLayers keeps on the
// device, at every position any of its passes fed — Step, a chain of
// StepN, a sampled Verify, a token tree's Verify and the path KeepPath
// kept, a draft fused with its verification (DraftVerify), a tree drafted
// and verified in one submission (DraftVerifyTree) and its path kept —
// the residual stream entering those layers (the embedding for layer 0)
// in the order given, equal to the reference's ForwardFeatures; after a
// Truncate and a re-feed the features follow the text.
func TestFeatures(t *testing.T) {
	layers := []int{3, 0, 1}
	g := NewGroup(gputest.Device(t))
	e, ref, m := tinyTarget(t, g, 4, layers)
	if got := e.FeatureLayers(); !slices.Equal(got, layers) {
		t.Fatalf("FeatureLayers() = %v, want %v", got, layers)
	}
	e.FeatureLayers()[0] = 2
	if e.FeatureLayers()[0] != 3 {
		t.Error("FeatureLayers returns the engine's own slice")
	}
	// A drafter in the group, for the fused passes.
	d, err := g.New(m.Config, m.Weights, Options{KVBytes: 8 << 20, MaxSequences: 8, KV: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ctx := context.Background()
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	text := []int{3, 17, 5, 9, 30, 200, 11}
	en := &engine.Entry{Seq: seq, Tokens: text}
	if err := e.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	// A chain: the next token and two of its greedy tokens fed on the
	// device.
	chain, err := e.StepN(ctx, []*engine.Entry{{Seq: seq, Tokens: []int{en.Next}}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, en.Next, chain[0][0].ID, chain[0][1].ID)
	// A sampled verification of four tokens.
	draft := []int{chain[0][2].ID, 40, 41, 42}
	v := &engine.VerifyEntry{Seq: seq, Tokens: draft, Out: 2, Sampling: sampling.Params{Temperature: 0.8},
		Draws: []sampling.Draw{{X: 40, U: 0.3, V: 0.6}, {X: 41, U: 0.9, V: 0.1}}}
	if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
		t.Fatal(err)
	}
	text = append(text, draft...)
	checkFeatures(t, "after Step, StepN and Verify", e, seq, ref, text)

	seq.Truncate(5)
	text = append(text[:5], 77, 78, 79)
	if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: text[5:]}}); err != nil {
		t.Fatal(err)
	}
	checkFeatures(t, "after Truncate and a re-feed", e, seq, ref, text)

	// A tree past the line: roots 50 and 51, 52 under 50, 53 under 51;
	// keep 51, 53.
	n := seq.Len()
	tree := &engine.VerifyEntry{Seq: seq, Tokens: []int{50, 51, 52, 53}, Parents: []int{n - 1, n - 1, n, n + 1}, Out: 4}
	if err := e.Verify(ctx, []*engine.VerifyEntry{tree}); err != nil {
		t.Fatal(err)
	}
	if err := seq.KeepPath([]int{n + 1, n + 3}); err != nil {
		t.Fatal(err)
	}
	text = append(text, 51, 53)
	checkFeatures(t, "after KeepPath", e, seq, ref, text)

	// A draft fused with its verification: the target takes its pending
	// token and the drafter's first three.
	dseq, err := d.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer dseq.Release()
	if err := d.Step(ctx, []*engine.Entry{{Seq: dseq, Tokens: text[:len(text)-1]}}); err != nil {
		t.Fatal(err)
	}
	seq.Truncate(len(text) - 1)
	step := engine.ChainStep{
		Draft:  &engine.Entry{Seq: dseq, Tokens: text[len(text)-1:]},
		Verify: &engine.VerifyEntry{Seq: seq, Tokens: text[len(text)-1:], Out: 4}, Take: 3,
	}
	out, err := d.DraftVerify(ctx, e, []engine.ChainStep{step}, 4)
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, engine.IDs(out[0][:3])...)
	checkFeatures(t, "after a fused draft and verification", e, seq, ref, text)

	// A tree drafted and verified in one submission; the path to its last
	// verified node kept.
	dseq.Truncate(len(text) - 1) // it holds the text, and a token drafted after it
	seq.Truncate(len(text) - 1)
	ts := []engine.TreeStep{{
		Draft:  &engine.Entry{Seq: dseq, Tokens: text[len(text)-1:]},
		Verify: &engine.VerifyEntry{Seq: seq, Tokens: text[len(text)-1:]}, Width: 2, Depth: 3, Nodes: 5,
	}}
	if !d.FusesTree(e, ts) {
		t.Fatal("FusesTree refused the step")
	}
	if err := d.DraftVerifyTree(ctx, e, ts); err != nil {
		t.Fatal(err)
	}
	nodes, last := ts[0].Tree, -1
	for k, nd := range nodes {
		if nd.Row >= 0 && (last < 0 || nd.Row > nodes[last].Row) {
			last = k
		}
	}
	var slots, keep []int
	for k := last; k >= 0; k = nodes[k].Parent {
		slots = append([]int{len(text) + nodes[k].Row}, slots...)
		keep = append([]int{nodes[k].ID}, keep...)
	}
	if err := seq.KeepPath(slots); err != nil {
		t.Fatal(err)
	}
	text = append(text, keep...)
	checkFeatures(t, "after a tree drafted and verified on the device, its path kept", e, seq, ref, text)

	for _, bad := range [][]int{{0, 0}, {-1}, {4}, {1, 2, 1}} {
		if _, err := g.New(m.Config, m.Weights, Options{KVBytes: 8 << 20, MaxSequences: 8, FeatureLayers: bad}); err == nil {
			t.Errorf("feature layers %v accepted", bad)
		}
	}
}

// TestNoFeatures: an engine without FeatureLayers keeps no features: no
// feature buffers, no pairs, no gathers in its passes; with them each
// position's features count in the KV budget.
func TestNoFeatures(t *testing.T) {
	g := NewGroup(gputest.Device(t))
	plain, _, m := tinyTarget(t, g, 2, nil)
	if plain.kv.Features != 0 || plain.act.featPairs != nil || len(plain.FeatureLayers()) != 0 {
		t.Errorf("an engine without feature layers keeps %d feature buffers (pairs %v)", plain.kv.Features, plain.act.featPairs)
	}
	seq := enginetest.NewSequence(t, plain)
	defer seq.Release()
	if err := plain.Step(context.Background(), []*engine.Entry{{Seq: seq, Tokens: []int{1, 2, 3}}}); err != nil {
		t.Fatal(err)
	}
	with, err := g.New(m.Config, m.Weights, Options{KVBytes: 16 << 20, MaxSequences: 16, KV: "f32", FeatureLayers: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer with.Close()
	c := m.Config
	perToken := func(features int) int { return engine.KVBytesPerToken(&c, 4) + features*c.HiddenSize*4 }
	if got, want := with.kv.Blocks, (16<<20)/(perToken(2)*16); got != want {
		t.Errorf("%d blocks with two feature layers, want %d", got, want)
	}
	if got, want := plain.kv.Blocks, (16<<20)/(perToken(0)*16); got != want {
		t.Errorf("%d blocks without features, want %d", got, want)
	}
}

// TestFeatureTransfer: Features and AppendFeatures carry a sequence's
// features to another, over which the head drafts the same
// (enginetest.FeatureTransfer); an engine that keeps none refuses both.
func TestFeatureTransfer(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.FeatureTransfer(t, rig.target, rig.head)
	plain, _, _ := tinyTarget(t, NewGroup(gputest.Device(t)), 2, nil)
	enginetest.NoFeatures(t, plain)
}
