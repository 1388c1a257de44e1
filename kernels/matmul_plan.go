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
	kernelGEMM8                       // gemm_int4.wgsl, 8 × 8 outputs a thread (128 × 128 tiles); not picked until measured
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
	case kernelGEMM8:
		return "gemm-8x8"
	case kernelGEMM2x8:
		return "gemm-2x8"
	}
	return fmt.Sprintf("matMulKernel(%d)", int(k))
}

// The matrix-vector kernel's tiling (see the header of matvec_int4.wgsl):
// up to matVecMaxT activation rows, staged matVecStaged floats at a time.
const (
	matVecLanes  = 16
	matVecRows   = 16
	matVecMaxT   = 4
	matVecStaged = 2048
)

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
		return int4 && T <= matVecMaxT && divCeil(w.N, matVecRows) <= l.MaxComputeWorkgroupsPerDimension
	case kernelGEMM2, kernelGEMM4, kernelGEMM8, kernelGEMM2x8:
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
	case kernelGEMM8:
		return 8, 8
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
