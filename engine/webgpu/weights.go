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
	embed   *kernels.Matrix // embed_tokens (vocab, H)
	layers  []layerWeights
	norm    *gpu.Buffer     // model.norm (H)
	head    *kernels.Matrix // lm_head (vocab, H); embed when tied
	invFreq *gpu.Buffer     // RoPE inverse frequencies (D/2)
	buffers []*gpu.Buffer   // everything above, for Release
	mats    []*kernels.Matrix
}

type layerWeights struct {
	inputNorm, postNorm *gpu.Buffer // (H)
	qNorm, kNorm        *gpu.Buffer // (D)
	q, k, v             *kernels.Matrix
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
	if gw.norm, err = vec("model.norm.weight", w.Norm); err != nil {
		return nil, err
	}
	if gw.invFreq, err = kernels.UploadRopeInvFreq(d, c.HeadDim, c.RopeTheta); err != nil {
		return nil, err
	}
	gw.buffers = append(gw.buffers, gw.invFreq)
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
			{&g.qNorm, "self_attn.q_norm.weight", l.QNorm},
			{&g.kNorm, "self_attn.k_norm.weight", l.KNorm},
		} {
			if *v.dst, err = vec(p+v.name, v.data); err != nil {
				return nil, err
			}
		}
		if g.q, err = mat(kernels.UploadMatrix(d, p+"self_attn.q_proj.weight", l.QProj)); err != nil {
			return nil, err
		}
		if g.k, err = mat(kernels.UploadMatrix(d, p+"self_attn.k_proj.weight", l.KProj)); err != nil {
			return nil, err
		}
		if g.v, err = mat(kernels.UploadMatrix(d, p+"self_attn.v_proj.weight", l.VProj)); err != nil {
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
