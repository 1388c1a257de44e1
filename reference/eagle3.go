package reference

import (
	"fmt"

	"webdraft/eagle3"
	"webdraft/qwen3"
	"webdraft/tensor"
	"webdraft/treemask"
)

// Head is an EAGLE-3 draft head in plain Go, following llama_eagle3.py's
// forward (SGLang's and vLLM's) step by step. It holds no per-sequence state.
type Head struct {
	cfg     eagle3.Config
	layer   qwen3.Config // the midlayer's attention shape
	w       *eagle3.Weights
	embed   tensor.Matrix // the head's embed_tokens, else its target's
	invFreq []float32
}

// NewHead returns a head over w; targetEmbed is the target's embedding,
// which the head uses unless its checkpoint has one of its own.
func NewHead(cfg eagle3.Config, w *eagle3.Weights, targetEmbed tensor.Matrix) (*Head, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	embed := w.EmbedTokens
	if embed == nil {
		embed = targetEmbed
	}
	if embed == nil {
		return nil, fmt.Errorf("reference: the head has no embedding and none was given")
	}
	if rows, cols := embed.Shape(); rows != cfg.VocabSize || cols != cfg.HiddenSize {
		return nil, fmt.Errorf("reference: the head's embedding is %d×%d, want %d×%d", rows, cols, cfg.VocabSize, cfg.HiddenSize)
	}
	if w.FC == nil || w.LMHead == nil || len(w.TargetIDs) != cfg.DraftVocabSize {
		return nil, fmt.Errorf("reference: the head's weights are incomplete")
	}
	layer := cfg.Layer()
	return &Head{cfg: cfg, layer: layer, w: w, embed: embed, invFreq: layer.RopeInvFreq()}, nil
}

// Config returns the head's hyperparameters.
func (h *Head) Config() eagle3.Config { return h.cfg }

// TargetToken is the target's token for draft token d.
func (h *Head) TargetToken(d int) int { return int(h.w.TargetIDs[d]) }

// HeadSequence is one sequence's cache of the head's layer.
type HeadSequence struct {
	len  int
	k, v []float32 // (len, kv_heads·D), RoPE applied to k
}

// NewSequence returns an empty sequence.
func (h *Head) NewSequence() *HeadSequence { return &HeadSequence{} }

// Len is the number of cached positions.
func (s *HeadSequence) Len() int { return s.len }

// HeadRow is one row's result.
type HeadRow struct {
	Logits []float32 // (draft_vocab_size): the draft vocabulary's scores (TargetToken maps an index)
	Hidden []float32 // (H): the layer's output before norm, the next step's hidden
}

// Forward feeds T rows at positions seq.Len() … seq.Len()+T−1, each
// attending to the positions before it: row t is token ids[t] (a target
// token id) with hidden[t], either the target's features for the position
// before it (the three auxiliary hidden states concatenated, 3·Ht) or a
// Hidden the head returned (H; later draft steps, no fc).
func (h *Head) Forward(seq *HeadSequence, ids []int, hidden [][]float32) ([]HeadRow, error) {
	c, w := &h.cfg, h.w
	H, T := c.HiddenSize, len(ids)
	if T == 0 || len(hidden) != T {
		return nil, fmt.Errorf("eagle3 head: %d tokens with %d hidden rows", T, len(hidden))
	}
	// embeds = embed_tokens(input_ids): (T, H)
	e := make([]float32, T*H)
	// hidden_states = fc(hidden_states) where 3·Ht wide: (T, H)
	x := make([]float32, T*H)
	for t, id := range ids {
		if id < 0 || id >= c.VocabSize {
			return nil, fmt.Errorf("eagle3 head: token %d outside the vocabulary [0, %d)", id, c.VocabSize)
		}
		h.embed.Row(id, e[t*H:(t+1)*H])
		switch len(hidden[t]) {
		case 3 * c.TargetHiddenSize:
			MatMul(x[t*H:(t+1)*H], hidden[t], w.FC, 1)
		case H:
			copy(x[t*H:(t+1)*H], hidden[t])
		default:
			return nil, fmt.Errorf("eagle3 head: row %d's hidden is %d wide, want %d (the target's features) or %d (the head's)", t, len(hidden[t]), 3*c.TargetHiddenSize, H)
		}
	}
	// residual = hidden_states; hidden = cat([input_layernorm(embeds),
	// hidden_norm(hidden_states)]): (T, 2H)
	in := make([]float32, T*2*H)
	for t := range T {
		RMSNorm(in[t*2*H:t*2*H+H], e[t*H:(t+1)*H], w.InputLayernorm, c.RMSNormEps)
		RMSNorm(in[t*2*H+H:(t+1)*2*H], x[t*H:(t+1)*H], w.HiddenNorm, c.RMSNormEps)
	}
	// q, k, v from the 2H-wide input; RoPE at the rows' positions (no q/k
	// norm: a Llama layer)
	l := &h.layer
	D, qDim, kvDim := l.HeadDim, l.QDim(), l.KVDim()
	q := make([]float32, T*qDim)
	k := make([]float32, T*kvDim)
	v := make([]float32, T*kvDim)
	MatMul(q, in, w.QProj, T)
	MatMul(k, in, w.KProj, T)
	MatMul(v, in, w.VProj, T)
	P := seq.len
	rows := make([]treemask.Row, T)
	for t := range T {
		rows[t] = treemask.LineRow(P + t)
		for i := 0; i < qDim; i += D {
			Rope(q[t*qDim+i:t*qDim+i+D], P+t, h.invFreq)
		}
		for i := 0; i < kvDim; i += D {
			Rope(k[t*kvDim+i:t*kvDim+i+D], P+t, h.invFreq)
		}
	}
	seq.k = append(seq.k, k...)
	seq.v = append(seq.v, v...)
	seq.len += T
	attn := make([]float32, T*qDim)
	Attention(attn, q, seq.k, seq.v, P, rows, l)
	// hidden, residual = post_attention_layernorm(o_proj(attn), residual)
	o := make([]float32, T*H)
	MatMul(o, attn, w.OProj, T)
	Add(x, o) // x is now the residual: fc'd hidden + attention
	// the MLP block: x becomes the layer's output before norm
	mlpBlock(x, T, c.IntermediateSize, w.PostAttentionLayernorm, w.GateProj, w.UpProj, w.DownProj, c.RMSNormEps)
	// logits = lm_head(norm(hidden + residual)): (T, Vd)
	out := make([]HeadRow, T)
	for t := range T {
		z := make([]float32, H)
		RMSNorm(z, x[t*H:(t+1)*H], w.Norm, c.RMSNormEps)
		out[t] = HeadRow{Logits: make([]float32, c.DraftVocabSize), Hidden: x[t*H : (t+1)*H : (t+1)*H]}
		MatMul(out[t].Logits, z, w.LMHead, 1)
	}
	return out, nil
}
