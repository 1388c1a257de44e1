package kernels

import (
	"fmt"
	"math"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	matMulInt4 = gpu.Kernel{
		Module: "matmul_int4.wgsl", Source: shaders.MatMulInt4, Entry: "main", ParamsSize: 32,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, qweight, scales, out, norm
	}
	matMulF16 = gpu.Kernel{
		Module: "matmul_dense.wgsl", Source: shaders.MatMulDense, Entry: "dense_f16", ParamsSize: 32,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, w, out, norm
	}
	matMulF32 = gpu.Kernel{
		Module: "matmul_dense.wgsl", Source: shaders.MatMulDense, Entry: "dense_f32", ParamsSize: 32,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, w, out, norm
	}
)

// The matmul kernels' tiling (see the header of matmul_int4.wgsl).
const (
	matMulWG   = 64 // threads per workgroup
	matMulRows = 4  // output features per workgroup for prefill (T > 1)
)

// matMulTT returns the activation rows per workgroup for T rows: 1 for
// decode, a tile of 4 or 8 for prefill.
func matMulTT(T int) uint32 {
	switch {
	case T == 1:
		return 1
	case T <= 4:
		return 4
	}
	return 8
}

// MatMul records out = x · Wᵀ, or out += x · Wᵀ when accumulate (a residual
// added in place), like nn.Linear without bias:
//
//	x   (T, K) f32
//	w   (N, K) any Format
//	out (T, N) f32
//
// T is 1…64 in practice (any T ≥ 1 works). A matrix too large for one
// storage binding is split into row blocks, one dispatch each.
func MatMul(b *gpu.Batch, out, x *gpu.Buffer, w *Matrix, T int, accumulate bool) error {
	return matMul(b, out, x, w, T, matMulInput{accumulate: accumulate}, b.Device().Limits().MaxStorageBufferBindingSize)
}

// MatMulNorm records out = rmsnorm(x) · Wᵀ — a projection after one of
// Qwen3's RMSNorms, the normalization computed on the fly:
//
//	x      (T, K) f32, not normalized
//	weight (K) f32 RMSNorm weight
//	w      (N, K) any Format
//	out    (T, N) f32
//
// It equals RMSNorm (x[t][k] · weight[k] / sqrt(mean_k x[t][k]² + eps))
// then MatMul, without writing the normalized rows out.
func MatMulNorm(b *gpu.Batch, out, x, weight *gpu.Buffer, w *Matrix, T int, eps float64) error {
	return matMul(b, out, x, w, T, matMulInput{norm: weight, eps: eps}, b.Device().Limits().MaxStorageBufferBindingSize)
}

// MatMulSwiGLU records out (+)= (silu(gate) · up) · Wᵀ — Qwen3's down_proj
// of its MLP activation, the activation computed on the fly — from the
// output of the stacked gate/up projection:
//
//	gateUp (T, 2K) f32: gate_proj(h) | up_proj(h)
//	w      (N, K) any Format
//	out    (T, N) f32
//
// It equals MatMul of the (T, K) input x[t][k] = silu(gate[t][k]) ·
// up[t][k], silu(g) = g / (1 + exp(−g)), without writing x out.
func MatMulSwiGLU(b *gpu.Batch, out, gateUp *gpu.Buffer, w *Matrix, T int, accumulate bool) error {
	return matMul(b, out, gateUp, w, T, matMulInput{accumulate: accumulate, swiglu: true}, b.Device().Limits().MaxStorageBufferBindingSize)
}

// matMulInput says what a matmul computes from x before the product, and
// whether it adds into out.
type matMulInput struct {
	accumulate bool
	swiglu     bool        // x is gate | up: the input is silu(gate) · up
	norm       *gpu.Buffer // non-nil: the input is RMSNorm(x) with this weight
	eps        float64
}

// matMul is MatMul, MatMulNorm or MatMulSwiGLU (as `in` says) with the binding
// limit as a parameter, so that tests can exercise the row-block split on
// small matrices.
func matMul(b *gpu.Batch, out, x *gpu.Buffer, w *Matrix, T int, in matMulInput, maxBinding uint64) error {
	if w == nil {
		return fmt.Errorf("kernels: matmul: nil matrix")
	}
	op := "matmul " + w.Name
	if T <= 0 {
		return fmt.Errorf("kernels: %s: T = %d", op, T)
	}
	xCols := w.K
	if in.swiglu {
		xCols = 2 * w.K
	}
	if err := need(op, "x", x, T*xCols); err != nil {
		return err
	}
	if in.norm != nil {
		if in.swiglu || in.accumulate {
			return fmt.Errorf("kernels: %s: a normalized input neither adds into out nor takes SwiGLU", op)
		}
		if err := need(op, "norm weight", in.norm, w.K); err != nil {
			return err
		}
	}
	if err := need(op, "out", out, T*w.N); err != nil {
		return err
	}
	if uint64(T)*uint64(xCols)*4 > maxBinding || uint64(T)*uint64(w.N)*4 > maxBinding {
		return fmt.Errorf("kernels: %s: %d activation rows exceed one binding", op, T)
	}
	var k gpu.Kernel
	switch w.Format {
	case Int4:
		k = matMulInt4
	case F16:
		k = matMulF16
	case F32:
		k = matMulF32
	default:
		return fmt.Errorf("kernels: %s: unknown format %v", op, w.Format)
	}
	d := b.Device()
	tt := matMulTT(T)
	// Decode (T = 1) reads each weight once and reuses nothing: a row per
	// workgroup gives the GPU four times the workgroups to hide latency with
	// (as long as the rows fit the grid's x dimension; a vocabulary-sized
	// head keeps four).
	rows := matMulRows
	if T == 1 && uint32(w.N) <= d.Limits().MaxComputeWorkgroupsPerDimension {
		rows = 1
	}
	consts := gpu.Consts{"TT": tt, "ROWS": uint32(rows), "SWIGLU": 0, "NORM": 0}
	if in.swiglu {
		consts["SWIGLU"] = 1
	}
	if in.norm != nil {
		consts["NORM"] = 1
	}
	p, err := d.Pipeline(k, consts)
	if err != nil {
		return err
	}
	align := d.Limits().MinStorageBufferOffsetAlignment
	blocks, err := w.rowBlocks(maxBinding, align)
	if err != nil {
		return err
	}
	acc := uint32(0)
	if in.accumulate {
		acc = 1
	}
	// The norm weight; without NORM the binding is unread, and x stands in.
	norm := x.Slice(0, 16)
	if in.norm != nil {
		norm = in.norm.Slice(0, uint64(w.K)*4)
	}
	for _, blk := range blocks {
		// out[t][n0 + n] for t < T, n < blk.n: the binding starts at column
		// n0 of row 0 and ends after column n0+n-1 of row T-1.
		outBind := out.Slice(uint64(blk.n0)*4, uint64((T-1)*w.N+blk.n)*4)
		binds := append([]gpu.Binding{x.Slice(0, uint64(T*xCols)*4)}, w.bindRows(blk)...)
		binds = append(binds, outBind, norm)
		params := []uint32{uint32(T), uint32(blk.n), uint32(w.K), uint32(w.G), uint32(w.N), acc, math.Float32bits(float32(in.eps)), 0}
		if err := b.Dispatch(p, params, binds, divCeil(blk.n, rows), divCeil(T, int(tt)), 1); err != nil {
			return fmt.Errorf("kernels: %s: %w", op, err)
		}
	}
	return nil
}
