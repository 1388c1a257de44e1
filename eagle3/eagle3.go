// Package eagle3 describes an EAGLE-3 draft head (LlamaForCausalLMEagle3, as
// SGLang's and vLLM's llama_eagle3.py load it): its config.json and its
// weight tree, in the public checkpoint layout, and the plan of a call's
// rows (PlanRows), which the engines that run a head share.
//
// The head reads its target. Three of the target's hidden states — the
// residual stream entering three of its layers, concatenated, 3·Ht wide —
// go through fc to the head's width H; one Llama decoder layer (midlayer)
// takes [input_layernorm(embedding); hidden_norm(hidden)], 2·H wide, into
// q, k and v, attends over the head's own KV cache with RoPE, and runs its
// MLP; norm and lm_head score draft_vocab_size tokens, which d2t maps to
// the target's vocabulary (target id = draft id + d2t[draft id]). A later
// draft step feeds back the layer's output before norm (H wide, no fc).
package eagle3

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"webdraft/qwen3"
)

// Architecture is the config's architectures entry of an EAGLE-3 head.
const Architecture = "LlamaForCausalLMEagle3"

// Config is an EAGLE-3 head's hyperparameters (config.json's names).
type Config struct {
	HiddenSize            int     // hidden_size: H, the head's width (the embedding's)
	IntermediateSize      int     // intermediate_size
	NumAttentionHeads     int     // num_attention_heads
	NumKeyValueHeads      int     // num_key_value_heads (default num_attention_heads)
	HeadDim               int     // head_dim (default hidden_size / num_attention_heads)
	RMSNormEps            float64 // rms_norm_eps (default 1e-6)
	RopeTheta             float64 // rope_theta (default 10000)
	MaxPositionEmbeddings int     // max_position_embeddings (default 8192)
	VocabSize             int     // vocab_size: the target's vocabulary
	DraftVocabSize        int     // draft_vocab_size: lm_head's rows (default vocab_size)
	TargetHiddenSize      int     // target_hidden_size: Ht (default hidden_size); fc takes 3·Ht
	// AuxLayers are the target layers whose input (the residual stream
	// entering them) the head reads, ascending: eagle_config's
	// eagle_aux_hidden_state_layer_ids, which name layer outputs, plus one
	// (as SGLang reads them), or nil for the engines' default (DefaultAux).
	AuxLayers []int
}

// rawConfig is config.json as EAGLE-3 heads ship it.
type rawConfig struct {
	Architectures         []string         `json:"architectures"`
	HiddenSize            int              `json:"hidden_size"`
	IntermediateSize      int              `json:"intermediate_size"`
	NumHiddenLayers       *int             `json:"num_hidden_layers"`
	NumAttentionHeads     int              `json:"num_attention_heads"`
	NumKeyValueHeads      *int             `json:"num_key_value_heads"`
	HeadDim               *int             `json:"head_dim"`
	RMSNormEps            *float64         `json:"rms_norm_eps"`
	RopeTheta             *float64         `json:"rope_theta"`
	RopeScaling           *json.RawMessage `json:"rope_scaling"`
	MaxPositionEmbeddings *int             `json:"max_position_embeddings"`
	VocabSize             int              `json:"vocab_size"`
	DraftVocabSize        *int             `json:"draft_vocab_size"`
	TargetHiddenSize      *int             `json:"target_hidden_size"`
	HiddenAct             *string          `json:"hidden_act"`
	Bias                  bool             `json:"bias"`
	AttentionBias         bool             `json:"attention_bias"`
	MLPBias               bool             `json:"mlp_bias"`
	TieWordEmbeddings     bool             `json:"tie_word_embeddings"`
	EagleConfig           *struct {
		UseAuxHiddenState *bool `json:"use_aux_hidden_state"`
		AuxLayerIDs       []int `json:"eagle_aux_hidden_state_layer_ids"`
	} `json:"eagle_config"`
}

// LoadConfig reads and checks an EAGLE-3 head's config.json.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := ParseConfig(data)
	if err != nil { // ParseConfig's errors begin "config.json: "
		return Config{}, fmt.Errorf("%s: %w", filepath.Dir(path), err)
	}
	return c, nil
}

// IsHead reports whether config.json data names an EAGLE-3 head.
func IsHead(data []byte) bool {
	var r struct {
		Architectures []string `json:"architectures"`
	}
	return json.Unmarshal(data, &r) == nil && slices.Contains(r.Architectures, Architecture)
}

// ParseConfig parses and checks config.json data. It refuses what webdraft
// does not run: another architecture, more than one layer, biases, RoPE
// scaling, an activation other than SiLU, a tied head, a head without fc.
func ParseConfig(data []byte) (Config, error) {
	var r rawConfig
	if err := json.Unmarshal(data, &r); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	if !slices.Contains(r.Architectures, Architecture) {
		return Config{}, fmt.Errorf("config.json: architectures %q, want [%q] (an EAGLE-3 head)", r.Architectures, Architecture)
	}
	c := Config{
		HiddenSize: r.HiddenSize, IntermediateSize: r.IntermediateSize, NumAttentionHeads: r.NumAttentionHeads,
		NumKeyValueHeads: r.NumAttentionHeads, RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 8192,
		VocabSize: r.VocabSize, DraftVocabSize: r.VocabSize, TargetHiddenSize: r.HiddenSize,
	}
	set := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	set(&c.NumKeyValueHeads, r.NumKeyValueHeads)
	set(&c.MaxPositionEmbeddings, r.MaxPositionEmbeddings)
	set(&c.DraftVocabSize, r.DraftVocabSize)
	set(&c.TargetHiddenSize, r.TargetHiddenSize)
	if r.NumAttentionHeads > 0 {
		c.HeadDim = r.HiddenSize / r.NumAttentionHeads
	}
	set(&c.HeadDim, r.HeadDim)
	if r.RMSNormEps != nil {
		c.RMSNormEps = *r.RMSNormEps
	}
	if r.RopeTheta != nil {
		c.RopeTheta = *r.RopeTheta
	}
	switch {
	case r.NumHiddenLayers != nil && *r.NumHiddenLayers != 1:
		return Config{}, fmt.Errorf("config.json: num_hidden_layers %d: webdraft runs heads of one layer", *r.NumHiddenLayers)
	case r.Bias || r.AttentionBias || r.MLPBias:
		return Config{}, fmt.Errorf("config.json: a head with biases (bias, attention_bias or mlp_bias) is not supported")
	case r.RopeScaling != nil && string(*r.RopeScaling) != "null":
		return Config{}, fmt.Errorf("config.json: rope_scaling %s is not supported", *r.RopeScaling)
	case r.HiddenAct != nil && *r.HiddenAct != "silu":
		return Config{}, fmt.Errorf("config.json: hidden_act %q, want silu", *r.HiddenAct)
	case r.TieWordEmbeddings:
		return Config{}, fmt.Errorf("config.json: tie_word_embeddings: a head scores its own draft vocabulary with lm_head")
	}
	if e := r.EagleConfig; e != nil {
		if e.UseAuxHiddenState != nil && !*e.UseAuxHiddenState {
			return Config{}, fmt.Errorf("config.json: eagle_config.use_aux_hidden_state false: a head without fc is not supported")
		}
		if len(e.AuxLayerIDs) > 0 {
			if len(e.AuxLayerIDs) != 3 {
				return Config{}, fmt.Errorf("config.json: eagle_aux_hidden_state_layer_ids %v: want three layers", e.AuxLayerIDs)
			}
			for _, id := range e.AuxLayerIDs {
				c.AuxLayers = append(c.AuxLayers, id+1)
			}
			slices.Sort(c.AuxLayers)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// Validate checks the sizes' consistency.
func (c Config) Validate() error {
	switch {
	case c.HiddenSize <= 0 || c.IntermediateSize <= 0 || c.VocabSize <= 0 || c.TargetHiddenSize <= 0:
		return fmt.Errorf("hidden_size %d, intermediate_size %d, vocab_size %d, target_hidden_size %d: want positive sizes",
			c.HiddenSize, c.IntermediateSize, c.VocabSize, c.TargetHiddenSize)
	case c.NumAttentionHeads <= 0 || c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		return fmt.Errorf("%d attention heads for %d key/value heads: want a positive multiple", c.NumAttentionHeads, c.NumKeyValueHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim %d: want a positive even number", c.HeadDim)
	case c.DraftVocabSize <= 0 || c.DraftVocabSize > c.VocabSize:
		return fmt.Errorf("draft_vocab_size %d: want 1 … vocab_size %d", c.DraftVocabSize, c.VocabSize)
	case c.RMSNormEps <= 0 || c.RopeTheta <= 0:
		return fmt.Errorf("rms_norm_eps %g, rope_theta %g: want positive values", c.RMSNormEps, c.RopeTheta)
	}
	return nil
}

// DefaultAux is the target layers a head reads when its config names none,
// as SGLang and vLLM choose them: the inputs of layers 2, L/2 and L−3, in
// the order the target's layers run.
func DefaultAux(targetLayers int) []int {
	aux := []int{2, targetLayers / 2, targetLayers - 3}
	slices.Sort(aux)
	return aux
}

// Aux returns the target layers whose inputs the head reads, ascending.
func (c Config) Aux(targetLayers int) []int {
	if c.AuxLayers != nil {
		return c.AuxLayers
	}
	return DefaultAux(targetLayers)
}

// Check refuses a head that does not fit target t, in one line naming both.
func (c Config) Check(t qwen3.Config) error {
	aux := c.Aux(t.NumHiddenLayers)
	switch {
	case c.TargetHiddenSize != t.HiddenSize:
		return fmt.Errorf("eagle3: the head reads hidden states of width %d (target_hidden_size), the target's are %d wide (hidden_size)", c.TargetHiddenSize, t.HiddenSize)
	case c.VocabSize != t.VocabSize:
		return fmt.Errorf("eagle3: the head's vocabulary has %d tokens, the target's %d", c.VocabSize, t.VocabSize)
	case c.HiddenSize != t.HiddenSize:
		return fmt.Errorf("eagle3: the head is %d wide and takes the target's embedding, which is %d wide", c.HiddenSize, t.HiddenSize)
	case aux[0] < 0 || aux[2] >= t.NumHiddenLayers || aux[0] == aux[1] || aux[1] == aux[2]: // ascending
		return fmt.Errorf("eagle3: the head reads the inputs of target layers %v, the target has layers 0 … %d", aux, t.NumHiddenLayers-1)
	}
	return nil
}

// Layer is the head's midlayer as a Qwen3-shaped config (one layer, no
// q/k norm), for the attention and RoPE helpers the target's code uses.
func (c Config) Layer() qwen3.Config {
	return qwen3.Config{
		VocabSize: c.VocabSize, HiddenSize: c.HiddenSize, IntermediateSize: c.IntermediateSize, NumHiddenLayers: 1,
		NumAttentionHeads: c.NumAttentionHeads, NumKeyValueHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim,
		RMSNormEps: c.RMSNormEps, RopeTheta: c.RopeTheta, MaxPositionEmbeddings: c.MaxPositionEmbeddings,
	}
}
