package kernels

import (
	"fmt"

	"webdraft/gpu"
)

// The matmuls: out (+)= x' · Wᵀ, where x' is x, its RMSNorm or the SwiGLU of
// a gate|up row. One entry point a form (MatMul, MatMulNorm, MatMulSwiGLU);
// the adapter's plan (plan.go) picks the kernel by the number of rows, and
// each kernel family records itself from its own file: the row-tile kernel
// for any shape and format (matmul_rowtile.go), the matrix-vector kernels
// for a few rows (matvec.go, matvec_batch.go), skinny_int4.wgsl and the
// GEMM for more (skinny.go, gemm.go), the latter two split along K when
// their tiles are too few, then summed (splitk.go). Every kernel binds x,
// the weights, out, the norm weight and, for int4, the scales, in that
// order.

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
	return matMulPlanned(b, out, x, w, T, matMulInput{accumulate: accumulate})
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
	return matMulPlanned(b, out, x, w, T, matMulInput{norm: weight, eps: eps})
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
	return matMulPlanned(b, out, gateUp, w, T, matMulInput{accumulate: accumulate, swiglu: true})
}

// matMulInput says what a matmul computes from x before the product, and
// whether it adds into out.
type matMulInput struct {
	accumulate bool
	swiglu     bool          // x is gate | up: the input is silu(gate) · up
	norm       *gpu.Buffer   // non-nil: the input is RMSNorm(x) with this weight
	merge      *decodeSplits // non-nil: the input is these attention splits merged (x unused)
	eps        float64
}

// matMulParams are the params of the kernels over whole weight rows
// (prelude.wgsl's MatMulParams).
type matMulParams struct {
	T, N, K, G, Ldo, Accumulate uint32
	Eps                         float32
	Magic                       uint32 // codesMagic
}

// codesMagic is prelude.wgsl's MAGIC, which the int4 kernels take in their
// params for codes_in_place (see there).
const codesMagic = 0x4B000000

// matMulPlanned is a matmul as the device's plan runs it.
func matMulPlanned(b *gpu.Batch, out, x *gpu.Buffer, w *Matrix, T int, in matMulInput) error {
	if w == nil {
		return fmt.Errorf("kernels: matmul: nil matrix")
	}
	d := b.Device()
	l := d.Limits()
	_, err := matMulSplitK(b, out, x, w, T, in, w.planned(d, T), l.MaxStorageBufferBindingSize, false)
	return err
}

// splitK is a split-K matmul's partial sums left for the next kernel to
// sum as it reads them, instead of matmul_reduce.wgsl first:
//
//	part  (splits, T, N) f32 partial sums, then (splits, T) partial sums of
//	      squares of the input rows (the RMSNorm's, with a norm)
//
// splits ≤ 1: the matmul wrote out itself, and part is unset.
type splitK struct {
	part   gpu.Binding
	splits int
}

// matMulSplitK records T rows of w as choice says, binding at most
// maxBinding bytes at once (tests force both). When deferReduce and the
// matmul splits along K it records no reduce: it returns the partials
// instead, and out is left unwritten. A matrix in several row blocks (each
// block's partials would overwrite the last's in scratch) is reduced into
// out as without deferReduce; so is one that does not split.
func matMulSplitK(b *gpu.Batch, out, x *gpu.Buffer, w *Matrix, T int, in matMulInput, choice matMulChoice, maxBinding uint64, deferReduce bool) (splitK, error) {
	if w == nil {
		return splitK{}, fmt.Errorf("kernels: matmul: nil matrix")
	}
	op := w.opName()
	if T <= 0 {
		return splitK{}, fmt.Errorf("kernels: %s: T = %d", op, T)
	}
	if deferReduce && in.accumulate {
		return splitK{}, fmt.Errorf("kernels: %s: a deferred reduce does not add into out", op)
	}
	xCols := w.K
	if in.swiglu {
		xCols = 2 * w.K
	}
	if in.merge != nil {
		if err := in.merge.check(op, w, T); err != nil {
			return splitK{}, err
		}
		if in.swiglu || in.norm != nil || choice.kernel != kernelMatVecBatch {
			return splitK{}, fmt.Errorf("kernels: %s: merged attention splits: want %v without SwiGLU or a norm, not %v", op, kernelMatVecBatch, choice)
		}
	} else if err := need(op, "x", x, T*xCols); err != nil {
		return splitK{}, err
	}
	if in.norm != nil {
		if in.swiglu || in.accumulate {
			return splitK{}, fmt.Errorf("kernels: %s: a normalized input neither adds into out nor takes SwiGLU", op)
		}
		if err := need(op, "norm weight", in.norm, w.K); err != nil {
			return splitK{}, err
		}
	}
	if err := need(op, "out", out, T*w.N); err != nil {
		return splitK{}, err
	}
	if uint64(T)*uint64(xCols)*4 > maxBinding || uint64(T)*uint64(w.N)*4 > maxBinding {
		return splitK{}, fmt.Errorf("kernels: %s: %d activation rows exceed one binding", op, T)
	}
	d := b.Device()
	if !choice.kernel.fits(w, T, d.Limits()) {
		return splitK{}, fmt.Errorf("kernels: %s: %v does not take %d rows of this matrix", op, choice, T)
	}
	blocks, err := w.rowBlocks(maxBinding, d.Limits().MinStorageBufferOffsetAlignment)
	if err != nil {
		return splitK{}, err
	}
	call := matMulCall{b: b, op: op, w: w, T: T, in: in, choice: choice, deferReduce: deferReduce && len(blocks) == 1}
	if in.merge != nil {
		// The norm's binding is unread without NORM: the splits stand in.
		call.x, call.norm = in.merge.part, in.merge.part
	} else {
		// The norm weight; without NORM the binding is unread, and x stands in.
		call.x, call.norm = x.Slice(0, uint64(T*xCols)*4), x.Slice(0, 16)
	}
	if in.norm != nil {
		call.norm = in.norm.Slice(0, uint64(w.K)*4)
	}
	var record func(rowBlock, gpu.Binding) error
	switch k := choice.kernel; {
	case k == kernelMatVec:
		record = call.matVec
	case k == kernelMatVecBatch:
		record = call.matVecBatch
	case k == kernelSkinny:
		record = call.skinny
	case k.isGEMM():
		record = call.gemm
	default:
		record = call.rowTile
	}
	for _, blk := range blocks {
		// out[t][n0 + n] for t < T, n < blk.n: the binding starts at column
		// n0 of row 0 and ends after column n0+n-1 of row T-1.
		if err := record(blk, out.Slice(uint64(blk.n0)*4, uint64((T-1)*w.N+blk.n)*4)); err != nil {
			return splitK{}, fmt.Errorf("kernels: %s: %w", op, err)
		}
	}
	return call.split, nil
}

// matMulCall is one matmul's arguments, bound, for each row block.
type matMulCall struct {
	b           *gpu.Batch
	op          string
	w           *Matrix
	T           int
	in          matMulInput
	choice      matMulChoice
	x, norm     gpu.Binding
	deferReduce bool   // a split leaves its partials in split, unreduced
	split       splitK // set by splitDispatch when deferReduce and it split
}

// specialization is a matmul kernel's tuning constants: vals[i] for
// names[i], besides the input's SWIGLU and NORM.
type specialization struct {
	names []string
	vals  [6]uint32
}

// matMulPipelineKey names a matmul pipeline in its matrix's memo.
type matMulPipelineKey struct {
	module, entry string
	vals          [6]uint32
	swiglu, norm  bool
	mergeD        int // merged attention splits of head_dim mergeD; 0: none
}

// pipeline returns kernel k specialized by s and — but for a kernel that
// takes them as params (inputInParams) — the input's SWIGLU and NORM,
// through the matrix's memo.
func (c *matMulCall) pipeline(k gpu.Kernel, s specialization) (*gpu.Pipeline, error) {
	byConsts := !inputInParams(k)
	key := matMulPipelineKey{module: k.Module, entry: k.Entry, vals: s.vals}
	if byConsts {
		key.swiglu, key.norm = c.in.swiglu, c.in.norm != nil
	}
	if c.in.merge != nil {
		key.mergeD = c.in.merge.D
	}
	return c.w.pipes.Get(c.b.Device(), key, k, func() gpu.Consts {
		consts := gpu.Consts{}
		for i, name := range s.names {
			consts[name] = s.vals[i]
		}
		if byConsts {
			consts["SWIGLU"], consts["NORM"] = c.inputFlags()
		}
		if key.mergeD > 0 {
			consts["MERGE"], consts["AD"] = 1, uint32(key.mergeD)
		}
		return consts
	})
}

// inputInParams reports whether kernel k takes its input's SwiGLU and norm
// as params rather than constants: skinny_int4.wgsl, so that one pipeline
// serves all of a batch's projections of one layout. (On the H200 a
// dependent skinny dispatch after one of another pipeline costs more, its
// long unrolled code fetched anew, it seems, than the flags' branches do.
// gemm_int4.wgsl keeps the flags constant: as params they made its steps
// slower.)
func inputInParams(k gpu.Kernel) bool { return k.Module == skinnyInt4.Module }

// inputFlags is the input's SwiGLU and norm flags as WGSL values.
func (c *matMulCall) inputFlags() (swiglu, norm uint32) {
	return wgslBool(c.in.swiglu), wgslBool(c.in.norm != nil)
}

// bind returns the storage bindings every matmul kernel takes, in binding
// order: x, the rows of blk, out, the norm weight and, for int4, their
// scales.
func (c *matMulCall) bind(blk rowBlock, out gpu.Binding) []gpu.Binding {
	weights, scales := c.w.bindRows(blk)
	binds := []gpu.Binding{c.x, weights, out, c.norm}
	if c.w.Format == Int4 {
		binds = append(binds, scales)
	}
	return binds
}

// params returns the params of a kernel over whole rows for blk.
func (c *matMulCall) params(blk rowBlock) *matMulParams {
	w := c.w
	return &matMulParams{T: uint32(c.T), N: uint32(blk.n), K: uint32(w.K), G: uint32(w.G), Ldo: uint32(w.N),
		Accumulate: wgslBool(c.in.accumulate), Eps: float32(c.in.eps), Magic: codesMagic}
}

// rowDispatch records kernel k — one over whole weight rows, taking
// matMulParams — for blk, over rows output features and tt activation rows
// a workgroup.
func (c *matMulCall) rowDispatch(blk rowBlock, out gpu.Binding, k gpu.Kernel, consts specialization, rows, tt int) error {
	p, err := c.pipeline(k, consts)
	if err != nil {
		return err
	}
	return gpu.Dispatch(c.b, p, c.params(blk), c.bind(blk, out), divCeil(blk.n, rows), divCeil(c.T, tt), 1)
}
