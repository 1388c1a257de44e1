package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine/cpu/ops"
	"webdraft/reference"
	"webdraft/weights"
)

// TestLogits holds the engine's logits to the reference's over a prompt
// and the rows of a verification after it, on the golden model and on the
// embedded target: within logitTol × max|logit| at every row.
func TestLogits(t *testing.T) {
	type model struct {
		name string
		load func() (*checkpoint.Model, error)
	}
	models := []model{{"golden_tied", func() (*checkpoint.Model, error) {
		return checkpoint.Load(filepath.Join("..", "..", "testdata", "golden", "tied"), checkpoint.LoadOptions{})
	}}}
	if weights.Embedded() {
		models = append(models, model{"embedded_target", func() (*checkpoint.Model, error) {
			return checkpoint.LoadFS(weights.FS(), "target", checkpoint.LoadOptions{})
		}})
	}
	for _, mc := range models {
		for _, fixed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fixed=%v", mc.name, fixed), func(t *testing.T) {
				defer ops.SetFixed(ops.SetFixed(fixed))
				testLogits(t, mc.load)
			})
		}
	}
}

// testLogits compares the logits of the model load gives, every one
// computed exactly (NoScreen: a greedy read-out otherwise screens most of
// them, TestScreenedReadOut).
func testLogits(t *testing.T, load func() (*checkpoint.Model, error)) {
	m, err := load()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := New(m.Config, m.Weights, Options{KVBytes: 64 << 20, NoScreen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	tokens := make([]int, 48)
	for i := range tokens {
		tokens[i] = rng.IntN(min(m.Config.VocabSize, 5000))
	}
	const prompt = 40
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	rseq := ref.NewSequence()
	worst := 0.0
	for _, span := range [][2]int{{0, 12}, {12, 24}, {24, 36}, {36, prompt}, {prompt, len(tokens)}} { // read out, the pass keeps its logits
		n := span[1] - span[0]
		if _, err := e.forward(context.Background(), []feed{{seq: seq, tokens: tokens[span[0]:span[1]], read: readout{rows: n}}}); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			want, err := ref.Forward(rseq, tokens[span[0]+i:span[0]+i+1])
			if err != nil {
				t.Fatal(err)
			}
			got := e.pass.logits[i*e.pass.headRows : (i+1)*e.pass.headRows]
			var scale, diff float64
			for j, w := range want {
				scale = math.Max(scale, math.Abs(float64(w)))
				diff = math.Max(diff, math.Abs(float64(got[j]-w)))
			}
			worst = math.Max(worst, diff/scale)
		}
	}
	t.Logf("max |Δlogit| / max|logit| = %.3g", worst)
	if worst > logitTol {
		t.Errorf("logits %.3g × max|logit| from the reference's, want ≤ %g", worst, logitTol)
	}
}

const logitTol = 1e-4
