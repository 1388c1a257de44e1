package kernels

import (
	"fmt"

	"webdraft/gpu"
	"webdraft/shaders"
)

var add = gpu.Kernel{
	Module: "add.wgsl", Source: shaders.Add, Entry: "main", ParamsSize: 16,
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadOnly}, // x, y
}

const addWG = 256

// Add records x += y over n values (a residual add):
//
//	x (n) f32, updated in place
//	y (n) f32, a different buffer from x
func Add(b *gpu.Batch, x, y *gpu.Buffer, n int) error {
	op := "add"
	if n <= 0 {
		return fmt.Errorf("kernels: %s: n = %d", op, n)
	}
	if err := need(op, "x", x, n); err != nil {
		return err
	}
	if err := need(op, "y", y, n); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(add, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{x.Slice(0, uint64(n)*4), y.Slice(0, uint64(n)*4)}
	if err := b.Dispatch(p, []uint32{uint32(n), 0, 0, 0}, binds, divCeil(n, addWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
