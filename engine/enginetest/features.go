package enginetest

import (
	"context"
	"errors"
	"slices"
	"testing"

	"webdraft/engine"
)

// FeatureTarget is a target engine that reads its sequences' features
// back and takes features computed elsewhere.
type FeatureTarget interface {
	engine.Engine
	engine.FeatureReader
	engine.FeatureWriter
}

// FeatureTransfer checks edge drafting's feature path on a target and a
// head h over it: the features Features reads back from a sequence the
// target fed, appended to a fresh sequence in two parts (AppendFeatures),
// read back bit for bit, and h drafts the same tokens over either; the
// model's passes refuse the features-only sequence (ErrFeaturesOnly) until
// it is truncated to none; bad ranges and rows are refused and change
// nothing. The text spans several KV blocks.
func FeatureTransfer(t *testing.T, target FeatureTarget, h engine.Engine) {
	t.Helper()
	ctx := context.Background()
	F := target.FeatureWidth()
	if F == 0 {
		t.Fatal("the target keeps no features")
	}
	vocab := target.Config().VocabSize
	text := make([]int, 41)
	for i := range text {
		text[i] = (i*37 + 11) % vocab
	}
	fed := text[:len(text)-1] // the last token is the head's to feed (a verified context's bonus)

	computed, err := target.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer computed.Release()
	wantNext := TargetStep(t, target, computed, fed...)
	rows, err := target.Features(computed, 0, len(fed))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(fed)*F {
		t.Fatalf("Features(0, %d): %d floats, want %d", len(fed), len(rows), len(fed)*F)
	}
	part, err := target.Features(computed, 17, 23)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(part, rows[17*F:23*F]) {
		t.Error("Features(17, 23) differs from those positions of Features(0, n)")
	}
	for _, r := range [][2]int{{0, len(fed) + 1}, {-1, 2}, {5, 4}} {
		if _, err := target.Features(computed, r[0], r[1]); err == nil {
			t.Errorf("Features(%d, %d) of %d positions: accepted", r[0], r[1], len(fed))
		}
	}

	sent, err := target.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer sent.Release()
	if err := target.AppendFeatures(sent, rows[:F*3/2]); err == nil {
		t.Error("AppendFeatures of a row and a half: accepted")
	}
	if sent.Len() != 0 {
		t.Fatalf("a refused AppendFeatures left %d positions", sent.Len())
	}
	if err := target.AppendFeatures(sent, rows[:7*F]); err != nil {
		t.Fatal(err)
	}
	if err := target.AppendFeatures(sent, rows[7*F:]); err != nil {
		t.Fatal(err)
	}
	if sent.Len() != len(fed) {
		t.Fatalf("after AppendFeatures the sequence holds %d positions, want %d", sent.Len(), len(fed))
	}
	back, err := target.Features(sent, 0, len(fed))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, rows) {
		t.Error("the appended features do not read back as they were written")
	}

	// The head drafts the same over either sequence.
	draft := func(tseq engine.Sequence) []engine.Token {
		hseq, err := h.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer hseq.Release()
		out, err := engine.StepN(ctx, h, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: text}}, 4)
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	want, got := draft(computed), draft(sent)
	for i := range want {
		if got[i].ID != want[i].ID || got[i].Logprob != want[i].Logprob {
			t.Errorf("draft token %d over the appended features: %d (%v), over the target's own: %d (%v)",
				i, got[i].ID, got[i].Logprob, want[i].ID, want[i].Logprob)
		}
	}

	// The model's own passes refuse the sequence until it holds nothing.
	err = target.Step(ctx, []*engine.Entry{{Seq: sent, Tokens: []int{text[len(fed)]}}})
	if !errors.Is(err, engine.ErrFeaturesOnly) {
		t.Errorf("Step over a features-only sequence: %v, want ErrFeaturesOnly", err)
	}
	err = target.Verify(ctx, []*engine.VerifyEntry{{Seq: sent, Tokens: []int{text[len(fed)]}, Out: 1}})
	if !errors.Is(err, engine.ErrFeaturesOnly) {
		t.Errorf("Verify over a features-only sequence: %v, want ErrFeaturesOnly", err)
	}
	sent.Truncate(5)
	if err := target.Step(ctx, []*engine.Entry{{Seq: sent, Tokens: []int{1}}}); !errors.Is(err, engine.ErrFeaturesOnly) {
		t.Errorf("Step after Truncate(5): %v, want ErrFeaturesOnly", err)
	}
	sent.Truncate(0)
	if next := TargetStep(t, target, sent, fed...); next != wantNext {
		t.Errorf("the sequence truncated to none and fed the text again: next %d, want %d", next, wantNext)
	}
}

// NoFeatures checks that an engine that keeps no features refuses to read
// or take them.
func NoFeatures(t *testing.T, e FeatureTarget) {
	t.Helper()
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	if e.FeatureWidth() != 0 {
		t.Errorf("FeatureWidth %d, want 0", e.FeatureWidth())
	}
	if _, err := e.Features(seq, 0, 0); err == nil {
		t.Error("Features of an engine that keeps none: accepted")
	}
	if err := e.AppendFeatures(seq, nil); err == nil {
		t.Error("AppendFeatures to an engine that keeps none: accepted")
	}
}
