package eagle3

import (
	"os"
	"strings"
	"testing"

	"webdraft/qwen3"
	"webdraft/tensor"
)

// TestConfigRefuses: heads webdraft cannot run, or that do not fit their
// target, are refused in one line that names what is wrong.
func TestConfigRefuses(t *testing.T) {
	base, err := os.ReadFile("../testdata/eagle3/tiny/config.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, want string }{
		{`"num_hidden_layers": 1`, `"num_hidden_layers": 2`, "one layer"},
		{`"LlamaForCausalLMEagle3"`, `"LlamaForCausalLM"`, "EAGLE-3 head"},
		{`"rope_scaling": null`, `"rope_scaling": {"type": "yarn"}`, "rope_scaling"},
		{`"draft_vocab_size": 40`, `"draft_vocab_size": 400`, "draft_vocab_size"},
		{`"tie_word_embeddings": false`, `"tie_word_embeddings": true`, "tie_word_embeddings"},
	} {
		data := strings.Replace(string(base), c.from, c.to, 1)
		if data == string(base) {
			t.Fatalf("config.json has no %s", c.from)
		}
		if _, err := ParseConfig([]byte(data)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one naming %q", c.to, err, c.want)
		}
	}
	cfg, err := ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	target := qwen3.Config{VocabSize: 300, HiddenSize: 48, NumHiddenLayers: 8}
	if err := cfg.Check(target); err == nil || !strings.Contains(err.Error(), "64 wide") || !strings.Contains(err.Error(), "48 wide") {
		t.Errorf("a 64-wide head on a 48-wide target: %v", err)
	}
	target.HiddenSize = 64
	cfg.TargetHiddenSize = 64
	if err := cfg.Check(target); err != nil {
		t.Errorf("a fitting target: %v", err)
	}
	if got := cfg.Aux(36); got[0] != 2 || got[1] != 18 || got[2] != 33 {
		t.Errorf("default layers of a 36-layer target: %v, want [2 18 33]", got)
	}
	target.NumHiddenLayers = 2 // layers 2, 1 and −1 by default
	if err := cfg.Check(target); err == nil || !strings.Contains(err.Error(), "target layers") {
		t.Errorf("a 2-layer target: %v", err)
	}
	for _, d2t := range [][]int64{{0, 0, -1}, {0, 5, 4}, {0, 0, 300}} {
		c := Config{DraftVocabSize: 3, VocabSize: 300}
		if _, err := TargetIDsFrom(d2t, &c); err == nil {
			t.Errorf("d2t %v accepted", d2t)
		}
	}
}

// TestWeightsValidate: a complete tree of c's shapes passes; a tensor
// missing or of another shape, a norm of another length, an embedding of
// another shape, and target ids too few, outside the vocabulary or not
// ascending are refused, each naming what is wrong.
func TestWeightsValidate(t *testing.T) {
	c := Config{HiddenSize: 16, IntermediateSize: 24, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 8,
		VocabSize: 50, DraftVocabSize: 4, TargetHiddenSize: 16}
	full := func() *Weights {
		w := &Weights{TargetIDs: []int32{1, 5, 9, 40}}
		for _, s := range w.Slots(&c) {
			if s.Vector != nil {
				*s.Vector = make([]float32, s.Shape[0])
				continue
			}
			*s.Matrix = &tensor.F32{Rows: s.Shape[0], Cols: s.Shape[1], Data: make([]float32, s.Shape[0]*s.Shape[1])}
		}
		return w
	}
	if err := full().Validate(&c); err != nil {
		t.Fatalf("a complete tree: %v", err)
	}
	for _, bad := range []struct {
		name, want string
		spoil      func(w *Weights)
	}{
		{"no fc", "fc.weight is missing", func(w *Weights) { w.FC = nil }},
		{"a narrow q_proj", "q_proj", func(w *Weights) { w.QProj = &tensor.F32{Rows: 16, Cols: 16, Data: make([]float32, 256)} }},
		{"a short norm", "norm.weight has 3 values", func(w *Weights) { w.Norm = w.Norm[:3] }},
		{"an embedding of another width", EmbedName, func(w *Weights) { w.EmbedTokens = &tensor.F32{Rows: 50, Cols: 8, Data: make([]float32, 400)} }},
		{"three target ids", "target ids", func(w *Weights) { w.TargetIDs = w.TargetIDs[:3] }},
		{"a target id past the vocabulary", "ascending tokens", func(w *Weights) { w.TargetIDs[3] = 50 }},
		{"target ids out of order", "ascending tokens", func(w *Weights) { w.TargetIDs[1] = 1 }},
	} {
		w := full()
		bad.spoil(w)
		if err := w.Validate(&c); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error naming %q", bad.name, err, bad.want)
		}
	}
}
