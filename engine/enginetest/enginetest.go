// Package enginetest checks that an engine.Engine behaves as the interface
// promises, against the reference model: every engine (CPU, WebGPU) runs the
// same suite.
package enginetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/qwen3"
	"webdraft/reference"
)

// Run checks e (over weights w of config c) against the reference model.
// Greedy tokens must be identical; the test models are chosen so that the
// reference's top-2 margins are wide enough for that.
func Run(t *testing.T, e engine.Engine, c qwen3.Config, w *qwen3.Weights) {
	ref, err := reference.New(c, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(c.VocabSize), 11))
	prompt := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = rng.IntN(c.VocabSize)
		}
		return p
	}
	refDraft := func(tokens []int, n int) []int {
		out, err := ref.Draft(ref.NewSequence(), tokens, n)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("draft matches reference", func(t *testing.T) {
		for _, n := range []int{1, 7, 40} {
			p := prompt(n)
			seq, err := e.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			got, err := engine.Draft(ctx, e, seq, p, 8)
			seq.Release()
			if err != nil {
				t.Fatal(err)
			}
			if want := refDraft(p, 8); !slices.Equal(got, want) {
				t.Errorf("prompt of %d: draft %v, reference %v", n, got, want)
			}
		}
	})

	t.Run("batched equals one at a time", func(t *testing.T) {
		// Sequences of different lengths, one prefilling while others decode.
		prompts := [][]int{prompt(3), prompt(17), prompt(1), prompt(30)}
		var want [][]int
		for _, p := range prompts {
			want = append(want, refDraft(p, 6))
		}
		entries := newEntries(t, e, prompts)
		got := make([][]int, len(prompts))
		for step := 0; step < 6; step++ {
			if err := e.Step(ctx, entries); err != nil {
				t.Fatal(err)
			}
			for i, en := range entries {
				got[i] = append(got[i], en.Next)
				en.Tokens = []int{en.Next}
			}
		}
		for i := range prompts {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("sequence %d: batched %v, alone %v", i, got[i], want[i])
			}
		}
	})

	t.Run("truncate rolls back", func(t *testing.T) {
		p := prompt(12)
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		if _, err := engine.Draft(ctx, e, seq, p, 5); err != nil {
			t.Fatal(err)
		}
		if seq.Len() != len(p)+4 {
			t.Fatalf("Len = %d, want %d", seq.Len(), len(p)+4)
		}
		seq.Truncate(5)
		got, err := engine.Draft(ctx, e, seq, p[5:], 5)
		if err != nil {
			t.Fatal(err)
		}
		if want := refDraft(p, 5); !slices.Equal(got, want) {
			t.Errorf("after rollback: %v, want %v", got, want)
		}
	})

	t.Run("steps chained equal steps", func(t *testing.T) {
		// engine.StepN (the engine's own when it chains steps on the
		// device) over entries of different lengths, one prefilling.
		prompts := [][]int{prompt(5), prompt(1), prompt(23)}
		entries := newEntries(t, e, prompts)
		got, err := engine.StepN(ctx, e, entries, 7)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range prompts {
			if want := refDraft(p, 7); !slices.Equal(got[i], want) {
				t.Errorf("entry %d: %v, reference %v", i, got[i], want)
			}
			if n := entries[i].Seq.Len(); n != len(p)+6 {
				t.Errorf("entry %d: Len = %d, want %d", i, n, len(p)+6)
			}
			if entries[i].Next != got[i][6] || !slices.Equal(entries[i].Tokens, p) {
				t.Errorf("entry %d: Next %d (want %d), Tokens changed", i, entries[i].Next, got[i][6])
			}
		}
		// And on from there, one entry rolled back.
		entries[0].Seq.Truncate(len(prompts[0]) + 2)
		entries[0].Tokens = got[0][2:3]
		entries[1].Tokens, entries[2].Tokens = []int{got[1][6]}, []int{got[2][6]}
		more, err := engine.StepN(ctx, e, entries, 3)
		if err != nil {
			t.Fatal(err)
		}
		if want := refDraft(prompts[0], 6)[3:6]; !slices.Equal(more[0], want) {
			t.Errorf("after rollback: %v, reference %v", more[0], want)
		}
		if want := refDraft(prompts[2], 10)[7:10]; !slices.Equal(more[2], want) {
			t.Errorf("continued: %v, reference %v", more[2], want)
		}
	})

	t.Run("chained steps past the context", func(t *testing.T) {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		p := prompt(c.MaxPositionEmbeddings - 3)
		_, err = engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: p}}, 6)
		if !errors.Is(err, engine.ErrContextFull) {
			t.Errorf("6 steps after %d of %d positions: %v", len(p), c.MaxPositionEmbeddings, err)
		}
		if n := seq.Len(); n > c.MaxPositionEmbeddings {
			t.Errorf("Len = %d past max_position_embeddings", n)
		}
	})

	t.Run("chained decode past the context", func(t *testing.T) {
		// Single tokens only (the engine may chain every step): nothing is
		// fed past max_position_embeddings.
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		p := prompt(c.MaxPositionEmbeddings - 3)
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: p}}); err != nil {
			t.Fatal(err)
		}
		_, err = engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: p[:1]}}, 6)
		if !errors.Is(err, engine.ErrContextFull) {
			t.Errorf("6 steps after %d of %d positions: %v", len(p), c.MaxPositionEmbeddings, err)
		}
		if n := seq.Len(); n > c.MaxPositionEmbeddings {
			t.Errorf("Len = %d past max_position_embeddings", n)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		for _, tokens := range [][]int{{}, {-1}, {c.VocabSize}} {
			if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: tokens}}); err == nil {
				t.Errorf("Step accepted tokens %v", tokens)
			}
			if _, err := engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: tokens}}, 3); err == nil {
				t.Errorf("StepN accepted tokens %v", tokens)
			}
		}
		other, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer other.Release()
		twice := []*engine.Entry{{Seq: other, Tokens: []int{1}}, {Seq: other, Tokens: []int{2}}}
		if _, err := engine.StepN(ctx, e, twice, 3); err == nil {
			t.Error("StepN accepted one sequence twice in a batch")
		}
		if other.Len() != 0 {
			t.Errorf("a refused StepN changed the cache: Len = %d", other.Len())
		}
		long := make([]int, c.MaxPositionEmbeddings+1)
		err = e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: long}})
		if !errors.Is(err, engine.ErrContextFull) {
			t.Errorf("past max_position_embeddings: %v", err)
		}
		if seq.Len() != 0 {
			t.Errorf("a refused step changed the cache: Len = %d", seq.Len())
		}
	})
}

// newEntries gives each prompt a fresh sequence of e, released when the
// test ends.
func newEntries(t *testing.T, e engine.Engine, prompts [][]int) []*engine.Entry {
	t.Helper()
	entries := make([]*engine.Entry, len(prompts))
	for i, p := range prompts {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(seq.Release)
		entries[i] = &engine.Entry{Seq: seq, Tokens: p}
	}
	return entries
}
