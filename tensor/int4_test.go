package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestQuantizeRowKnownValues(t *testing.T) {
	// One group of 8 (the smallest allowed): max|w| = 7 gives s = 1 exactly.
	w := []float32{7, -7, 0.5, -0.5, 1.49, -2.5, 3.5, 0}
	q := make([]uint32, 1)
	s := make([]uint16, 1)
	if err := QuantizeRow(q, s, w, 8); err != nil {
		t.Fatal(err)
	}
	if got := F16ToF32(s[0]); got != 1 {
		t.Fatalf("scale = %v, want 1", got)
	}
	// Halves round away from zero: 0.5→1, -0.5→-1, -2.5→-3, 3.5→4.
	want := []int{7, -7, 1, -1, 1, -3, 4, 0}
	for j, wq := range want {
		if got := int(q[0]>>(4*j)&15) - 8; got != wq {
			t.Errorf("element %d: q = %d, want %d", j, got, wq)
		}
	}
}

func TestQuantizeRowZeroGroup(t *testing.T) {
	w := make([]float32, 16)
	q := make([]uint32, 2)
	s := make([]uint16, 2)
	if err := QuantizeRow(q, s, w, 8); err != nil {
		t.Fatal(err)
	}
	for i := range q {
		if q[i] != 0x88888888 || s[i] != 0 {
			t.Fatalf("zero group: word %#x scale %#x, want 0x88888888 and 0", q[i], s[i])
		}
	}
}

func TestQuantizeRowRejects(t *testing.T) {
	for _, w := range [][]float32{
		{float32(math.NaN()), 0, 0, 0, 0, 0, 0, 0},
		{float32(math.Inf(1)), 0, 0, 0, 0, 0, 0, 0},
		{1e6, 0, 0, 0, 0, 0, 0, 0}, // scale overflows f16
	} {
		if err := QuantizeRow(make([]uint32, 1), make([]uint16, 1), w, 8); err == nil {
			t.Errorf("QuantizeRow(%v) succeeded, want an error", w)
		}
	}
	if _, err := QuantizeInt4(make([]float32, 2*40), 2, 40, 32); err == nil {
		t.Error("40 columns with group 32 accepted")
	}
}

// TestInt4RoundTrip checks the error bound of the scheme on random matrices:
// |w - dequant(w)| ≤ s/2 (no clamping inside the range), and that Row reads
// back what QuantizeRow packed.
func TestInt4RoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, shape := range [][3]int{{1, 32, 32}, {5, 64, 32}, {3, 128, 64}, {7, 96, 8}} {
		rows, cols, g := shape[0], shape[1], shape[2]
		w := make([]float32, rows*cols)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(6)-4)))
		}
		m, err := QuantizeInt4(w, rows, cols, g)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
		row := make([]float32, cols)
		for r := range rows {
			m.Row(r, row)
			for c := range cols {
				s := F16ToF32(m.Scales[r*cols/g+c/g])
				if d := math.Abs(float64(row[c] - w[r*cols+c])); d > float64(s)/2*1.0001 {
					t.Fatalf("%v: (%d,%d) = %v, dequantized %v, scale %v", shape, r, c, w[r*cols+c], row[c], s)
				}
			}
		}
	}
}

func TestDenseRows(t *testing.T) {
	f := &F32{Rows: 2, Cols: 3, Data: []float32{1, 2, 3, 4, 5, 6}}
	h := &F16{Rows: 2, Cols: 3}
	for _, v := range f.Data {
		h.Data = append(h.Data, F32ToF16(v))
	}
	for _, m := range []Matrix{f, h} {
		row := make([]float32, 3)
		m.Row(1, row)
		if row[0] != 4 || row[1] != 5 || row[2] != 6 {
			t.Errorf("%T row 1 = %v", m, row)
		}
	}
	if err := (&F32{Rows: 2, Cols: 3, Data: make([]float32, 5)}).Validate(); err == nil {
		t.Error("short F32 accepted")
	}
}

func TestFloatConversions(t *testing.T) {
	cases := []struct {
		f    float32
		bits uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {1.0 / 16777216, 0x0001}, // smallest subnormal
		{1 + 1.0/2048, 0x3c00}, // tie, rounds to even
		{1e6, 0x7c00},          // overflow to +Inf
	}
	for _, c := range cases {
		if got := F32ToF16(c.f); got != c.bits {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.f, got, c.bits)
		}
	}
	if got := BF16ToF32(0x3f80); got != 1 {
		t.Errorf("BF16ToF32(0x3f80) = %v", got)
	}
}
