package tensor

import (
	"fmt"
	"math"
)

// DefaultGroupSize is the number of consecutive input columns that share one
// f16 scale.
const DefaultGroupSize = 32

// Int4 is a matrix in the int4 scheme of docs/reference.md.
//
// Row r, column c has code n = QWeight[r*Cols/8 + c/8] >> (4*(c%8)) & 15 and
// scale s = Scales[r*Cols/GroupSize + c/GroupSize]; its value is (n-8)*s in f32.
type Int4 struct {
	Rows, Cols int
	GroupSize  int
	QWeight    []uint32 // (Rows, Cols/8): eight 4-bit codes per word, first in the low bits
	Scales     []uint16 // (Rows, Cols/GroupSize) f16 bits
}

func (m *Int4) Shape() (int, int) { return m.Rows, m.Cols }

// Row dequantizes row r: dst[c] = (code(r, c) - 8) * scale(r, c/G).
func (m *Int4) Row(r int, dst []float32) {
	words := m.QWeight[r*m.Cols/8 : (r+1)*m.Cols/8]
	scales := m.Scales[r*m.Cols/m.GroupSize : (r+1)*m.Cols/m.GroupSize]
	for w, word := range words {
		s := F16ToF32(scales[w*8/m.GroupSize])
		out := dst[w*8 : w*8+8]
		for j := range out {
			out[j] = float32(int32(word>>(4*j)&15)-8) * s
		}
	}
}

// Validate checks the shape, the group size and the lengths of both arrays.
func (m *Int4) Validate() error {
	if err := CheckInt4Shape(m.Rows, m.Cols, m.GroupSize); err != nil {
		return err
	}
	if want := m.Rows * m.Cols / 8; len(m.QWeight) != want {
		return fmt.Errorf("int4 matrix (%d, %d): qweight has %d words, want %d", m.Rows, m.Cols, len(m.QWeight), want)
	}
	if want := m.Rows * m.Cols / m.GroupSize; len(m.Scales) != want {
		return fmt.Errorf("int4 matrix (%d, %d): scales has %d values, want %d", m.Rows, m.Cols, len(m.Scales), want)
	}
	return nil
}

// CheckInt4Shape reports whether a (rows, cols) matrix can be stored as int4
// with the given group size.
func CheckInt4Shape(rows, cols, groupSize int) error {
	switch {
	case rows <= 0 || cols <= 0:
		return fmt.Errorf("int4: bad shape (%d, %d)", rows, cols)
	case groupSize <= 0 || groupSize%8 != 0:
		return fmt.Errorf("int4: group size %d is not a positive multiple of 8", groupSize)
	case cols%groupSize != 0:
		return fmt.Errorf("int4: %d input columns are not a multiple of the group size %d", cols, groupSize)
	}
	return nil
}

// QuantizeInt4 quantizes a dense (rows, cols) f32 matrix.
func QuantizeInt4(w []float32, rows, cols, groupSize int) (*Int4, error) {
	if err := CheckInt4Shape(rows, cols, groupSize); err != nil {
		return nil, err
	}
	if len(w) != rows*cols {
		return nil, fmt.Errorf("int4: %d weights for shape (%d, %d)", len(w), rows, cols)
	}
	m := &Int4{
		Rows: rows, Cols: cols, GroupSize: groupSize,
		QWeight: make([]uint32, rows*cols/8),
		Scales:  make([]uint16, rows*cols/groupSize),
	}
	for r := 0; r < rows; r++ {
		err := QuantizeRow(m.QWeight[r*cols/8:(r+1)*cols/8], m.Scales[r*cols/groupSize:(r+1)*cols/groupSize], w[r*cols:(r+1)*cols], groupSize)
		if err != nil {
			return nil, fmt.Errorf("row %d: %w", r, err)
		}
	}
	return m, nil
}

// QuantizeRow quantizes one row w (len(w) a multiple of groupSize) into
// len(w)/8 words and len(w)/groupSize f16 scales, bit-exactly by §2:
//
//	s = f16(max|w| / 7)
//	q = clamp(round_half_away_from_zero(w / s), -8, 7), q = 0 where s == 0
//	stored nibble q + 8
//
// A scale that overflows f16 (|w| > 7·65504) or a non-finite weight is an error.
func QuantizeRow(qweight []uint32, scales []uint16, w []float32, groupSize int) error {
	for g := range len(w) / groupSize {
		group := w[g*groupSize : (g+1)*groupSize]
		var amax float32
		for i, v := range group {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("int4: non-finite weight %v at column %d", v, g*groupSize+i)
			}
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		sBits := F32ToF16(amax / 7)
		s := F16ToF32(sBits)
		if math.IsInf(float64(s), 0) {
			return fmt.Errorf("int4: group %d has max|w| = %g, too large for an f16 scale", g, amax)
		}
		scales[g] = sBits
		for j := 0; j < groupSize; j += 8 {
			var word uint32
			for k := range 8 {
				var q int32
				if s != 0 {
					q = int32(roundHalfAway(group[j+k] / s))
					q = min(max(q, -8), 7)
				}
				word |= uint32(q+8) << (4 * k)
			}
			qweight[(g*groupSize+j)/8] = word
		}
	}
	return nil
}

// roundHalfAway rounds to the nearest integer, halves away from zero.
func roundHalfAway(x float32) float32 { return float32(math.Round(float64(x))) }
