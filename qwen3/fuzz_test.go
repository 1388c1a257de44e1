package qwen3

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

// FuzzParseConfig feeds ParseConfig arbitrary bytes. It must never panic,
// and a config it accepts must be one webdraft can use:
//   - Validate passes, and the derived sizes (QDim, KVDim, GroupSize) and
//     RoPE's inverse frequencies (head_dim/2 of them, none NaN or negative)
//     come out without a panic;
//   - it is a fixed point: the Config, written back as a transformers 5.x
//     config.json, parses to the same Config.
//
// Seeds: testdata/fuzz/FuzzParseConfig and the two published configs of
// config_test.go. Bounded run (Taskfile's fuzz task):
//
//	go test ./qwen3 -run '^$' -fuzz '^FuzzParseConfig$' -fuzztime 10s
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(config4x))
	f.Add([]byte(config5x))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("ParseConfig accepted a config Validate refuses: %v", err)
		}
		if g := c.GroupSize(); g < 1 || g*c.NumKeyValueHeads != c.NumAttentionHeads {
			t.Fatalf("GroupSize %d from %+v", g, c)
		}
		_, _ = c.QDim(), c.KVDim()
		if c.HeadDim <= 1<<16 { // larger ones are valid but not worth the allocation here
			inv := c.RopeInvFreq()
			if len(inv) != c.HeadDim/2 {
				t.Fatalf("%d inverse frequencies for head_dim %d", len(inv), c.HeadDim)
			}
			for i, v := range inv {
				if math.IsNaN(float64(v)) || v < 0 {
					t.Fatalf("inverse frequency %d is %v (rope_theta %v, head_dim %d)", i, v, c.RopeTheta, c.HeadDim)
				}
			}
		}
		again, err := ParseConfig(writeConfig(t, c))
		if err != nil {
			t.Fatalf("the accepted config, written back, is refused: %v\n%s", err, writeConfig(t, c))
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("written back and parsed again:\n%+v\nwas\n%+v", again, c)
		}
	})
}

// writeConfig writes c as transformers 5.x writes a config.json.
func writeConfig(t *testing.T, c Config) []byte {
	m := map[string]any{
		"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3",
		"vocab_size": c.VocabSize, "hidden_size": c.HiddenSize, "intermediate_size": c.IntermediateSize,
		"num_hidden_layers": c.NumHiddenLayers, "num_attention_heads": c.NumAttentionHeads,
		"num_key_value_heads": c.NumKeyValueHeads, "head_dim": c.HeadDim, "rms_norm_eps": c.RMSNormEps,
		"rope_parameters":         map[string]any{"rope_theta": c.RopeTheta, "rope_type": "default"},
		"max_position_embeddings": c.MaxPositionEmbeddings, "tie_word_embeddings": c.TieWordEmbeddings,
		"hidden_act": "silu", "attention_bias": false, "use_sliding_window": false, "dtype": c.DType,
	}
	if c.EOSTokenIDs != nil {
		m["eos_token_id"] = c.EOSTokenIDs
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
