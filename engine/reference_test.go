package engine_test

import (
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/internal/synth"
)

// TestReference runs the engine suite on the golden models, tied and untied, and
// on a head over part of the vocabulary (lm_head.token_ids).
func TestReference(t *testing.T) {
	partial := filepath.Join(t.TempDir(), "partial")
	if err := synth.Write(partial, synth.Shapes["tiny"], synth.Options{Seed: 12, Std: 0.3, HeadTokens: 100}); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{
		"tied":         filepath.Join("..", "testdata", "golden", "tied"),
		"untied":       filepath.Join("..", "testdata", "golden", "untied"),
		"partial_head": partial,
	} {
		t.Run(name, func(t *testing.T) {
			m, err := checkpoint.Load(dir, checkpoint.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			e, err := engine.NewReference(m.Config, m.Weights, 64<<20)
			if err != nil {
				t.Fatal(err)
			}
			enginetest.Run(t, e, m.Config, m.Weights)
		})
	}
}
