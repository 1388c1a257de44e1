package tensor_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"webdraft/safetensors"
	"webdraft/tensor"
)

// TestQuantizeMatchesTorch holds QuantizeRow bit-exactly to the independent
// PyTorch implementation of the int4 scheme (docs/reference.md) in testdata/golden/make_golden.py,
// on crafted edge cases: zero groups, exact halves, f16 ties and subnormal
// scales, large magnitudes, bf16 inputs.
func TestQuantizeMatchesTorch(t *testing.T) {
	f, err := safetensors.Open(filepath.Join("..", "testdata", "golden", "quant_cases.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := []string{"bf16case"}
	for i := 0; ; i++ {
		if _, ok := f.Tensor(fmt.Sprintf("case%d.w", i)); !ok {
			break
		}
		names = append(names, fmt.Sprintf("case%d", i))
	}
	if len(names) < 5 {
		t.Fatalf("only %d cases in the file", len(names))
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			w, _ := f.Tensor(name + ".w")
			wantQ, _ := f.Tensor(name + ".qweight")
			wantS, _ := f.Tensor(name + ".scales")
			rows, cols := w.Shape[0], w.Shape[1]
			vals := make([]float32, rows*cols)
			switch w.DType {
			case safetensors.F32:
				copy(vals, safetensors.Float32s(w.Data))
			case safetensors.BF16:
				for i, b := range safetensors.Uint16s(w.Data) {
					vals[i] = tensor.BF16ToF32(b)
				}
			}
			m, err := tensor.QuantizeInt4(vals, rows, cols, 32)
			if err != nil {
				t.Fatal(err)
			}
			compareInt4(t, m, safetensors.Uint32s(wantQ.Data), safetensors.Uint16s(wantS.Data))
		})
	}
}

// compareInt4 reports every word and scale of m that differs from want.
func compareInt4(t *testing.T, m *tensor.Int4, wantQ []uint32, wantS []uint16) {
	t.Helper()
	if len(m.QWeight) != len(wantQ) || len(m.Scales) != len(wantS) {
		t.Fatalf("sizes %d/%d, want %d/%d", len(m.QWeight), len(m.Scales), len(wantQ), len(wantS))
	}
	bad := 0
	for i := range wantS {
		if m.Scales[i] != wantS[i] && bad < 5 {
			bad++
			t.Errorf("scale %d = %#04x, want %#04x", i, m.Scales[i], wantS[i])
		}
	}
	for i := range wantQ {
		if m.QWeight[i] != wantQ[i] && bad < 10 {
			bad++
			t.Errorf("word %d (row %d) = %#08x, want %#08x", i, i/(m.Cols/8), m.QWeight[i], wantQ[i])
		}
	}
}
