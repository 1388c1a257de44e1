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

// GatherRows returns a new matrix of m's rows at the given indices, in that
// order, in m's own format (for int4 the codes and scales are copied, so the
// rows are bit-identical). Every index must lie in [0, rows).
func GatherRows(m Matrix, rows []int32) (Matrix, error) {
	n, cols := m.Shape()
	for i, r := range rows {
		if r < 0 || int(r) >= n {
			return nil, fmt.Errorf("gather rows: index %d at %d is outside [0, %d)", r, i, n)
		}
	}
	switch m := m.(type) {
	case *F32:
		return &F32{Rows: len(rows), Cols: cols, Data: gather(m.Data, rows, cols)}, nil
	case *F16:
		return &F16{Rows: len(rows), Cols: cols, Data: gather(m.Data, rows, cols)}, nil
	case *Int4:
		return &Int4{Rows: len(rows), Cols: cols, GroupSize: m.GroupSize,
			QWeight: gather(m.QWeight, rows, cols/8), Scales: gather(m.Scales, rows, cols/m.GroupSize)}, nil
	}
	return nil, fmt.Errorf("gather rows: unsupported matrix type %T", m)
}

// gather copies the rows of width w at the given indices.
func gather[T any](data []T, rows []int32, w int) []T {
	out := make([]T, 0, len(rows)*w)
	for _, r := range rows {
		out = append(out, data[int(r)*w:(int(r)+1)*w]...)
	}
	return out
}
