package eagle3

import (
	"fmt"

	"webdraft/qwen3"
	"webdraft/tensor"
)

// Weights is an EAGLE-3 head's weight tree; each field's comment gives its
// checkpoint name and shape (H the head's width, Ht the target's, D
// head_dim, I intermediate_size, Vd draft_vocab_size).
type Weights struct {
	FC                     tensor.Matrix // fc.weight (H, 3·Ht)
	InputLayernorm         []float32     // midlayer.input_layernorm.weight (H): on the token's embedding
	HiddenNorm             []float32     // midlayer.hidden_norm.weight (H): on the hidden state
	QProj                  tensor.Matrix // midlayer.self_attn.q_proj.weight (heads·D, 2·H)
	KProj                  tensor.Matrix // midlayer.self_attn.k_proj.weight (kv_heads·D, 2·H)
	VProj                  tensor.Matrix // midlayer.self_attn.v_proj.weight (kv_heads·D, 2·H)
	OProj                  tensor.Matrix // midlayer.self_attn.o_proj.weight (H, heads·D)
	PostAttentionLayernorm []float32     // midlayer.post_attention_layernorm.weight (H)
	GateProj               tensor.Matrix // midlayer.mlp.gate_proj.weight (I, H)
	UpProj                 tensor.Matrix // midlayer.mlp.up_proj.weight (I, H)
	DownProj               tensor.Matrix // midlayer.mlp.down_proj.weight (H, I)
	Norm                   []float32     // norm.weight (H)
	LMHead                 tensor.Matrix // lm_head.weight (Vd, H)
	// EmbedTokens is embed_tokens.weight (vocab, H) when the checkpoint has
	// one; nil, the head takes its target's (as heads are trained, with
	// the target's embedding frozen).
	EmbedTokens tensor.Matrix
	// TargetIDs is the target token each draft token is: draft id + d2t
	// (the checkpoint's d2t, Vd offsets), strictly increasing.
	TargetIDs []int32
}

// Checkpoint names besides the slots.
const (
	D2TName   = "d2t"                 // (Vd) int64 offsets: target id = draft id + d2t[draft id]
	T2DName   = "t2d"                 // (vocab) bool: which target tokens the draft vocabulary has; unused
	EmbedName = "embed_tokens.weight" // optional (vocab, H)
)

// Slots lists the tree's tensors (not d2t, t2d or the optional embedding)
// with their shapes, in checkpoint order, for a loader to fill.
func (w *Weights) Slots(c *Config) []qwen3.Slot {
	H, Ht, D, I := c.HiddenSize, c.TargetHiddenSize, c.HeadDim, c.IntermediateSize
	qDim, kvDim := c.NumAttentionHeads*D, c.NumKeyValueHeads*D
	m := func(name string, out, in int, dst *tensor.Matrix) qwen3.Slot {
		return qwen3.Slot{Name: name, Shape: []int{out, in}, Matrix: dst}
	}
	v := func(name string, dst *[]float32) qwen3.Slot {
		return qwen3.Slot{Name: name, Shape: []int{H}, Vector: dst}
	}
	return []qwen3.Slot{
		m("fc.weight", H, 3*Ht, &w.FC),
		v("midlayer.input_layernorm.weight", &w.InputLayernorm),
		v("midlayer.hidden_norm.weight", &w.HiddenNorm),
		m("midlayer.self_attn.q_proj.weight", qDim, 2*H, &w.QProj),
		m("midlayer.self_attn.k_proj.weight", kvDim, 2*H, &w.KProj),
		m("midlayer.self_attn.v_proj.weight", kvDim, 2*H, &w.VProj),
		m("midlayer.self_attn.o_proj.weight", H, qDim, &w.OProj),
		v("midlayer.post_attention_layernorm.weight", &w.PostAttentionLayernorm),
		m("midlayer.mlp.gate_proj.weight", I, H, &w.GateProj),
		m("midlayer.mlp.up_proj.weight", I, H, &w.UpProj),
		m("midlayer.mlp.down_proj.weight", H, I, &w.DownProj),
		v("norm.weight", &w.Norm),
		m("lm_head.weight", c.DraftVocabSize, H, &w.LMHead),
	}
}

// TargetIDsFrom checks d2t and returns each draft token's target token:
// Vd offsets, every id within the vocabulary, strictly increasing (as d2t is
// built: the sorted draft vocabulary minus the draft ids).
func TargetIDsFrom(d2t []int64, c *Config) ([]int32, error) {
	if len(d2t) != c.DraftVocabSize {
		return nil, fmt.Errorf("%s has %d entries, want draft_vocab_size %d", D2TName, len(d2t), c.DraftVocabSize)
	}
	ids := make([]int32, len(d2t))
	for d, off := range d2t {
		t := int64(d) + off
		switch {
		case t < 0 || t >= int64(c.VocabSize):
			return nil, fmt.Errorf("%s[%d] = %d maps draft token %d to %d, outside the vocabulary [0, %d)", D2TName, d, off, d, t, c.VocabSize)
		case d > 0 && int32(t) <= ids[d-1]:
			return nil, fmt.Errorf("%s[%d] = %d maps draft token %d to %d, not after draft token %d's %d", D2TName, d, off, d, t, d-1, ids[d-1])
		}
		ids[d] = int32(t)
	}
	return ids, nil
}

// Validate refuses a weight tree with a tensor missing or of another shape
// than c's, an embedding of another shape, or target ids that are not Vd
// ascending tokens of the vocabulary.
func (w *Weights) Validate(c *Config) error {
	for _, s := range w.Slots(c) {
		if s.Vector != nil {
			if len(*s.Vector) != s.Shape[0] {
				return fmt.Errorf("%s has %d values, want %d", s.Name, len(*s.Vector), s.Shape[0])
			}
			continue
		}
		if *s.Matrix == nil {
			return fmt.Errorf("%s is missing", s.Name)
		}
		if rows, cols := (*s.Matrix).Shape(); rows != s.Shape[0] || cols != s.Shape[1] {
			return fmt.Errorf("%s is %d×%d, want %d×%d", s.Name, rows, cols, s.Shape[0], s.Shape[1])
		}
	}
	if w.EmbedTokens != nil {
		if rows, cols := w.EmbedTokens.Shape(); rows != c.VocabSize || cols != c.HiddenSize {
			return fmt.Errorf("%s is %d×%d, want %d×%d", EmbedName, rows, cols, c.VocabSize, c.HiddenSize)
		}
	}
	if len(w.TargetIDs) != c.DraftVocabSize {
		return fmt.Errorf("%d target ids (%s) for a draft vocabulary of %d", len(w.TargetIDs), D2TName, c.DraftVocabSize)
	}
	for d, t := range w.TargetIDs {
		if t < 0 || int(t) >= c.VocabSize || d > 0 && t <= w.TargetIDs[d-1] {
			return fmt.Errorf("draft token %d is target token %d: want ascending tokens of [0, %d)", d, t, c.VocabSize)
		}
	}
	return nil
}
