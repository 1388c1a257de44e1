package cpu_test

import (
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
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
