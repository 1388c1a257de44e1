package ops

import (
	"unsafe"

	"webdraft/tensor"
)

// Linear is a weight matrix W (Rows, Cols), nn.Linear's layout, ready for
// MulRows. An int4 matrix whose groups are whole blocks (group size a
// multiple of 32) is multiplied from its codes and f16 scales: on a
// machine with AVX-512 VNNI repacked once into the fixed-point kernel's
// layout (the same bytes, in another order) and multiplied with
// fixed-point inputs, elsewhere read in place by the f32 kernels. Any
// other matrix (f32, f16, int4 of smaller groups) is widened a row at a
// time into the worker's scratch.
type Linear struct {
	Rows, Cols int
	m          tensor.Matrix
	// The fixed-point path: packFixed's codes and scales, and the group
	// size. nil fixed: another path.
	fixed       []byte
	fixedScales []uint16
	groupSize   int
	// screenMax is A_b per 32-column block (screen.go); nil: the matrix
	// does not screen.
	screenMax []float64
	// The in-place int4 path: codes as bytes, 16 a block (two codes a
	// byte, the first in the low nibble), and the f16 scales, one per
	// blocksPerScale blocks. nil codes: the row-at-a-time path.
	codes          []byte
	scales         []uint16
	blocksPerScale int
}

// NewLinear prepares m for MulRows: it repacks an int4 matrix for the
// fixed-point kernel where that runs, and otherwise copies nothing.
func NewLinear(m tensor.Matrix) *Linear {
	rows, cols := m.Shape()
	l := &Linear{Rows: rows, Cols: cols, m: m}
	if q, ok := m.(*tensor.Int4); ok && q.GroupSize%Block == 0 && len(q.QWeight) > 0 && useFixed {
		l.fixed, l.fixedScales = packFixed(rows, cols, q.GroupSize, q.QWeight, q.Scales)
		l.groupSize = q.GroupSize
		l.m = nil // the packed copy serves Row too: m may be freed
		return l
	}
	if q, ok := m.(*tensor.Int4); ok && q.GroupSize%Block == 0 && len(q.QWeight) > 0 {
		// A []uint32 read as bytes: little-endian, so byte j of word w
		// holds codes 8w+2j (low nibble) and 8w+2j+1 (high nibble).
		l.codes = unsafe.Slice((*byte)(unsafe.Pointer(&q.QWeight[0])), 4*len(q.QWeight))
		l.scales = q.Scales
		l.blocksPerScale = q.GroupSize / Block
	}
	return l
}

// InPlace reports whether MulRows multiplies the matrix from its int4
// codes (in place or repacked) rather than widening each row.
func (l *Linear) InPlace() bool { return l.fixed != nil || l.codes != nil && littleEndian }

// Fixed reports whether MulRows takes the fixed-point kernel.
func (l *Linear) Fixed() bool { return l.fixed != nil }

// ScratchLen is the scratch MulRows needs: 2·Cols floats.
func (l *Linear) ScratchLen() int { return 2 * l.Cols }

// MulRows computes, for the weight rows r in [lo, hi) and each of the
// input rows x_t of in (prepared for l: NewInput(…, l, …)):
//
//	out[t*ld + r] = Σ_c W[r][c]·x_t[c]     (y = x @ W.T, nn.Linear)
//
// or adds it there with add (the residual stream's hidden += o_proj(…)).
// scratch holds at least ScratchLen floats (a block's scales widened, or
// a row widened).
func (l *Linear) MulRows(out []float32, ld int, in *Input, lo, hi int, add bool, scratch []float32) {
	T := in.T
	if lo >= hi || T == 0 {
		return
	}
	if l.fixed != nil {
		l.mulFixed(out, ld, in, lo, hi, add)
		return
	}
	if in.blocked == nil || in.Cols != l.Cols {
		panic("ops: MulRows: the input is not prepared in the blocked layout for this matrix")
	}
	x := in.blocked
	if l.InPlace() {
		bytesPerRow := l.Cols / 2
		scalesPerRow := l.Cols / Block / l.blocksPerScale
		// The assembly kernels take four rows at a time where they can (one
		// scale a block, an even number of blocks); the rest go row by
		// row, or four at a time for one input, through the Go kernels.
		r := int4Tiles(l.codes, l.scales, l.blocksPerScale, l.Cols, x, T, out, ld, lo, hi, add, scratch)
		if T == 1 {
			// One input row: four weight rows at a time.
			x := x[:l.Cols]
			for ; r+4 <= hi; r += 4 {
				s0, s1, s2, s3 := int4Dot1x4(l.codes[r*bytesPerRow:(r+4)*bytesPerRow], l.scales[r*scalesPerRow:(r+4)*scalesPerRow], l.blocksPerScale, x)
				if add {
					out[r] += s0
					out[r+1] += s1
					out[r+2] += s2
					out[r+3] += s3
				} else {
					out[r], out[r+1], out[r+2], out[r+3] = s0, s1, s2, s3
				}
			}
		}
		for ; r < hi; r++ {
			codes := l.codes[r*bytesPerRow : (r+1)*bytesPerRow]
			scales := l.scales[r*scalesPerRow : (r+1)*scalesPerRow]
			int4Row(codes, scales, l.blocksPerScale, x, l.Cols, T, out[r:], ld, add)
		}
		return
	}
	raw, row := scratch[:l.Cols], scratch[l.Cols:2*l.Cols]
	for r := lo; r < hi; r++ {
		l.m.Row(r, raw)
		Permute(row, raw)
		for t := range T {
			s := Dot(row, x[t*l.Cols:(t+1)*l.Cols])
			if add {
				out[t*ld+r] += s
			} else {
				out[t*ld+r] = s
			}
		}
	}
}

// Row writes row r of W into dst (Cols floats): an embedding lookup, for
// a model whose head is its embedding.
func (l *Linear) Row(r int, dst []float32) {
	if l.fixed == nil {
		l.m.Row(r, dst)
		return
	}
	groups := l.Cols / l.groupSize
	rb, lane := r/16, r%16
	block := l.fixed[rb*l.Cols/Block*256:]
	for c := range l.Cols {
		b, i := c/Block, c%Block
		j, half, k := i/8, i%8/4, i%4
		code := block[b*256+64*j+4*lane+k] >> (4 * half) & 0xF
		s := tensor.F16ToF32(l.fixedScales[(rb*groups+c/l.groupSize)*16+lane])
		dst[c] = float32(int(code)-8) * s
	}
}

// SetFixed chooses, for the Linears made after it, the fixed-point kernel
// (on, where the machine has it) or the f32 kernels (off), and returns
// the previous choice: tests and benchmarks run both kernels on a machine
// with VNNI. It is not safe to call while Linears are being made.
func SetFixed(on bool) (was bool) {
	was, useFixed = useFixed, on && hasFixed
	return was
}

// littleEndian: the in-place path reads a word's codes byte by byte.
var littleEndian = func() bool {
	w := uint32(1)
	return *(*byte)(unsafe.Pointer(&w)) == 1
}()
