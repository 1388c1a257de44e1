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
	kernelAuto    matMulKernel = iota // pickMatMul's choice
	kernelRowTile                     // matmul_int4.wgsl / matmul_dense.wgsl: any shape, 1 or 4–8-row tiles
	kernelMatVec                      // matvec_int4.wgsl: 1–4 rows
	kernelGEMM2                       // gemm_int4.wgsl, 2 × 4 outputs a thread (32 × 64 tiles)
	kernelGEMM4                       // gemm_int4.wgsl, 4 × 4 outputs a thread (64 × 64 tiles)
	kernelGEMM2x8                     // gemm_int4.wgsl, 2 × 8 outputs a thread (32 × 128 tiles); not picked until measured
)

func (k matMulKernel) String() string {
	switch k {
	case kernelAuto:
		return "auto"
	case kernelRowTile:
		return "row-tile"
	case kernelMatVec:
		return "matvec"
	case kernelGEMM2:
		return "gemm-2"
	case kernelGEMM4:
		return "gemm-4"
	case kernelGEMM2x8:
		return "gemm-2x8"
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

// matVecTargetGroups is how many workgroups the matrix-vector kernel
// aims for at least (the H200 has 132 SMs): its workgroups shrink until a
// matrix has that many, or are as small as they go.
const matVecTargetGroups = 256

// pickMatVecLayout returns the layout for an N × K matrix: 4 rows a
// thread (each staged input read serves four weight rows), the fewest
// lanes that take a row in one chunk of matVecMaxWeights vec4s a thread,
// and the largest workgroup that still gives matVecTargetGroups
// workgroups.
func pickMatVecLayout(n, k int) matVecLayout {
	l := matVecLayout{lanes: 16, rt: 4, wg: 256}
	for l.lanes < 64 && k > 32*l.lanes*matVecMaxWeights/l.rt {
		l.lanes *= 2
	}
	for l.wg > 64 && l.wg > l.lanes && divCeil(n, l.rows()) < matVecTargetGroups {
		l.wg /= 2
	}
	return l
}

// matVecFor plans T rows of w with layout l, or pickMatVecLayout's
// (with smaller workgroups where the device's workgroup memory needs them)
// when l is zero.
func matVecFor(w *Matrix, T int, l matVecLayout, limits gpu.Limits) (matVecPlan, bool) {
	auto := l == matVecLayout{}
	if auto {
		l = pickMatVecLayout(w.N, w.K)
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
	memory := func(kc int) uint32 {
		shm := max(int(p.tt)*kc/4, l.rt*l.wg)
		return uint32(16 * (shm + l.wg + l.wg/16))
	}
	kc := int(alignUp(uint64(k), uint64(step)))
	for kc > step && (kc/step*l.rt > matVecMaxWeights || memory(kc) > limit) {
		kc -= step
	}
	if !l.valid() || kc/step*l.rt > matVecMaxWeights || memory(kc) > limit {
		return p, false
	}
	chunks := divCeil(k, kc)
	p.kc = uint32(alignUp(uint64(divCeil(k, int(chunks))), uint64(step)))
	p.shm = uint32(max(int(p.tt)*int(p.kc)/4, l.rt*l.wg))
	return p, true
}

// gemmMinT is the fewest activation rows pickMatMul gives gemm_int4.wgsl.
// Below it — 5 to 8 rows, past the matrix-vector kernel's 4 —
// matmul_int4.wgsl's 8-row tile is faster on the H200: a batch-8 decode
// step took 7.5 ms with it, 12.8 ms with the GEMM (whose 32-row tile costs
// the same at 8 rows as at 32) and 12.5 ms with the matrix-vector kernel
// at 8 rows.
const gemmMinT = 9

// pickMatMul returns the kernel for T rows of w on a device with limits l:
// the matrix-vector kernel for 1–4 rows, the 8-row tile for 5–8, the GEMM
// beyond (4 rows a thread past 32 rows, where its workgroup memory fits),
// and the row-tile kernels for whatever the int4 kernels do not take.
func pickMatMul(w *Matrix, T int, l gpu.Limits) matMulKernel {
	switch {
	case T <= matVecMaxT && kernelMatVec.fits(w, T, l):
		return kernelMatVec
	case T > 32 && kernelGEMM4.fits(w, T, l):
		return kernelGEMM4
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
	case kernelMatVec:
		if !int4 || T > matVecMaxT {
			return false
		}
		_, ok := matVecFor(w, T, matVecLayout{}, l)
		return ok
	case kernelGEMM2, kernelGEMM4, kernelGEMM2x8:
		tm, tn := k.gemmTile()
		return int4 && divCeil(w.N, 16*tn) <= l.MaxComputeWorkgroupsPerDimension &&
			gemmMemory(tm, tn) <= l.MaxComputeWorkgroupStorageSize
	}
	return false
}

// gemmTile returns a GEMM kernel's outputs a thread: tm activation rows ×
// tn features.
func (k matMulKernel) gemmTile() (tm, tn int) {
	switch k {
	case kernelGEMM4:
		return 4, 4
	case kernelGEMM2x8:
		return 2, 8
	}
	return 2, 4
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

// gemmMemory returns the workgroup memory gemm_int4.wgsl takes at tm × tn
// outputs a thread (see its header).
func gemmMemory(tm, tn int) uint32 {
	bm, bn, bk := 16*tm, 16*tn, 128/tn
	return uint32(4*bk*(bm+4) + 4*bk*bn + bm*bk + 4*bm)
}
