package cpu

import (
	"context"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/qwen3"
	"webdraft/reference"
)

// tinyTarget writes a tiny random f32 target of the given layers and loads
// it as f32: the CPU engine over it keeps the features of layers, beside
// the reference model, the oracle.
func tinyTarget(t *testing.T, layers int, features []int) (*Engine, *reference.Model, qwen3.Config, *qwen3.Weights) {
	t.Helper()
	m := enginetest.TinyModel(t, layers)
	e, err := New(m.Config, m.Weights, Options{KVBytes: 16 << 20, Threads: 3, FeatureLayers: features})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	return e, ref, m.Config, m.Weights
}

// checkFeatures holds a sequence's features to the reference's over its
// text.
func checkFeatures(t *testing.T, what string, seq engine.Sequence, ref *reference.Model, text []int, layers []int) {
	t.Helper()
	s := seq.(*sequence)
	if s.Len() != len(text) {
		t.Fatalf("%s: the sequence holds %d positions, want %d", what, s.Len(), len(text))
	}
	for i, want := range enginetest.Features(t, ref, text, layers) {
		got := s.features(i)
		if len(got) != len(want) {
			t.Fatalf("%s: position %d: %d floats of features, want %d", what, i, len(got), len(want))
		}
		if e := enginetest.RelErr(got, want); e > 1e-5 {
			t.Errorf("%s: position %d: features %.2g from the reference's", what, i, e)
		}
	}
}

// TestFeatures: a sequence of an engine with FeatureLayers keeps, at every
// position fed by Step or Verify, the residual stream entering those
// layers (the embedding for layer 0) in the order given, equal to the
// reference's ForwardFeatures; after a Truncate and a re-feed, and after
// a token tree's path is kept (KeepPath), the features follow the text.
func TestFeatures(t *testing.T) {
	layers := []int{3, 0, 1}
	e, ref, cfg, w := tinyTarget(t, 4, layers)
	if got := e.FeatureLayers(); !slices.Equal(got, layers) {
		t.Fatalf("FeatureLayers() = %v, want %v", got, layers)
	}
	e.FeatureLayers()[0] = 2
	if e.FeatureLayers()[0] != 3 {
		t.Error("FeatureLayers returns the engine's own slice")
	}
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
	text = append(text, en.Next)
	draft := []int{en.Next, 40, 41, 42}
	v := &engine.VerifyEntry{Seq: seq, Tokens: draft, Out: 2}
	if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
		t.Fatal(err)
	}
	text = append(text[:len(text)-1], draft...)
	checkFeatures(t, "after Step and Verify", seq, ref, text, layers)

	seq.Truncate(5)
	text = append(text[:5], 77, 78, 79)
	if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: text[5:]}}); err != nil {
		t.Fatal(err)
	}
	checkFeatures(t, "after Truncate and a re-feed", seq, ref, text, layers)

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
	checkFeatures(t, "after KeepPath", seq, ref, text, layers)

	for _, bad := range [][]int{{0, 0}, {-1}, {4}, {1, 2, 1}} {
		if _, err := New(cfg, w, Options{FeatureLayers: bad}); err == nil {
			t.Errorf("feature layers %v accepted", bad)
		}
	}
}

// TestNoFeatures: an engine without FeatureLayers keeps no features.
func TestNoFeatures(t *testing.T) {
	e, _, _, _ := tinyTarget(t, 2, nil)
	seq := enginetest.NewSequence(t, e)
	if err := e.Step(context.Background(), []*engine.Entry{{Seq: seq, Tokens: []int{1, 2, 3}}}); err != nil {
		t.Fatal(err)
	}
	if s := seq.(*sequence); s.feat != nil || e.featureWidth() != 0 {
		t.Errorf("%d floats of features kept without FeatureLayers", len(s.feat))
	}
}

// TestFeatureTransfer: Features and AppendFeatures carry a sequence's
// features to another, over which the head drafts the same
// (enginetest.FeatureTransfer); an engine that keeps none refuses both.
func TestFeatureTransfer(t *testing.T) {
	rig := newHeadRig(t, true)
	enginetest.FeatureTransfer(t, rig.target, rig.head)
	plain, _, _, _ := tinyTarget(t, 2, nil)
	enginetest.NoFeatures(t, plain)
}
