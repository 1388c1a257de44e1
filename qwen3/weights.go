package qwen3

import (
	"fmt"

	"webdraft/tensor"
)

// Weights is the Qwen3 weight tree. Field names follow modeling_qwen3.py;
// each field's comment gives its checkpoint name and shape.
type Weights struct {
	EmbedTokens tensor.Matrix // model.embed_tokens.weight (vocab, hidden)
	Layers      []Layer       // model.layers.{i}
	Norm        []float32     // model.norm.weight (hidden)
	LMHead      tensor.Matrix // lm_head.weight (vocab, hidden); EmbedTokens when tied
}

// Layer is one decoder layer.
type Layer struct {
	InputLayernorm         []float32     // input_layernorm.weight (hidden)
	QProj                  tensor.Matrix // self_attn.q_proj.weight (heads*head_dim, hidden)
	KProj                  tensor.Matrix // self_attn.k_proj.weight (kv_heads*head_dim, hidden)
	VProj                  tensor.Matrix // self_attn.v_proj.weight (kv_heads*head_dim, hidden)
	OProj                  tensor.Matrix // self_attn.o_proj.weight (hidden, heads*head_dim)
	QNorm                  []float32     // self_attn.q_norm.weight (head_dim)
	KNorm                  []float32     // self_attn.k_norm.weight (head_dim)
	PostAttentionLayernorm []float32     // post_attention_layernorm.weight (hidden)
	GateProj               tensor.Matrix // mlp.gate_proj.weight (intermediate, hidden)
	UpProj                 tensor.Matrix // mlp.up_proj.weight (intermediate, hidden)
	DownProj               tensor.Matrix // mlp.down_proj.weight (hidden, intermediate)
}

// Slot is one tensor of the tree: its checkpoint name, its shape, and the
// field it fills (Matrix for 2-D weights, Vector for norm weights).
type Slot struct {
	Name   string
	Shape  []int // (out, in) for matrices, (n) for vectors
	Matrix *tensor.Matrix
	Vector *[]float32
}

// NewWeights returns an empty tree for c, and its slots in checkpoint order.
// A tied model has no lm_head slot: call Tie once the slots are filled.
func NewWeights(c *Config) (*Weights, []Slot) {
	w := &Weights{Layers: make([]Layer, c.NumHiddenLayers)}
	return w, w.Slots(c)
}

// Slots lists w's tensors in checkpoint order, each pointing at its field.
func (w *Weights) Slots(c *Config) []Slot {
	h, inter, q, kv, d := c.HiddenSize, c.IntermediateSize, c.QDim(), c.KVDim(), c.HeadDim
	mat := func(name string, m *tensor.Matrix, out, in int) Slot {
		return Slot{Name: name, Shape: []int{out, in}, Matrix: m}
	}
	vec := func(name string, v *[]float32, n int) Slot {
		return Slot{Name: name, Shape: []int{n}, Vector: v}
	}
	slots := []Slot{mat("model.embed_tokens.weight", &w.EmbedTokens, c.VocabSize, h)}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		slots = append(slots,
			vec(p+"input_layernorm.weight", &l.InputLayernorm, h),
			mat(p+"self_attn.q_proj.weight", &l.QProj, q, h),
			mat(p+"self_attn.k_proj.weight", &l.KProj, kv, h),
			mat(p+"self_attn.v_proj.weight", &l.VProj, kv, h),
			mat(p+"self_attn.o_proj.weight", &l.OProj, h, q),
			vec(p+"self_attn.q_norm.weight", &l.QNorm, d),
			vec(p+"self_attn.k_norm.weight", &l.KNorm, d),
			vec(p+"post_attention_layernorm.weight", &l.PostAttentionLayernorm, h),
			mat(p+"mlp.gate_proj.weight", &l.GateProj, inter, h),
			mat(p+"mlp.up_proj.weight", &l.UpProj, inter, h),
			mat(p+"mlp.down_proj.weight", &l.DownProj, h, inter),
		)
	}
	slots = append(slots, vec("model.norm.weight", &w.Norm, h))
	if !c.TieWordEmbeddings {
		slots = append(slots, mat("lm_head.weight", &w.LMHead, c.VocabSize, h))
	}
	return slots
}

// Tie points a tied model's head at its embedding; it is a no-op when untied.
func (w *Weights) Tie(c *Config) {
	if c.TieWordEmbeddings {
		w.LMHead = w.EmbedTokens
	}
}
