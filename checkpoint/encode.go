package checkpoint

import (
	"fmt"
	"sync"

	"webdraft/internal/parallel"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// newMatrix allocates a rows×cols matrix in format q.
func newMatrix(q Quant, rows, cols, groupSize int) tensor.Matrix {
	switch q {
	case Int4:
		return &tensor.Int4{Rows: rows, Cols: cols, GroupSize: groupSize,
			QWeight: make([]uint32, rows*cols/8), Scales: make([]uint16, rows*cols/groupSize)}
	case F16:
		return &tensor.F16{Rows: rows, Cols: cols, Data: make([]uint16, rows*cols)}
	default:
		return &tensor.F32{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
	}
}

// encodeRows fills dst (rows r0 … r0+dst.rows of src, in dst's format) from a
// BF16, F16 or F32 source tensor of width cols, in parallel over rows.
func encodeRows(dst tensor.Matrix, src safetensors.Tensor, r0 int) error {
	rows, cols := dst.Shape()
	var (
		mu       sync.Mutex
		firstErr error
	)
	parallel.For(rows, 64, func(lo, hi int) {
		row := make([]float32, cols)
		for r := lo; r < hi; r++ {
			sourceRow(src, r0+r, cols, row)
			if err := encodeRow(dst, r, row); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("row %d: %w", r0+r, err)
				}
				mu.Unlock()
				return
			}
		}
	})
	return firstErr
}

// encodeRow stores one f32 row as row r of dst.
func encodeRow(dst tensor.Matrix, r int, row []float32) error {
	switch m := dst.(type) {
	case *tensor.Int4:
		return tensor.QuantizeRow(m.QWeight[r*m.Cols/8:(r+1)*m.Cols/8], m.Scales[r*m.Cols/m.GroupSize:(r+1)*m.Cols/m.GroupSize], row, m.GroupSize)
	case *tensor.F16:
		out := m.Data[r*m.Cols : (r+1)*m.Cols]
		for i, v := range row {
			out[i] = tensor.F32ToF16(v)
		}
	case *tensor.F32:
		copy(m.Data[r*m.Cols:(r+1)*m.Cols], row)
	default:
		return fmt.Errorf("unsupported matrix type %T", dst)
	}
	return nil
}

// sourceRow widens row r of a BF16/F16/F32 tensor with cols columns to f32.
func sourceRow(src safetensors.Tensor, r, cols int, dst []float32) {
	size := src.DType.Size()
	b := src.Data[r*cols*size : (r+1)*cols*size]
	switch src.DType {
	case safetensors.BF16:
		for i, v := range safetensors.Uint16s(b) {
			dst[i] = tensor.BF16ToF32(v)
		}
	case safetensors.F16:
		for i, v := range safetensors.Uint16s(b) {
			dst[i] = tensor.F16ToF32(v)
		}
	case safetensors.F32:
		copy(dst, safetensors.Float32s(b))
	}
}

// checkSource verifies a source tensor's dtype and shape against its slot.
func checkSource(folder *safetensors.Folder, name string, shape []int) (safetensors.Tensor, error) {
	t, ok := folder.Tensor(name)
	if !ok {
		return t, fmt.Errorf("%s: tensor %s is missing", folder.Dir, name)
	}
	switch t.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	default:
		return t, fmt.Errorf("%s: tensor %s has dtype %s (want BF16, F16 or F32)", folder.FileOf(name), name, t.DType)
	}
	if !sameShape(t.Shape, shape) {
		return t, fmt.Errorf("%s: tensor %s has shape %v, the config implies %v", folder.FileOf(name), name, t.Shape, shape)
	}
	return t, nil
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
