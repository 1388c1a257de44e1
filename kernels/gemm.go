package kernels

import (
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// gemm_int4.wgsl: int4 W times many activation rows, both tiled in
// workgroup memory (see its header).
var gemmInt4 = gpu.Kernel{
	Module: "gemm_int4.wgsl", Source: shaders.GEMMInt4, Entry: "main", Params: reflect.TypeFor[splitParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, qweight, out, norm, scales
}

// The constants gemm_int4.wgsl is specialized by (besides SWIGLU and NORM).
var gemmConsts = []string{"TM", "TN"}

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

// gemm records one row block with gemm_int4.wgsl at the choice's tiling
// and split-K target.
func (c *matMulCall) gemm(blk rowBlock, out gpu.Binding) error {
	g := c.choice.kernel.gemmTile()
	p, err := c.pipeline(gemmInt4, specialization{gemmConsts, [6]uint32{uint32(g.tm), uint32(g.tn)}})
	if err != nil {
		return err
	}
	return c.splitDispatch(p, blk, out, g.bn(), g.bm(), g.bk(), c.choice.groups)
}
