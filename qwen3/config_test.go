package qwen3

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Qwen3-0.6B's config.json as transformers 4.51 published it.
const config4x = `{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}`

// The same model as transformers 5.x writes it.
const config5x = `{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "dtype": "bfloat16",
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
  "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 40960,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "tie_word_embeddings": true, "transformers_version": "5.17.0", "use_sliding_window": false,
  "vocab_size": 151936
}`

func TestParseConfig(t *testing.T) {
	want := Config{VocabSize: 151936, HiddenSize: 1024, IntermediateSize: 3072, NumHiddenLayers: 28,
		NumAttentionHeads: 16, NumKeyValueHeads: 8, HeadDim: 128, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 40960, TieWordEmbeddings: true, DType: "bfloat16"}
	for name, js := range map[string]string{"4.x": config4x, "5.x": config5x} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseConfig([]byte(js))
			if err != nil {
				t.Fatal(err)
			}
			wantEOS := map[string][]int{"4.x": {151645}, "5.x": nil}[name]
			if !slices.Equal(got.EOSTokenIDs, wantEOS) {
				t.Errorf("eos_token_id %v, want %v", got.EOSTokenIDs, wantEOS)
			}
			got.EOSTokenIDs = nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			// head_dim is independent of hidden/heads (1024/16 = 64).
			if got.QDim() != 2048 || got.KVDim() != 1024 || got.GroupSize() != 2 {
				t.Errorf("QDim %d KVDim %d GroupSize %d", got.QDim(), got.KVDim(), got.GroupSize())
			}
		})
	}
}

func TestParseConfigRejects(t *testing.T) {
	cases := []struct{ edit, want string }{
		{`"model_type": "llama"`, "model_type"},
		{`"eos_token_id": "x"`, "eos_token_id"},
		{`"attention_bias": true`, "attention_bias"},
		{`"use_sliding_window": true`, "use_sliding_window"},
		{`"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4}`, "yarn"},
		{`"rope_scaling": {"type": "linear", "factor": 2}`, "linear"},
		{`"num_key_value_heads": 3`, "multiple"},
		{`"hidden_size": 0`, "hidden_size"},
		{`"layer_types": ["sliding_attention"]`, "layer_types"},
		{`"hidden_act": "gelu"`, "hidden_act"},
		{`"architectures": ["Qwen3MoeForCausalLM"]`, "architecture"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := ParseConfig(withField(t, config5x, c.edit))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, c.want)
			}
		})
	}
	if _, err := ParseConfig([]byte(`{`)); err == nil {
		t.Error("bad JSON accepted")
	}
}

// withField returns js with one top-level field (`"key": value`) set.
func withField(t *testing.T, js, field string) []byte {
	t.Helper()
	var m, f map[string]json.RawMessage
	if err := json.Unmarshal([]byte(js), &m); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte("{"+field+"}"), &f); err != nil {
		t.Fatal(err)
	}
	for k, v := range f {
		m[k] = v
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestNewWeightsSlots(t *testing.T) {
	c, err := ParseConfig([]byte(config5x))
	if err != nil {
		t.Fatal(err)
	}
	w, slots := NewWeights(&c)
	if want := 1 + 28*11 + 1; len(slots) != want { // embed, 11 per layer, norm; tied: no head
		t.Errorf("%d slots, want %d", len(slots), want)
	}
	if s := slots[2]; s.Name != "model.layers.0.self_attn.q_proj.weight" || s.Shape[0] != 2048 || s.Shape[1] != 1024 {
		t.Errorf("slot 2 = %+v", s)
	}
	if s := slots[6]; s.Name != "model.layers.0.self_attn.q_norm.weight" || s.Shape[0] != 128 {
		t.Errorf("slot 6 = %+v", s)
	}
	if err := w.Tie(&c); err != nil {
		t.Fatal(err)
	}
	c.TieWordEmbeddings = false
	_, slots = NewWeights(&c)
	if last := slots[len(slots)-1]; last.Name != "lm_head.weight" {
		t.Errorf("untied: last slot %s", last.Name)
	}
}
