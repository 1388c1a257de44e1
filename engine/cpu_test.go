package engine_test

import (
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/enginetest"
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
