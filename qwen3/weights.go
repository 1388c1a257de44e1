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
	LMHead      tensor.Matrix // lm_head.weight (head rows, hidden); EmbedTokens when tied
	// HeadTokens is the token each LMHead row scores, when the head covers
	// only part of the vocabulary (lm_head.token_ids (head rows)); nil when
	// row i scores token i. Tokens outside it have probability zero.
	HeadTokens []int32
}

// HeadTokensName is the checkpoint name of Weights.HeadTokens.
const HeadTokensName = "lm_head.token_ids"

// HeadRows is the number of rows of the output head.
func (w *Weights) HeadRows(c *Config) int {
	if w.HeadTokens != nil {
		return len(w.HeadTokens)
	}
	return c.VocabSize
}

// CheckHeadTokens validates a head's token list: at least one token, each in
// the vocabulary, none twice.
func CheckHeadTokens(ids []int32, vocab int) error {
	if len(ids) == 0 {
		return fmt.Errorf("%s is empty", HeadTokensName)
	}
	seen := make(map[int32]bool, len(ids)) // not vocab-sized: vocab is what a config claims
	for i, t := range ids {
		switch {
		case t < 0 || int(t) >= vocab:
			return fmt.Errorf("%s: token %d at index %d is outside the vocabulary [0, %d)", HeadTokensName, t, i, vocab)
		case seen[t]:
			return fmt.Errorf("%s: token %d appears twice (again at index %d)", HeadTokensName, t, i)
		}
		seen[t] = true
	}
	return nil
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
		slots = append(slots, mat("lm_head.weight", &w.LMHead, w.HeadRows(c), h))
	}
	return slots
}

// Tie points a tied model's head at its embedding — at the rows of
// HeadTokens when set (validated by CheckHeadTokens) —; it is a no-op when
// untied.
func (w *Weights) Tie(c *Config) error {
	if !c.TieWordEmbeddings {
		return nil
	}
	if w.HeadTokens == nil {
		w.LMHead = w.EmbedTokens
		return nil
	}
	head, err := tensor.GatherRows(w.EmbedTokens, w.HeadTokens)
	if err != nil {
		return fmt.Errorf("%s: %w", HeadTokensName, err)
	}
	w.LMHead = head
	return nil
}
