package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var gatherKernel = gpu.Kernel{
	Module: "gather.wgsl", Source: shaders.Gather, Entry: "main", Params: reflect.TypeFor[gatherParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // pairs, src, dst
}

// gatherParams are gather.wgsl's params: N pairs of rows of Words words.
type gatherParams struct{ N, Words, _, _ uint32 }

const gatherWG = 64

// GatherPairWords is the u32 words a pair of Gather's takes.
const GatherPairWords = 2

// Gather records dst[pairs[i][0]] = src[pairs[i][1]] for the first n pairs
// of pairs ((n, GatherPairWords) u32 words from its start): single words
// copied from src into dst. Every word a pair names must lie within its
// buffer; two pairs must not name one destination word.
func Gather(b *gpu.Batch, dst, src, pairs *gpu.Buffer, n int) error {
	if pairs == nil || n <= 0 || uint64(n*GatherPairWords)*4 > pairs.Size() {
		return fmt.Errorf("kernels: gather: %d pairs in a buffer of %d bytes", n, bufSize(pairs))
	}
	return gatherRows(b, "gather", dst, src, pairs.Slice(0, uint64(n*GatherPairWords)*4), n, 1)
}

// GatherRows records, for the first n pairs of the binding pairs ((n,
// GatherPairWords) u32 words: destination row, source row), row
// pairs[i][0] of dst = row pairs[i][1] of src, rows of words u32 (or f32)
// words each — row r of a buffer is its words r·words … (r+1)·words−1:
// hidden states moved between a pass's rows, a store of them and a
// target's features by index, without a round trip to the host. Every row
// a pair names must lie within its buffer; two pairs must not name one
// destination row; dst and src are different buffers.
func GatherRows(b *gpu.Batch, dst, src *gpu.Buffer, pairs gpu.Binding, n, words int) error {
	op := "gather rows"
	if pairs.Buf == nil || n <= 0 || uint64(n*GatherPairWords)*4 > pairs.Size || pairs.Offset+pairs.Size > pairs.Buf.Size() {
		return fmt.Errorf("kernels: %s: %d pairs in a binding of %d bytes", op, n, pairs.Size)
	}
	return gatherRows(b, op, dst, src, pairs.Buf.Slice(pairs.Offset, uint64(n*GatherPairWords)*4), n, words)
}

// gatherRows records gather.wgsl over n pairs (bound) of rows of words
// words.
func gatherRows(b *gpu.Batch, op string, dst, src *gpu.Buffer, pairs gpu.Binding, n, words int) error {
	switch {
	case words <= 0:
		return fmt.Errorf("kernels: %s: rows of %d words", op, words)
	case src == nil || dst == nil || src == dst:
		return fmt.Errorf("kernels: %s: want two buffers, got %q and %q", op, bufLabel(src), bufLabel(dst))
	case src.Size()%4 != 0 || dst.Size()%4 != 0 || src.Size() < uint64(words)*4 || dst.Size() < uint64(words)*4:
		return fmt.Errorf("kernels: %s: buffers of %d and %d bytes do not hold whole rows of %d words", op, src.Size(), dst.Size(), words)
	}
	threads := uint64(n) * uint64(words)
	if threads > 1<<32-1 {
		return fmt.Errorf("kernels: %s: %d pairs of %d words is too large for one dispatch", op, n, words)
	}
	p, err := b.Device().Pipeline(gatherKernel, nil)
	if err != nil {
		return err
	}
	groups := (threads + gatherWG - 1) / gatherWG
	x := min(groups, 65535)
	y := (groups + x - 1) / x
	binds := []gpu.Binding{pairs, src.All(), dst.All()}
	if err := gpu.Dispatch(b, p, &gatherParams{N: uint32(n), Words: uint32(words)}, binds, uint32(x), uint32(y), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// bufSize and bufLabel are a buffer's size and label for errors, a nil
// buffer's 0 and "nil".
func bufSize(b *gpu.Buffer) uint64 {
	if b == nil {
		return 0
	}
	return b.Size()
}

func bufLabel(b *gpu.Buffer) string {
	if b == nil {
		return "nil"
	}
	return b.Label()
}
