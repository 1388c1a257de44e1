package eagle3

import (
	"os"
	"strings"
	"testing"

	"webdraft/qwen3"
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
