package kernels

import (
	"fmt"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	swiGLU = gpu.Kernel{
		Module: "swiglu.wgsl", Source: shaders.SwiGLU, Entry: "main", ParamsSize: 16,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // gate, up, out
	}
	add = gpu.Kernel{
		Module: "add.wgsl", Source: shaders.Add, Entry: "main", ParamsSize: 16,
		Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadOnly}, // x, y
	}
)

const (
	swiGLUWG = 64
	addWG    = 256
)

// SwiGLU records out = silu(gate) · up, the Qwen3 MLP's gating:
//
//	gate (T, I) f32
//	up   (T, I) f32
//	out  (T, I) f32, a different buffer from gate and up
func SwiGLU(b *gpu.Batch, out, gate, up *gpu.Buffer, T, I int) error {
	return swiglu(b, out, gate, up, T, I, I, 0)
}

// SwiGLUFused is SwiGLU over one (T, 2I) buffer holding gate_proj's output
// in columns [0, I) and up_proj's in [I, 2I), as a matmul with the two
// weights stacked writes it.
func SwiGLUFused(b *gpu.Batch, out, gateUp *gpu.Buffer, T, I int) error {
	return swiglu(b, out, gateUp, gateUp, T, I, 2*I, I)
}

// swiglu reads gate rows of stride ld from gate and up rows of stride ld
// from up, starting upOff values in.
func swiglu(b *gpu.Batch, out, gate, up *gpu.Buffer, T, I, ld, upOff int) error {
	op := "swiglu"
	if T <= 0 || I <= 0 {
		return fmt.Errorf("kernels: %s: shape (%d, %d)", op, T, I)
	}
	gateN, upN := (T-1)*ld+I, upOff+(T-1)*ld+I // values up to the last one read
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"gate", gate, gateN}, {"up", up, upN}, {"out", out, T * I}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	p, err := b.Device().Pipeline(swiGLU, nil)
	if err != nil {
		return err
	}
	params := []uint32{uint32(T), uint32(I), uint32(ld), uint32(upOff)}
	binds := []gpu.Binding{gate.Slice(0, uint64(gateN)*4), up.Slice(0, uint64(upN)*4), out.Slice(0, uint64(T*I)*4)}
	if err := b.Dispatch(p, params, binds, divCeil(I, swiGLUWG), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

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
