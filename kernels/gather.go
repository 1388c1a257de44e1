package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	gatherKernel = gpu.Kernel{
		Module: "gather.wgsl", Source: shaders.Gather, Entry: "main", Params: reflect.TypeFor[gatherParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // pairs, src, dst
	}
	gatherTwoKernel = gpu.Kernel{
		Module: "gather.wgsl", Source: shaders.Gather, Entry: "two", Params: reflect.TypeFor[gatherParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadWrite}, // pairs, src, dst, pairs2, dst2
	}
)

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
	return gatherRows(b, "gather", src, []gatherDest{{dst, pairs.Slice(0, uint64(n*GatherPairWords)*4)}}, n, 1)
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
	bound, err := boundPairs(op, pairs, n)
	if err != nil {
		return err
	}
	return gatherRows(b, op, src, []gatherDest{{dst, bound}}, n, words)
}

// boundPairs is the binding of the first n pairs of pairs, or why pairs
// does not hold them.
func boundPairs(op string, pairs gpu.Binding, n int) (gpu.Binding, error) {
	if pairs.Buf == nil || n <= 0 || uint64(n*GatherPairWords)*4 > pairs.Size || pairs.Offset+pairs.Size > pairs.Buf.Size() {
		return gpu.Binding{}, fmt.Errorf("kernels: %s: %d pairs in a binding of %d bytes", op, n, pairs.Size)
	}
	return pairs.Buf.Slice(pairs.Offset, uint64(n*GatherPairWords)*4), nil
}

// GatherRowsTwice is GatherRows into two buffers in one dispatch: by the
// first n pairs of pairs into dst, and by those of pairs2 into dst2 (src
// unlike both; dst and dst2 different buffers).
func GatherRowsTwice(b *gpu.Batch, dst, dst2, src *gpu.Buffer, pairs, pairs2 gpu.Binding, n, words int) error {
	op := "gather rows twice"
	if dst == dst2 {
		return fmt.Errorf("kernels: %s: both into %q", op, bufLabel(dst))
	}
	to := []gatherDest{{dst, pairs}, {dst2, pairs2}}
	for i := range to {
		var err error
		if to[i].pairs, err = boundPairs(op, to[i].pairs, n); err != nil {
			return err
		}
	}
	return gatherRows(b, op, src, to, n, words)
}

// gatherDest is a destination of gather.wgsl: a buffer and the pairs
// (bound) that place rows in it.
type gatherDest struct {
	dst   *gpu.Buffer
	pairs gpu.Binding
}

// gatherRows records gather.wgsl over n pairs of rows of words words into
// one destination (main) or two (two).
func gatherRows(b *gpu.Batch, op string, src *gpu.Buffer, to []gatherDest, n, words int) error {
	if words <= 0 {
		return fmt.Errorf("kernels: %s: rows of %d words", op, words)
	}
	for _, g := range to {
		switch {
		case src == nil || g.dst == nil || src == g.dst:
			return fmt.Errorf("kernels: %s: want two buffers, got %q and %q", op, bufLabel(src), bufLabel(g.dst))
		case src.Size()%4 != 0 || g.dst.Size()%4 != 0 || src.Size() < uint64(words)*4 || g.dst.Size() < uint64(words)*4:
			return fmt.Errorf("kernels: %s: buffers of %d and %d bytes do not hold whole rows of %d words", op, src.Size(), g.dst.Size(), words)
		}
	}
	kernel, binds := gatherKernel, []gpu.Binding{to[0].pairs, src.All(), to[0].dst.All()}
	if len(to) == 2 {
		kernel, binds = gatherTwoKernel, append(binds, to[1].pairs, to[1].dst.All())
	}
	threads := uint64(n) * uint64(words)
	if threads > 1<<32-1 {
		return fmt.Errorf("kernels: %s: %d pairs of %d words is too large for one dispatch", op, n, words)
	}
	p, err := b.Device().Pipeline(kernel, nil)
	if err != nil {
		return err
	}
	groups := (threads + gatherWG - 1) / gatherWG
	x := min(groups, 65535)
	y := (groups + x - 1) / x
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
