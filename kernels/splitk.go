package kernels

import (
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// A split-K matmul: gemm_int4.wgsl, skinny_int4.wgsl and
// matvec_batch_int4.wgsl, whose tiles alone would be too few workgroups to
// fill a large GPU, each take a slice of K (grid z) and write partial sums
// to scratch, which matmul_reduce.wgsl adds up into out — or the next
// kernel as it reads them (qkv_rope_kv.wgsl).

// matMulReduce is matmul_reduce.wgsl.
var matMulReduce = gpu.Kernel{
	Module: "matmul_reduce.wgsl", Source: shaders.MatMulReduce, Entry: "main", Params: reflect.TypeFor[reduceParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // part, out
}

// splitParams are the params of the kernels that may split along K
// (prelude.wgsl's SplitParams).
type splitParams struct {
	T, N, K, G, Ldo, Accumulate uint32
	Eps                         float32
	Splits, Kps, Swiglu, Norm   uint32
	Magic                       uint32 // codesMagic
	Msplits                     uint32 // matvec_batch_int4.wgsl's MERGE: the attention's splits
	_, _, _                     uint32
}

// reduceParams are matmul_reduce.wgsl's params.
type reduceParams struct {
	T, N, Splits, Ldo, Accumulate, Norm, K uint32
	Eps                                    float32
}

// splitDispatch records pipeline p — gemm_int4.wgsl, skinny_int4.wgsl or
// matvec_batch_int4.wgsl, which share bindings, params and the split-K
// protocol — over tiles of bn output features × bm activation rows, split
// along K into parts of a multiple of step inputs, the last one shorter
// where step does not divide K (then summed by matmul_reduce.wgsl, or left in
// c.split when c.deferReduce) when the tiles alone are fewer than target
// workgroups.
func (c *matMulCall) splitDispatch(p *gpu.Pipeline, blk rowBlock, out gpu.Binding, bn, bm, step, target int) error {
	w, T, d := c.w, c.T, c.b.Device()
	splits, kps := c.splitK(blk, bn, bm, step, target)
	partials := uint64(splits) * uint64(T) * uint64(blk.n+1) * 4 // sums, then sums of squares
	// A merged input is in scratch already: no split-K partials over it.
	if splits > 1 && (partials > d.Limits().MaxStorageBufferBindingSize || c.in.merge != nil) {
		splits, kps = 1, w.K
	}
	dst := out
	if splits > 1 {
		scratch, err := d.Scratch(partials)
		if err != nil {
			return err
		}
		dst = scratch.Slice(0, partials)
	}
	swiglu, norm := c.inputFlags() // skinny_int4.wgsl's; gemm_int4.wgsl takes them as constants
	params := &splitParams{T: uint32(T), N: uint32(blk.n), K: uint32(w.K), G: uint32(w.G), Ldo: uint32(w.N),
		Accumulate: wgslBool(c.in.accumulate), Eps: float32(c.in.eps), Splits: uint32(splits), Kps: uint32(kps), Swiglu: swiglu, Norm: norm,
		Magic: codesMagic}
	if c.in.merge != nil {
		params.Msplits = uint32(c.in.merge.splits)
	}
	if err := gpu.Dispatch(c.b, p, params, c.bind(blk, dst), divCeil(blk.n, bn), divCeil(T, bm), uint32(splits)); err != nil {
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
	rp := &reduceParams{T: uint32(T), N: uint32(blk.n), Splits: uint32(splits), Ldo: uint32(w.N), Accumulate: wgslBool(c.in.accumulate),
		Norm: norm, K: uint32(w.K), Eps: float32(c.in.eps)}
	return gpu.Dispatch(c.b, r, rp, []gpu.Binding{dst, out}, divCeil(blk.n, 256), uint32(T), 1)
}

// splitK returns how a matmul over tiles of bn output features × bm
// activation rows of blk splits along K for at least target workgroups:
// the slices, and the inputs each (a multiple of step; the last slice
// shorter where they do not divide K).
func (c *matMulCall) splitK(blk rowBlock, bn, bm, step, target int) (splits, kps int) {
	K := c.w.K
	tiles := int(divCeil(blk.n, bn)) * int(divCeil(c.T, bm))
	kSteps := (K + step - 1) / step
	splits = min(kSteps, max(1, (target+tiles-1)/tiles))
	kps = (kSteps + splits - 1) / splits * step
	return (K + kps - 1) / kps, kps
}

// splitBlockLog is log2 of SB in matmul_reduce.wgsl and qkv_rope_kv.wgsl
// (prelude.wgsl's split_sum) for a split-K of splits parts: the splits a
// thread loads before it adds them up, the smallest power of two that
// covers splits, at most 8. (A loop to the param splits went one load at a
// time; a block of 8 at two or four splits was slower, loading the last
// split again for the rest.)
func splitBlockLog(splits int) int {
	l := 0
	for l < 3 && 1<<l < splits {
		l++
	}
	return l
}

// reduceConsts specializes split_sum's kernels by SB = 1 << i, without a
// map a dispatch.
var reduceConsts = [4]gpu.Consts{{"SB": 1}, {"SB": 2}, {"SB": 4}, {"SB": 8}}
