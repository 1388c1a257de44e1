package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var advanceRowsKernel = gpu.Kernel{
	Module: "advance_rows.wgsl", Source: shaders.AdvanceRows, Entry: "main", Params: reflect.TypeFor[advanceRowsParams](),
	Storage: []gpu.Access{gpu.ReadWrite}, // rows
}

// advanceRowsParams are advance_rows.wgsl's params (prelude.wgsl's
// WordsParams): N rows.
type advanceRowsParams struct{ N, _, _, _ uint32 }

const advanceRowsWG = 64

// AdvanceRows records, for the first T rows of rows (PutRow's, each a line
// token's), the row of the token after it: slot, position and base one
// on, sequence and mask kept (advance_rows.wgsl). A chain drafted on the
// device moves its passes' rows so, with no write from the host between
// them.
func AdvanceRows(b *gpu.Batch, rows *gpu.Buffer, T int) error {
	op := "advance_rows"
	if T <= 0 || uint64(T*RowWords)*4 > rows.Size() {
		return fmt.Errorf("kernels: %s: %d rows of a %d-byte buffer", op, T, rows.Size())
	}
	p, err := b.Device().Pipeline(advanceRowsKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{rows.Slice(0, uint64(T*RowWords)*4)}
	if err := gpu.Dispatch(b, p, &advanceRowsParams{N: uint32(T)}, binds, uint32((T+advanceRowsWG-1)/advanceRowsWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
