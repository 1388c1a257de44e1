//go:build goexperiment.simd && amd64

package ops

import (
	"math/bits"
	"simd/archsimd"
	"unsafe"

	"webdraft/tensor"
)

// The vector kernels: AVX-512 through simd/archsimd, sixteen f32 lanes.
// Each falls back to its portable twin on a processor without AVX-512.

// Vector reports which kernels run: "avx512" or "portable".
func Vector() string {
	if useAVX512 {
		return "avx512"
	}
	return "portable"
}

var useAVX512 = archsimd.X86.AVX512()

// int4Row computes out[t*ld] (or adds to it) = Σ_c W[c]·x_t[c] for one
// int4 weight row (codes: Cols/2 bytes; scales: one per bps blocks) and
// the T input rows of x, four at a time so that each block of weights is
// widened once for four rows.
func int4Row(codes []byte, scales []uint16, bps int, x []float32, cols, T int, out []float32, ld int, add bool) {
	if !useAVX512 {
		int4RowGo(codes, scales, bps, x, cols, T, out, ld, add)
		return
	}
	if len(codes)*2 != cols || len(scales)*bps*Block != cols || len(x) < T*cols || len(out) < (T-1)*ld+1 {
		panic("ops: int4Row: shapes do not match")
	}
	put := func(t int, s float32) {
		if add {
			out[t*ld] += s
		} else {
			out[t*ld] = s
		}
	}
	row := func(t int) []float32 { return x[t*cols : (t+1)*cols] }
	t := 0
	for ; t+4 <= T; t += 4 {
		s0, s1, s2, s3 := int4Dot4(codes, scales, bps, row(t), row(t+1), row(t+2), row(t+3))
		put(t, s0)
		put(t+1, s1)
		put(t+2, s2)
		put(t+3, s3)
	}
	switch T - t {
	case 3:
		s0, s1, s2, _ := int4Dot4(codes, scales, bps, row(t), row(t+1), row(t+2), row(t+2))
		put(t, s0)
		put(t+1, s1)
		put(t+2, s2)
	case 2:
		s0, s1 := int4Dot2(codes, scales, bps, row(t), row(t+1))
		put(t, s0)
		put(t+1, s1)
	case 1:
		put(t, int4Dot1(codes, scales, bps, row(t)))
	}
}

// The int4 dot products walk raw pointers: a block is 16 bytes of codes
// and 32 floats (128 bytes) of each input row, and slicing per block
// costs more scalar work than the block's vector work. Callers pass
// slices of matching length (MulRows' shapes), checked once in int4Row.

// widen turns a block's 16 bytes of codes into its 32 weights: the
// even columns' and the odd columns'. tbl holds the group's 16 values,
// (code − 8)·s as the reference dequantizes them, and each code picks
// its value out of it (VPERMPS reads an index's low 4 bits, so the low
// nibble needs no mask).
func widen(codes unsafe.Pointer, tbl archsimd.Float32x16) (even, odd archsimd.Float32x16) {
	c := archsimd.LoadUint8x16((*[16]byte)(codes)).ExtendToUint32()
	return tbl.Permute(c), tbl.Permute(c.ShiftAllRight(4))
}

// levels are the codes' values before scaling: code − 8.
var levels = [16]float32{-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7}

// table is a group's 16 weight values for scale bits sb.
func table(sb uint16) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16(&levels).Mul(archsimd.BroadcastFloat32x16(tensor.F16ToF32(sb)))
}

func load16(x []float32) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(x))
}

// at loads the 16 floats at byte offset off from p.
func at(p unsafe.Pointer, off uintptr) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, off)))
}

// int4Dot1x4 is one input row's dot products with four weight rows that
// follow each other in memory (bytesPerRow codes, scalesPerRow scales
// each): four independent chains, the input read once.
func int4Dot1x4(codes []byte, scales []uint16, bps int, x []float32) (float32, float32, float32, float32) {
	if !useAVX512 {
		return int4Dot1x4Go(codes, scales, bps, x)
	}
	rowBytes, rowScales := uintptr(len(codes)/4), len(scales)/4
	var a0, a1, a2, a3 archsimd.Float32x16
	c0 := unsafe.Pointer(unsafe.SliceData(codes))
	p := unsafe.Pointer(unsafe.SliceData(x))
	var co, o uintptr
	for g := range rowScales {
		t0, t1 := table(scales[g]), table(scales[rowScales+g])
		t2, t3 := table(scales[2*rowScales+g]), table(scales[3*rowScales+g])
		for range bps {
			xe, xo := at(p, o), at(p, o+64)
			c := unsafe.Add(c0, co)
			e0, o0 := widen(c, t0)
			e1, o1 := widen(unsafe.Add(c, rowBytes), t1)
			e2, o2 := widen(unsafe.Add(c, 2*rowBytes), t2)
			e3, o3 := widen(unsafe.Add(c, 3*rowBytes), t3)
			a0 = e0.MulAdd(xe, a0)
			a1 = e1.MulAdd(xe, a1)
			a2 = e2.MulAdd(xe, a2)
			a3 = e3.MulAdd(xe, a3)
			a0 = o0.MulAdd(xo, a0)
			a1 = o1.MulAdd(xo, a1)
			a2 = o2.MulAdd(xo, a2)
			a3 = o3.MulAdd(xo, a3)
			co += 16
			o += 128
		}
	}
	return sum4x16(a0, a1, a2, a3)
}

func int4Dot4(codes []byte, scales []uint16, bps int, x0, x1, x2, x3 []float32) (float32, float32, float32, float32) {
	var a0, a1, a2, a3 archsimd.Float32x16
	c0 := unsafe.Pointer(unsafe.SliceData(codes))
	var co uintptr
	p0, p1 := unsafe.Pointer(unsafe.SliceData(x0)), unsafe.Pointer(unsafe.SliceData(x1))
	p2, p3 := unsafe.Pointer(unsafe.SliceData(x2)), unsafe.Pointer(unsafe.SliceData(x3))
	var o uintptr
	for _, sb := range scales {
		tbl := table(sb)
		for range bps {
			even, odd := widen(unsafe.Add(c0, co), tbl)
			a0 = at(p0, o).MulAdd(even, a0)
			a1 = at(p1, o).MulAdd(even, a1)
			a2 = at(p2, o).MulAdd(even, a2)
			a3 = at(p3, o).MulAdd(even, a3)
			a0 = at(p0, o+64).MulAdd(odd, a0)
			a1 = at(p1, o+64).MulAdd(odd, a1)
			a2 = at(p2, o+64).MulAdd(odd, a2)
			a3 = at(p3, o+64).MulAdd(odd, a3)
			co += 16
			o += 128
		}
	}
	return sum4x16(a0, a1, a2, a3)
}

func int4Dot2(codes []byte, scales []uint16, bps int, x0, x1 []float32) (float32, float32) {
	var a0, a1 archsimd.Float32x16
	c0 := unsafe.Pointer(unsafe.SliceData(codes))
	var co uintptr
	p0, p1 := unsafe.Pointer(unsafe.SliceData(x0)), unsafe.Pointer(unsafe.SliceData(x1))
	var o uintptr
	for _, sb := range scales {
		tbl := table(sb)
		for range bps {
			even, odd := widen(unsafe.Add(c0, co), tbl)
			a0 = at(p0, o).MulAdd(even, a0)
			a1 = at(p1, o).MulAdd(even, a1)
			a0 = at(p0, o+64).MulAdd(odd, a0)
			a1 = at(p1, o+64).MulAdd(odd, a1)
			co += 16
			o += 128
		}
	}
	return sum16(a0), sum16(a1)
}

func int4Dot1(codes []byte, scales []uint16, bps int, x0 []float32) float32 {
	var a0, a1 archsimd.Float32x16
	c0 := unsafe.Pointer(unsafe.SliceData(codes))
	var co uintptr
	p0 := unsafe.Pointer(unsafe.SliceData(x0))
	var o uintptr
	for _, sb := range scales {
		tbl := table(sb)
		for range bps {
			even, odd := widen(unsafe.Add(c0, co), tbl)
			a0 = at(p0, o).MulAdd(even, a0)
			a1 = at(p0, o+64).MulAdd(odd, a1)
			co += 16
			o += 128
		}
	}
	return sum16(a0.Add(a1))
}

// sum4x16 adds each vector's lanes, the four reductions sharing their
// horizontal adds.
func sum4x16(a, b, c, d archsimd.Float32x16) (float32, float32, float32, float32) {
	ab := a.GetLo().Add(a.GetHi()).AddPairsGrouped(b.GetLo().Add(b.GetHi()))
	cd := c.GetLo().Add(c.GetHi()).AddPairsGrouped(d.GetLo().Add(d.GetHi()))
	h := ab.AddPairsGrouped(cd)
	var r [4]float32
	h.GetLo().Add(h.GetHi()).Store(&r)
	return r[0], r[1], r[2], r[3]
}

// sum16 adds a vector's lanes.
func sum16(v archsimd.Float32x16) float32 {
	s8 := v.GetLo().Add(v.GetHi())
	s4 := s8.GetLo().Add(s8.GetHi())
	s4 = s4.AddPairs(s4)
	s4 = s4.AddPairs(s4)
	return s4.GetElem(0)
}

// Dot is Σ a[i]·b[i] over len(a) (b at least as long).
func Dot(a, b []float32) float32 {
	if !useAVX512 {
		return dotGo(a, b)
	}
	b = b[:len(a)]
	var a0, a1 archsimd.Float32x16
	i := 0
	for ; i+32 <= len(a); i += 32 {
		a0 = load16(a[i:]).MulAdd(load16(b[i:]), a0)
		a1 = load16(a[i+16:]).MulAdd(load16(b[i+16:]), a1)
	}
	if i+16 <= len(a) {
		a0 = load16(a[i:]).MulAdd(load16(b[i:]), a0)
		i += 16
	}
	s := sum16(a0.Add(a1))
	for ; i < len(a); i++ {
		s += a[i] * b[i]
	}
	return s
}

// Axpy is y += a·x over len(y) (x at least as long).
func Axpy(y []float32, a float32, x []float32) {
	if !useAVX512 {
		axpyGo(y, a, x)
		return
	}
	x = x[:len(y)]
	av := archsimd.BroadcastFloat32x16(a)
	i := 0
	for ; i+16 <= len(y); i += 16 {
		p := (*[16]float32)(y[i:])
		load16(x[i:]).MulAdd(av, archsimd.LoadFloat32x16(p)).Store(p)
	}
	for ; i < len(y); i++ {
		y[i] += a * x[i]
	}
}

// ExpSum sets x[i] = exp(x[i] − m) and returns their sum (m at least
// every x[i]: a softmax's numerators).
func ExpSum(x []float32, m float32) float32 {
	if !useAVX512 {
		return expSumGo(x, m)
	}
	mv, c := archsimd.BroadcastFloat32x16(m), newExpConsts()
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= len(x); i += 16 {
		p := (*[16]float32)(x[i:])
		e := c.exp(archsimd.LoadFloat32x16(p).Sub(mv))
		e.Store(p)
		acc = acc.Add(e)
	}
	s := sum16(acc)
	if i < len(x) {
		s += expSumGo(x[i:], m)
	}
	return s
}

// ExpSumFrom is Σ exp(x[i] − m), x unchanged (a row's softmax
// denominator after its maximum m).
func ExpSumFrom(x []float32, m float32) float32 {
	if !useAVX512 {
		return expSumFromGo(x, m)
	}
	mv, c := archsimd.BroadcastFloat32x16(m), newExpConsts()
	var a0, a1 archsimd.Float32x16
	i := 0
	for ; i+32 <= len(x); i += 32 {
		a0 = a0.Add(c.exp(load16(x[i:]).Sub(mv)))
		a1 = a1.Add(c.exp(load16(x[i+16:]).Sub(mv)))
	}
	s := sum16(a0.Add(a1))
	if i < len(x) {
		s += expSumFromGo(x[i:], m)
	}
	return s
}

// Max is the largest value of a non-empty x and the first index where it
// stands; nan reports a NaN in x.
func Max(x []float32) (best float32, at int, nan bool) {
	if !useAVX512 || len(x) < 16 {
		return maxGo(x)
	}
	m := load16(x)
	var isNaN archsimd.Mask32x16
	i := 0
	for ; i+16 <= len(x); i += 16 {
		v := load16(x[i:])
		isNaN = isNaN.Or(v.IsNaN())
		m = m.Max(v)
	}
	if isNaN.ToBits() != 0 {
		return maxGo(x)
	}
	m8 := m.GetLo().Max(m.GetHi())
	m4 := m8.GetLo().Max(m8.GetHi())
	best = max(m4.GetElem(0), m4.GetElem(1), m4.GetElem(2), m4.GetElem(3))
	for _, v := range x[i:] {
		if v != v {
			return maxGo(x)
		}
		best = max(best, v)
	}
	bv := archsimd.BroadcastFloat32x16(best)
	for j := 0; j+16 <= len(x); j += 16 {
		if hit := load16(x[j:]).Equal(bv).ToBits(); hit != 0 {
			return best, j + bits.TrailingZeros16(hit), false
		}
	}
	for j := i; j < len(x); j++ {
		if x[j] == best {
			return best, j, false
		}
	}
	return best, 0, false // unreachable: best is one of x
}

// expConsts are the vector exp's constants, broadcast once for a loop
// whose calls of exp are inlined (a call would spill every vector).
type expConsts struct {
	hi, lo, log2e, nc1, nc2     archsimd.Float32x16
	p0, p1, p2, p3, p4, p5, one archsimd.Float32x16
}

// exp is e^x lane by lane (Cephes' expf: x = n·ln2 + r, a degree-6
// polynomial in r, 2^n by VSCALEFPS), within 2 ulp; exactly 0 below
// −87.3 (−Inf included), where f32's normal range ends.
func (c *expConsts) exp(x archsimd.Float32x16) archsimd.Float32x16 {
	live := x.GreaterEqual(c.lo)
	x = x.Min(c.hi).Max(c.lo)
	n := x.Mul(c.log2e).RoundToEvenScaled(0)
	r := n.MulAdd(c.nc2, n.MulAdd(c.nc1, x)) // x − n·ln2, ln2 in two parts
	p := c.p0.MulAdd(r, c.p1).MulAdd(r, c.p2).MulAdd(r, c.p3).MulAdd(r, c.p4).MulAdd(r, c.p5)
	return p.MulAdd(r.Mul(r), r).Add(c.one).Scale(n).Masked(live) // ·2ⁿ
}

func newExpConsts() expConsts {
	b := archsimd.BroadcastFloat32x16
	return expConsts{
		hi: b(88.3762626647949), lo: b(-87.3365447504019), log2e: b(1.44269504088896341),
		nc1: b(-0.693359375), nc2: b(2.12194440e-4),
		p0: b(1.9875691500e-4), p1: b(1.3981999507e-3), p2: b(8.3334519073e-3),
		p3: b(4.1665795894e-2), p4: b(1.6666665459e-1), p5: b(5.0000001201e-1), one: b(1),
	}
}

// SiLUMul sets g[i] = SiLU(g[i])·u[i] (the MLP's act_fn(gate)·up).
func SiLUMul(g, u []float32) {
	if !useAVX512 {
		siluMulGo(g, u)
		return
	}
	u = u[:len(g)]
	one := archsimd.BroadcastFloat32x16(1)
	zero := archsimd.BroadcastFloat32x16(0)
	c := newExpConsts()
	i := 0
	for ; i+16 <= len(g); i += 16 {
		p := (*[16]float32)(g[i:])
		x := archsimd.LoadFloat32x16(p)
		e := c.exp(zero.Sub(x))
		x.Div(one.Add(e)).Mul(load16(u[i:])).Store(p)
	}
	siluMulGo(g[i:], u[i:])
}

// fmaLoop runs n rounds of 8 independent vector multiply-adds twice and
// returns the multiply-adds done (16 lanes each): the machine's peak, a
// yardstick for kernels bound by arithmetic. Eight chains hide the
// instruction's latency and stay in registers.
func fmaLoop(n int) float64 {
	if !useAVX512 {
		return fmaLoopGo(n)
	}
	m := archsimd.BroadcastFloat32x16(0.999)
	c := archsimd.BroadcastFloat32x16(1e-3)
	v := func(i float32) archsimd.Float32x16 { return archsimd.BroadcastFloat32x16(i) }
	// Chains of different values, so that none is computed once for two.
	a0, a1, a2, a3, a4, a5, a6, a7 := v(1), v(2), v(3), v(4), v(5), v(6), v(7), v(8)
	for range n {
		a0, a1, a2, a3 = a0.MulAdd(m, c), a1.MulAdd(m, c), a2.MulAdd(m, c), a3.MulAdd(m, c)
		a4, a5, a6, a7 = a4.MulAdd(m, c), a5.MulAdd(m, c), a6.MulAdd(m, c), a7.MulAdd(m, c)
		a0, a1, a2, a3 = a0.MulAdd(m, c), a1.MulAdd(m, c), a2.MulAdd(m, c), a3.MulAdd(m, c)
		a4, a5, a6, a7 = a4.MulAdd(m, c), a5.MulAdd(m, c), a6.MulAdd(m, c), a7.MulAdd(m, c)
	}
	sink = sum16(a0.Add(a1).Add(a2).Add(a3).Add(a4).Add(a5).Add(a6).Add(a7))
	return float64(n) * 16 * 16
}

// int4Rows4x4, int4Rows4x2 and int4Rows4x1 are in int4tile_amd64.s.
//
//go:noescape
func int4Rows4x4(codes *byte, rowBytes int, scales *uint16, blocks int, groups int, x *[4]*float32, levels *[16]float32, scratch *float32, out *float32, ldBytes int, add int, inputs int)

//go:noescape
func int4Rows4x2(codes *byte, rowBytes int, scales *uint16, blocks int, groups int, x *[4]*float32, levels *[16]float32, scratch *float32, out *float32, ldBytes int, add int, inputs int)

//go:noescape
func int4Rows4x1(codes *byte, rowBytes int, scales *uint16, blocks int, groups int, x *[4]*float32, levels *[16]float32, scratch *float32, out *float32, ldBytes int, add int, inputs int)

// tileGroups is how many groups of four weight rows a kernel call takes:
// their codes (8 KiB at 256 columns) stay in cache while every input tile
// passes over them, so the weights are read from memory once.
const tileGroups = 16

// int4Tiles computes the weight rows [lo, hi), four at a time, against
// the input rows in tiles of four (three: the last input twice), then two
// or one, with the assembly kernels, for weights of one scale a block
// (blocks even); it returns the first row it left to the caller (lo when
// it took none).
func int4Tiles(codes []byte, scales []uint16, bps, cols int, x []float32, T int, out []float32, ld, lo, hi int, add bool, scratch []float32) int {
	blocks := cols / Block
	groups := (hi - lo) / 4
	if !useAVX512 || bps != 1 || T < 1 || groups == 0 || blocks%2 != 0 || len(scratch) < 4*blocks {
		return lo
	}
	bytesPerRow, scalesPerRow := cols/2, blocks
	if len(codes) < hi*bytesPerRow || len(scales) < hi*scalesPerRow || len(x) < T*cols || len(out) < (T-1)*ld+hi {
		panic("ops: int4Tiles: shapes do not match")
	}
	type tile struct {
		t0, n int
		x     [4]*float32
	}
	var buf [8]tile
	tiles := buf[:0]
	for t0 := 0; t0 < T; {
		tl := tile{t0: t0, n: min(4, T-t0)}
		for i := range tl.x {
			tl.x[i] = &x[min(t0+i, T-1)*cols]
		}
		tiles = append(tiles, tl)
		t0 += tl.n
	}
	a := 0
	if add {
		a = 1
	}
	for g0 := 0; g0 < groups; g0 += tileGroups {
		r := lo + 4*g0
		n := min(tileGroups, groups-g0)
		c, sc := &codes[r*bytesPerRow], &scales[r*scalesPerRow]
		for i := range tiles {
			tl := &tiles[i]
			o := &out[tl.t0*ld+r]
			switch tl.n {
			case 1:
				int4Rows4x1(c, bytesPerRow, sc, blocks, n, &tl.x, &levels, &scratch[0], o, 4*ld, a, tl.n)
			case 2:
				int4Rows4x2(c, bytesPerRow, sc, blocks, n, &tl.x, &levels, &scratch[0], o, 4*ld, a, tl.n)
			default:
				int4Rows4x4(c, bytesPerRow, sc, blocks, n, &tl.x, &levels, &scratch[0], o, 4*ld, a, tl.n)
			}
		}
	}
	return lo + 4*groups
}

// Attend computes one query head's attention over the first n cached
// slots that mask leaves visible: out = softmax(q·kⱼ·scale)·vⱼ, key j at
// keys[j·stride:], value j at values[j·stride:], both len(q) long; scores
// holds n floats of scratch. Heads of 64 or 128 (Qwen3's) take the vector
// path: four keys' scores reduced together, and the weighted sum of values
// in registers.
func Attend(out, q, keys, values []float32, stride, n int, scale float32, scores []float32, mask Mask) {
	D := len(q)
	if !useAVX512 || (D != 64 && D != 128) || n < 1 {
		attendGo(out, q, keys, values, stride, n, scale, scores, mask)
		return
	}
	scores = scores[:n]
	_ = keys[(n-1)*stride+D-1]
	_ = values[(n-1)*stride+D-1]
	kp := unsafe.Pointer(unsafe.SliceData(keys))
	vp := unsafe.Pointer(unsafe.SliceData(values))
	st := uintptr(stride) * 4
	q0, q1, q2, q3 := load16(q), load16(q[16:]), load16(q[32:]), load16(q[48:])
	var q4, q5, q6, q7 archsimd.Float32x16
	if D == 128 {
		q4, q5, q6, q7 = load16(q[64:]), load16(q[80:]), load16(q[96:]), load16(q[112:])
	}
	dot := func(k unsafe.Pointer) archsimd.Float32x16 {
		a := at(k, 0).Mul(q0)
		a = at(k, 64).MulAdd(q1, a)
		a = at(k, 128).MulAdd(q2, a)
		a = at(k, 192).MulAdd(q3, a)
		if D == 128 {
			a = at(k, 256).MulAdd(q4, a)
			a = at(k, 320).MulAdd(q5, a)
			a = at(k, 384).MulAdd(q6, a)
			a = at(k, 448).MulAdd(q7, a)
		}
		return a
	}
	j := 0
	for ; j+4 <= n; j += 4 {
		k := unsafe.Add(kp, uintptr(j)*st)
		s0, s1, s2, s3 := sum4x16(dot(k), dot(unsafe.Add(k, st)), dot(unsafe.Add(k, 2*st)), dot(unsafe.Add(k, 3*st)))
		scores[j], scores[j+1], scores[j+2], scores[j+3] = s0*scale, s1*scale, s2*scale, s3*scale
	}
	for ; j < n; j++ {
		scores[j] = sum16(dot(unsafe.Add(kp, uintptr(j)*st))) * scale
	}
	mask.apply(scores)
	m, _, _ := Max(scores)
	inv := 1 / ExpSum(scores, m)
	var o0, o1, o2, o3, o4, o5, o6, o7 archsimd.Float32x16
	for j, s := range scores {
		p := archsimd.BroadcastFloat32x16(s * inv)
		v := unsafe.Add(vp, uintptr(j)*st)
		o0 = at(v, 0).MulAdd(p, o0)
		o1 = at(v, 64).MulAdd(p, o1)
		o2 = at(v, 128).MulAdd(p, o2)
		o3 = at(v, 192).MulAdd(p, o3)
		if D == 128 {
			o4 = at(v, 256).MulAdd(p, o4)
			o5 = at(v, 320).MulAdd(p, o5)
			o6 = at(v, 384).MulAdd(p, o6)
			o7 = at(v, 448).MulAdd(p, o7)
		}
	}
	o0.Store((*[16]float32)(out))
	o1.Store((*[16]float32)(out[16:]))
	o2.Store((*[16]float32)(out[32:]))
	o3.Store((*[16]float32)(out[48:]))
	if D == 128 {
		o4.Store((*[16]float32)(out[64:]))
		o5.Store((*[16]float32)(out[80:]))
		o6.Store((*[16]float32)(out[96:]))
		o7.Store((*[16]float32)(out[112:]))
	}
}

// ExpScaled sets e[i] = exp((x[i] − m) / t) — a softmax's numerators at
// temperature t > 0, m at least every x[i] — and returns their sum and
// the largest x[i]. The quotient is f32's, as package sampling scales.
func ExpScaled(e, x []float32, m, t float32) (sum, top float32) {
	if !useAVX512 || len(x) < 16 {
		return expScaledGo(e, x, m, t)
	}
	e = e[:len(x)]
	mv, tv := archsimd.BroadcastFloat32x16(m), archsimd.BroadcastFloat32x16(t)
	c := newExpConsts()
	var a0, a1 archsimd.Float32x16
	h0 := load16(x)
	h1 := h0
	i := 0
	for ; i+32 <= len(x); i += 32 { // two vectors a round: two chains
		v0, v1 := load16(x[i:]), load16(x[i+16:])
		h0, h1 = h0.Max(v0), h1.Max(v1)
		p0, p1 := c.exp(v0.Sub(mv).Div(tv)), c.exp(v1.Sub(mv).Div(tv))
		p0.Store((*[16]float32)(e[i:]))
		p1.Store((*[16]float32)(e[i+16:]))
		a0, a1 = a0.Add(p0), a1.Add(p1)
	}
	for ; i+16 <= len(x); i += 16 {
		v := load16(x[i:])
		h0 = h0.Max(v)
		p := c.exp(v.Sub(mv).Div(tv))
		p.Store((*[16]float32)(e[i:]))
		a0 = a0.Add(p)
	}
	sum, top = sum16(a0.Add(a1)), max16(h0.Max(h1))
	if i < len(x) {
		s, t := expScaledGo(e[i:], x[i:], m, t)
		sum, top = sum+s, max(top, t)
	}
	return sum, top
}

// FirstAtLeast is the index of the first x[i] ≥ v, len(x) if there is
// none (a NaN is never ≥ v): 64 values a step, one test of the four
// comparisons' masks together.
func FirstAtLeast(x []float32, v float32) int {
	if !useAVX512 {
		return firstAtLeastGo(x, v)
	}
	vv := archsimd.BroadcastFloat32x16(v)
	i := 0
	for ; i+64 <= len(x); i += 64 {
		a, b := load16(x[i:]).GreaterEqual(vv), load16(x[i+16:]).GreaterEqual(vv)
		c, d := load16(x[i+32:]).GreaterEqual(vv), load16(x[i+48:]).GreaterEqual(vv)
		if a.Or(b).Or(c.Or(d)).ToBits() != 0 {
			break
		}
	}
	for ; i+16 <= len(x); i += 16 {
		if hit := load16(x[i:]).GreaterEqual(vv).ToBits(); hit != 0 {
			return i + bits.TrailingZeros16(hit)
		}
	}
	return i + firstAtLeastGo(x[i:], v)
}

// HashBelow appends to dst, in order, base + i for the i where h·2⁻³² ≤
// lim[i], h token i's coupled-noise hash under the key (k0, k1) —
// sampling.Gumbel's: three keyed rounds of sampling.Mix32 over tokens[i],
// or base + i where tokens is nil. A token's noise is at most
// −log(h·2⁻³²), so only these can lift a logit by −log lim[i]. Sixteen
// tokens a step: the hashes in vector lanes (sampling.Mix32 written again
// for them), converted to f32 and compared with lim at once.
func HashBelow(dst []int32, lim []float32, tokens []int32, base int, k0, k1 uint32) []int32 {
	if !useAVX512 || len(lim) < 16 {
		return hashBelowGo(dst, lim, tokens, base, k0, k1)
	}
	if tokens != nil {
		tokens = tokens[:len(lim)]
	}
	kv0, kv1 := archsimd.BroadcastUint32x16(k0), archsimd.BroadcastUint32x16(k1)
	m1, m2 := archsimd.BroadcastUint32x16(0x7feb352d), archsimd.BroadcastUint32x16(0x846ca68b)
	mix := func(x archsimd.Uint32x16) archsimd.Uint32x16 {
		x = x.Xor(x.ShiftAllRight(16)).Mul(m1)
		x = x.Xor(x.ShiftAllRight(15)).Mul(m2)
		return x.Xor(x.ShiftAllRight(16))
	}
	scale := archsimd.BroadcastFloat32x16(1.0 / 4294967296)
	var lane [16]uint32
	for j := range lane {
		lane[j] = uint32(base + j)
	}
	ids, step := archsimd.LoadUint32x16(&lane), archsimd.BroadcastUint32x16(16)
	i := 0
	for ; i+16 <= len(lim); i += 16 {
		t := ids
		if tokens != nil {
			t = archsimd.LoadUint32x16((*[16]uint32)(unsafe.Pointer(&tokens[i])))
		}
		h := mix(mix(mix(t.Xor(kv0)).Add(kv1)).Xor(kv0))
		hit := h.ConvertToFloat32().Mul(scale).LessEqual(load16(lim[i:])).ToBits()
		for hit != 0 {
			dst = append(dst, int32(base+i+bits.TrailingZeros16(hit)))
			hit &= hit - 1
		}
		ids = ids.Add(step)
	}
	for ; i < len(lim); i++ {
		t := uint32(base + i)
		if tokens != nil {
			t = uint32(tokens[i])
		}
		if float32(noiseHash(t, k0, k1))*(1.0/4294967296) <= lim[i] {
			dst = append(dst, int32(base+i))
		}
	}
	return dst
}

// AtLeast is Σ e[i] over the i where x[i] ≥ v, and how many there are.
func AtLeast(e, x []float32, v float32) (sum float32, n int) {
	if !useAVX512 {
		return atLeastGo(e, x, v)
	}
	e = e[:len(x)]
	vv := archsimd.BroadcastFloat32x16(v)
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= len(x); i += 16 {
		in := load16(x[i:]).GreaterEqual(vv)
		acc = acc.Add(load16(e[i:]).Masked(in))
		n += bits.OnesCount16(in.ToBits())
	}
	sum = sum16(acc)
	if i < len(x) {
		s, k := atLeastGo(e[i:], x[i:], v)
		sum, n = sum+s, n+k
	}
	return sum, n
}

// KeepAtLeast sets e[i] = 0 where x[i] < v and returns Σ e.
func KeepAtLeast(e, x []float32, v float32) float32 {
	if !useAVX512 {
		return keepAtLeastGo(e, x, v)
	}
	e = e[:len(x)]
	vv := archsimd.BroadcastFloat32x16(v)
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= len(x); i += 16 {
		p := (*[16]float32)(e[i:])
		k := archsimd.LoadFloat32x16(p).Masked(load16(x[i:]).GreaterEqual(vv))
		k.Store(p)
		acc = acc.Add(k)
	}
	sum := sum16(acc)
	if i < len(x) {
		sum += keepAtLeastGo(e[i:], x[i:], v)
	}
	return sum
}

// Between moves the pairs (x[i], e[i]) with lo ≤ x[i] < hi to the front
// of dx and de, in order, and returns how many. dx and de may be x and e;
// else they are at least len(x) + 16 long.
func Between(dx, de, x, e []float32, lo, hi float32) int {
	if !useAVX512 {
		return betweenGo(dx, de, x, e, lo, hi)
	}
	e = e[:len(x)]
	lv, hv := archsimd.BroadcastFloat32x16(lo), archsimd.BroadcastFloat32x16(hi)
	n, i := 0, 0
	for ; i+16 <= len(x); i += 16 {
		// n ≤ i: a whole vector stored at n overwrites only what is read.
		v, w := load16(x[i:]), load16(e[i:])
		in := v.GreaterEqual(lv).And(v.Less(hv))
		bitsIn := in.ToBits()
		if bitsIn == 0 {
			continue
		}
		v.Compress(in).Store((*[16]float32)(dx[n:]))
		w.Compress(in).Store((*[16]float32)(de[n:]))
		n += bits.OnesCount16(bitsIn)
	}
	for ; i < len(x); i++ {
		if l := x[i]; l >= lo && l < hi {
			dx[n], de[n] = l, e[i]
			n++
		}
	}
	return n
}

// Residual sets r[i] = max(0, p[i]·a − q[i]·b) over len(r) and returns
// Σ r; r may be p.
func Residual(r, p []float32, a float32, q []float32, b float32) float32 {
	if !useAVX512 {
		return residualGo(r, p, a, q, b)
	}
	p, q = p[:len(r)], q[:len(r)]
	av, bv := archsimd.BroadcastFloat32x16(a), archsimd.BroadcastFloat32x16(b)
	var zero, acc archsimd.Float32x16
	i := 0
	for ; i+16 <= len(r); i += 16 {
		v := load16(p[i:]).Mul(av).Sub(load16(q[i:]).Mul(bv)).Max(zero)
		v.Store((*[16]float32)(r[i:]))
		acc = acc.Add(v)
	}
	sum := sum16(acc)
	if i < len(r) {
		sum += residualGo(r[i:], p[i:], a, q[i:], b)
	}
	return sum
}

// Scale sets y[i] = x[i]·a over len(y) and returns Σ y; y may be x.
func Scale(y, x []float32, a float32) float32 {
	if !useAVX512 {
		return scaleGo(y, x, a)
	}
	x = x[:len(y)]
	av := archsimd.BroadcastFloat32x16(a)
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= len(y); i += 16 {
		v := load16(x[i:]).Mul(av)
		v.Store((*[16]float32)(y[i:]))
		acc = acc.Add(v)
	}
	sum := sum16(acc)
	if i < len(y) {
		sum += scaleGo(y[i:], x[i:], a)
	}
	return sum
}

// SumMin is Σ x and the smallest x[i] (+Inf for an empty x): a NaN makes
// the sum NaN.
func SumMin(x []float32) (sum, least float32) {
	if !useAVX512 || len(x) < 16 {
		return sumMinGo(x)
	}
	var acc archsimd.Float32x16
	lo := load16(x)
	i := 0
	for ; i+16 <= len(x); i += 16 {
		v := load16(x[i:])
		acc, lo = acc.Add(v), lo.Min(v)
	}
	m8 := lo.GetLo().Min(lo.GetHi())
	m4 := m8.GetLo().Min(m8.GetHi())
	sum, least = sum16(acc), min(m4.GetElem(0), m4.GetElem(1), m4.GetElem(2), m4.GetElem(3))
	if i < len(x) {
		s, l := sumMinGo(x[i:])
		sum, least = sum+s, min(least, l)
	}
	return sum, least
}

// RangeInt32 is the smallest and largest of a non-empty x (a list of
// tokens' bounds).
func RangeInt32(x []int32) (lo, hi int32) {
	if !useAVX512 || len(x) < 16 {
		return rangeInt32Go(x)
	}
	l := archsimd.LoadInt32x16Slice(x)
	h := l
	i := 16
	for ; i+16 <= len(x); i += 16 {
		v := archsimd.LoadInt32x16Slice(x[i:])
		l, h = l.Min(v), h.Max(v)
	}
	l8, h8 := l.GetLo().Min(l.GetHi()), h.GetLo().Max(h.GetHi())
	l4, h4 := l8.GetLo().Min(l8.GetHi()), h8.GetLo().Max(h8.GetHi())
	lo = min(l4.GetElem(0), l4.GetElem(1), l4.GetElem(2), l4.GetElem(3))
	hi = max(h4.GetElem(0), h4.GetElem(1), h4.GetElem(2), h4.GetElem(3))
	for _, v := range x[i:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}
