package kernels

import (
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/sampling"
	"webdraft/shaders"
)

var (
	argmaxPartial = gpu.Kernel{
		Module: "argmax.wgsl", Source: shaders.Argmax, Entry: "partial", Params: reflect.TypeFor[argmaxParams](),
		Storage: argmaxStorage,
	}
	argmaxMerge = gpu.Kernel{
		Module: "argmax.wgsl", Source: shaders.Argmax, Entry: "merge", Params: reflect.TypeFor[argmaxParams](),
		Storage: argmaxStorage,
	}
	// logits, candidates, ids, lp, tokens, keys
	argmaxStorage = []gpu.Access{gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}
)

// argmaxParams are argmax.wgsl's params.
type argmaxParams struct {
	T, V, Chunks, LSE0 uint32
	Mapped, Coupled    uint32
	_, _               uint32
}

// argmaxChunk is how many logits one workgroup of argmax.wgsl's first
// pass covers (its CHUNK).
const argmaxChunk = 4096

// ArgmaxNaN is the id Argmax writes for a row that holds a NaN.
const ArgmaxNaN = 0xffffffff

// Argmax records ids[t] = the first index of the largest of logits[t]
// (greedy decoding; torch.argmax's tie rule), lp[t], its log-probability
// (log softmax at temperature 1), and lp[lse0 + t], the row's log-sum-exp:
//
//	logits (T, V) f32
//	ids    (T) u32 at a range of a buffer; ArgmaxNaN for a row with a NaN
//	lp     (lse0 + T) f32, lse0 ≥ T: a range of its own buffer, or of ids'
//	       past ids' T words (one buffer then holds the read-out)
func Argmax(b *gpu.Batch, ids, lp gpu.Binding, logits *gpu.Buffer, T, V, lse0 int) error {
	return argmax(b, ids, lp, logits, nil, gpu.Binding{}, T, V, lse0)
}

// ArgmaxCoupled is Argmax whose rows may be coupled drafts, as
// ArgmaxOfCoupled's over a head of the whole vocabulary (each logit's
// index its token); a zero keys Binding: Argmax.
func ArgmaxCoupled(b *gpu.Batch, ids, lp gpu.Binding, logits *gpu.Buffer, keys gpu.Binding, T, V, lse0 int) error {
	return argmax(b, ids, lp, logits, nil, keys, T, V, lse0)
}

// ArgmaxOf is Argmax over the logits of a head that scores V tokens of a
// larger vocabulary, tokens[v] the token of logit v, the others −∞: ids[t]
// is the token, the first in token order among the largest, as Argmax over
// the whole vocabulary's row would choose (the rows need not be placed in
// one first), and lp the same.
//
//	tokens (V) u32
func ArgmaxOf(b *gpu.Batch, ids, lp gpu.Binding, logits, tokens *gpu.Buffer, T, V, lse0 int) error {
	return ArgmaxOfCoupled(b, ids, lp, logits, tokens, gpu.Binding{}, T, V, lse0)
}

// ArgmaxCoupledWords is how many u32 words a row takes in the keys of
// ArgmaxOfCoupled.
const ArgmaxCoupledWords = 4

// ArgmaxOfCoupled is ArgmaxOf whose rows may be coupled drafts
// (sampling.CoupledChoice): where row t's keys (PutCoupledKey) are set,
// ids[t] is the token with the largest logit / T + its Gumbel noise under
// the row's key, keyed by the token in the larger vocabulary, and lp[t]
// its log-probability at temperature 1. A zero keys Binding: ArgmaxOf.
//
//	keys (T, ArgmaxCoupledWords) u32
func ArgmaxOfCoupled(b *gpu.Batch, ids, lp gpu.Binding, logits, tokens *gpu.Buffer, keys gpu.Binding, T, V, lse0 int) error {
	if err := need("argmax", "tokens", tokens, V); err != nil {
		return err
	}
	return argmax(b, ids, lp, logits, tokens, keys, T, V, lse0)
}

// PutCoupledKey writes one row's keys words for ArgmaxOfCoupled: d's key
// and the temperature where d is coupled and T > 0, else a greedy row.
func PutCoupledKey(w []uint32, T float32, d sampling.Draw) {
	clear(w[:ArgmaxCoupledWords])
	if d.Coupled && T > 0 {
		k0, k1 := d.Key()
		w[0], w[1], w[2], w[3] = k0, k1, math.Float32bits(T), 1
	}
}

func argmax(b *gpu.Batch, ids, lp gpu.Binding, logits, tokens *gpu.Buffer, keys gpu.Binding, T, V, lse0 int) error {
	op := "argmax"
	if T <= 0 || V <= 0 || lse0 < T {
		return fmt.Errorf("kernels: %s: shape (%d, %d), log-sum-exps at word %d", op, T, V, lse0)
	}
	if err := need(op, "logits", logits, T*V); err != nil {
		return err
	}
	if err := needRange(op, "ids", ids, T, nil, 0); err != nil {
		return err
	}
	if err := needRange(op, "lp", lp, lse0+T, nil, 0); err != nil {
		return err
	}
	if lp.Buf == ids.Buf && lp.Offset < ids.Offset+uint64(T)*4 && ids.Offset < lp.Offset+uint64(lse0+T)*4 {
		return fmt.Errorf("kernels: %s: lp (at byte %d of %q) overlaps ids (at byte %d), written too", op, lp.Offset, ids.Buf.Label(), ids.Offset)
	}
	d := b.Device()
	chunks := (V + argmaxChunk - 1) / argmaxChunk
	params := &argmaxParams{T: uint32(T), V: uint32(V), Chunks: uint32(chunks), LSE0: uint32(lse0)}
	mapping, keyed := logits.Slice(0, 4), logits.Slice(0, 4) // bound, unread
	if tokens != nil {
		params.Mapped, mapping = 1, tokens.Slice(0, uint64(V)*4)
	}
	if keys.Buf != nil {
		if err := needRange(op, "keys", keys, T*ArgmaxCoupledWords, nil, 0); err != nil {
			return err
		}
		params.Coupled, keyed = 1, keys.Buf.Slice(keys.Offset, uint64(T*ArgmaxCoupledWords)*4)
	}
	candBytes := uint64(T*chunks) * 16 * uint64(1+params.Coupled)
	scratch, err := d.Scratch(candBytes)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{logits.Slice(0, uint64(T*V)*4), scratch.Slice(0, candBytes), ids.Buf.Slice(ids.Offset, uint64(T)*4), lp.Buf.Slice(lp.Offset, uint64(lse0+T)*4), mapping, keyed}
	return dispatchPasses(b, op, params, binds, pass{argmaxPartial, chunks, T}, pass{argmaxMerge, T, 1})
}
