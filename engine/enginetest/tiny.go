package enginetest

import (
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
	"webdraft/internal/synth"
	"webdraft/safetensors"
)

// TinyModel writes the tiny synthetic model with layers layers (random f32
// weights, seed 7) and loads it as f32: the engines' tests' target.
func TinyModel(t *testing.T, layers int) *checkpoint.Model {
	t.Helper()
	cfg := synth.Shapes["tiny"]
	cfg.NumHiddenLayers = layers
	dir := filepath.Join(t.TempDir(), "target")
	if err := synth.Write(dir, cfg, synth.Options{Seed: 7, Std: 0.2, DType: safetensors.F32}); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{Quant: checkpoint.F32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
