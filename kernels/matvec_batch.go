package kernels

import (
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// matvec_batch_int4.wgsl: int4 W times one (long rows) to four activation rows, one
// weight row a thread (see its header).
var matVecBatchInt4 = gpu.Kernel{
	Module: "matvec_batch_int4.wgsl", Source: shaders.MatVecBatchInt4, Entry: "main", Params: reflect.TypeFor[matMulParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, qweight, out, norm, scales
}

// The constants matvec_batch_int4.wgsl is specialized by.
var matVecBatchConsts = []string{"TT", "KC"}

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
