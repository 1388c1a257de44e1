package kernels

import (
	"fmt"
	"math"

	"webdraft/gpu"
	"webdraft/reference"
	"webdraft/shaders"
)

var rope = gpu.Kernel{
	Module: "rope.wgsl", Source: shaders.Rope, Entry: "main", ParamsSize: 16,
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // y, pos, inv_freq
}

const ropeWG = 64

// UploadRopeInvFreq uploads theta^(−2i/D) for i < D/2, computed exactly as
// reference.RopeInvFreq (and so transformers) computes it.
func UploadRopeInvFreq(d *gpu.Device, D int, theta float64) (*gpu.Buffer, error) {
	if D <= 0 || D%2 != 0 {
		return nil, fmt.Errorf("kernels: rope: head_dim %d is not positive and even", D)
	}
	return d.UploadF32("rope.inv_freq", reference.RopeInvFreq(D, theta))
}

// Rope records the rotary embedding of T rows of heads×D values in place,
// split-halves layout (rotate_half), row t at position pos[t]:
//
//	y        (T, heads, D) f32, rotated in place
//	pos      (T) u32 absolute positions (< 2^24)
//	invFreq  (D/2) f32 from UploadRopeInvFreq
func Rope(b *gpu.Batch, y, pos, invFreq *gpu.Buffer, T, heads, D int) error {
	op := "rope"
	if T <= 0 || heads <= 0 || D <= 0 || D%2 != 0 {
		return fmt.Errorf("kernels: %s: shape (%d, %d, %d)", op, T, heads, D)
	}
	if err := need(op, "y", y, T*heads*D); err != nil {
		return err
	}
	if err := need(op, "pos", pos, T); err != nil {
		return err
	}
	if err := need(op, "invFreq", invFreq, D/2); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(rope, nil)
	if err != nil {
		return err
	}
	params := []uint32{uint32(T), uint32(heads), uint32(D), 0}
	binds := []gpu.Binding{y.Slice(0, uint64(T*heads*D)*4), pos.Slice(0, uint64(T)*4), invFreq.Slice(0, uint64(D/2)*4)}
	if err := b.Dispatch(p, params, binds, divCeil(heads*D/2, ropeWG), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

var qkNormRope = gpu.Kernel{
	Module: "qk_norm_rope.wgsl", Source: shaders.QKNormRope, Entry: "main", ParamsSize: 32,
	// q, k, q_norm, k_norm, pos, inv_freq
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly},
}

// qkNormRopeWG and qkNormRopePairs bound head_dim: D/2 ≤ WG·PAIRS.
const (
	qkNormRopeWG    = 64
	qkNormRopePairs = 2
)

// QKNormRope records, in place and in one pass, q = rope(q_norm(q)) and
// k = rope(k_norm(k)) (Qwen3's per-head RMSNorm over head_dim, then RoPE
// in the split-halves layout, row t at position pos[t]):
//
//	q              (T, heads, D) f32
//	k              (T, kv_heads, D) f32, a different buffer from q
//	qNorm, kNorm   (D) f32
//	pos            (T) u32
//	invFreq        (D/2) f32 from UploadRopeInvFreq
//
// It equals RMSNorm then Rope on each, with one dispatch instead of four.
func QKNormRope(b *gpu.Batch, q, k, qNorm, kNorm, pos, invFreq *gpu.Buffer, T, heads, kvHeads, D int, eps float64) error {
	op := "qk_norm_rope"
	if T <= 0 || heads <= 0 || kvHeads <= 0 || D <= 0 || D%2 != 0 || D/2 > qkNormRopeWG*qkNormRopePairs {
		return fmt.Errorf("kernels: %s: T %d, heads %d/%d, head_dim %d (even, at most %d)", op, T, heads, kvHeads, D, 2*qkNormRopeWG*qkNormRopePairs)
	}
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"q", q, T * heads * D}, {"k", k, T * kvHeads * D}, {"qNorm", qNorm, D}, {"kNorm", kNorm, D}, {"pos", pos, T}, {"invFreq", invFreq, D / 2}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	p, err := b.Device().Pipeline(qkNormRope, nil)
	if err != nil {
		return err
	}
	params := []uint32{uint32(T), uint32(heads), uint32(kvHeads), uint32(D), math.Float32bits(float32(eps)), 0, 0, 0}
	f := func(buf *gpu.Buffer, n int) gpu.Binding { return buf.Slice(0, uint64(n)*4) }
	binds := []gpu.Binding{f(q, T*heads*D), f(k, T*kvHeads*D), f(qNorm, D), f(kNorm, D), f(pos, T), f(invFreq, D/2)}
	if err := b.Dispatch(p, params, binds, uint32(heads+kvHeads), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
