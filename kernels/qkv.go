package kernels

import (
	"fmt"
	"math"

	"webdraft/gpu"
	"webdraft/reference"
	"webdraft/shaders"
)

var qkvRopeKV = gpu.Kernel{
	Module: "qkv_rope_kv.wgsl", Source: shaders.QKVRopeKV, Entry: "main", ParamsSize: 32,
	// qkv, consts, pos, seq, table, q, kcache, vcache
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite},
}

// qkNormRopeWG and qkNormRopePairs (WG and PAIRS in qkv_rope_kv.wgsl) bound
// head_dim: D/2 ≤ WG·PAIRS.
const (
	qkNormRopeWG    = 64
	qkNormRopePairs = 2
)

// UploadQKNormRope uploads what QKVRopeKV needs of one layer besides the
// activations: q_norm (D), k_norm (D) and RoPE's inverse frequencies (D/2,
// computed exactly as reference.RopeInvFreq), in one buffer.
func UploadQKNormRope(d *gpu.Device, name string, qNorm, kNorm []float32, theta float64) (*gpu.Buffer, error) {
	D := len(qNorm)
	if D == 0 || D%2 != 0 || len(kNorm) != D || D/2 > qkNormRopeWG*qkNormRopePairs {
		return nil, fmt.Errorf("kernels: %s: q_norm %d and k_norm %d values: want equal, even head_dim ≤ %d", name, D, len(kNorm), 2*qkNormRopeWG*qkNormRopePairs)
	}
	consts := append(append(append(make([]float32, 0, 2*D+D/2), qNorm...), kNorm...), reference.RopeInvFreq(D, theta)...)
	return d.UploadF32(name, consts)
}

// QKVRopeKV records, for T rows of the stacked q/k/v projection, Qwen3's
// per-head q_norm/k_norm and RoPE (row t at position pos[t]) and the append
// of keys and values to layer's cache, in one dispatch:
//
//	qkv      (T, (heads + 2·kv_heads)·D) f32: q_proj | k_proj | v_proj
//	consts   from UploadQKNormRope
//	seq, pos (T) u32: block-table row and position of each row; every
//	         position's block must be in its slot's table
//	q        (T, heads, D) f32, written: rope(q_norm(q))
//
// It equals RMSNorm (over head_dim, with q_norm or k_norm) then RoPE on
// each query and key head, followed by writing the keys and values to the
// cache slots of their positions, with one dispatch instead of several.
func QKVRopeKV(b *gpu.Batch, q, qkv, consts *gpu.Buffer, c *KVCache, layer int, seq, pos *gpu.Buffer, T, heads int, eps float64) error {
	op := "qkv_rope_kv"
	if err := c.checkRows(op, layer, T, map[string]*gpu.Buffer{"seq": seq, "pos": pos}); err != nil {
		return err
	}
	if err := c.checkHeads(op, heads); err != nil {
		return err
	}
	D := c.D
	if D%2 != 0 || D/2 > qkNormRopeWG*qkNormRopePairs {
		return fmt.Errorf("kernels: %s: head_dim %d (even, at most %d)", op, D, 2*qkNormRopeWG*qkNormRopePairs)
	}
	width := (heads + 2*c.KVHeads) * D
	for _, n := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"qkv", qkv, T * width}, {"consts", consts, 2*D + D/2}, {"q", q, T * heads * D}} {
		if err := need(op, n.name, n.buf, n.n); err != nil {
			return err
		}
	}
	p, err := c.pipeline(b.Device(), qkvRopeKV, 0, 0, 0, true, func() gpu.Consts { return nil })
	if err != nil {
		return err
	}
	kc, vc := c.layer(layer)
	f := func(buf *gpu.Buffer, n int) gpu.Binding { return buf.Slice(0, uint64(n)*4) }
	binds := []gpu.Binding{f(qkv, T*width), f(consts, 2*D+D/2), f(pos, T), f(seq, T), c.Table.All(), f(q, T*heads*D), kc, vc}
	params := []uint32{uint32(T), uint32(heads), uint32(c.KVHeads), uint32(D), math.Float32bits(float32(eps)), uint32(c.BlockSize), uint32(c.MaxBlocks), 0}
	if err := b.Dispatch(p, params, binds, uint32(heads+2*c.KVHeads), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
