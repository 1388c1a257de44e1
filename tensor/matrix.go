package tensor

import "fmt"

// Matrix is a 2-D weight W[out][in] (PyTorch's nn.Linear.weight layout: one
// row per output feature).
type Matrix interface {
	// Shape returns (rows, cols) = (out_features, in_features).
	Shape() (rows, cols int)
	// Row writes W[r][:] as f32 into dst, which has at least cols elements.
	Row(r int, dst []float32)
}

// F32 is a dense f32 matrix, row-major.
type F32 struct {
	Rows, Cols int
	Data       []float32 // (Rows, Cols)
}

// F16 is a dense IEEE half matrix, row-major, stored as raw bits.
type F16 struct {
	Rows, Cols int
	Data       []uint16 // (Rows, Cols) f16 bits
}

var (
	_ Matrix = (*F32)(nil)
	_ Matrix = (*F16)(nil)
	_ Matrix = (*Int4)(nil)
)

func (m *F32) Shape() (int, int) { return m.Rows, m.Cols }

func (m *F32) Row(r int, dst []float32) { copy(dst[:m.Cols], m.Data[r*m.Cols:(r+1)*m.Cols]) }

func (m *F16) Shape() (int, int) { return m.Rows, m.Cols }

func (m *F16) Row(r int, dst []float32) {
	src := m.Data[r*m.Cols : (r+1)*m.Cols]
	for i, h := range src {
		dst[i] = F16ToF32(h)
	}
}

// Validate checks that the data length matches the shape.
func (m *F32) Validate() error { return checkLen("f32", m.Rows, m.Cols, len(m.Data), m.Rows*m.Cols) }

// Validate checks that the data length matches the shape.
func (m *F16) Validate() error { return checkLen("f16", m.Rows, m.Cols, len(m.Data), m.Rows*m.Cols) }

func checkLen(kind string, rows, cols, got, want int) error {
	if rows <= 0 || cols <= 0 {
		return fmt.Errorf("%s matrix: bad shape (%d, %d)", kind, rows, cols)
	}
	if got != want {
		return fmt.Errorf("%s matrix (%d, %d): %d elements, want %d", kind, rows, cols, got, want)
	}
	return nil
}
