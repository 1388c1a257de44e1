package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var gatherKernel = gpu.Kernel{
	Module: "gather.wgsl", Source: shaders.Gather, Entry: "main", Params: reflect.TypeFor[copyParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // pairs, src, dst
}

const gatherWG = 64

// GatherPairWords is the u32 words a pair of Gather's takes.
const GatherPairWords = 2

// Gather records dst[pairs[i][0]] = src[pairs[i][1]] for the first n pairs
// of pairs ((n, GatherPairWords) u32 words from its start): single words
// copied from src into dst. Every word a pair names must lie within its
// buffer; two pairs must not name one destination word.
func Gather(b *gpu.Batch, dst, src, pairs *gpu.Buffer, n int) error {
	op := "gather"
	if n <= 0 || uint64(n*GatherPairWords)*4 > pairs.Size() {
		return fmt.Errorf("kernels: %s: %d pairs in a buffer of %d bytes", op, n, pairs.Size())
	}
	if src.Size()%4 != 0 || dst.Size()%4 != 0 {
		return fmt.Errorf("kernels: %s: buffers of %d and %d bytes are not whole words", op, src.Size(), dst.Size())
	}
	p, err := b.Device().Pipeline(gatherKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{pairs.Slice(0, uint64(n*GatherPairWords)*4), src.All(), dst.All()}
	if err := gpu.Dispatch(b, p, &copyParams{N: uint32(n)}, binds, uint32((n+gatherWG-1)/gatherWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
