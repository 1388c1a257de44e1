package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var scatterKernel = gpu.Kernel{
	Module: "scatter.wgsl", Source: shaders.Scatter, Entry: "main", Params: reflect.TypeFor[scatterParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // in, cols, out
}

// scatterParams are scatter.wgsl's params.
type scatterParams struct{ N, V, _, _ uint32 }

const scatterWG = 256

// Scatter records out[t][cols[j]] = in[t][j] for T rows (the logits of a
// head over part of the vocabulary, placed at their tokens); out's other
// entries are left as they are:
//
//	in   (T, N) f32
//	cols (N) u32, each below V, none twice (a duplicate's winner is
//	     undefined)
//	out  (T, V) f32
func Scatter(b *gpu.Batch, out, in, cols *gpu.Buffer, T, N, V int) error {
	op := "scatter"
	if T <= 0 || N <= 0 || N > V {
		return fmt.Errorf("kernels: %s: %d rows of %d into %d", op, T, N, V)
	}
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"in", in, T * N}, {"cols", cols, N}, {"out", out, T * V}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	p, err := b.Device().Pipeline(scatterKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{in.Slice(0, uint64(T*N)*4), cols.Slice(0, uint64(N)*4), out.Slice(0, uint64(T*V)*4)}
	if err := gpu.Dispatch(b, p, &scatterParams{N: uint32(N), V: uint32(V)}, binds, uint32((N+scatterWG-1)/scatterWG), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
