package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// matmul_rowtile.wgsl: any shape, any format, each thread whole words of
// the weight rows (see its header).
var (
	rowTileInt4 = gpu.Kernel{
		Module: "matmul_rowtile.wgsl", Source: shaders.MatMulRowTile, Entry: "int4", Params: reflect.TypeFor[matMulParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, qweight, out, norm, scales
	}
	rowTileF16 = gpu.Kernel{
		Module: "matmul_rowtile.wgsl", Source: shaders.MatMulRowTile, Entry: "dense_f16", Params: reflect.TypeFor[matMulParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, dense, out, norm
	}
	rowTileF32 = gpu.Kernel{
		Module: "matmul_rowtile.wgsl", Source: shaders.MatMulRowTile, Entry: "dense_f32", Params: reflect.TypeFor[matMulParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, dense, out, norm
	}
)

// rowTileRows is the output features a workgroup computes for prefill
// (T > 1): ROWS in matmul_rowtile.wgsl.
const rowTileRows = 4

// rowTileConsts are the constants matmul_rowtile.wgsl is specialized by.
var rowTileConsts = []string{"TT", "ROWS"}

// rowTileTT returns the activation rows a workgroup holds for T rows: 1
// for decode, a tile of 4 or 8 for prefill.
func rowTileTT(T int) uint32 {
	switch {
	case T == 1:
		return 1
	case T <= 4:
		return 4
	}
	return 8
}

// rowTile records one row block with matmul_rowtile.wgsl.
func (c *matMulCall) rowTile(blk rowBlock, out gpu.Binding) error {
	w, T, d := c.w, c.T, c.b.Device()
	var k gpu.Kernel
	switch w.Format {
	case Int4:
		k = rowTileInt4
	case F16:
		k = rowTileF16
	case F32:
		k = rowTileF32
	default:
		return fmt.Errorf("unknown format %v", w.Format)
	}
	tt := rowTileTT(T)
	// Decode (T = 1) reads each weight once and reuses nothing: a row per
	// workgroup gives the GPU four times the workgroups to hide latency with
	// (as long as the rows fit the grid's x dimension; a vocabulary-sized
	// head keeps four).
	rows := rowTileRows
	if T == 1 && uint32(w.N) <= d.Limits().MaxComputeWorkgroupsPerDimension {
		rows = 1
	}
	return c.rowDispatch(blk, out, k, specialization{rowTileConsts, [6]uint32{tt, uint32(rows)}}, rows, int(tt))
}
