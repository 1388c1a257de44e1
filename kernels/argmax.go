package kernels

import (
	"fmt"

	"webdraft/gpu"
	"webdraft/shaders"
)

var argmax = gpu.Kernel{
	Module: "argmax.wgsl", Source: shaders.Argmax, Entry: "main", ParamsSize: 16,
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // logits, ids
}

// ArgmaxNaN is the id Argmax writes for a row that holds a NaN.
const ArgmaxNaN = 0xffffffff

// Argmax records ids[t] = the first index of the largest of logits[t]
// (greedy decoding; torch.argmax's tie rule):
//
//	logits (T, V) f32
//	ids    (T) u32; ArgmaxNaN for a row with a NaN
func Argmax(b *gpu.Batch, ids, logits *gpu.Buffer, T, V int) error {
	op := "argmax"
	if T <= 0 || V <= 0 {
		return fmt.Errorf("kernels: %s: shape (%d, %d)", op, T, V)
	}
	if err := need(op, "logits", logits, T*V); err != nil {
		return err
	}
	if err := need(op, "ids", ids, T); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(argmax, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{logits.Slice(0, uint64(T*V)*4), ids.Slice(0, uint64(T)*4)}
	if err := b.Dispatch(p, []uint32{uint32(T), uint32(V), 0, 0}, binds, uint32(T), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
