package kernels

import (
	"fmt"

	"webdraft/gpu"
)

// matMulKernel names the kernel that computes a matmul. Each has shapes it
// takes (fits); pickMatMul chooses among them by the number of activation
// rows, from measurements on the H200 (BENCHMARKS.md, and
// BenchmarkMatMulKernels to redo them).
type matMulKernel int

const (
	kernelAuto        matMulKernel = iota // pickMatMul's choice
	kernelRowTile                         // matmul_int4.wgsl / matmul_dense.wgsl: any shape, 1 or 4–8-row tiles
	kernelMatVec                          // matvec_int4.wgsl: 1–4 rows
	kernelMatVecBatch                     // matvec_batch_int4.wgsl: 1–4 rows, one weight row a thread
	kernelGEMM2                           // gemm_int4.wgsl, 2 × 4 outputs a thread (32 × 64 tiles)
	kernelGEMM4                           // gemm_int4.wgsl, 4 × 4 outputs a thread (64 × 64 tiles)
	kernelGEMM2x8                         // gemm_int4.wgsl, 2 × 8 outputs a thread (32 × 128 tiles)
	kernelSkinny                          // skinny_int4.wgsl: weights in registers, activations broadcast
)

func (k matMulKernel) String() string {
	switch k {
	case kernelAuto:
		return "auto"
	case kernelRowTile:
		return "row-tile"
	case kernelMatVec:
		return "matvec"
	case kernelMatVecBatch:
		return "matvec-batch"
	case kernelGEMM2:
		return "gemm-2"
	case kernelGEMM4:
		return "gemm-4"
	case kernelGEMM2x8:
		return "gemm-2x8"
	case kernelSkinny:
		return "skinny"
	}
	return fmt.Sprintf("matMulKernel(%d)", int(k))
}

// matVecLayout is matvec_int4.wgsl's tiling (see its header): lanes
// threads along K share rt neighbouring weight rows, wg threads a
// workgroup.
type matVecLayout struct{ lanes, rt, wg int }

func (l matVecLayout) String() string { return fmt.Sprintf("matvec-%dx%d/%d", l.lanes, l.rt, l.wg) }

// rows is the weight rows a workgroup computes.
func (l matVecLayout) rows() int { return l.wg / l.lanes * l.rt }

// valid reports whether the kernel takes the layout.
func (l matVecLayout) valid() bool {
	return l.lanes >= 16 && l.wg >= l.lanes && l.wg%l.lanes == 0 && l.wg <= 256 &&
		l.rt >= 1 && l.rt <= l.lanes
}

// The matrix-vector kernel takes up to matVecMaxT activation rows; a
// thread holds at most matVecMaxWeights weight vec4s of a chunk in
// registers (64 of them).
const (
	matVecMaxT       = 4
	matVecMaxWeights = 16
)

// pickMatVecLayout returns the layout for T rows of an N × K matrix, the
// fastest of ten measured on the H200 (BenchmarkMatMulKernels, dependent
// matmuls as in a decode pass; BENCHMARKS.md) at Qwen3-1.7B's shapes, as
// a rule: tall matrices (the stacked gate/up projection, the head) want
// few lanes a row and, from two rows on, 8 rows a thread; long rows
// (down_proj) 32 lanes or, from two rows on, one row a thread; the rest
// 64 lanes of 4 rows. The differences are small at one row — every
// layout's dependent time there is mostly latency (7–16 µs for 2–12 MB) —
// and up to 3× at four.
func pickMatVecLayout(n, k, T int) matVecLayout {
	switch {
	case n >= 8192 && T == 1:
		return matVecLayout{lanes: 16, rt: 2, wg: 128}
	case n >= 8192:
		return matVecLayout{lanes: 16, rt: 8, wg: 128}
	case k > 2048 && T == 1:
		return matVecLayout{lanes: 32, rt: 4, wg: 128}
	case k > 2048:
		return matVecLayout{lanes: 16, rt: 1, wg: 256}
	case T <= 2:
		return matVecLayout{lanes: 64, rt: 4, wg: 128}
	}
	return matVecLayout{lanes: 32, rt: 4, wg: 128}
}

// matVecFor plans T rows of w with layout l, or pickMatVecLayout's
// (with smaller workgroups where the device's workgroup memory needs them)
// when l is zero.
func matVecFor(w *Matrix, T int, l matVecLayout, limits gpu.Limits) (matVecPlan, bool) {
	auto := l == matVecLayout{}
	if auto {
		l = pickMatVecLayout(w.N, w.K, T)
	}
	for {
		p, ok := planMatVec(l, T, w.K, limits.MaxComputeWorkgroupStorageSize)
		if ok && divCeil(w.N, l.rows()) <= limits.MaxComputeWorkgroupsPerDimension {
			return p, true
		}
		if !auto || l.wg/2 < l.lanes {
			return p, false
		}
		l.wg /= 2
	}
}

// matVecPlan is a matvec_int4.wgsl dispatch's constants: tt activation
// rows a workgroup, kc input columns staged a chunk, shm vec4s of
// workgroup memory.
type matVecPlan struct {
	matVecLayout
	tt, kc, shm uint32
}

// planMatVec sizes the chunk for T rows of a K-column matrix on a device
// with limit bytes of workgroup memory: the whole row when it fits both
// the workgroup memory and a thread's matVecMaxWeights registers, else
// equal chunks that do. It fails when not even one vec4 a lane fits.
func planMatVec(l matVecLayout, T, k int, limit uint32) (matVecPlan, bool) {
	p := matVecPlan{matVecLayout: l, tt: matVecTT(T)}
	step := 32 * l.lanes
	// The staged input, then the partial sums and the norm's sums of
	// squares (matvec_int4.wgsl's shm).
	shm := func(kc int) int { return max(int(p.tt)*kc/4, l.rt*l.wg+l.wg+l.wg/16) }
	memory := func(kc int) uint32 { return uint32(16 * shm(kc)) }
	kc := int(alignUp(uint64(k), uint64(step)))
	for kc > step && (kc/step*l.rt > matVecMaxWeights || memory(kc) > limit) {
		kc -= step
	}
	if !l.valid() || kc/step*l.rt > matVecMaxWeights || memory(kc) > limit {
		return p, false
	}
	chunks := divCeil(k, kc)
	p.kc = uint32(alignUp(uint64(divCeil(k, int(chunks))), uint64(step)))
	p.shm = uint32(shm(int(p.kc)))
	return p, true
}

// The row counts where pickMatMul moves from one kernel to the next,
// from BenchmarkMatMulKernels on the H200 (dependent matmuls at
// Qwen3-1.7B's four projections, summed over a layer; BENCHMARKS.md):
// 5–40 rows are fastest on skinny_int4.wgsl (a layer at 16 rows 130 µs
// against 257 µs on the 8-row tile; at 32 rows 190 µs against 295 µs on
// the GEMM at 2 × 8); more on the GEMM at 4 × 4 — or at 2 × 8 from 17 rows,
// or 2 × 4, where the device's workgroup memory does not take 4 × 4. At 64
// rows the benchmark favoured skinny_int4.wgsl too (339 µs a layer against
// 374 µs), but a decode step of 64 sequences took 16.3 ms with it against
// 15.4 ms with the GEMM, so the GEMM keeps 41 rows on — up to the
// prompt chunks of skinnyMinPrefillT rows and more, where the arithmetic
// bounds both kernels and skinny_int4.wgsl's was the faster at every
// projection (at 1,024 rows 4.0 ms a layer against 4.9 ms, 25–28
// TFLOP/s against 21).
const (
	gemmMinT          = 17
	gemm4MinT         = 41
	skinnyMaxT        = 40
	skinnyMinPrefillT = 128
)

// pickMatMul returns the kernel for T rows of w on a device with limits l:
// the matrix-vector kernels for 1–4 rows (matvec_int4.wgsl for one, but a
// single row of more than 4,096 inputs; matvec_batch_int4.wgsl for 2–4:
// decode steps of 2 and 4 sequences took 2.49 and 3.63 ms with it against
// 3.3 and 4.35 with matvec_int4.wgsl's layouts, in runs on the H200),
// skinny_int4.wgsl for 5–40 and for prompt chunks, the GEMM between, and the row-tile kernels for
// whatever the int4 kernels do not take.
func pickMatMul(w *Matrix, T int, l gpu.Limits) matMulKernel {
	switch {
	case T == 1 && w.K > 4096:
		// One row of long inputs (down_proj): the row-tile kernel's 64
		// threads a weight row were faster than every matrix-vector
		// layout (11.9 µs against 14.8–16.2 µs in two runs).
		return kernelRowTile
	case T == 1 && kernelMatVec.fits(w, T, l):
		return kernelMatVec
	case T <= matVecMaxT && kernelMatVecBatch.fits(w, T, l):
		return kernelMatVecBatch
	case (T <= skinnyMaxT || T >= skinnyMinPrefillT) && kernelSkinny.fits(w, T, l):
		return kernelSkinny
	case T >= gemm4MinT && kernelGEMM4.fits(w, T, l):
		return kernelGEMM4
	case T >= gemmMinT && kernelGEMM2x8.fits(w, T, l):
		return kernelGEMM2x8
	case T >= gemmMinT && kernelGEMM2.fits(w, T, l):
		return kernelGEMM2
	}
	return kernelRowTile
}

// fits reports whether kernel k computes T rows of w on a device with
// limits l. The int4 kernels read 32 codes at a time, which must lie in
// one scale group, and need their tiles to fit the grid.
func (k matMulKernel) fits(w *Matrix, T int, l gpu.Limits) bool {
	int4 := w.Format == Int4 && w.K%32 == 0 && w.G%32 == 0
	switch k {
	case kernelRowTile:
		return true
	case kernelMatVecBatch:
		return int4 && T <= matVecMaxT && divCeil(w.N, matVecBatchRows) <= l.MaxComputeWorkgroupsPerDimension
	case kernelMatVec:
		if !int4 || T > matVecMaxT {
			return false
		}
		_, ok := matVecFor(w, T, matVecLayout{}, l)
		return ok
	case kernelSkinny:
		s := pickSkinnyLayout(w.N, T)
		return int4 && divCeil(w.N, s.rows()) <= l.MaxComputeWorkgroupsPerDimension &&
			s.chunk(l.MaxComputeWorkgroupStorageSize) > 0
	case kernelGEMM2, kernelGEMM4, kernelGEMM2x8:
		g := k.gemmTile()
		return int4 && w.K%g.bk() == 0 && divCeil(w.N, 16*g.tn) <= l.MaxComputeWorkgroupsPerDimension &&
			g.memory() <= l.MaxComputeWorkgroupStorageSize
	}
	return false
}

// isGEMM reports whether k is gemm_int4.wgsl at some tiling.
func (k matMulKernel) isGEMM() bool {
	switch k {
	case kernelGEMM2, kernelGEMM4, kernelGEMM2x8:
		return true
	}
	return false
}

// gemmTile is a gemm_int4.wgsl tiling: tm activation rows × tn features a
// thread.
type gemmTile struct{ tm, tn int }

// gemmTile returns the GEMM kernel's tiling.
func (k matMulKernel) gemmTile() gemmTile {
	switch k {
	case kernelGEMM4:
		return gemmTile{4, 4}
	case kernelGEMM2x8:
		return gemmTile{2, 8}
	}
	return gemmTile{2, 4}
}

// bm, bn and bk are a workgroup's tile: activation rows, features, and
// inputs a stage.
func (g gemmTile) bm() int { return 16 * g.tm }
func (g gemmTile) bn() int { return 16 * g.tn }
func (g gemmTile) bk() int { return 128 / g.tn }

// memory returns the workgroup memory gemm_int4.wgsl takes (see its
// header).
func (g gemmTile) memory() uint32 {
	bm, bn, bk := g.bm(), g.bn(), g.bk()
	return uint32(4*bk*(bm+4) + 4*bk*bn + bm*bk + 4*bm)
}

// targetGroups is how many workgroups a matmul on this tiling should have
// at least: fewer leave a large GPU's SMs idle (the H200 has 132, each
// holding several), so a matrix of few tiles is split along K (split-K).
// Measured on the H200 (BenchmarkMatMulKernels, targets 128 to 1,024): 512
// at 2 rows a thread; 256 at 4 (3–8 % faster than 512 at 64 rows).
func (g gemmTile) targetGroups() int {
	if g.tm == 4 {
		return 256
	}
	return 512
}

// matvec_batch_int4.wgsl's tiling (see its header): matVecBatchLanes
// threads a weight row, matVecBatchRows rows a workgroup, the input staged
// matVecBatchStaged floats at a time.
const (
	matVecBatchLanes  = 16
	matVecBatchRows   = 16
	matVecBatchStaged = 2048
)

// matVecBatchChunk returns how many input columns matvec_batch_int4.wgsl
// stages at a time for tt rows: matVecBatchStaged values in all, fewer
// where the device's workgroup memory (staged input, then tt·WG partial
// sums and the norm's tt·ROWS sums) would not hold them — but at least one
// 32-column vec4 a lane (at tt ≤ 4 WebGPU's default 16 KiB always holds
// that).
func matVecBatchChunk(tt, limit uint32) uint32 {
	kc := uint32(matVecBatchStaged) / tt
	for kc > 32*matVecBatchLanes && 4*(tt*kc+tt*matVecBatchLanes*matVecBatchRows+tt*matVecBatchRows+tt) > limit {
		kc /= 2
	}
	return kc
}

// matVecTT returns the activation rows a matvec workgroup holds for T rows
// (T ≤ matVecMaxT): a power of two.
func matVecTT(T int) uint32 {
	tt := uint32(1)
	for tt < uint32(T) {
		tt *= 2
	}
	return tt
}

// skinnyLayout is skinny_int4.wgsl's tiling (see its header): tt
// activation rows a workgroup, rt weight rows a thread, wg threads.
type skinnyLayout struct{ tt, rt, wg int }

func (l skinnyLayout) String() string { return fmt.Sprintf("skinny-%dx%d/%d", l.tt, l.rt, l.wg) }

// rows is the weight rows a workgroup computes.
func (l skinnyLayout) rows() int { return l.wg * l.rt }

// valid reports whether the kernel takes the layout.
func (l skinnyLayout) valid() bool {
	return l.tt >= 4 && l.tt%4 == 0 && l.wg >= l.tt && l.wg%l.tt == 0 && l.wg <= 256 && l.rt >= 1 && l.rt <= 4
}

// chunk returns the inputs a chunk (KC) for a device with limit bytes of
// workgroup memory: the most, up to 128, whose staged activations fit it;
// 0 when none does.
func (l skinnyLayout) chunk(limit uint32) int {
	for kc := 128; kc >= 32; kc -= 32 {
		if uint32(4*(kc*l.tt+l.wg+l.tt)) <= limit {
			return kc
		}
	}
	return 0
}

// pickSkinnyLayout returns skinny_int4.wgsl's layout for T activation rows
// of an N-row matrix, the fastest measured on the H200 at Qwen3-1.7B's
// shapes (BenchmarkMatMulKernels; BENCHMARKS.md), as a rule: two weight
// rows a thread; 8 or 16 activation rows a workgroup up to 8 or 16, 32
// beyond — but 16 for a vocabulary-sized head, whose tiles fill the GPU
// anyway; 64 threads, or more for tall matrices (gate|up, the head) — and
// 256 for prompt chunks of 256 rows and more, which have tiles enough for
// any matrix (at 1,024 rows q|k|v 627 µs against 686 at 128 threads, down
// 1,010 against 1,138; 64 rows a workgroup or four weight rows a thread
// were slower at every projection).
func pickSkinnyLayout(n, T int) skinnyLayout {
	tall := n >= 8192
	wg := 64
	if tall {
		wg = 128
	}
	switch {
	case T >= 256 && n < 65536:
		return skinnyLayout{tt: 32, rt: 2, wg: 256}
	case T <= 8:
		return skinnyLayout{tt: 8, rt: 2, wg: wg}
	case T <= 16 || n >= 65536:
		return skinnyLayout{tt: 16, rt: 2, wg: wg}
	case tall:
		return skinnyLayout{tt: 32, rt: 2, wg: 256}
	}
	return skinnyLayout{tt: 32, rt: 2, wg: 128}
}

// targetGroups is how many workgroups a skinny_int4.wgsl matmul at layout
// l should have at least (split-K below that), as gemmTile.targetGroups:
// 512 up to 16 activation rows a workgroup, 256 at 32 (measured against
// 512 and 1,024 at 8, 16 and 32 rows on the H200).
func (l skinnyLayout) targetGroups() int {
	if l.tt <= 16 {
		return 512
	}
	return 256
}
