package ops

import (
	"math"

	"webdraft/sampling"
	"webdraft/tensor"
)

// The portable kernels: plain Go, the same arithmetic as the vector ones
// in another order. They run where the vector kernels cannot and are what
// those are compared with first.

// int4RowGo is int4Row in plain Go: for each block the row's 32 weights
// are widened once, then dotted with up to 8 input rows at a time.
func int4RowGo(codes []byte, scales []uint16, bps int, x []float32, cols, T int, out []float32, ld int, add bool) {
	const chunk = 8
	var w [Block]float32
	for t0 := 0; t0 < T; t0 += chunk {
		n := min(chunk, T-t0)
		var acc [chunk]float32
		for b := 0; b < cols/Block; b++ {
			s := tensor.F16ToF32(scales[b/bps])
			c := codes[b*Block/2 : (b+1)*Block/2]
			for i, v := range c {
				w[i] = float32(int32(v&15)-8) * s
				w[Block/2+i] = float32(int32(v>>4)-8) * s
			}
			for t := range n {
				xb := x[(t0+t)*cols+b*Block : (t0+t)*cols+(b+1)*Block]
				var d float32
				for i, wv := range w {
					d += wv * xb[i]
				}
				acc[t] += d
			}
		}
		for t := range n {
			if add {
				out[(t0+t)*ld] += acc[t]
			} else {
				out[(t0+t)*ld] = acc[t]
			}
		}
	}
}

// int4Dot1x4Go is one input row's dot products with four consecutive
// weight rows.
func int4Dot1x4Go(codes []byte, scales []uint16, bps int, x []float32) (float32, float32, float32, float32) {
	var s [4]float32
	cols := len(x)
	for i := range s {
		int4RowGo(codes[i*cols/2:(i+1)*cols/2], scales[i*len(scales)/4:(i+1)*len(scales)/4], bps, x, cols, 1, s[i:], 1, false)
	}
	return s[0], s[1], s[2], s[3]
}

// dotGo is Σ a[i]·b[i] over len(a).
func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpyGo is y += a·x over len(y).
func axpyGo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// expSumGo sets x[i] = exp(x[i] − m) and returns their sum.
func expSumGo(x []float32, m float32) float32 {
	var s float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		s += e
	}
	return s
}

// maxGo is the largest value of a non-empty x and its first index; NaN
// is reported by nan.
func maxGo(x []float32) (best float32, at int, nan bool) {
	best = x[0]
	for i, v := range x {
		if v != v {
			return 0, i, true
		}
		if v > best {
			best, at = v, i
		}
	}
	return best, at, false
}

// expSumFromGo is Σ exp(x[i] − m), x left as it is.
func expSumFromGo(x []float32, m float32) float32 {
	var s float32
	for _, v := range x {
		s += float32(math.Exp(float64(v - m)))
	}
	return s
}

// RMSNorm computes out = x / sqrt(mean(x²) + eps) · weight over
// len(weight) (Qwen3RMSNorm in f32); out may be x.
func RMSNorm(out, x, weight []float32, eps float64) {
	x = x[:len(weight)]
	ss := Dot(x, x)
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(weight)))+eps))
	for i, wt := range weight {
		out[i] = wt * (x[i] * inv)
	}
}

// Rope rotates one head x (D) in the split-halves layout by the angles
// whose cosines and sines (D/2 each) are given: x·cos + rotate_half(x)·sin.
func Rope(x, cos, sin []float32) {
	half := len(cos)
	x1, x2 := x[:half], x[half:2*half]
	sin = sin[:half]
	for i, c := range cos {
		a, b := x1[i], x2[i]
		x1[i] = a*c - b*sin[i]
		x2[i] = b*c + a*sin[i]
	}
}

// RopeAngles fills cos and sin (D/2 each) for position pos, as the
// reference computes them: angle = pos·inv_freq in f32, then sin and cos
// in float64.
func RopeAngles(cos, sin []float32, pos int, invFreq []float32) {
	for i, f := range invFreq {
		s, c := math.Sincos(float64(float32(pos) * f))
		cos[i], sin[i] = float32(c), float32(s)
	}
}

// siluMulGo is g[i] = SiLU(g[i])·u[i], SiLU(x) = x·sigmoid(x).
func siluMulGo(g, u []float32) {
	u = u[:len(g)]
	for i, x := range g {
		g[i] = x / (1 + float32(math.Exp(float64(-x)))) * u[i]
	}
}

// sink keeps the yardstick's result alive.
var sink float32

// fmaLoopGo is fmaLoop in scalar Go: eight chains.
func fmaLoopGo(n int) float64 {
	a := [8]float32{1, 2, 3, 4, 5, 6, 7, 8}
	for range n {
		for i := range a {
			a[i] = a[i]*0.999 + 1e-3
		}
	}
	sink = a[0] + a[7]
	return float64(n) * 8
}

// attendGo is Attend in plain Go.
func attendGo(out, q, keys, values []float32, stride, n int, scale float32, scores []float32, mask Mask) {
	D := len(q)
	scores = scores[:n]
	for j := range scores {
		scores[j] = Dot(q, keys[j*stride:j*stride+D]) * scale
	}
	mask.apply(scores)
	m, _, _ := Max(scores)
	inv := 1 / ExpSum(scores, m)
	clear(out[:D])
	for j, s := range scores {
		Axpy(out[:D], s*inv, values[j*stride:j*stride+D])
	}
}

// Mask is which of the slots an attention row reads: every slot below
// Base, and slot Base + i where bit i of Bits is set (a token tree's
// ancestors; package treemask). Causal attention over n slots is
// Mask{Base: n}.
type Mask struct {
	Base int
	Bits uint64
}

// apply sets the scores of the slots m hides to −Inf, which the softmax
// weighs 0.
func (m Mask) apply(scores []float32) {
	for j := m.Base; j < len(scores); j++ {
		if i := j - m.Base; i >= 64 || m.Bits>>uint(i)&1 == 0 {
			scores[j] = float32(math.Inf(-1))
		}
	}
}

// The sampled read-out's row kernels (package cpu's sampler), plain Go;
// their sums run in float64.

// expScaledGo sets e[i] = exp((x[i] − m) / t) and returns their sum and
// the largest x[i].
func expScaledGo(e, x []float32, m, t float32) (sum, top float32) {
	e = e[:len(x)]
	top = float32(math.Inf(-1))
	var s float64
	for i, l := range x {
		v := float32(math.Exp(float64((l - m) / t)))
		e[i] = v
		s += float64(v)
		top = max(top, l)
	}
	return float32(s), top
}

// atLeastGo is Σ e[i] over the x[i] ≥ v, and how many there are.
func atLeastGo(e, x []float32, v float32) (sum float32, n int) {
	e = e[:len(x)]
	var s float64
	for i, l := range x {
		if l >= v {
			s += float64(e[i])
			n++
		}
	}
	return float32(s), n
}

// firstAtLeastGo is the index of the first x[i] ≥ v, len(x) if none.
func firstAtLeastGo(x []float32, v float32) int {
	for i, l := range x {
		if l >= v {
			return i
		}
	}
	return len(x)
}

// keepAtLeastGo sets e[i] = 0 where x[i] < v and returns Σ e.
func keepAtLeastGo(e, x []float32, v float32) (sum float32) {
	e = e[:len(x)]
	var s float64
	for i, l := range x {
		if l < v {
			e[i] = 0
		}
		s += float64(e[i])
	}
	return float32(s)
}

// betweenGo moves the pairs (x[i], e[i]) with lo ≤ x[i] < hi to the
// front of dx and de, in order, and returns how many.
func betweenGo(dx, de, x, e []float32, lo, hi float32) int {
	e = e[:len(x)]
	n := 0
	for i, l := range x {
		if l >= lo && l < hi {
			dx[n], de[n] = l, e[i]
			n++
		}
	}
	return n
}

// residualGo sets r[i] = max(0, p[i]·a − q[i]·b) and returns Σ r.
func residualGo(r, p []float32, a float32, q []float32, b float32) (sum float32) {
	p, q = p[:len(r)], q[:len(r)]
	var s float64
	for i := range r {
		v := max(0, float32(p[i]*a)-float32(q[i]*b))
		r[i] = v
		s += float64(v)
	}
	return float32(s)
}

// scaleGo sets y[i] = x[i]·a and returns Σ y.
func scaleGo(y, x []float32, a float32) (sum float32) {
	x = x[:len(y)]
	var s float64
	for i := range y {
		y[i] = x[i] * a
		s += float64(y[i])
	}
	return float32(s)
}

// sumMinGo is Σ x and the smallest x[i] (+Inf for none).
func sumMinGo(x []float32) (sum, least float32) {
	least = float32(math.Inf(1))
	var s float64
	for _, v := range x {
		s += float64(v)
		least = min(least, v)
	}
	return float32(s), least
}

// rangeInt32Go is the smallest and largest of a non-empty x.
func rangeInt32Go(x []int32) (lo, hi int32) {
	lo, hi = x[0], x[0]
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// noiseHash is sampling.Gumbel's hash of token t under the key (k0, k1):
// three keyed rounds of sampling.Mix32.
func noiseHash(t, k0, k1 uint32) uint32 {
	return sampling.Mix32(sampling.Mix32(sampling.Mix32(t^k0)+k1) ^ k0)
}

// hashBelowGo appends to dst the i where h·2⁻³² ≤ lim[i], h token i's
// noise hash (tokens[i], or i where tokens is nil).
func hashBelowGo(dst []int32, lim []float32, tokens []int32, base int, k0, k1 uint32) []int32 {
	for i, l := range lim {
		t := uint32(base + i)
		if tokens != nil {
			t = uint32(tokens[i])
		}
		if float32(noiseHash(t, k0, k1))*(1.0/4294967296) <= l {
			dst = append(dst, int32(base+i))
		}
	}
	return dst
}
