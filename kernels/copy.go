package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var copyKernel = gpu.Kernel{
	Module: "copy.wgsl", Source: shaders.Copy, Entry: "main", Params: reflect.TypeFor[copyParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // src, dst
}

// copyParams are copy.wgsl's params (prelude.wgsl's WordsParams): N 16-byte words.
type copyParams struct{ N, _, _, _ uint32 }

const copyWG = 256

// Copy records dst = src over the first bytes of each (a multiple of 16).
func Copy(b *gpu.Batch, dst, src *gpu.Buffer, bytes uint64) error {
	return CopyTo(b, dst, 0, src, bytes)
}

// CopyTo records dst[at : at+bytes] = src[:bytes] (bytes a multiple of 16,
// at a multiple of the device's minStorageBufferOffsetAlignment).
func CopyTo(b *gpu.Batch, dst *gpu.Buffer, at uint64, src *gpu.Buffer, bytes uint64) error {
	if bytes > src.Size() {
		return fmt.Errorf("kernels: copy: %d bytes from a buffer of %d", bytes, src.Size())
	}
	return CopyRange(b, dst, at, src.Slice(0, bytes))
}

// CopyRange records dst[at : at+src.Size] = src, a range of a buffer (its
// size a multiple of 16, its offset and at multiples of the device's
// minStorageBufferOffsetAlignment).
func CopyRange(b *gpu.Batch, dst *gpu.Buffer, at uint64, src gpu.Binding) error {
	op := "copy"
	bytes := src.Size
	if bytes == 0 || bytes%16 != 0 || src.Offset+bytes > src.Buf.Size() || at+bytes > dst.Size() {
		return fmt.Errorf("kernels: %s: %d bytes from offset %d to offset %d (need a positive multiple of 16 within both buffers)", op, bytes, src.Offset, at)
	}
	words := bytes / 16
	if words > 1<<32-1 {
		return fmt.Errorf("kernels: %s: %d bytes is too large for one dispatch", op, bytes)
	}
	p, err := b.Device().Pipeline(copyKernel, nil)
	if err != nil {
		return err
	}
	groups := (words + copyWG - 1) / copyWG
	x := min(groups, 65535)
	y := (groups + x - 1) / x
	binds := []gpu.Binding{src, dst.Slice(at, bytes)}
	if err := gpu.Dispatch(b, p, &copyParams{N: uint32(words)}, binds, uint32(x), uint32(y), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
