package bench

import (
	"embed"
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

//go:embed *.wgsl
var files embed.FS

// The kernels, linked with package shaders' prelude as every kernel is:
// fma.wgsl, the device's f32 multiply-add rate; stream_read.wgsl, a pass
// that only reads its bytes (a sum a thread written), the floor of a phase
// that reads from memory.
var (
	fmaSource        = mustLink("fma.wgsl")
	streamReadSource = mustLink("stream_read.wgsl")
)

// Modules returns this package's kernels as they are compiled, by file
// name (the browser test compiles each with the browser's compiler).
func Modules() map[string]string {
	return map[string]string{"fma.wgsl": fmaSource, "stream_read.wgsl": streamReadSource}
}

func mustLink(name string) string {
	src, err := files.ReadFile(name)
	if err == nil {
		var linked string
		if linked, err = shaders.Link(name, string(src)); err == nil {
			return linked
		}
	}
	panic(fmt.Sprintf("bench: %s: %v", name, err)) // a broken build: every test of the package fails on it
}

var streamReadKernel = gpu.Kernel{
	Module: "stream_read.wgsl", Source: streamReadSource, Entry: "main", Params: reflect.TypeFor[streamReadParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite}, // src, sums
}

// streamReadParams are stream_read.wgsl's params (package shaders' WordsParams): N vec4s to read.
type streamReadParams struct{ N, _, _, _ uint32 }

// fmaParams are fma.wgsl's params.
type fmaParams struct {
	M, C  float32
	Iters uint32
	_     uint32
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
		return fmt.Errorf("bench: %s: %d bytes (need a positive multiple of 16)", op, bytes)
	}
	if err := need(op, "src", src, int(bytes/4)); err != nil {
		return err
	}
	n := StreamReadSums(bytes)
	groups := n / streamReadWG
	if groups > int(b.Device().Limits().MaxComputeWorkgroupsPerDimension) || bytes/16 > math.MaxUint32 {
		return fmt.Errorf("bench: %s: %d bytes is too large for one dispatch", op, bytes)
	}
	if err := need(op, "sums", sums, n); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(streamReadKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{src.Slice(0, bytes), sums.Slice(0, uint64(n)*4)}
	if err := gpu.Dispatch(b, p, &streamReadParams{N: uint32(bytes / 16)}, binds, uint32(groups), 1, 1); err != nil {
		return fmt.Errorf("bench: %s: %w", op, err)
	}
	return nil
}

// fmaKernel and imadKernel are fma.wgsl's f32 and integer yardsticks.
var (
	fmaKernel = gpu.Kernel{
		Module: "fma.wgsl", Source: fmaSource, Entry: "main", Params: reflect.TypeFor[fmaParams](),
		Storage: []gpu.Access{gpu.ReadWrite}, // out
	}
	imadKernel = gpu.Kernel{
		Module: "fma.wgsl", Source: fmaSource, Entry: "imad", Params: reflect.TypeFor[fmaParams](),
		Storage: []gpu.Access{gpu.ReadWrite}, // out
	}
)

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
	return arithmetic(b, out, groups, "fma", fmaKernel)
}

// IMAD records groups workgroups of the integer yardstick (fma.wgsl's
// imad): groups·256 threads of FMAFlops integer operations each (a
// multiply and an add counted as two), one word each written to out.
func IMAD(b *gpu.Batch, out *gpu.Buffer, groups int) error {
	return arithmetic(b, out, groups, "imad", imadKernel)
}

// arithmetic records groups workgroups of one of fma.wgsl's entry points.
func arithmetic(b *gpu.Batch, out *gpu.Buffer, groups int, op string, k gpu.Kernel) error {
	if groups <= 0 || groups > int(b.Device().Limits().MaxComputeWorkgroupsPerDimension) {
		return fmt.Errorf("bench: %s: %d workgroups", op, groups)
	}
	if err := need(op, "out", out, groups*fmaWG); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(k, nil)
	if err != nil {
		return err
	}
	params := &fmaParams{M: 0.999, C: 0.001, Iters: fmaIters}
	if err := gpu.Dispatch(b, p, params, []gpu.Binding{out.Slice(0, uint64(groups*fmaWG)*4)}, uint32(groups), 1, 1); err != nil {
		return fmt.Errorf("bench: %s: %w", op, err)
	}
	return nil
}

// need reports whether buf holds at least n u32 (or f32) values.
func need(op, name string, buf *gpu.Buffer, n int) error {
	if buf == nil {
		return fmt.Errorf("bench: %s: %s is nil", op, name)
	}
	if want := uint64(n) * 4; buf.Size() < want {
		return fmt.Errorf("bench: %s: %s (%q) has %d bytes, need %d", op, name, buf.Label(), buf.Size(), want)
	}
	return nil
}
