package webgpu

import (
	"errors"
	"fmt"

	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// weights is the model on the GPU, uploaded once.
type weights struct {
	embed  *kernels.Matrix // embed_tokens (vocab, H)
	layers []layerWeights
	norm   *gpu.Buffer     // model.norm (H)
	head   *kernels.Matrix // lm_head (head rows, H); embed when tied over the whole vocabulary
	// headTokens is the token each head row scores (head rows) u32, when the
	// head covers part of the vocabulary; nil otherwise.
	headTokens *gpu.Buffer
	headRows   int
	buffers    []*gpu.Buffer // everything above, for Release
	mats       []*kernels.Matrix
}

type layerWeights struct {
	inputNorm, postNorm *gpu.Buffer     // (H)
	qkNormRope          *gpu.Buffer     // q_norm, k_norm (D each), RoPE's inv_freq (D/2)
	qkv                 *kernels.Matrix // q_proj, k_proj, v_proj stacked: ((heads + 2·kv_heads)·D, H)
	o                   *kernels.Matrix // (H, heads*D)
	gateUp              *kernels.Matrix // gate_proj stacked over up_proj: (2I, H)
	down                *kernels.Matrix // (H, I)
}

// upload copies w to the device.
func upload(d *gpu.Device, c *qwen3.Config, w *qwen3.Weights) (_ *weights, err error) {
	gw := &weights{layers: make([]layerWeights, len(w.Layers))}
	defer func() {
		if err != nil {
			gw.release()
		}
	}()
	vec := func(name string, v []float32) (*gpu.Buffer, error) {
		b, err := d.UploadF32(name, v)
		if err == nil {
			gw.buffers = append(gw.buffers, b)
		}
		return b, err
	}
	mat := func(m *kernels.Matrix, err error) (*kernels.Matrix, error) {
		if err == nil {
			gw.mats = append(gw.mats, m)
		}
		return m, err
	}
	if gw.embed, err = mat(kernels.UploadMatrix(d, "model.embed_tokens.weight", w.EmbedTokens)); err != nil {
		return nil, err
	}
	gw.head = gw.embed
	if w.LMHead != w.EmbedTokens {
		if gw.head, err = mat(kernels.UploadMatrix(d, "lm_head.weight", w.LMHead)); err != nil {
			return nil, err
		}
	}
	gw.headRows = w.HeadRows(c)
	if w.HeadTokens != nil {
		ids := make([]uint32, len(w.HeadTokens))
		for i, t := range w.HeadTokens {
			ids[i] = uint32(t)
		}
		if gw.headTokens, err = d.UploadU32(qwen3.HeadTokensName, ids); err != nil {
			return nil, err
		}
		gw.buffers = append(gw.buffers, gw.headTokens)
	}
	if gw.norm, err = vec("model.norm.weight", w.Norm); err != nil {
		return nil, err
	}
	invFreq := c.RopeInvFreq()
	for i, l := range w.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		g := &gw.layers[i]
		for _, v := range []struct {
			dst  **gpu.Buffer
			name string
			data []float32
		}{
			{&g.inputNorm, "input_layernorm.weight", l.InputLayernorm},
			{&g.postNorm, "post_attention_layernorm.weight", l.PostAttentionLayernorm},
		} {
			if *v.dst, err = vec(p+v.name, v.data); err != nil {
				return nil, err
			}
		}
		if g.qkNormRope, err = kernels.UploadQKNormRope(d, p+"self_attn.qk_norm_rope", l.QNorm, l.KNorm, invFreq, l.InputLayernorm); err != nil {
			return nil, err
		}
		gw.buffers = append(gw.buffers, g.qkNormRope)
		if g.qkv, err = mat(kernels.UploadStacked(d, p+"self_attn.qkv_proj", l.QProj, l.KProj, l.VProj)); err != nil {
			return nil, err
		}
		if g.o, err = mat(kernels.UploadMatrix(d, p+"self_attn.o_proj.weight", l.OProj)); err != nil {
			return nil, err
		}
		if g.gateUp, err = mat(kernels.UploadStacked(d, p+"mlp.gate_up_proj", l.GateProj, l.UpProj)); err != nil {
			return nil, err
		}
		if g.down, err = mat(kernels.UploadMatrix(d, p+"mlp.down_proj.weight", l.DownProj)); err != nil {
			return nil, err
		}
	}
	return gw, nil
}

func (w *weights) release() {
	for _, m := range w.mats {
		m.Release()
	}
	for _, b := range w.buffers {
		b.Release()
	}
	w.mats, w.buffers = nil, nil
}

var errReleased = errors.New("webgpu engine: closed")
