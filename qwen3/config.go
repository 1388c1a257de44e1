// Package qwen3 describes the Qwen3 architecture: its hyperparameters (parsed
// from a Hugging Face config.json) and its weight tree, named as Hugging
// Face's modeling_qwen3.py names it.
package qwen3

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
)

// Config holds the hyperparameters webdraft uses (HF's Qwen3Config names).
type Config struct {
	VocabSize             int     // vocab_size
	HiddenSize            int     // hidden_size
	IntermediateSize      int     // intermediate_size: the MLP width
	NumHiddenLayers       int     // num_hidden_layers
	NumAttentionHeads     int     // num_attention_heads: query heads
	NumKeyValueHeads      int     // num_key_value_heads: GQA key/value heads
	HeadDim               int     // head_dim: independent of hidden/heads
	RMSNormEps            float64 // rms_norm_eps
	RopeTheta             float64 // rope_theta (4.x) or rope_parameters.rope_theta (5.x)
	MaxPositionEmbeddings int     // max_position_embeddings
	TieWordEmbeddings     bool    // tie_word_embeddings: lm_head shares embed_tokens
	DType                 string  // torch_dtype (4.x) or dtype (5.x), informational
	// EOSTokenIDs are the tokens that end a generation (eos_token_id: one,
	// a list, or none).
	EOSTokenIDs []int
}

// QDim is the width of the query projection: heads × head_dim.
func (c *Config) QDim() int { return c.NumAttentionHeads * c.HeadDim }

// KVDim is the width of each of the key and value projections.
func (c *Config) KVDim() int { return c.NumKeyValueHeads * c.HeadDim }

// GroupSize is the number of query heads sharing one key/value head.
func (c *Config) GroupSize() int { return c.NumAttentionHeads / c.NumKeyValueHeads }

// RopeInvFreq is RoPE's inverse frequencies theta^(-2i/D) for i < D/2
// (D = head_dim), computed in f32 as transformers does: 1 / theta **
// (arange(0, D, 2).float() / D). Every implementation takes them from here,
// so that they agree to the bit.
func (c *Config) RopeInvFreq() []float32 {
	D := c.HeadDim
	inv := make([]float32, D/2)
	for i := range inv {
		exp := float32(2*i) / float32(D)
		inv[i] = 1 / float32(math.Pow(c.RopeTheta, float64(exp)))
	}
	return inv
}

// rawConfig is config.json as transformers 4.x and 5.x write it.
type rawConfig struct {
	ModelType             string          `json:"model_type"`
	Architectures         []string        `json:"architectures"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	RopeTheta             *float64        `json:"rope_theta"`
	RopeScaling           *rope           `json:"rope_scaling"`
	RopeParameters        *rope           `json:"rope_parameters"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	TorchDType            string          `json:"torch_dtype"`
	DType                 string          `json:"dtype"`
	AttentionBias         bool            `json:"attention_bias"`
	UseSlidingWindow      bool            `json:"use_sliding_window"`
	LayerTypes            []string        `json:"layer_types"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`
	HiddenAct             string          `json:"hidden_act"`
}

type rope struct {
	RopeType  string   `json:"rope_type"`
	Type      string   `json:"type"` // older spelling of rope_type
	RopeTheta *float64 `json:"rope_theta"`
}

func (r *rope) kind() string {
	if r.RopeType != "" {
		return r.RopeType
	}
	return r.Type
}

// LoadConfig reads and validates a config.json.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses a config.json written by transformers 4.x or 5.x and
// rejects what webdraft does not support.
func ParseConfig(data []byte) (Config, error) {
	var r rawConfig
	if err := json.Unmarshal(data, &r); err != nil {
		return Config{}, fmt.Errorf("bad config.json: %w", err)
	}
	if r.ModelType != "qwen3" {
		return Config{}, fmt.Errorf("model_type is %q, want \"qwen3\"", r.ModelType)
	}
	if len(r.Architectures) > 0 && r.Architectures[0] != "Qwen3ForCausalLM" {
		return Config{}, fmt.Errorf("architecture %q is not supported (want Qwen3ForCausalLM)", r.Architectures[0])
	}
	c := Config{
		VocabSize:             r.VocabSize,
		HiddenSize:            r.HiddenSize,
		IntermediateSize:      r.IntermediateSize,
		NumHiddenLayers:       r.NumHiddenLayers,
		NumAttentionHeads:     r.NumAttentionHeads,
		MaxPositionEmbeddings: r.MaxPositionEmbeddings,
		RMSNormEps:            1e-6,
		RopeTheta:             10000,
		TieWordEmbeddings:     true, // Qwen3Config's default
		DType:                 r.TorchDType,
	}
	if r.DType != "" {
		c.DType = r.DType
	}
	if err := parseEOS(r.EOSTokenID, &c.EOSTokenIDs); err != nil {
		return Config{}, err
	}
	c.NumKeyValueHeads = c.NumAttentionHeads
	if r.NumKeyValueHeads != nil {
		c.NumKeyValueHeads = *r.NumKeyValueHeads
	}
	if r.HeadDim != nil {
		c.HeadDim = *r.HeadDim
	} else if c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if r.RMSNormEps != nil {
		c.RMSNormEps = *r.RMSNormEps
	}
	if r.TieWordEmbeddings != nil {
		c.TieWordEmbeddings = *r.TieWordEmbeddings
	}
	if r.RopeTheta != nil {
		c.RopeTheta = *r.RopeTheta
	}
	for _, rp := range []*rope{r.RopeScaling, r.RopeParameters} {
		if rp == nil {
			continue
		}
		if k := rp.kind(); k != "" && k != "default" {
			return Config{}, fmt.Errorf("rope type %q is not supported (only default RoPE)", k)
		}
		if rp.RopeTheta != nil {
			c.RopeTheta = *rp.RopeTheta
		}
	}
	if r.AttentionBias {
		return Config{}, fmt.Errorf("attention_bias: true is not supported")
	}
	if r.UseSlidingWindow {
		return Config{}, fmt.Errorf("use_sliding_window: true is not supported")
	}
	for i, t := range r.LayerTypes {
		if t != "full_attention" {
			return Config{}, fmt.Errorf("layer_types[%d] is %q: only full_attention is supported", i, t)
		}
	}
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return Config{}, fmt.Errorf("hidden_act %q is not supported (want silu)", r.HiddenAct)
	}
	return c, c.Validate()
}

// parseEOS reads eos_token_id: null, an id, or a list of ids.
func parseEOS(raw json.RawMessage, ids *[]int) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		*ids = []int{one}
		return nil
	}
	if err := json.Unmarshal(raw, ids); err != nil {
		return fmt.Errorf("eos_token_id %s: want an id, a list of ids or null", raw)
	}
	return nil
}

// Validate checks that the hyperparameters are positive and consistent.
func (c *Config) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads}, {"head_dim", c.HeadDim},
		{"max_position_embeddings", c.MaxPositionEmbeddings},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%s is %d, want > 0", f.name, f.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim %d is odd: RoPE needs pairs", c.HeadDim)
	}
	if !(c.RMSNormEps > 0) || !(c.RopeTheta > 0) {
		return fmt.Errorf("rms_norm_eps %g and rope_theta %g must be positive", c.RMSNormEps, c.RopeTheta)
	}
	return nil
}
