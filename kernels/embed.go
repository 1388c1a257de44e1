package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// embed.wgsl, one entry point a table format.
var (
	embedInt4 = gpu.Kernel{
		Module: "embed.wgsl", Source: shaders.Embed, Entry: "int4", Params: reflect.TypeFor[embedParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // ids, qweight, out, scales
	}
	embedF16 = gpu.Kernel{
		Module: "embed.wgsl", Source: shaders.Embed, Entry: "dense_f16", Params: reflect.TypeFor[embedParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // ids, dense, out
	}
	embedF32 = gpu.Kernel{
		Module: "embed.wgsl", Source: shaders.Embed, Entry: "dense_f32", Params: reflect.TypeFor[embedParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // ids, dense, out
	}
)

// embedParams are embed.wgsl's params (prelude.wgsl's EmbedParams).
type embedParams struct {
	T, V, K, G, Row0, N uint32
	_, _                uint32
}

const embedWG = 64

// Embed records the embedding gather out[t] = E[ids[t]] (embed_tokens):
//
//	ids (T) u32 token ids; an id outside [0, V) gives a row of NaN
//	e   (V, H) any Format
//	out (T, H) f32
//
// A table larger than one storage binding (Qwen3's 151,936-row table on an
// adapter with WebGPU's default 128 MiB) is bound in blocks of rows, a
// dispatch each, like MatMul's.
func Embed(b *gpu.Batch, out *gpu.Buffer, ids gpu.Binding, e *Matrix, T int) error {
	return embed(b, out, ids, e, T, b.Device().Limits().MaxStorageBufferBindingSize)
}

// embed is Embed with the binding limit as a parameter, so that tests can
// exercise the row-block split on small tables.
func embed(b *gpu.Batch, out *gpu.Buffer, ids gpu.Binding, e *Matrix, T int, maxBinding uint64) error {
	if e == nil {
		return fmt.Errorf("kernels: embed: nil matrix")
	}
	op := "embed " + e.Name
	if T <= 0 {
		return fmt.Errorf("kernels: %s: T = %d", op, T)
	}
	if err := needRange(op, "ids", ids, T, nil, 0); err != nil {
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
	blocks, err := e.rowBlocks(maxBinding, b.Device().Limits().MinStorageBufferOffsetAlignment)
	if err != nil {
		return err
	}
	for _, blk := range blocks {
		table, scales := e.bindRows(blk)
		binds := []gpu.Binding{ids.Buf.Slice(ids.Offset, uint64(T)*4), table, out.Slice(0, uint64(T*e.K)*4)}
		if e.Format == Int4 {
			binds = append(binds, scales)
		}
		params := &embedParams{T: uint32(T), V: uint32(e.N), K: uint32(e.K), G: uint32(e.G), Row0: uint32(blk.n0), N: uint32(blk.n)}
		if err := gpu.Dispatch(b, p, params, binds, divCeil(e.K/8, embedWG), uint32(T), 1); err != nil {
			return fmt.Errorf("kernels: %s: %w", op, err)
		}
	}
	return nil
}
