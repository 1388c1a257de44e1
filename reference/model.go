// Package reference is the plain-Go Qwen3: f32 math in clear loops, parallel
// over rows. It is the oracle every GPU kernel is tested against, is itself
// tested against Hugging Face transformers' outputs, and serves as the CPU
// backend (--backend cpu).
//
// It follows modeling_qwen3.py step by step; comments give the shapes and the
// PyTorch line each step mirrors. T is the number of new tokens, P the number
// already cached, H hidden_size, D head_dim.
package reference

import (
	"fmt"
	"math"

	"webdraft/qwen3"
	"webdraft/tensor"
	"webdraft/treemask"
)

// Model runs a Qwen3 weight tree. It holds no per-sequence state and is safe
// for concurrent use on different Sequences.
type Model struct {
	cfg     qwen3.Config
	w       *qwen3.Weights
	invFreq []float32 // (D/2) RoPE inverse frequencies, theta^(-2i/D)
}

// New returns a model over weights that match cfg (as checkpoint.Load gives).
func New(cfg qwen3.Config, w *qwen3.Weights) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(w.Layers) != cfg.NumHiddenLayers || w.EmbedTokens == nil || w.LMHead == nil {
		return nil, fmt.Errorf("reference: weights do not match the config (%d layers, want %d)", len(w.Layers), cfg.NumHiddenLayers)
	}
	if rows, _ := w.LMHead.Shape(); rows != w.HeadRows(&cfg) {
		return nil, fmt.Errorf("reference: the head has %d rows, want %d", rows, w.HeadRows(&cfg))
	}
	return &Model{cfg: cfg, w: w, invFreq: cfg.RopeInvFreq()}, nil
}

// Config returns the model's hyperparameters.
func (m *Model) Config() qwen3.Config { return m.cfg }

// Sequence is one sequence's KV cache.
type Sequence struct {
	len  int
	k, v [][]float32 // per layer: (len, kv_heads*D), RoPE already applied to k
	tree treemask.Tree
}

// NewSequence returns an empty sequence for m.
func (m *Model) NewSequence() *Sequence {
	return &Sequence{k: make([][]float32, m.cfg.NumHiddenLayers), v: make([][]float32, m.cfg.NumHiddenLayers)}
}

// Len is the number of cached positions.
func (s *Sequence) Len() int { return s.len }

// Truncate drops cached positions from n on (a rejected draft rolls back).
func (s *Sequence) Truncate(n int) {
	if n >= s.len || n < 0 {
		return
	}
	for l := range s.k {
		kvDim := len(s.k[l]) / s.len
		s.k[l] = s.k[l][:n*kvDim]
		s.v[l] = s.v[l][:n*kvDim]
	}
	s.len = n
	s.tree.Truncate(n)
}

// KeepPath ends the sequence's token tree keeping the nodes of path, moved
// to follow the line (treemask.Tree.KeepPath).
func (s *Sequence) KeepPath(path []int) error {
	moves, n, err := s.tree.KeepPath(s.len, path)
	if err != nil {
		return err
	}
	for l := range s.k {
		kvDim := len(s.k[l]) / max(s.len, 1)
		for _, m := range moves {
			copy(s.k[l][m.To*kvDim:(m.To+1)*kvDim], s.k[l][m.From*kvDim:(m.From+1)*kvDim])
			copy(s.v[l][m.To*kvDim:(m.To+1)*kvDim], s.v[l][m.From*kvDim:(m.From+1)*kvDim])
		}
	}
	if n < s.len {
		s.Truncate(n)
	}
	return nil
}

// Forward appends tokens to seq's cache and returns the logits (vocab) at the
// last new position.
func (m *Model) Forward(seq *Sequence, tokens []int) ([]float32, error) {
	logits, err := m.ForwardBatch([]Input{{Seq: seq, Tokens: tokens}})
	if err != nil {
		return nil, err
	}
	return logits[0], nil
}

// Input is one sequence's part of a batched forward pass.
type Input struct {
	Seq    *Sequence
	Tokens []int
	// Parents places the tokens in a token tree (package treemask); nil:
	// they continue the sequence's line.
	Parents []int
}

// segment locates an input's rows in the batch: rows r0 … r0+T-1 of x are its
// positions P … P+T-1.
type segment struct {
	seq      *Sequence
	r0, T, P int
	rows     []treemask.Row // each token's position and the slots it attends to
}

// ForwardBatch appends each input's tokens to its sequence and returns, per
// input, the logits (vocab) at its last new position. The rows of all inputs
// share every matrix multiplication, so weights are read once per pass;
// attention stays within each sequence. Nothing changes if an input is bad.
func (m *Model) ForwardBatch(inputs []Input) ([][]float32, error) {
	outs := make([]int, len(inputs))
	for i := range outs {
		outs[i] = 1
	}
	rows, err := m.ForwardRows(inputs, outs)
	if err != nil {
		return nil, err
	}
	last := make([][]float32, len(rows))
	for i, r := range rows {
		last[i] = r[0]
	}
	return last, nil
}

// ForwardRows is ForwardBatch returning the logits of each input's last
// outs[i] new positions (1 ≤ outs[i] ≤ its tokens), in order.
func (m *Model) ForwardRows(inputs []Input, outs []int) ([][][]float32, error) {
	logits, _, err := m.forward(inputs, outs, nil)
	return logits, err
}

// ForwardFeatures is ForwardRows also returning, for each input's new
// positions, the hidden states an EAGLE-3 head reads: the residual stream
// entering each of the layers aux (ascending), concatenated — (T, 3·H)
// rows for three layers (package eagle3).
func (m *Model) ForwardFeatures(inputs []Input, outs []int, aux []int) (logits, features [][][]float32, err error) {
	for i, l := range aux {
		if l < 0 || l >= m.cfg.NumHiddenLayers || i > 0 && l <= aux[i-1] {
			return nil, nil, fmt.Errorf("forward: feature layers %v: want ascending layers of 0 … %d", aux, m.cfg.NumHiddenLayers-1)
		}
	}
	if len(aux) == 0 {
		return nil, nil, fmt.Errorf("forward: no feature layers")
	}
	return m.forward(inputs, outs, aux)
}

func (m *Model) forward(inputs []Input, outs []int, aux []int) ([][][]float32, [][][]float32, error) {
	if len(outs) != len(inputs) {
		return nil, nil, fmt.Errorf("forward: %d output counts for %d inputs", len(outs), len(inputs))
	}
	c := &m.cfg
	H := c.HiddenSize
	segs := make([]segment, len(inputs))
	rows := 0
	seen := map[*Sequence]bool{}
	for i, in := range inputs {
		T, P := len(in.Tokens), in.Seq.len
		switch {
		case T == 0:
			return nil, nil, fmt.Errorf("forward: input %d has no tokens", i)
		case seen[in.Seq]:
			return nil, nil, fmt.Errorf("forward: input %d repeats a sequence of the batch", i)
		case P+T > c.MaxPositionEmbeddings:
			return nil, nil, fmt.Errorf("forward: %d positions exceed max_position_embeddings %d", P+T, c.MaxPositionEmbeddings)
		}
		for j, t := range in.Tokens {
			if t < 0 || t >= c.VocabSize {
				return nil, nil, fmt.Errorf("forward: token %d at index %d is outside the vocabulary [0, %d)", t, j, c.VocabSize)
			}
		}
		if outs[i] < 1 || outs[i] > T {
			return nil, nil, fmt.Errorf("forward: input %d reads out %d of its %d rows", i, outs[i], T)
		}
		if in.Parents != nil && len(in.Parents) != T {
			return nil, nil, fmt.Errorf("forward: input %d has %d parents for %d tokens", i, len(in.Parents), T)
		}
		parents := in.Parents
		if parents == nil {
			parents = make([]int, T)
			for j := range parents {
				parents[j] = treemask.Line
			}
		}
		placed, err := in.Seq.tree.Plan(P, parents)
		if err != nil {
			return nil, nil, fmt.Errorf("forward: input %d: %w", i, err)
		}
		seen[in.Seq] = true
		segs[i] = segment{seq: in.Seq, r0: rows, T: T, P: P, rows: placed}
		rows += T
	}

	// hidden = embed_tokens(input_ids): (rows, H)
	x := make([]float32, rows*H)
	for i, in := range inputs {
		for t, tok := range in.Tokens {
			r := segs[i].r0 + t
			m.w.EmbedTokens.Row(tok, x[r*H:(r+1)*H])
		}
	}
	// features[r] = cat(hidden before layer aux[0], aux[1], …): (rows, len(aux)·H)
	var feats []float32
	if len(aux) > 0 {
		feats = make([]float32, rows*len(aux)*H)
	}
	for l := range m.w.Layers {
		for a, al := range aux {
			if al == l {
				for r := range rows {
					copy(feats[(r*len(aux)+a)*H:(r*len(aux)+a+1)*H], x[r*H:(r+1)*H])
				}
			}
		}
		m.layer(l, x, segs)
	}
	for _, sg := range segs {
		sg.seq.tree.Commit(sg.P, sg.rows)
		sg.seq.len += sg.T
	}

	// hidden = norm(hidden[rows read out]); logits = lm_head(hidden): (rows read out, vocab)
	n := 0
	for _, o := range outs {
		n += o
	}
	read := make([]float32, n*H)
	k := 0
	for i, sg := range segs {
		for r := sg.r0 + sg.T - outs[i]; r < sg.r0+sg.T; r++ {
			RMSNorm(read[k*H:(k+1)*H], x[r*H:(r+1)*H], m.w.Norm, c.RMSNormEps)
			k++
		}
	}
	logits := make([]float32, n*c.VocabSize)
	if ids := m.w.HeadTokens; ids != nil {
		// A head over part of the vocabulary: the other tokens' logits are
		// −∞ (probability zero).
		head := make([]float32, n*len(ids))
		MatMul(head, read, m.w.LMHead, n)
		for i := range logits {
			logits[i] = float32(math.Inf(-1))
		}
		for k := range n {
			row := logits[k*c.VocabSize:]
			for j, t := range ids {
				row[t] = head[k*len(ids)+j]
			}
		}
	} else {
		MatMul(logits, read, m.w.LMHead, n)
	}
	out := make([][][]float32, len(segs))
	k = 0
	for i := range out {
		for range outs[i] {
			out[i] = append(out[i], logits[k*c.VocabSize:(k+1)*c.VocabSize])
			k++
		}
	}
	if aux == nil {
		return out, nil, nil
	}
	w := len(aux) * H
	features := make([][][]float32, len(segs))
	for i, sg := range segs {
		for r := sg.r0; r < sg.r0+sg.T; r++ {
			features[i] = append(features[i], feats[r*w:(r+1)*w:(r+1)*w])
		}
	}
	return out, features, nil
}

// layer runs decoder layer l on x (rows, H) in place, appending each
// segment's keys and values to its sequence's cache for that layer.
func (m *Model) layer(l int, x []float32, segs []segment) {
	c, w := &m.cfg, &m.w.Layers[l]
	H, D, qDim, kvDim := c.HiddenSize, c.HeadDim, c.QDim(), c.KVDim()
	T := len(x) / H // rows of the whole batch

	// --- self-attention block ---
	// residual = hidden; hidden = input_layernorm(hidden): (T, H)
	h := make([]float32, T*H)
	for t := range T {
		RMSNorm(h[t*H:(t+1)*H], x[t*H:(t+1)*H], w.InputLayernorm, c.RMSNormEps)
	}
	// q = q_proj(h): (T, heads*D); k, v = k_proj(h), v_proj(h): (T, kv_heads*D)
	q := make([]float32, T*qDim)
	k := make([]float32, T*kvDim)
	v := make([]float32, T*kvDim)
	MatMul(q, h, w.QProj, T)
	MatMul(k, h, w.KProj, T)
	MatMul(v, h, w.VProj, T)
	// q = q_norm(q.view(T, heads, D)); k = k_norm(k.view(T, kv_heads, D)):
	// RMSNorm over head_dim only, before RoPE.
	for i := 0; i < len(q); i += D {
		RMSNorm(q[i:i+D], q[i:i+D], w.QNorm, c.RMSNormEps)
	}
	for i := 0; i < len(k); i += D {
		RMSNorm(k[i:i+D], k[i:i+D], w.KNorm, c.RMSNormEps)
	}
	attn := make([]float32, T*qDim)
	for _, sg := range segs {
		// q, k = apply_rotary_pos_emb(q, k, cos, sin) at positions P … P+T-1.
		for t := range sg.T {
			r := sg.r0 + t
			for i := 0; i < qDim; i += D {
				Rope(q[r*qDim+i:r*qDim+i+D], sg.rows[t].Pos, m.invFreq)
			}
			for i := 0; i < kvDim; i += D {
				Rope(k[r*kvDim+i:r*kvDim+i+D], sg.rows[t].Pos, m.invFreq)
			}
		}
		// past_key_values.update(k, v): the cache grows to (P+T, kv_heads*D).
		rows := func(a []float32, w int) []float32 { return a[sg.r0*w : (sg.r0+sg.T)*w] }
		sg.seq.k[l] = append(sg.seq.k[l], rows(k, kvDim)...)
		sg.seq.v[l] = append(sg.seq.v[l], rows(v, kvDim)...)
		// attn = softmax(q·kᵀ/√D + causal mask)·v with GQA: (T, heads*D)
		Attention(rows(attn, qDim), rows(q, qDim), sg.seq.k[l], sg.seq.v[l], sg.P, sg.rows, c)
	}
	// hidden = residual + o_proj(attn)
	o := make([]float32, T*H)
	MatMul(o, attn, w.OProj, T)
	Add(x, o)

	mlpBlock(x, T, c.IntermediateSize, w.PostAttentionLayernorm, w.GateProj, w.UpProj, w.DownProj, c.RMSNormEps)
}

// mlpBlock is a decoder layer's MLP block on x (T, H) in place:
// residual = hidden; h = post_attention_layernorm(hidden);
// hidden = residual + down_proj(SiLU(gate_proj(h)) * up_proj(h)).
func mlpBlock(x []float32, T, I int, postNorm []float32, gateProj, upProj, downProj tensor.Matrix, eps float64) {
	H := len(x) / T
	h := make([]float32, T*H)
	for t := range T {
		RMSNorm(h[t*H:(t+1)*H], x[t*H:(t+1)*H], postNorm, eps)
	}
	gate := make([]float32, T*I)
	up := make([]float32, T*I)
	MatMul(gate, h, gateProj, T)
	MatMul(up, h, upProj, T)
	for i := range gate {
		gate[i] = SiLU(gate[i]) * up[i]
	}
	MatMul(h, gate, downProj, T)
	Add(x, h)
}

// Draft feeds tokens to seq and returns the n greedy tokens that follow. The
// cache then holds the tokens and the first n-1 drafted ones.
func (m *Model) Draft(seq *Sequence, tokens []int, n int) ([]int, error) {
	if n <= 0 {
		return nil, fmt.Errorf("draft: n = %d, want > 0", n)
	}
	if seq.len+len(tokens)+n-1 > m.cfg.MaxPositionEmbeddings {
		return nil, fmt.Errorf("draft: %d context tokens + %d drafted exceed max_position_embeddings %d", seq.len+len(tokens), n, m.cfg.MaxPositionEmbeddings)
	}
	out := make([]int, 0, n)
	for len(out) < n {
		logits, err := m.Forward(seq, tokens)
		if err != nil {
			return out, err
		}
		next, err := Argmax(logits)
		if err != nil {
			return out, err
		}
		out = append(out, next)
		tokens = []int{next}
	}
	return out, nil
}

// Argmax returns the index of the largest logit (the first on ties, as
// torch.argmax does).
func Argmax(logits []float32) (int, error) {
	best := 0
	for i, v := range logits {
		if math.IsNaN(float64(v)) {
			return 0, fmt.Errorf("argmax: NaN logit at %d", i)
		}
		if v > logits[best] {
			best = i
		}
	}
	return best, nil
}
