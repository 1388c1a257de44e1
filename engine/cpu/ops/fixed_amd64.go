//go:build goexperiment.simd && amd64

package ops

import (
	"encoding/binary"
	"math"
	"simd/archsimd"
	"unsafe"
)

// useFixed: int4 matrices take the fixed-point kernel (int4Fixed16),
// which needs AVX-512 VNNI's VPDPBUSD.
var useFixed = hasFixed

// hasFixed: this machine can run the fixed-point kernel.
var hasFixed = useAVX512 && archsimd.X86.AVX512VNNI()

// int4Fixed16 is in int4fixed_amd64.s.
//
//go:noescape
func int4Fixed16(codes *byte, scales *uint16, groups, bps int, x *byte, stride int, T int, out *float32, ldBytes int, blocks16 int, mask int, addMask int)

// int4Screen16 is int4Fixed16 over the same inputs to 16 bits (screen.go),
// in int4fixed_amd64.s.
//
//go:noescape
func int4Screen16(codes *byte, scales *uint16, groups, bps int, x *byte, stride int, T int, out *float32, ldBytes int, blocks16 int, mask int, addMask int)

// hasScreen: this machine can run the screening kernel.
var hasScreen = hasFixed

// fixedInputs is how many input rows one kernel call takes.
const fixedInputs = 8

// fixedChunkBytes bounds the codes of the row blocks every group of
// fixedInputs inputs passes over in turn: they stay in L2, so that a
// matrix is read from memory once however many inputs meet it.
const fixedChunkBytes = 64 << 10

// mulFixed computes the weight rows [lo, hi) against every input row
// (fixedCalls), in fixed point.
func (l *Linear) mulFixed(out []float32, ld int, in *Input, lo, hi int, add bool) {
	if in.fixed == nil || in.Cols != l.Cols {
		panic("ops: MulRows: the input is not prepared in fixed point for this matrix")
	}
	l.fixedCalls(int4Fixed16, in, out, ld, lo, hi, add)
}

// Screen computes the weight rows [lo, hi) against every input row of in
// as MulRows does, but to 16 bits of each input (EnableScreen, the
// package's screening): each result within ScreenBound of MulRows'.
func (l *Linear) Screen(out []float32, ld int, in *Input, lo, hi int) {
	if l.screenMax == nil || in.fixed == nil || in.Cols != l.Cols {
		panic("ops: Screen: the matrix does not screen, or the input is not prepared in fixed point for it")
	}
	if lo < hi && in.T > 0 {
		l.fixedCalls(int4Screen16, in, out, ld, lo, hi, false)
	}
}

// fixedKernel is int4Fixed16's signature.
type fixedKernel func(codes *byte, scales *uint16, groups, bps int, x *byte, stride int, T int, out *float32, ldBytes int, blocks16 int, mask int, addMask int)

// fixedCalls runs kernel over the weight rows [lo, hi) against every
// fixed-point input row of in: the 16-row blocks that [lo, hi) covers
// whole in calls of up to fixedChunkBytes of codes for each eight inputs,
// a block it covers in part by a call of its own, masked to its rows.
func (l *Linear) fixedCalls(kernel fixedKernel, in *Input, out []float32, ld, lo, hi int, add bool) {
	T, x, stride := in.T, in.fixed, fixedStride(l.Cols)
	if len(out) < (T-1)*ld+hi {
		panic("ops: MulRows: output too short")
	}
	groups, bps := l.Cols/l.groupSize, l.groupSize/Block
	bytes16, scales16 := l.Cols/Block*256, groups*16
	chunk := max(1, fixedChunkBytes/bytes16)
	call := func(rb, n int, mask uint16) {
		addMask := 0
		if add {
			addMask = int(mask)
		}
		for c := rb; c < rb+n; c += chunk {
			m := min(chunk, rb+n-c)
			for t0 := 0; t0 < T; t0 += fixedInputs {
				kernel(&l.fixed[c*bytes16], &l.fixedScales[c*scales16], groups, bps,
					&x[t0*stride], stride, min(fixedInputs, T-t0), &out[t0*ld+16*c], 4*ld, m, int(mask), addMask)
			}
		}
	}
	// rowsMask is the mask of rows [a, b) of the block starting at row r.
	rowsMask := func(r, a, b int) uint16 {
		var m uint16
		for i := max(a-r, 0); i < min(b-r, 16); i++ {
			m |= 1 << i
		}
		return m
	}
	first, last := lo/16, (hi-1)/16
	if lo%16 != 0 || first == last {
		call(first, 1, rowsMask(16*first, lo, hi))
		first++
	}
	if first > last {
		return
	}
	whole := last
	if hi%16 != 0 {
		whole--
	}
	if whole >= first {
		call(first, whole-first+1, 0xFFFF)
	}
	if whole < last {
		call(last, 1, rowsMask(16*last, lo, hi))
	}
}

// quantize writes row (whole 32-column blocks) in fixed point into dst;
// the vector twin of quantizeGo, equal to it bit for bit.
func quantize(dst []byte, row []float32) {
	if !useAVX512 {
		quantizeGo(dst, row)
		return
	}
	nb := len(row) / Block
	meta := dst[96*nb:]
	signs := archsimd.BroadcastInt32x16(math.MaxInt32)
	half := archsimd.BroadcastInt32x16(128)
	for b := range nb {
		p := unsafe.Pointer(&row[b*Block])
		x0, x1 := at(p, 0), at(p, 64)
		a0 := x0.AsInt32x16().And(signs).AsFloat32x16()
		a1 := x1.AsInt32x16().And(signs).AsFloat32x16()
		s, inv := fixedScale(max16(a0.Max(a1)), sum16(x0.Add(x1)))
		iv := archsimd.BroadcastFloat32x16(inv)
		q0 := x0.Mul(iv).RoundToEvenScaled(0).ConvertToInt32()
		q1 := x1.Mul(iv).RoundToEvenScaled(0).ConvertToInt32()
		d := (*[96]int8)(unsafe.Pointer(&dst[96*b]))
		lo0 := storeSplit(d, 0, q0, half)
		lo1 := storeSplit(d, 16, q1, half)
		total, lo := sum16i(q0.Add(q1)), sum16i(lo0.Add(lo1))
		binary.LittleEndian.PutUint32(meta[12*b:], math.Float32bits(s))
		binary.LittleEndian.PutUint32(meta[12*b+4:], uint32(-8*total))
		binary.LittleEndian.PutUint32(meta[12*b+8:], uint32(-8*(total-lo)))
	}
}

// storeSplit writes split's three parts of sixteen quantized values q —
// hi, mid and lo at d[i:], d[32+i:] and d[64+i:] — and returns lo. A
// function rather than a loop over an array of the two vectors, which
// the compiler kept on the stack (quantize 1.2 times slower).
func storeSplit(d *[96]int8, i int, q, half archsimd.Int32x16) archsimd.Int32x16 {
	t := q.Add(half).ShiftAllRight(8)
	h := t.Add(half).ShiftAllRight(8)
	h.TruncateToInt8().Store((*[16]int8)(d[i:]))
	t.Sub(h.ShiftAllLeft(8)).TruncateToInt8().Store((*[16]int8)(d[32+i:]))
	lo := q.Sub(t.ShiftAllLeft(8))
	lo.TruncateToInt8().Store((*[16]int8)(d[64+i:]))
	return lo
}

// max16 is a vector's largest lane (none of them NaN).
func max16(v archsimd.Float32x16) float32 {
	m8 := v.GetLo().Max(v.GetHi())
	m4 := m8.GetLo().Max(m8.GetHi())
	m4 = m4.Max(m4.SelectFromPair(2, 3, 0, 1, m4))
	m4 = m4.Max(m4.SelectFromPair(1, 0, 3, 2, m4))
	return m4.GetElem(0)
}

// sum16i adds a vector's lanes.
func sum16i(v archsimd.Int32x16) int32 {
	s8 := v.GetLo().Add(v.GetHi())
	s4 := s8.GetLo().Add(s8.GetHi())
	s4 = s4.AddPairs(s4)
	s4 = s4.AddPairs(s4)
	return s4.GetElem(0)
}
