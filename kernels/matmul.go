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
	matVecBatchInt4 = gpu.Kernel{
		Module: "matvec_batch_int4.wgsl", Source: shaders.MatVecBatchInt4, Entry: "main", ParamsSize: 32,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, qweight, scales, out, norm
	}
	matVecInt4 = gpu.Kernel{
		Module: "matvec_int4.wgsl", Source: shaders.MatVecInt4, Entry: "main", ParamsSize: 32,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, qweight, scales, out, norm
	}
	gemmInt4 = gpu.Kernel{
		Module: "gemm_int4.wgsl", Source: shaders.GEMMInt4, Entry: "main", ParamsSize: 48,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, qweight, scales, out, norm
	}
	skinnyInt4 = gpu.Kernel{
		Module: "skinny_int4.wgsl", Source: shaders.SkinnyInt4, Entry: "main", ParamsSize: 48,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, qweight, scales, out, norm
	}
	matMulReduce = gpu.Kernel{
		Module: "matmul_reduce.wgsl", Source: shaders.MatMulReduce, Entry: "main", ParamsSize: 32,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // partial sums, out
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
	kernel     matMulKernel // zero: pickMatMul's choice (benchmarks force others)
	matVec     matVecLayout // zero: pickMatVecLayout's choice
	skinny     skinnyLayout // zero: pickSkinnyLayout's choice
	groups     int          // the split-K target of the GEMM or the skinny kernel; zero: their default
}

// matMul is MatMul, MatMulNorm or MatMulSwiGLU (as `in` says) with the binding
// limit as a parameter, so that tests can exercise the row-block split on
// small matrices.
func matMul(b *gpu.Batch, out, x *gpu.Buffer, w *Matrix, T int, in matMulInput, maxBinding uint64) error {
	_, err := matMulSplitK(b, out, x, w, T, in, maxBinding, false)
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

// matMulSplitK is matMul that, when deferReduce and the matmul splits
// along K, records no reduce: it returns the partials instead, and out is
// left unwritten. A matrix in several row blocks (each block's partials
// would overwrite the last's in scratch) is reduced into out as matMul
// does; so is one that does not split.
func matMulSplitK(b *gpu.Batch, out, x *gpu.Buffer, w *Matrix, T int, in matMulInput, maxBinding uint64, deferReduce bool) (splitK, error) {
	if w == nil {
		return splitK{}, fmt.Errorf("kernels: matmul: nil matrix")
	}
	op := "matmul " + w.Name
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
	if err := need(op, "x", x, T*xCols); err != nil {
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
	blocks, err := w.rowBlocks(maxBinding, d.Limits().MinStorageBufferOffsetAlignment)
	if err != nil {
		return splitK{}, err
	}
	call := matMulCall{b: b, op: op, w: w, T: T, in: in, deferReduce: deferReduce && len(blocks) == 1,
		x: x.Slice(0, uint64(T*xCols)*4),
		// The norm weight; without NORM the binding is unread, and x stands in.
		norm: x.Slice(0, 16),
	}
	if in.norm != nil {
		call.norm = in.norm.Slice(0, uint64(w.K)*4)
	}
	kernel := in.kernel
	if kernel == kernelAuto {
		kernel = pickMatMul(w, T, d.Limits())
	} else if !kernel.fits(w, T, d.Limits()) {
		return splitK{}, fmt.Errorf("kernels: %s: %v does not take %d rows of this matrix", op, kernel, T)
	}
	var record func(rowBlock, gpu.Binding) error
	switch kernel {
	case kernelMatVec:
		record = call.matVec
	case kernelMatVecBatch:
		record = call.matVecBatch
	case kernelRowTile:
		record = call.rowTile
	case kernelSkinny:
		record = call.skinny
	default:
		g := kernel.gemmTile()
		record = func(blk rowBlock, out gpu.Binding) error { return call.gemm(blk, out, g) }
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

// matMulCall is one MatMul's arguments, bound, for each row block.
type matMulCall struct {
	b           *gpu.Batch
	op          string
	w           *Matrix
	T           int
	in          matMulInput
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

// The constants each matmul kernel is specialized by, in order.
var (
	rowTileConsts     = []string{"TT", "ROWS"}
	matVecConsts      = []string{"LANES", "RT", "WG", "TT", "KC", "SHM"}
	matVecBatchConsts = []string{"TT", "KC"}
	gemmConsts        = []string{"TM", "TN"}
	skinnyConsts      = []string{"TT", "RT", "WG", "KC"}
)

// matMulPipelineKey names a matmul pipeline in its matrix's memo.
type matMulPipelineKey struct {
	module, entry string
	vals          [6]uint32
	swiglu, norm  bool
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
	return c.w.pipes.Get(c.b.Device(), key, k, func() gpu.Consts {
		consts := gpu.Consts{}
		for i, name := range s.names {
			consts[name] = s.vals[i]
		}
		if byConsts {
			consts["SWIGLU"], consts["NORM"] = c.inputParams()
		}
		return consts
	})
}

// inputInParams reports whether kernel k takes its input's SwiGLU and norm
// as params rather than constants: skinny_int4.wgsl, so that one pipeline
// serves all of a batch's projections of one layout. On the H200 a
// dependent skinny dispatch at 32 rows cost 5–15 µs more after one of
// another pipeline (its long unrolled code fetched anew, it seems), which
// made a layer's four projections 30 % slower than each alone: 261 µs
// against 198 (BenchmarkDecodeLayer); with the flags as params, 205 µs and
// a 32-sequence decode step 10.0 → 8.7 ms. gemm_int4.wgsl keeps them
// constant: as params they made a 64-sequence step 2 % slower.
func inputInParams(k gpu.Kernel) bool { return k.Module == skinnyInt4.Module }

// inputParams is the input's SwiGLU and norm flags as params.
func (c *matMulCall) inputParams() (swiglu, norm uint32) {
	if c.in.swiglu {
		swiglu = 1
	}
	if c.in.norm != nil {
		norm = 1
	}
	return swiglu, norm
}

func (c *matMulCall) accumulate() uint32 {
	if c.in.accumulate {
		return 1
	}
	return 0
}

// rowTile records one row block with the kernels that give each thread
// whole weight rows' words: matmul_int4.wgsl or matmul_dense.wgsl.
func (c *matMulCall) rowTile(blk rowBlock, out gpu.Binding) error {
	w, T, d := c.w, c.T, c.b.Device()
	var k gpu.Kernel
	switch w.Format {
	case Int4:
		k = matMulInt4
	case F16:
		k = matMulF16
	case F32:
		k = matMulF32
	default:
		return fmt.Errorf("unknown format %v", w.Format)
	}
	tt := matMulTT(T)
	// Decode (T = 1) reads each weight once and reuses nothing: a row per
	// workgroup gives the GPU four times the workgroups to hide latency with
	// (as long as the rows fit the grid's x dimension; a vocabulary-sized
	// head keeps four).
	rows := matMulRows
	if T == 1 && uint32(w.N) <= d.Limits().MaxComputeWorkgroupsPerDimension {
		rows = 1
	}
	return c.rowDispatch(blk, out, k, specialization{rowTileConsts, [6]uint32{tt, uint32(rows)}}, rows, int(tt))
}

// matVec records one row block with matvec_int4.wgsl.
func (c *matMulCall) matVec(blk rowBlock, out gpu.Binding) error {
	p, ok := matVecFor(c.w, c.T, c.in.matVec, c.b.Device().Limits())
	if !ok {
		return fmt.Errorf("%v does not take %d rows of this matrix on this device", p.matVecLayout, c.T)
	}
	l := p.matVecLayout
	consts := specialization{matVecConsts, [6]uint32{uint32(l.lanes), uint32(l.rt), uint32(l.wg), p.tt, p.kc, p.shm}}
	return c.rowDispatch(blk, out, matVecInt4, consts, l.rows(), int(p.tt))
}

// matVecBatch records one row block with matvec_batch_int4.wgsl.
func (c *matMulCall) matVecBatch(blk rowBlock, out gpu.Binding) error {
	w, d := c.w, c.b.Device()
	tt := matVecTT(c.T)
	// No longer than the row (rounded to a vec4 a lane): each thread loads
	// KC / 32 / LANES weight vec4s a chunk, and one past the row would only
	// be skipped.
	kc := min(matVecBatchChunk(tt, d.Limits().MaxComputeWorkgroupStorageSize), uint32(alignUp(uint64(w.K), 32*matVecBatchLanes)))
	return c.rowDispatch(blk, out, matVecBatchInt4, specialization{matVecBatchConsts, [6]uint32{tt, kc}}, matVecBatchRows, int(tt))
}

// rowDispatch records kernel k, which shares matmul_int4.wgsl's bindings and
// params, over rows output features and tt activation rows a workgroup.
func (c *matMulCall) rowDispatch(blk rowBlock, out gpu.Binding, k gpu.Kernel, consts specialization, rows, tt int) error {
	w, T := c.w, c.T
	p, err := c.pipeline(k, consts)
	if err != nil {
		return err
	}
	binds := append([]gpu.Binding{c.x}, w.bindRows(blk)...)
	binds = append(binds, out, c.norm)
	params := []uint32{uint32(T), uint32(blk.n), uint32(w.K), uint32(w.G), uint32(w.N), c.accumulate(), math.Float32bits(float32(c.in.eps)), 0}
	return c.b.Dispatch(p, params, binds, divCeil(blk.n, rows), divCeil(T, tt), 1)
}

// gemm records one row block with gemm_int4.wgsl at tiling g.
func (c *matMulCall) gemm(blk rowBlock, out gpu.Binding, g gemmTile) error {
	p, err := c.pipeline(gemmInt4, specialization{gemmConsts, [6]uint32{uint32(g.tm), uint32(g.tn)}})
	if err != nil {
		return err
	}
	target := g.targetGroups()
	if c.in.groups > 0 {
		target = c.in.groups
	}
	return c.splitDispatch(p, blk, out, g.bn(), g.bm(), g.bk(), target)
}

// skinny records one row block with skinny_int4.wgsl.
func (c *matMulCall) skinny(blk rowBlock, out gpu.Binding) error {
	l := c.in.skinny
	if l == (skinnyLayout{}) {
		l = pickSkinnyLayout(c.w.N, c.T)
	}
	kc := l.chunk(c.b.Device().Limits().MaxComputeWorkgroupStorageSize)
	if !l.valid() || kc == 0 {
		return fmt.Errorf("%v does not fit this device", l)
	}
	consts := specialization{skinnyConsts, [6]uint32{uint32(l.tt), uint32(l.rt), uint32(l.wg), uint32(kc)}}
	p, err := c.pipeline(skinnyInt4, consts)
	if err != nil {
		return err
	}
	target := l.targetGroups()
	if c.in.groups > 0 {
		target = c.in.groups
	}
	return c.splitDispatch(p, blk, out, l.rows(), l.tt, 32, target)
}

// splitDispatch records pipeline p — gemm_int4.wgsl or skinny_int4.wgsl,
// which share bindings, params and the split-K protocol — over tiles of
// bn output features × bm activation rows, split along K into parts of a
// multiple of step inputs (then summed by matmul_reduce.wgsl, or left in
// c.split when c.deferReduce) when the tiles alone are fewer than target
// workgroups.
func (c *matMulCall) splitDispatch(p *gpu.Pipeline, blk rowBlock, out gpu.Binding, bn, bm, step, target int) error {
	w, T, d := c.w, c.T, c.b.Device()
	tiles := int(divCeil(blk.n, bn)) * int(divCeil(T, bm))
	kSteps := w.K / step
	splits := min(kSteps, max(1, (target+tiles-1)/tiles))
	kps := (kSteps + splits - 1) / splits * step
	splits = (w.K + kps - 1) / kps
	partials := uint64(splits) * uint64(T) * uint64(blk.n+1) * 4 // sums, then sums of squares
	if splits > 1 && partials > d.Limits().MaxStorageBufferBindingSize {
		splits, kps = 1, w.K
	}
	binds := append([]gpu.Binding{c.x}, w.bindRows(blk)...)
	dst := out
	if splits > 1 {
		scratch, err := d.Scratch(partials)
		if err != nil {
			return err
		}
		dst = scratch.Slice(0, partials)
	}
	binds = append(binds, dst, c.norm)
	swiglu, norm := c.inputParams() // skinny_int4.wgsl's; gemm_int4.wgsl's padding
	params := []uint32{uint32(T), uint32(blk.n), uint32(w.K), uint32(w.G), uint32(w.N), c.accumulate(),
		math.Float32bits(float32(c.in.eps)), uint32(splits), uint32(kps), swiglu, norm, 0}
	if err := c.b.Dispatch(p, params, binds, divCeil(blk.n, bn), divCeil(T, bm), uint32(splits)); err != nil {
		return err
	}
	if splits == 1 {
		return nil
	}
	if c.deferReduce {
		c.split = splitK{part: dst, splits: splits}
		return nil
	}
	r, err := d.Pipeline(matMulReduce, reduceConsts[splitBlockLog(splits)])
	if err != nil {
		return err
	}
	params = []uint32{uint32(T), uint32(blk.n), uint32(splits), uint32(w.N), c.accumulate(), norm, uint32(w.K), math.Float32bits(float32(c.in.eps))}
	return c.b.Dispatch(r, params, []gpu.Binding{dst, out}, divCeil(blk.n, 256), uint32(T), 1)
}

// splitBlockLog is log2 of SB in matmul_reduce.wgsl and qkv_rope_kv.wgsl
// for a split-K of splits parts: the splits a thread loads before it adds
// them up, the smallest power of two that covers splits, at most 8. (A
// loop to the param splits went one load at a time; a block of 8 at two or
// four splits made 64-row steps 0.7 % slower, loading the last split again
// for the rest.)
func splitBlockLog(splits int) int {
	l := 0
	for l < 3 && 1<<l < splits {
		l++
	}
	return l
}

// reduceConsts specializes matmul_reduce.wgsl by SB = 1 << i, without a
// map a dispatch.
var reduceConsts = [4]gpu.Consts{{"SB": 1}, {"SB": 2}, {"SB": 4}, {"SB": 8}}
