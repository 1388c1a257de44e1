package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// matvec_batch_int4.wgsl: int4 W times one (long rows) to four activation
// rows a workgroup, in blocks of four up to matVecBatchMaxT (see its
// header).
var matVecBatchInt4 = gpu.Kernel{
	Module: "matvec_batch_int4.wgsl", Source: shaders.MatVecBatchInt4, Entry: "main", Params: reflect.TypeFor[splitParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, qweight, out, norm, scales
}

// The constants matvec_batch_int4.wgsl is specialized by.
var matVecBatchConsts = []string{"LANES", "ROWS", "RT", "WG", "TT", "KC"}

// matVecBatchStaged is how many input values matvec_batch_int4.wgsl stages
// at a time (KC · TT), at most.
const matVecBatchStaged = 2048

// matVecBatchMaxT is the most activation rows matvec_batch_int4.wgsl takes
// in one dispatch: blocks of up to matVecMaxT a workgroup (grid y).
const matVecBatchMaxT = 5 * matVecMaxT

// matVecBatchTT is the activation rows a workgroup of
// matvec_batch_int4.wgsl holds for T rows: a power of two, at most
// matVecMaxT (more rows take several blocks).
func matVecBatchTT(T int) uint32 { return min(matVecTT(T), matVecMaxT) }

// matVecBatchLayout is matvec_batch_int4.wgsl's tiling (see its header):
// lanes threads a weight row, rows weight rows a workgroup, rt of them a
// thread (0: 1), and staged input values at a time over its activation
// rows (KC · TT; 0: matVecBatchStaged).
type matVecBatchLayout struct {
	lanes, rows, rt, staged int
}

func (l matVecBatchLayout) String() string {
	s := fmt.Sprintf("matvec-batch-%dx%d", l.lanes, l.rows)
	if l.rt > 1 {
		s += fmt.Sprintf("x%d", l.rt)
	}
	if l.staged > 0 {
		s += fmt.Sprintf("/staged=%d", l.staged)
	}
	return s
}

// rowsAThread is the layout's weight rows a thread.
func (l matVecBatchLayout) rowsAThread() int { return max(l.rt, 1) }

// wg is the layout's threads a workgroup.
func (l matVecBatchLayout) wg() int { return l.lanes * l.rows / l.rowsAThread() }

// valid reports whether the kernel takes the layout.
func (l matVecBatchLayout) valid() bool {
	return l.lanes >= 1 && l.lanes&(l.lanes-1) == 0 && l.lanes <= 64 && l.rows >= 1 &&
		l.rows%l.rowsAThread() == 0 && l.wg() <= 256
}

// sharedBytes is the workgroup memory the layout takes for tt activation
// rows staged kc columns at a time: the staged input, the partial sums
// (one a weight row, lane and activation row) and the norm's sums of squares.
func (l matVecBatchLayout) sharedBytes(tt, kc uint32) uint32 {
	groups := uint32(l.wg() / l.lanes)
	return 4 * (tt*kc + tt*uint32(l.rows*l.lanes) + tt*groups + tt)
}

// matVecBatchDefault is the layout every shape takes where a plan does not
// choose by shape (plan.matVecBatchLayout): 16 lanes and 16 rows, one a
// thread.
var matVecBatchDefault = matVecBatchLayout{lanes: 16, rows: 16}

// matVecBatchNarrow, matVecBatchNarrowOne and matVecBatchWide are the
// H200's layouts (two weight rows a thread): for a matrix of few rows
// (Qwen3's o_proj and down_proj), one row of 2,048 inputs or more on 64
// lanes a row and 8 rows a workgroup — twice the workgroups, each thread a
// row's 64th —, two rows (or one of fewer inputs) on 32 lanes and 16 rows;
// for the rest, 16 lanes and 32 rows (kernels/plan.go).
var (
	matVecBatchNarrow    = matVecBatchLayout{lanes: 32, rows: 16, rt: 2}
	matVecBatchNarrowOne = matVecBatchLayout{lanes: 64, rows: 8, rt: 2}
	matVecBatchWide      = matVecBatchLayout{lanes: 16, rows: 32, rt: 2}
)

// matVecBatchHead is the H200's layout for one row of a vocabulary-sized
// head (matVecBatchHeadMinN rows or more) of matVecBatchHeadMinK inputs or
// more: one weight row a thread, 16 lanes × 16 rows, 1,024 input values
// staged at a time — 5 KiB of workgroup memory and few registers, so that
// more workgroups share an SM (kernels/plan.go).
var matVecBatchHead = matVecBatchLayout{lanes: 16, rows: 16, staged: 1024}

// matVecBatchHeadMinN is where a matrix counts as a head for
// matVecBatchHead: past every Qwen3 projection (24,576 rows at most).
// matVecBatchHeadMinK is the fewest inputs it pays at: Qwen3-1.7B's
// 2,048 (at Qwen3-0.6B's 1,024 the wide layout is the faster).
const (
	matVecBatchHeadMinN = 65536
	matVecBatchHeadMinK = 2048
)

// fits reports whether the layout takes T ≤ matVecBatchMaxT rows of w on
// a device with limits l: its workgroups fit the grid and at least one
// vec4 a lane of staged input fits the workgroup memory.
func (l matVecBatchLayout) fits(w *Matrix, T int, lim gpu.Limits) bool {
	tt := matVecBatchTT(T)
	kc := l.chunk(tt, lim.MaxComputeWorkgroupStorageSize)
	return l.valid() && divCeil(w.N, l.rows) <= lim.MaxComputeWorkgroupsPerDimension &&
		l.sharedBytes(tt, kc) <= lim.MaxComputeWorkgroupStorageSize
}

// chunk returns how many input columns the layout stages at a time for tt
// rows: the layout's staged values in all, fewer where the device's
// workgroup memory (staged input, then tt·WG partial sums and the norm's
// tt·ROWS sums) would not hold them — but at least one 32-column vec4 a
// lane (at tt ≤ 4 and 256 threads WebGPU's default 16 KiB always holds
// that).
func (l matVecBatchLayout) chunk(tt, limit uint32) uint32 {
	step := uint32(32 * l.lanes)
	staged := uint32(matVecBatchStaged)
	if l.staged > 0 {
		staged = uint32(l.staged)
	}
	kc := max(step, staged/tt/step*step)
	for kc > step && l.sharedBytes(tt, kc) > limit {
		kc = max(step, kc/2/step*step)
	}
	return kc
}

// matVecBatch records one row block with matvec_batch_int4.wgsl at the
// choice's layout, split along K in slices of whole vec4s a lane when its
// workgroups are fewer than the choice's split-K target.
func (c *matMulCall) matVecBatch(blk rowBlock, out gpu.Binding) error {
	w, d, l := c.w, c.b.Device(), c.choice.matVecBatch
	if !l.fits(w, c.T, d.Limits()) {
		return fmt.Errorf("%v does not take %d rows of %d × %d on this device", l, c.T, w.N, w.K)
	}
	tt := matVecBatchTT(c.T)
	// No longer than the row (rounded to a vec4 a lane): each thread loads
	// KC / 32 / LANES weight vec4s a chunk, and one past the row would only
	// be skipped.
	kc := min(l.chunk(tt, d.Limits().MaxComputeWorkgroupStorageSize), uint32(alignUp(uint64(w.K), uint64(32*l.lanes))))
	consts := specialization{matVecBatchConsts, [6]uint32{uint32(l.lanes), uint32(l.rows), uint32(l.rowsAThread()), uint32(l.wg()), tt, kc}}
	p, err := c.pipeline(matVecBatchInt4, consts)
	if err != nil {
		return err
	}
	return c.splitDispatch(p, blk, out, l.rows, int(tt), 32*l.lanes, c.choice.groups)
}
