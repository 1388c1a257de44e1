package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// matvec_int4.wgsl: int4 W times one to four activation rows, the
// memory-bound case (see its header).
var matVecInt4 = gpu.Kernel{
	Module: "matvec_int4.wgsl", Source: shaders.MatVecInt4, Entry: "main", Params: reflect.TypeFor[matMulParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, qweight, out, norm, scales
}

// The constants matvec_int4.wgsl is specialized by.
var matVecConsts = []string{"LANES", "RT", "WG", "TT", "KC", "SHM"}

// The kernel takes up to matVecMaxT activation rows; a thread holds at
// most matVecMaxWeights weight vec4s of a chunk in registers (64 of them).
const (
	matVecMaxT       = 4
	matVecMaxWeights = 16
)

// matVecLayout is matvec_int4.wgsl's tiling (see its header): lanes
// threads along K share rt neighbouring weight rows, wg threads a
// workgroup; the input is staged at most maxKC columns at a time (0: the
// whole row where it fits).
type matVecLayout struct{ lanes, rt, wg, maxKC int }

func (l matVecLayout) String() string {
	if l.maxKC > 0 {
		return fmt.Sprintf("matvec-%dx%d/%d/kc=%d", l.lanes, l.rt, l.wg, l.maxKC)
	}
	return fmt.Sprintf("matvec-%dx%d/%d", l.lanes, l.rt, l.wg)
}

// rows is the weight rows a workgroup computes.
func (l matVecLayout) rows() int { return l.wg / l.lanes * l.rt }

// valid reports whether the kernel takes the layout.
func (l matVecLayout) valid() bool {
	return l.lanes >= 16 && l.wg >= l.lanes && l.wg%l.lanes == 0 && l.wg <= 256 &&
		l.rt >= 1 && l.rt <= l.lanes
}

// pickMatVecLayout returns the layout for T rows of an N × K matrix, the
// fastest of ten measured on the H200 (BenchmarkMatMulKernels, dependent
// matmuls as in a decode pass) at Qwen3-1.7B's shapes, as a rule: tall
// matrices (the stacked gate/up projection, the head) want few lanes a row
// and, from two rows on, 8 rows a thread; long rows (down_proj) 32 lanes
// or, from two rows on, one row a thread; the rest 64 lanes of 4 rows. The
// differences are small at one row — every layout's dependent time there is
// mostly latency — and up to 3× at four.

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

// matVecFor plans T rows of w at pickMatVecLayout's layout, with smaller
// workgroups where the device's workgroup memory needs them.
func matVecFor(w *Matrix, T int, limits gpu.Limits) (matVecPlan, bool) {
	l := pickMatVecLayout(w.N, w.K, T)
	for {
		p, ok := matVecAt(l, w, T, limits)
		if ok || l.wg/2 < l.lanes {
			return p, ok
		}
		l.wg /= 2
	}
}

// matVecAt plans T rows of w at layout l, if the device takes it.
func matVecAt(l matVecLayout, w *Matrix, T int, limits gpu.Limits) (matVecPlan, bool) {
	p, ok := planMatVec(l, T, w.K, limits.MaxComputeWorkgroupStorageSize)
	return p, ok && divCeil(w.N, l.rows()) <= limits.MaxComputeWorkgroupsPerDimension
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
	if l.maxKC > 0 {
		kc = max(step, min(kc, l.maxKC/step*step))
	}
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

// matVecTT returns the activation rows a matrix-vector workgroup holds for
// T rows (T ≤ matVecMaxT): a power of two.
func matVecTT(T int) uint32 {
	tt := uint32(1)
	for tt < uint32(T) {
		tt *= 2
	}
	return tt
}

// matVec records one row block with matvec_int4.wgsl at the choice's plan.
func (c *matMulCall) matVec(blk rowBlock, out gpu.Binding) error {
	p := c.choice.matVec
	if p.tt < matVecTT(c.T) || p.kc == 0 {
		return fmt.Errorf("%v, planned for %d rows, does not take %d", p.matVecLayout, p.tt, c.T)
	}
	l := p.matVecLayout
	consts := specialization{matVecConsts, [6]uint32{uint32(l.lanes), uint32(l.rt), uint32(l.wg), p.tt, p.kc, p.shm}}
	return c.rowDispatch(blk, out, matVecInt4, consts, l.rows(), int(p.tt))
}
