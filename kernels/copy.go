package kernels

import (
	"fmt"
	"math"

	"webdraft/gpu"
	"webdraft/shaders"
)

var copyKernel = gpu.Kernel{
	Module: "copy.wgsl", Source: shaders.Copy, Entry: "main", ParamsSize: 16,
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // src, dst
}

const copyWG = 256

// Copy records dst = src over the first bytes of each (a multiple of 16):
// the device's bandwidth yardstick (webdraft bench).
func Copy(b *gpu.Batch, dst, src *gpu.Buffer, bytes uint64) error {
	return CopyTo(b, dst, 0, src, bytes)
}

// CopyTo records dst[at : at+bytes] = src[:bytes] (bytes a multiple of 16,
// at a multiple of the device's minStorageBufferOffsetAlignment).
func CopyTo(b *gpu.Batch, dst *gpu.Buffer, at uint64, src *gpu.Buffer, bytes uint64) error {
	op := "copy"
	if bytes == 0 || bytes%16 != 0 || bytes > src.Size() || at+bytes > dst.Size() {
		return fmt.Errorf("kernels: %s: %d bytes to offset %d (need a positive multiple of 16 within both buffers)", op, bytes, at)
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
	binds := []gpu.Binding{src.Slice(0, bytes), dst.Slice(at, bytes)}
	if err := b.Dispatch(p, []uint32{uint32(words), 0, 0, 0}, binds, uint32(x), uint32(y), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

var streamReadKernel = gpu.Kernel{
	Module: "stream_read.wgsl", Source: shaders.StreamRead, Entry: "main", ParamsSize: 16,
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // src, sums
}

// stream_read.wgsl's threads a workgroup and vec4s a thread.
const (
	streamReadWG = 256
	streamReadV  = 8
)

// StreamReadSums is how many u32 sums StreamRead writes for bytes of
// input: one a thread.
func StreamReadSums(bytes uint64) int {
	per := uint64(streamReadWG * streamReadV * 16)
	return int((bytes+per-1)/per) * streamReadWG
}

// StreamRead records a pass that reads the first bytes of src (a multiple
// of 16) once and writes StreamReadSums(bytes) u32 sums of them to sums
// (stream_read.wgsl): the floor of a phase that must read those bytes.
// Passes over one sums buffer are dependent.
func StreamRead(b *gpu.Batch, sums, src *gpu.Buffer, bytes uint64) error {
	op := "stream_read"
	if bytes == 0 || bytes%16 != 0 {
		return fmt.Errorf("kernels: %s: %d bytes (need a positive multiple of 16)", op, bytes)
	}
	if err := need(op, "src", src, int(bytes/4)); err != nil {
		return err
	}
	n := StreamReadSums(bytes)
	groups := n / streamReadWG
	if groups > int(b.Device().Limits().MaxComputeWorkgroupsPerDimension) || bytes/16 > math.MaxUint32 {
		return fmt.Errorf("kernels: %s: %d bytes is too large for one dispatch", op, bytes)
	}
	if err := need(op, "sums", sums, n); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(streamReadKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{src.Slice(0, bytes), sums.Slice(0, uint64(n)*4)}
	if err := b.Dispatch(p, []uint32{uint32(bytes / 16), 0, 0, 0}, binds, uint32(groups), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

var fmaKernel = gpu.Kernel{
	Module: "fma.wgsl", Source: shaders.FMA, Entry: "main", ParamsSize: 16,
	Storage: []gpu.Access{gpu.ReadWrite}, // out
}

const (
	fmaWG    = 256
	fmaIters = 1024
	// FMAFlops is the flops one FMA thread does: fmaIters rounds of eight
	// vec4 multiply-adds.
	FMAFlops = fmaIters * 8 * 4 * 2
)

// FMA records groups workgroups of the arithmetic yardstick (fma.wgsl):
// groups·256 threads of FMAFlops flops each, one f32 each written to out.
func FMA(b *gpu.Batch, out *gpu.Buffer, groups int) error {
	op := "fma"
	if groups <= 0 || groups > int(b.Device().Limits().MaxComputeWorkgroupsPerDimension) {
		return fmt.Errorf("kernels: %s: %d workgroups", op, groups)
	}
	if err := need(op, "out", out, groups*fmaWG); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(fmaKernel, nil)
	if err != nil {
		return err
	}
	params := []uint32{math.Float32bits(0.999), math.Float32bits(0.001), fmaIters, 0}
	if err := b.Dispatch(p, params, []gpu.Binding{out.Slice(0, uint64(groups*fmaWG)*4)}, uint32(groups), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
