package engine_test

import (
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/internal/synth"
)

func TestCPU(t *testing.T) {
	for _, name := range []string{"tied", "untied"} {
		t.Run(name, func(t *testing.T) {
			m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", name), checkpoint.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			e, err := engine.NewCPU(m.Config, m.Weights, 64<<20)
			if err != nil {
				t.Fatal(err)
			}
			enginetest.Run(t, e, m.Config, m.Weights)
		})
	}
}

// TestCPUPartialHead: a head over part of the vocabulary (lm_head.token_ids).
func TestCPUPartialHead(t *testing.T) {
	cfg := synth.Shapes["tiny"]
	dir := filepath.Join(t.TempDir(), "partial")
	if err := synth.Write(dir, cfg, synth.Options{Seed: 12, Std: 0.3, HeadTokens: 100}); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := engine.NewCPU(m.Config, m.Weights, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	enginetest.Run(t, e, m.Config, m.Weights)
}
