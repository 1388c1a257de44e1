package cpu_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/engine/enginetest"
	"webdraft/internal/synth"
)

// TestEngine runs the engine suite on the golden models, tied and untied,
// on a head over part of the vocabulary, and on one worker and three.
func TestEngine(t *testing.T) {
	partial := filepath.Join(t.TempDir(), "partial")
	if err := synth.Write(partial, synth.Shapes["tiny"], synth.Options{Seed: 12, Std: 0.3, HeadTokens: 100}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		threads   int
	}{
		{"tied", filepath.Join("..", "..", "testdata", "golden", "tied"), 0},
		{"untied", filepath.Join("..", "..", "testdata", "golden", "untied"), 0},
		{"partial_head", partial, 0},
		{"tied_1_thread", filepath.Join("..", "..", "testdata", "golden", "tied"), 1},
		{"untied_3_threads", filepath.Join("..", "..", "testdata", "golden", "untied"), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := checkpoint.Load(tc.dir, checkpoint.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			e, err := cpu.New(m.Config, m.Weights, cpu.Options{KVBytes: 64 << 20, Threads: tc.threads})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			enginetest.Run(t, e, m.Config, m.Weights)
		})
	}
}

// TestConcurrentDrivers drives one engine from two goroutines at once, as
// a server's scheduler and generator do, each on sequences of its own:
// every draft equals the same draft made alone.
func TestConcurrentDrivers(t *testing.T) {
	m, err := checkpoint.Load(filepath.Join("..", "..", "testdata", "golden", "untied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := cpu.New(m.Config, m.Weights, cpu.Options{KVBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	prompts := [][]int{{1, 2, 3}, {7, 8, 9, 10, 11, 12, 13}}
	draft := func(p []int) ([]int, error) {
		seq, err := e.NewSequence()
		if err != nil {
			return nil, err
		}
		defer seq.Release()
		toks, err := engine.Draft(ctx, e, seq, p, 12)
		return engine.IDs(toks), err
	}
	var want [][]int
	for _, p := range prompts {
		d, err := draft(p)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, d)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(prompts))
	for range 2 {
		for i, p := range prompts {
			wg.Go(func() {
				for range 20 {
					got, err := draft(p)
					if err != nil {
						errs <- err
						return
					}
					if !slices.Equal(got, want[i]) {
						errs <- fmt.Errorf("prompt %d: %v alongside another driver, %v alone", i, got, want[i])
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
