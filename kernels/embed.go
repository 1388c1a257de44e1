package kernels

import (
	"fmt"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	embedInt4 = gpu.Kernel{
		Module: "embed_int4.wgsl", Source: shaders.EmbedInt4, Entry: "main", ParamsSize: 16,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // ids, qweight, scales, out
	}
	embedF16 = gpu.Kernel{
		Module: "embed_dense.wgsl", Source: shaders.EmbedDense, Entry: "dense_f16", ParamsSize: 16,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // ids, e, out
	}
	embedF32 = gpu.Kernel{
		Module: "embed_dense.wgsl", Source: shaders.EmbedDense, Entry: "dense_f32", ParamsSize: 16,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // ids, e, out
	}
)

const embedWG = 64

// Embed records the embedding gather out[t] = E[ids[t]] (embed_tokens):
//
//	ids (T) u32 token ids; an id outside [0, V) gives a row of NaN
//	e   (V, H) any Format
//	out (T, H) f32
//
// The whole table is bound at once, so it must fit one storage binding
// (Qwen3-8B's int4 table is 311 MB: fine on GPUs, too large for lavapipe's
// 128 MiB; the reference engine checks ids on the host).
func Embed(b *gpu.Batch, out, ids *gpu.Buffer, e *Matrix, T int) error {
	if e == nil {
		return fmt.Errorf("kernels: embed: nil matrix")
	}
	op := "embed " + e.Name
	if T <= 0 {
		return fmt.Errorf("kernels: %s: T = %d", op, T)
	}
	if err := need(op, "ids", ids, T); err != nil {
		return err
	}
	if err := need(op, "out", out, T*e.K); err != nil {
		return err
	}
	var k gpu.Kernel
	switch e.Format {
	case Int4:
		k = embedInt4
	case F16:
		k = embedF16
	case F32:
		k = embedF32
	default:
		return fmt.Errorf("kernels: %s: unknown format %v", op, e.Format)
	}
	p, err := b.Device().Pipeline(k, nil)
	if err != nil {
		return err
	}
	binds := append([]gpu.Binding{ids.Slice(0, uint64(T)*4)}, e.bindRows(rowBlock{0, e.N})...)
	binds = append(binds, out.Slice(0, uint64(T*e.K)*4))
	params := []uint32{uint32(T), uint32(e.N), uint32(e.K), uint32(e.G)}
	if err := b.Dispatch(p, params, binds, divCeil(e.K/8, embedWG), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
