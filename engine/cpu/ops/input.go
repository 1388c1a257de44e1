package ops

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Input is a batch of T input rows of Cols columns, prepared once for
// every matrix that reads them (NewInput names those matrices): in the
// blocked f32 layout of Permute for the f32 kernels, and in 24-bit fixed
// point for the int4 kernel of machines with AVX-512 VNNI.
//
// Fixed point: each 32-column block of a row holds its values as
// v = round(x/s) with s = max|x|/fixedMax over the block, |v| ≤ fixedMax
// (2²²−1), split into three int8 parts v = 65536·hi + 256·mid + lo, so
// that the kernel multiplies them with int4 codes in exact integer sums.
// The value a kernel sees is s·v: within s/2 of x, 2⁻²³ of the block's
// largest magnitude, the precision of f32 itself. A block with a NaN or
// an infinity gets a NaN scale, so that what it feeds is NaN, as in float
// arithmetic.
type Input struct {
	T, Cols int
	// blocked is (T, Cols) in Permute's layout, when a reader wants it.
	blocked []float32
	// fixed is (T, fixedStride(Cols)) bytes, when a reader wants it: per
	// block hi[32], mid[32] and lo[32], then per block its scale (f32),
	// −8·Σv and −8·Σ(v − lo) (int32, the screening kernel's: screen.go),
	// little-endian.
	fixed                  []byte
	wantBlocked, wantFixed bool
}

// fixedMax bounds |v|: an exact integer in f32, and Σ code·v over a
// block (codes up to 15) within int32.
const fixedMax = 1<<22 - 1

// fixedStride is the bytes of one row of fixed-point input.
func fixedStride(cols int) int { return cols / Block * 108 }

// NewInput returns an empty Input in the forms its readers take.
func NewInput(readers ...*Linear) *Input {
	in := &Input{}
	for _, l := range readers {
		if l.fixed != nil {
			in.wantFixed = true
		} else {
			in.wantBlocked = true
		}
	}
	return in
}

// Resize makes room for T rows of cols columns, reusing its memory where
// it is large enough; the rows' contents are undefined until Set.
func (in *Input) Resize(T, cols int) {
	in.T, in.Cols = T, cols
	if in.wantBlocked {
		in.blocked = grow(in.blocked, T*cols)
	}
	if in.wantFixed {
		in.fixed = grow(in.fixed, T*fixedStride(cols))
	}
}

// Trim drops memory held for more than rows rows.
func (in *Input) Trim(rows int) {
	if cap(in.blocked) > rows*in.Cols {
		in.blocked = nil
	}
	if cap(in.fixed) > rows*fixedStride(in.Cols) {
		in.fixed = nil
	}
}

// Set prepares row t from src (Cols values, natural order).
func (in *Input) Set(t int, src []float32) {
	src = src[:in.Cols]
	if in.wantBlocked {
		Permute(in.blocked[t*in.Cols:(t+1)*in.Cols], src)
	}
	if in.wantFixed {
		n := fixedStride(in.Cols)
		quantize(in.fixed[t*n:(t+1)*n], src)
	}
}

// grow returns buf with length n, reallocated only when too short.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n, n+n/4)
	}
	return buf[:n]
}

// quantizeGo writes row (whole 32-column blocks) in fixed point into dst
// (fixedStride(len(row)) bytes): the definition every kernel matches.
func quantizeGo(dst []byte, row []float32) {
	nb := len(row) / Block
	meta := dst[96*nb:]
	for b := range nb {
		xs := row[b*Block : (b+1)*Block]
		var m, sum float32
		for _, v := range xs {
			m = max(m, float32(math.Abs(float64(v))))
			sum += v
		}
		s, inv := fixedScale(m, sum)
		var sv, slo int32
		for i, v := range xs {
			q := int32(math.RoundToEven(float64(v * inv)))
			hi, mid, lo := split(q)
			dst[96*b+i], dst[96*b+32+i], dst[96*b+64+i] = byte(hi), byte(mid), byte(lo)
			sv += q
			slo += int32(lo)
		}
		binary.LittleEndian.PutUint32(meta[12*b:], math.Float32bits(s))
		binary.LittleEndian.PutUint32(meta[12*b+4:], uint32(-8*sv))
		binary.LittleEndian.PutUint32(meta[12*b+8:], uint32(-8*(sv-slo)))
	}
}

// split is v's parts: v = 65536·hi + 256·mid + lo, each in int8.
func split(v int32) (hi, mid, lo int8) {
	t := (v + 128) >> 8
	h := (t + 128) >> 8
	return int8(h), int8(t - h<<8), int8(v - t<<8)
}

// fixedScale is a block's scale and its inverse from its largest
// magnitude m and its sum (which is not finite when the block holds a NaN
// or an infinity: then the scale is NaN).
func fixedScale(m, sum float32) (s, inv float32) {
	switch {
	case math.IsNaN(float64(sum)) || math.IsInf(float64(sum), 0):
		return float32(math.NaN()), 0
	case m == 0:
		return 0, 0
	}
	return m / fixedMax, fixedMax / m
}

// packFixed lays out an int4 matrix (groups of whole blocks) for
// int4Fixed16: rows in blocks of 16 (the last padded with zero weights),
// and in each, per 32-column block, four 64-byte words whose byte 4r+i
// holds row r's column 8j+i (low nibble) and 8j+4+i (high nibble) for
// word j; scales per 16-row block and group, the 16 rows' f16 together.
func packFixed(rows, cols, groupSize int, qweight []uint32, scales []uint16) (codes []byte, packed []uint16) {
	if cols%Block != 0 || groupSize%Block != 0 || len(qweight) != rows*cols/8 || len(scales) != rows*cols/groupSize {
		panic(fmt.Sprintf("ops: packFixed: %d×%d, group %d, %d words, %d scales", rows, cols, groupSize, len(qweight), len(scales)))
	}
	blocks16, nb, groups := (rows+15)/16, cols/Block, cols/groupSize
	codes = make([]byte, blocks16*nb*256)
	packed = make([]uint16, blocks16*groups*16)
	code := func(r, c int) byte {
		if r >= rows {
			return 8 // a padding row: weight 0
		}
		return byte(qweight[r*cols/8+c/8]>>(4*(c%8))) & 0xF
	}
	for rb := range blocks16 {
		for b := range nb {
			word := codes[(rb*nb+b)*256:]
			for j := range 4 {
				for r := range 16 {
					for i := range 4 {
						c := b*Block + 8*j + i
						word[64*j+4*r+i] = code(16*rb+r, c) | code(16*rb+r, c+4)<<4
					}
				}
			}
		}
		for g := range groups {
			for r := range 16 {
				if row := 16*rb + r; row < rows {
					packed[(rb*groups+g)*16+r] = scales[row*groups+g]
				}
			}
		}
	}
	return codes, packed
}
