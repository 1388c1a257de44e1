package ops

import (
	"encoding/binary"
	"math"

	"webdraft/tensor"
)

// Screening: a matrix product to 16 bits of each input — the fixed-point
// input's hi and mid parts, two VPDPBUSD chains a column block where the
// exact kernel has three —, with a bound on how far each result may be
// from the exact kernel's: enough to find which rows could hold the
// largest (or the n largest) exact results, so that only those are
// computed exactly (the read-out's greedy argmax and top tokens,
// engine/cpu).
//
// The screening kernel computes Σ_b w_scale·s·Σ(code−8)·(v − lo) where the
// exact one has v: the input less its low byte, |lo| ≤ 128 of the block's
// 2²²−1 (Input). Against the exact kernel's result for the same input,
// over every weight row r:
//
//	|screen_r − exact_r| ≤ Σ_b c_b·A_b,   c_b = s_b·(128 + 2·(nb + 3)·2⁻²⁴·(2²²−1))
//
// where A_b = max_r Σ_{j in block b} |W[r][j]| (the matrix's, measured
// once: EnableScreen), s_b the input block's scale (its largest magnitude
// over 2²²−1): 128·s_b the low bytes left out, and each kernel's f32
// rounding (a conversion, a scaling and an accumulation a block, each
// within 2⁻²⁴ of the nb blocks' Σ_b max|x_b|·A_b).

// EnableScreen readies l for Screen where the machine runs the screening
// kernel (the fixed-point kernel's machines) and reports whether it did:
// it measures A_b over the matrix's rows.
func (l *Linear) EnableScreen() bool {
	if l.fixed == nil || !hasScreen {
		return false
	}
	nb, groups := l.Cols/Block, l.Cols/l.groupSize
	bps := l.groupSize / Block
	// Σ |code − 8| over a byte's two codes.
	var dev [256]float64
	for v := range 256 {
		dev[v] = math.Abs(float64(v&0xF)-8) + math.Abs(float64(v>>4)-8)
	}
	l.screenMax = make([]float64, nb)
	var sums [16]float64
	for rb := range (l.Rows + 15) / 16 {
		for b := range nb {
			clear(sums[:])
			words := l.fixed[(rb*nb+b)*256 : (rb*nb+b+1)*256]
			for j := range 4 {
				for r := range 16 {
					w := words[64*j+4*r : 64*j+4*r+4]
					sums[r] += dev[w[0]] + dev[w[1]] + dev[w[2]] + dev[w[3]]
				}
			}
			scales := l.fixedScales[(rb*groups+b/bps)*16:]
			for r := range 16 {
				a := sums[r] * math.Abs(float64(tensor.F16ToF32(scales[r])))
				if a > l.screenMax[b] || a != a {
					l.screenMax[b] = a
				}
			}
		}
	}
	return true
}

// Screens reports whether l screens (EnableScreen).
func (l *Linear) Screens() bool { return l.screenMax != nil }

// ScreenBound is the most that Screen's result for input row t of in may
// differ from MulRows' for any row of l: +Inf where the row holds a NaN
// or an infinity (or l a weight that is not finite), which no screen can
// bound.
func (l *Linear) ScreenBound(in *Input, t int) float64 {
	nb := l.Cols / Block
	meta := in.fixed[t*fixedStride(l.Cols)+96*nb:]
	c := 128 + 2*float64(nb+3)*0x1p-24*fixedMax*(1+0x1p-20)
	var sum float64
	for b := range nb {
		if s := float64(math.Float32frombits(binary.LittleEndian.Uint32(meta[12*b:]))); s != 0 {
			sum += s * c * l.screenMax[b]
		}
	}
	if math.IsNaN(sum) || math.IsInf(sum, 0) {
		return math.Inf(1)
	}
	return sum * (1 + 1e-6)
}
