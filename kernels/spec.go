package kernels

import (
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var specAcceptKernel = gpu.Kernel{
	Module: "spec_accept.wgsl", Source: shaders.SpecAccept, Entry: "main", Params: reflect.TypeFor[specAcceptParams](),
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite}, // state, drafts, verify, ids, dids
}

var specDraftRowsKernel = gpu.Kernel{
	Module: "spec_draft_rows.wgsl", Source: shaders.SpecDraftRows, Entry: "main", Params: reflect.TypeFor[specDraftRowsParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite}, // state, rows, trows
}

type specDraftRowsParams struct{ B, K, _, _ uint32 }

var specRowsKernel = gpu.Kernel{
	Module: "spec_rows.wgsl", Source: shaders.SpecRows, Entry: "main", Params: reflect.TypeFor[specRowsParams](),
	// state, table, trows, tfeat, hrows, hsave, hchain
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite},
}

var specKeysKernel = gpu.Kernel{
	Module: "spec_keys.wgsl", Source: shaders.SpecKeys, Entry: "main", Params: reflect.TypeFor[specKeysParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite}, // state, draws, dkeys
}

type specKeysParams struct{ B, K, DKey0, DStride uint32 }

type specAcceptParams struct{ B, K, DraftsAt, DraftStride uint32 }

type specRowsParams struct {
	B, K, MaxBlocks, BlockSize, StoreRow uint32
	_, _, _                              uint32
}

const specWG = 64

// SpecStateWords is the u32 words of a sequence's state in a chain of
// speculative steps (spec_accept.wgsl): L, the position its next
// verification starts at; n, the drafts accepted at its last step; its
// table rows in the target's cache and in the head's.
const SpecStateWords = 4

// PutSpecState writes a sequence's state (SpecStateWords words) into dst.
func PutSpecState(dst []uint32, L, n, targetSlot, headSlot int) {
	dst[0], dst[1], dst[2], dst[3] = uint32(L), uint32(n), uint32(targetSlot), uint32(headSlot)
}

// SpecAccept records the acceptance of a speculative step of B sequences
// of K drafts each on the device (spec_accept.wgsl): n, the drafts the
// target's tokens agree with — its greedy tokens, or a sampled row's
// outcome (SetSampleOutcome) — (sequence i's draft c at
// word draftsAt + c·draftStride + i of drafts, its verified rows'
// tokens at words i·(K+1) … of verify), moves each state on (L += n + 1,
// n) and writes the target's token at the last accepted row, the bonus,
// at word i·(K+1) of ids, where the next verification feeds it. With
// drafter (a standalone drafter's chain) it also writes the drafter's
// next first pass's ids into dids: the bonus at word i, the token before
// it (the last accepted draft, else the bonus the step began with) at
// word B + i; else dids, a buffer of its own, stays as it is.
func SpecAccept(b *gpu.Batch, state, drafts, verify, ids, dids *gpu.Buffer, drafter bool, B, K, draftsAt, draftStride int) error {
	op := "spec_accept"
	rows := uint64(B * (K + 1))
	switch {
	case B <= 0 || K <= 0 || draftsAt < 0 || draftStride < B:
		return fmt.Errorf("kernels: %s: %d sequences of %d drafts, drafts from word %d every %d", op, B, K, draftsAt, draftStride)
	case uint64(B*SpecStateWords)*4 > state.Size():
		return fmt.Errorf("kernels: %s: %d states in a %d-byte buffer", op, B, state.Size())
	case uint64(draftsAt+(K-1)*draftStride+B)*4 > drafts.Size():
		return fmt.Errorf("kernels: %s: drafts up to word %d of a %d-byte buffer", op, draftsAt+(K-1)*draftStride+B, drafts.Size())
	case rows*4 > verify.Size() || rows*4 > ids.Size():
		return fmt.Errorf("kernels: %s: %d rows of verified tokens (%d bytes) and ids (%d bytes)", op, rows, verify.Size(), ids.Size())
	case dids == nil || drafter && uint64(2*B)*4 > dids.Size():
		return fmt.Errorf("kernels: %s: %d drafter ids in a %d-byte buffer", op, 2*B, bufSize(dids))
	}
	p, err := b.Device().Pipeline(specAcceptKernel, gpu.Consts{"DRAFTER": wgslBool(drafter)})
	if err != nil {
		return err
	}
	params := &specAcceptParams{B: uint32(B), K: uint32(K), DraftsAt: uint32(draftsAt), DraftStride: uint32(draftStride)}
	binds := []gpu.Binding{state.All(), drafts.All(), verify.All(), ids.All(), dids.All()}
	if err := gpu.Dispatch(b, p, params, binds, uint32((B+specWG-1)/specWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// SpecRowsOut is where SpecRows writes: the target's rows and their
// features' pairs, the head's first pass's rows, its store pair and its
// first chained row.
type SpecRowsOut struct {
	TargetRows, TargetFeatures, HeadRows *gpu.Buffer
	HeadSave                             gpu.Binding
	HeadChain                            *gpu.Buffer
}

// SpecRows records the places of the next chained speculative step's rows
// from each of B sequences' state (spec_rows.wgsl): the target's K+1 rows
// from L on (PutRow's line rows, its cache c's table row in the state)
// and the pairs (pool row, row) that keep their features; an EAGLE-3
// head's K+1 rows from the step before's first position, L − n − 1; the
// pair (storeRow + head slot, the row of the bonus token) that keeps that
// row's output in the head's store; the head's first chained row, at L.
func SpecRows(b *gpu.Batch, state *gpu.Buffer, c *KVCache, out SpecRowsOut, B, K, storeRow int) error {
	op := "spec_rows"
	rows := B * (K + 1)
	switch {
	case B <= 0 || K <= 0 || storeRow < 0:
		return fmt.Errorf("kernels: %s: %d sequences of %d drafts, store from row %d", op, B, K, storeRow)
	case uint64(B*SpecStateWords)*4 > state.Size():
		return fmt.Errorf("kernels: %s: %d states in a %d-byte buffer", op, B, state.Size())
	case uint64(rows*RowWords)*4 > min(out.TargetRows.Size(), out.HeadRows.Size()):
		return fmt.Errorf("kernels: %s: %d rows in buffers of %d and %d bytes", op, rows, out.TargetRows.Size(), out.HeadRows.Size())
	case uint64(rows*GatherPairWords)*4 > out.TargetFeatures.Size():
		return fmt.Errorf("kernels: %s: %d feature pairs in a %d-byte buffer", op, rows, out.TargetFeatures.Size())
	case uint64(B*GatherPairWords)*4 > out.HeadSave.Size || uint64(B*RowWords)*4 > out.HeadChain.Size():
		return fmt.Errorf("kernels: %s: %d store pairs in %d bytes, chained rows in %d", op, B, out.HeadSave.Size, out.HeadChain.Size())
	}
	p, err := b.Device().Pipeline(specRowsKernel, nil)
	if err != nil {
		return err
	}
	params := &specRowsParams{B: uint32(B), K: uint32(K), MaxBlocks: uint32(c.MaxBlocks), BlockSize: uint32(c.BlockSize), StoreRow: uint32(storeRow)}
	binds := []gpu.Binding{state.All(), c.table.All(), out.TargetRows.All(), out.TargetFeatures.All(), out.HeadRows.All(), out.HeadSave, out.HeadChain.All()}
	if err := gpu.Dispatch(b, p, params, binds, uint32((rows+specWG-1)/specWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// SpecDraftRows records the rows of a chained speculative step drafted by
// a standalone drafter, from each of B sequences' state
// (spec_draft_rows.wgsl): with first, the drafter's first pass's rows —
// the bonus at L (row i), the token before it at L − 1 (row B + i) — and
// the target's K+1 verified rows from L (rows i·(K+1) … of trows); else
// the drafter's first chained row at L + 1 (row i; trows unwritten, a
// buffer of its own). PutRow's line rows, each model's table row in the
// state.
func SpecDraftRows(b *gpu.Batch, state, rows, trows *gpu.Buffer, B, K int, first bool) error {
	op := "spec_draft_rows"
	n := B
	if first {
		n = 2 * B
	}
	switch {
	case B <= 0 || K <= 0:
		return fmt.Errorf("kernels: %s: %d sequences of %d drafts", op, B, K)
	case uint64(B*SpecStateWords)*4 > state.Size():
		return fmt.Errorf("kernels: %s: %d states in a %d-byte buffer", op, B, state.Size())
	case uint64(n*RowWords)*4 > rows.Size():
		return fmt.Errorf("kernels: %s: %d rows in a %d-byte buffer", op, n, rows.Size())
	case trows == nil || first && uint64(B*(K+1)*RowWords)*4 > trows.Size():
		return fmt.Errorf("kernels: %s: %d target rows in a %d-byte buffer", op, B*(K+1), bufSize(trows))
	}
	p, err := b.Device().Pipeline(specDraftRowsKernel, gpu.Consts{"FIRST": wgslBool(first)})
	if err != nil {
		return err
	}
	binds := []gpu.Binding{state.All(), rows.All(), trows.All()}
	if err := gpu.Dispatch(b, p, &specDraftRowsParams{B: uint32(B), K: uint32(K)}, binds, uint32((B+specWG-1)/specWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// SpecKeys records the coupled keys of a chained speculative step of B
// sequences of K drafts, from each sequence's state (spec_keys.wgsl): each
// coupled row of draws (the step's verification draws, B·(K+1) rows of
// SampleDrawWords, sequence i's from i·(K+1)), whose U and V words hold
// its generation's seed words (PutSampleSeed), gets the key of the
// position it decides (sampling.Keys.At: row t of a state at L decides
// L + t + 1), and each coupled draft t < K the key of row t, in dkeys (a
// buffer of ArgmaxCoupledWords a row, draft t's B rows from word
// dkey0 + t·dstride; nil: the drafts are not coupled).
func SpecKeys(b *gpu.Batch, state *gpu.Buffer, draws gpu.Binding, dkeys *gpu.Buffer, B, K, dkey0, dstride int) error {
	op := "spec_keys"
	rows := B * (K + 1)
	switch {
	case B <= 0 || K <= 0:
		return fmt.Errorf("kernels: %s: %d sequences of %d drafts", op, B, K)
	case uint64(B*SpecStateWords)*4 > state.Size():
		return fmt.Errorf("kernels: %s: %d states in a %d-byte buffer", op, B, state.Size())
	case uint64(rows*SampleDrawWords)*4 > draws.Size:
		return fmt.Errorf("kernels: %s: %d rows' draws in %d bytes", op, rows, draws.Size)
	case dkeys != nil && (dkey0 < 0 || dstride < B*ArgmaxCoupledWords || uint64(dkey0+(K-1)*dstride+B*ArgmaxCoupledWords)*4 > dkeys.Size()):
		return fmt.Errorf("kernels: %s: %d drafts' keys from word %d, %d words apart, in a %d-byte buffer", op, K, dkey0, dstride, dkeys.Size())
	}
	p, err := b.Device().Pipeline(specKeysKernel, nil)
	if err != nil {
		return err
	}
	params := &specKeysParams{B: uint32(B), K: uint32(K), DKey0: math.MaxUint32}
	var keys gpu.Binding
	if dkeys != nil {
		params.DKey0, params.DStride, keys = uint32(dkey0), uint32(dstride), dkeys.All()
	} else {
		// Bound but unread: a buffer no other binding aliases (WebGPU
		// forbids two writable bindings of one range).
		scratch, err := b.Device().Scratch(16)
		if err != nil {
			return err
		}
		keys = scratch.Slice(0, 16)
	}
	if err := gpu.Dispatch(b, p, params, []gpu.Binding{state.All(), draws, keys}, uint32((rows+specWG-1)/specWG), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
