package kernels

import (
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	attnDecode = gpu.Kernel{
		Module: "attention_decode.wgsl", Source: shaders.AttentionDecode, Entry: "main", Params: reflect.TypeFor[attentionDecodeParams](),
		// q (or q|k|v rows), kcache, vcache, table, rows, part, out, consts
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadOnly},
	}
	attnMerge = gpu.Kernel{
		Module: "attention_merge.wgsl", Source: shaders.AttentionMerge, Entry: "main", Params: reflect.TypeFor[attentionMergeParams](),
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // part, rows, out
	}
	attnPrefill = gpu.Kernel{
		Module: "attention_prefill.wgsl", Source: shaders.AttentionPrefill, Entry: "main", Params: reflect.TypeFor[attentionPrefillParams](),
		// q, kcache, vcache, table, rows, out
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite},
	}
)

// attentionDecodeParams are attention_decode.wgsl's params.
type attentionDecodeParams struct {
	T, Heads, KVHeads, BS, MaxBlocks, Splits uint32
	Scale                                    float32
	Part0                                    uint32
	Eps                                      float32
	QKNorm                                   uint32
	_, _                                     uint32
}

// attentionMergeParams are attention_merge.wgsl's params.
type attentionMergeParams struct{ T, Heads, Splits, _ uint32 }

// attentionPrefillParams are attention_prefill.wgsl's params.
type attentionPrefillParams struct {
	T, Heads, KVHeads, BS, MaxBlocks, Seq uint32
	Scale                                 float32
	Row0                                  uint32
}

// The attention kernels' limits.
const (
	prefillRows    = 64 // BR in attention_prefill.wgsl: query rows a workgroup
	prefillKeys    = 32 // BC: keys a tile
	decodeMinChunk = 16 // context positions per split, at least (a tuning's minChunk is 16 … maxChunk)
	decodeMergeMax = 64 // MAXS in attention_decode.wgsl: the most splits its last split merges
)

// decodeTuning is attention_decode.wgsl's tuning: threads a workgroup (wg,
// a power of two), the workgroups its splits should add up to at least,
// the longest and the shortest split (powers of two; the shortest 64 when
// minChunk is 0), the values a thread loads before it
// uses them (vb), and the fewest rows whose splits the last split merges
// (where the device orders storage device-wide) instead of a merge
// dispatch; mergeDispatch merges in a dispatch of its own always.
// directMaxGrid > 0: fewer rows than mergeMinRows whose context one split
// of maxChunk covers take that one split, no merge dispatch, where their
// splits at the shortest length would make at most directMaxGrid
// workgroups — a grid too small to fill the GPU whichever way it is cut
// (a small model's few kv heads), where the merge dispatch costs more than
// the longer split.
type decodeTuning struct {
	wg, workgroups, maxChunk, minChunk, vb int
	mergeMinRows                           int
	mergeDispatch                          bool
	directMaxGrid                          int
}

// attentionScale is 1/sqrt(D) as reference.Attention computes it.
func attentionScale(D int) float32 { return float32(1 / math.Sqrt(float64(D))) }

// decodeSplits is the number of splits attention_decode.wgsl uses at tune
// for T rows of heads query heads with contexts of up to maxLen positions.
func (c *KVCache) decodeSplits(T, heads, maxLen int, tune decodeTuning) int {
	chunk := c.decodeChunk(T, heads, maxLen, tune)
	return (maxLen + chunk - 1) / chunk
}

// decodeScratch is the number of f32 values of partial results
// attention_decode.wgsl keeps in one of the device's scratch buffers at
// tune, for T rows of heads query heads and contexts of up to maxLen
// positions: (T, heads, splits, D + 4): o, m, l and two words that keep
// each split's o 16-byte aligned.
func (c *KVCache) decodeScratch(T, heads, maxLen int, tune decodeTuning) int {
	return T * heads * c.decodeSplits(T, heads, maxLen, tune) * (c.D + 4)
}

// leastChunk is the shortest split tune allows: minChunk, 64 when unset
// (the fewer splits, the shorter the merge).
func (tune decodeTuning) leastChunk() int {
	if tune.minChunk == 0 {
		return 64
	}
	return tune.minChunk
}

// decodeChunk is the context positions per split: the longest power of two
// (tune.leastChunk() … tune.maxChunk) that still gives about tune.workgroups
// workgroups — a workgroup per kv head, split and row — so that a single
// sequence's decode spreads over the whole GPU while a large batch keeps
// merges few, and whose workgroup memory the device has; or, for a grid
// too small to fill the GPU, the one split that saves the merge dispatch
// (tune.directMaxGrid).
func (c *KVCache) decodeChunk(T, heads, maxLen int, tune decodeTuning) int {
	chunk := tune.maxChunk
	least := tune.leastChunk()
	if tune.directMaxGrid > 0 && maxLen <= chunk && T < tune.mergeMinRows &&
		c.KVHeads*T*((maxLen+least-1)/least) <= tune.directMaxGrid && c.decodeMemory(heads, chunk, false, tune) <= c.wgMemory {
		return chunk
	}
	for chunk > tune.leastChunk() && (c.KVHeads*T*((maxLen+chunk-1)/chunk) < tune.workgroups ||
		c.decodeMemory(heads, chunk, false, tune) > c.wgMemory) {
		chunk /= 2
	}
	return chunk
}

// decodeMemory is attention_decode.wgsl's workgroup memory in bytes: the
// group's queries and value sums (GROUP·D each), scores (GROUP·CHUNK), key
// offsets (CHUNK), the reductions (GROUP·WG and GROUP·WG/16), MERGE's
// m and l of each split (2·GROUP·MAXS; MAXS = 1 without MERGE) and its
// flag, and INPUT's new key and value (one word without INPUT:
// decodeInputMemory adds the rest).
func (c *KVCache) decodeMemory(heads, chunk int, merge bool, tune decodeTuning) int {
	group, wg := heads/c.KVHeads, tune.wg
	maxs := 1
	if merge {
		maxs = decodeMergeMax
	}
	return 4 * (2*group*c.D + group*chunk + chunk + group*wg + group*wg/16 + 2*group*maxs + 1 + 1)
}

// decodeInputMemory is the workgroup memory INPUT adds to decodeMemory's:
// the row's new key and value.
func (c *KVCache) decodeInputMemory() int { return 4 * (2*c.D - 1) }

// decodeInputFits reports whether attention_decode.wgsl's INPUT at shape
// fits the workgroup memory.
func (c *KVCache) decodeInputFits(heads int, shape DecodeShape, tune decodeTuning) bool {
	return c.decodeMemory(heads, shape.chunk, shape.merge, tune)+c.decodeInputMemory() <= c.wgMemory
}

// lastSplitMerges reports whether attention_decode.wgsl's last split
// merges the splits of T rows (no merge dispatch): where the device orders
// storage device-wide, the rows are enough, the splits more than one and
// few enough, and the workgroup memory holds their m and l.
func (c *KVCache) lastSplitMerges(d *gpu.Device, T, heads, maxLen int, tune decodeTuning) bool {
	splits := c.decodeSplits(T, heads, maxLen, tune)
	return d.DeviceScopeBarrier() && !tune.mergeDispatch && T >= tune.mergeMinRows && splits > 1 && splits <= decodeMergeMax &&
		c.decodeMemory(heads, c.decodeChunk(T, heads, maxLen, tune), true, tune) <= c.wgMemory
}

// DecodeShape is all that AttentionDecode's dispatches take from maxLen:
// calls for the same T rows and heads whose maxLen give equal shapes record
// the same dispatches with the same params, so an engine may replay one
// recording for the other (gpu.Recording).
type DecodeShape struct {
	chunk, splits int
	merge         bool
}

// DecodeShapeOf is the DecodeShape of AttentionDecode(…, T, heads, maxLen)
// on device d.
func (c *KVCache) DecodeShapeOf(d *gpu.Device, T, heads, maxLen int) DecodeShape {
	return c.decodeShape(d, T, heads, maxLen, planFor(d).decode)
}

// decodeShape is the DecodeShape at tuning tune.
func (c *KVCache) decodeShape(d *gpu.Device, T, heads, maxLen int, tune decodeTuning) DecodeShape {
	return DecodeShape{chunk: c.decodeChunk(T, heads, maxLen, tune), splits: c.decodeSplits(T, heads, maxLen, tune),
		merge: c.lastSplitMerges(d, T, heads, maxLen, tune)}
}

// AttentionDecode records GQA attention for T single query rows, each of
// its own sequence, slot and mask, over layer's cache — split over the
// context, then merged:
//
//	q       (T, heads, D) f32, after q_norm and RoPE
//	rows    (T, RowWords) u32 (PutRow): row t attends to the slots
//	        0 … slot of its sequence that its mask leaves visible — all
//	        of them for a line token, the line and its ancestors for a
//	        token-tree node
//	maxLen  ≥ slot+1 for every row (a row beyond it comes out NaN)
//	out     (T, heads, D) f32
//
// It is one dispatch when a single split covers maxLen, or when the last
// split to finish can merge them (gpu.Device.DeviceScopeBarrier, rows
// enough, at most decodeMergeMax splits); else a second dispatch merges.
// The splits' partial results pass through the device's scratch buffers
// (gpu.Device.CountedScratch or Scratch). The rows' own keys and values
// must already be in the cache (QKVProjRopeKV). The adapter's plan tunes
// it.
func AttentionDecode(b *gpu.Batch, out, q *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads, maxLen int) error {
	return attentionDecode(b, out, q, c, layer, rows, T, heads, maxLen, planFor(b.Device()).decode, nil)
}

// decodeInput is what attention_decode.wgsl's INPUT reads beside the q|k|v
// rows: UploadQKNormRope's consts and the norms' epsilon.
type decodeInput struct {
	consts *gpu.Buffer
	eps    float64
}

// attentionDecode is AttentionDecode at tuning tune (tests and benchmarks
// try others); with in, q holds the rows' q|k|v as the projection left
// them and the kernel does qkv_rope_kv.wgsl's work too (INPUT), for rows
// none of which sees another's new slot.
func attentionDecode(b *gpu.Batch, out, q *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads, maxLen int, tune decodeTuning, in *decodeInput) error {
	left, err := attentionSplits(b, out, q, c, layer, rows, T, heads, maxLen, tune, in)
	if err != nil || left == nil {
		return err
	}
	return left.record(b, out)
}

// decodeSplits is attention_decode.wgsl's splits left to merge: (T, heads,
// splits, D + 4) f32 partials in part, for attention_merge.wgsl's dispatch
// (record) or a kernel that merges them as it reads them
// (matvec_batch_int4.wgsl's MERGE).
type decodeSplits struct {
	part, rows          gpu.Binding
	pipe                *gpu.Pipeline // attention_merge.wgsl's
	T, heads, splits, D int
}

// record records attention_merge.wgsl: out (T, heads, D) from the splits.
func (s *decodeSplits) record(b *gpu.Batch, out *gpu.Buffer) error {
	binds := []gpu.Binding{s.part, s.rows, out.Slice(0, uint64(s.T*s.heads*s.D)*4)}
	mp := &attentionMergeParams{T: uint32(s.T), Heads: uint32(s.heads), Splits: uint32(s.splits)}
	if err := gpu.Dispatch(b, s.pipe, mp, binds, uint32(s.heads), uint32(s.T), 1); err != nil {
		return fmt.Errorf("kernels: attention_decode: merge: %w", err)
	}
	return nil
}

// check reports whether w's input is T rows of the merged splits.
func (s *decodeSplits) check(op string, w *Matrix, T int) error {
	if s.T != T || s.heads*s.D != w.K || s.D%4 != 0 {
		return fmt.Errorf("kernels: %s: %d rows of %d attention heads of %d: want %d rows of %d inputs", op, s.T, s.heads, s.D, T, w.K)
	}
	return nil
}

// attentionSplits records attention_decode.wgsl as attentionDecode does,
// and returns its splits where they are left to merge (more than one,
// none merging in the dispatch); else nil, out written.
func attentionSplits(b *gpu.Batch, out, q *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads, maxLen int, tune decodeTuning, in *decodeInput) (*decodeSplits, error) {
	op := "attention_decode"
	if err := c.checkRows(op, layer, T, rows); err != nil {
		return nil, err
	}
	if err := c.checkHeads(op, heads); err != nil {
		return nil, err
	}
	wg := tune.wg
	if c.D%8 != 0 || c.D/8 > wg {
		return nil, fmt.Errorf("kernels: %s: head_dim %d: want a multiple of 8, at most %d", op, c.D, 8*wg)
	}
	least := tune.leastChunk()
	if wg < 16 || wg&(wg-1) != 0 || tune.vb < 1 || least < decodeMinChunk || least&(least-1) != 0 || tune.maxChunk < least {
		return nil, fmt.Errorf("kernels: %s: tuning %+v: want a power-of-two workgroup of at least 16 threads, VB ≥ 1 and splits of %d positions or more, powers of two", op, tune, decodeMinChunk)
	}
	if maxLen <= 0 {
		return nil, fmt.Errorf("kernels: %s: maxLen = %d", op, maxLen)
	}
	n, qn := T*heads*c.D, T*heads*c.D
	qName, memory := "q", 0
	if in != nil {
		qn, qName, memory = T*(heads+2*c.KVHeads)*c.D, "qkv", c.decodeInputMemory()
		if in.consts == nil || in.consts.Size() < uint64(qkNormRopeLen(c.D))*4 {
			return nil, fmt.Errorf("kernels: %s: q_norm, k_norm and RoPE's frequencies: want %d values (UploadQKNormRope)", op, qkNormRopeLen(c.D))
		}
	}
	d := b.Device()
	shape := c.decodeShape(d, T, heads, maxLen, tune)
	chunk, splits, merge := shape.chunk, shape.splits, shape.merge
	for _, x := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{qName, q, qn}, {"out", out, n}} {
		if err := need(op, x.name, x.buf, x.n); err != nil {
			return nil, err
		}
	}
	direct := splits == 1 // one split: no merge, the kernel writes out itself
	if err := c.checkWorkgroupMemory(d, op, c.decodeMemory(heads, chunk, merge, tune)+memory); err != nil {
		return nil, err
	}
	split, mergePipe, err := c.decodePipelines(d, shape, heads, tune, in != nil)
	if err != nil {
		return nil, err
	}
	// The partials: after T·kv_heads arrival counts with merge.
	partBytes := uint64(c.decodeScratch(T, heads, maxLen, tune)) * 4
	var scratch *gpu.Buffer
	var part0 uint64
	if merge {
		scratch, part0, err = d.CountedScratch(T*c.KVHeads, partBytes)
	} else {
		scratch, err = d.Scratch(partBytes)
	}
	if err != nil {
		return nil, err
	}
	kc, vc := c.layer(layer)
	rowBinding := rows.Slice(0, uint64(T*RowWords)*4)
	params := &attentionDecodeParams{T: uint32(T), Heads: uint32(heads), KVHeads: uint32(c.KVHeads), BS: uint32(c.BlockSize),
		MaxBlocks: uint32(c.MaxBlocks), Splits: uint32(splits), Scale: attentionScale(c.D), Part0: uint32(part0 / 4)}
	consts := c.table.All() // unread without INPUT
	if in != nil {
		params.Eps, params.QKNorm, consts = float32(in.eps), 1, in.consts.Slice(0, uint64(qkNormRopeLen(c.D))*4)
	}
	part := scratch.Slice(0, part0+partBytes)
	binds := []gpu.Binding{q.Slice(0, uint64(qn)*4), kc, vc, c.table.All(), rowBinding, part, out.Slice(0, uint64(n)*4), consts}
	if err := gpu.Dispatch(b, split, params, binds, uint32(c.KVHeads), uint32(splits), uint32(T)); err != nil {
		return nil, fmt.Errorf("kernels: %s: %w", op, err)
	}
	if direct || merge {
		return nil, nil
	}
	return &decodeSplits{part: scratch.Slice(0, partBytes), rows: rowBinding, pipe: mergePipe, T: T, heads: heads, splits: splits, D: c.D}, nil
}

// decodePipelines returns attention_decode.wgsl's pipeline for shape (with
// input, its INPUT) and, where its splits leave the merge to a dispatch of
// its own (more than one split, none merging), attention_merge.wgsl's
// (else nil).
func (c *KVCache) decodePipelines(d *gpu.Device, shape DecodeShape, heads int, tune decodeTuning, input bool) (split, merge *gpu.Pipeline, err error) {
	group, wg, direct := heads/c.KVHeads, tune.wg, shape.splits == 1
	maxs := uint32(1)
	if shape.merge {
		maxs = decodeMergeMax
	}
	split, err = c.pipeline(d, attnDecode, kernelShape{chunk: shape.chunk, group: group, wg: wg, vb: tune.vb, direct: direct, merge: shape.merge, input: input}, true, func() gpu.Consts {
		return gpu.Consts{"D": uint32(c.D), "CHUNK": uint32(shape.chunk), "GROUP": uint32(group), "WG": uint32(wg), "VB": uint32(tune.vb),
			"DIRECT": wgslBool(direct), "MERGE": wgslBool(shape.merge), "MAXS": maxs, "INPUT": wgslBool(input)}
	})
	if err != nil || direct || shape.merge {
		return split, nil, err
	}
	merge, err = c.pipeline(d, attnMerge, kernelShape{chunk: shape.chunk}, false, func() gpu.Consts {
		return gpu.Consts{"D": uint32(c.D), "CHUNK": uint32(shape.chunk)}
	})
	return split, merge, err
}

// PrepareAttention builds on d every pipeline AttentionDecode (and one
// row's AttentionBlockDecode) would build for 1…maxT rows of heads query
// heads over contexts of 1…maxLen positions, and AttentionPrefill's,
// dispatching nothing. Which split
// length a decode pass takes, and whether its splits merge apart, depend
// on its rows and its longest context, so a generation that grows or a
// batch that changes meets new ones, and a pipeline the driver first
// builds mid-generation stalls that step by tens of milliseconds on a GPU.
// The shapes change only where a context passes a multiple of the
// shortest split, so only those lengths are tried.
func (c *KVCache) PrepareAttention(d *gpu.Device, heads, maxT, maxLen int) error {
	const op = "attention: prepare"
	if err := c.checkHeads(op, heads); err != nil {
		return err
	}
	if ch, ok := c.prefillChunks(); ok {
		if _, err := c.prefillPipeline(d, ch, heads/c.KVHeads); err != nil {
			return fmt.Errorf("kernels: %s: prefill: %w", op, err)
		}
	}
	tune := planFor(d).decode
	least := tune.leastChunk()
	seen := map[DecodeShape]bool{}
	for T := 1; T <= maxT; T++ {
		for n := 1; n <= maxLen; {
			shape := c.decodeShape(d, T, heads, n, tune)
			// The split count varies with n; the pipelines do not.
			key := DecodeShape{chunk: shape.chunk, splits: min(shape.splits, 2), merge: shape.merge}
			if !seen[key] {
				seen[key] = true
				if err := c.checkWorkgroupMemory(d, op, c.decodeMemory(heads, shape.chunk, shape.merge, tune)); err != nil {
					return err
				}
				inputs := []bool{false}
				if T == 1 && planFor(d).attentionInput && c.decodeInputFits(heads, shape, tune) { // AttentionBlockDecode's
					inputs = append(inputs, true)
				}
				for _, input := range inputs {
					if _, _, err := c.decodePipelines(d, shape, heads, tune, input); err != nil {
						return fmt.Errorf("kernels: %s: %d rows, %d positions: %w", op, T, n, err)
					}
				}
			}
			// 1, least, least + 1, 2·least, 2·least + 1, …
			if n%least == 0 {
				n++
			} else {
				n = (n/least + 1) * least
			}
		}
	}
	return nil
}

// PrefillSupported reports whether AttentionPrefill handles this cache's
// head_dim (a multiple of 32, whose staging fits the device's workgroup
// memory); AttentionDecode handles any, row by row.
func (c *KVCache) PrefillSupported() bool {
	_, ok := c.prefillChunks()
	return ok
}

// prefillChunks returns attention_prefill.wgsl's staging chunks for this
// cache's head_dim and device: the inputs of the queries and keys (DK, a
// multiple of 8) and of the values (DV, of 32) staged at a time, each
// dividing head_dim — the values whole where they fit (their chunk loop
// indexes each thread's output registers), then the longest query/key
// chunk that fits.
func (c *KVCache) prefillChunks() (prefillChunks, bool) {
	if c.D%32 != 0 {
		return prefillChunks{}, false
	}
	for dv := c.D; dv >= 32; dv -= 32 {
		for dk := c.D; dk >= 8; dk -= 8 {
			ch := prefillChunks{dk: dk, dv: dv}
			if c.D%dv == 0 && c.D%dk == 0 && ch.memory() <= c.wgMemory {
				return ch, true
			}
		}
	}
	return prefillChunks{}, false
}

// prefillChunks is attention_prefill.wgsl's DK and DV.
type prefillChunks struct{ dk, dv int }

// kvs is the vec4s of the staged keys or values (KVS).
func (ch prefillChunks) kvs() int { return max(ch.dk*prefillKeys, prefillKeys*ch.dv) / 4 }

// memory is the kernel's workgroup memory in bytes: staged queries, keys
// or values, and scores.
func (ch prefillChunks) memory() int {
	return 4 * (ch.dk*prefillRows + 4*ch.kvs() + prefillRows*prefillKeys)
}

// AttentionPrefill records GQA attention for the T query rows
// row0 … row0+T-1 (one sequence's part of a batch, its table row seq) over
// layer's cache, tiled:
//
//	q     (row0+T, heads, D) f32, after q_norm and RoPE
//	rows  (row0+T, RowWords) u32 (PutRow): row t attends to the slots
//	      0 … slot of the sequence its mask leaves visible (causal for a
//	      line token, the line and its ancestors for a token-tree node)
//	out   (row0+T, heads, D) f32; only the T rows are written
//
// Every slot up to the largest, the rows' own included, must be in the
// cache (QKVProjRopeKV). The cache must be PrefillSupported.
func AttentionPrefill(b *gpu.Batch, out, q *gpu.Buffer, c *KVCache, layer, seq int, rows *gpu.Buffer, row0, T, heads int) error {
	op := "attention_prefill"
	if row0 < 0 {
		return fmt.Errorf("kernels: %s: row0 = %d", op, row0)
	}
	if err := c.checkRows(op, layer, row0+T, rows); err != nil {
		return err
	}
	if err := c.checkHeads(op, heads); err != nil {
		return err
	}
	ch, ok := c.prefillChunks()
	if seq < 0 || seq >= c.Seqs || !ok {
		return fmt.Errorf("kernels: %s: slot %d of %d, head_dim %d (need a multiple of 32 whose tiles fit %d bytes of workgroup memory)", op, seq, c.Seqs, c.D, c.wgMemory)
	}
	n := (row0 + T) * heads * c.D
	if err := need(op, "q", q, n); err != nil {
		return err
	}
	if err := need(op, "out", out, n); err != nil {
		return err
	}
	group := heads / c.KVHeads
	p, err := c.prefillPipeline(b.Device(), ch, group)
	if err != nil {
		return err
	}
	kc, vc := c.layer(layer)
	params := &attentionPrefillParams{T: uint32(T), Heads: uint32(heads), KVHeads: uint32(c.KVHeads), BS: uint32(c.BlockSize),
		MaxBlocks: uint32(c.MaxBlocks), Seq: uint32(seq), Scale: attentionScale(c.D), Row0: uint32(row0)}
	binds := []gpu.Binding{q.Slice(0, uint64(n)*4), kc, vc, c.table.All(), rows.Slice(0, uint64((row0+T)*RowWords)*4), out.Slice(0, uint64(n)*4)}
	if err := gpu.Dispatch(b, p, params, binds, uint32(c.KVHeads), divCeil(T*group, prefillRows), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// prefillPipeline returns attention_prefill.wgsl's pipeline for chunks ch
// and group query heads a kv head.
func (c *KVCache) prefillPipeline(d *gpu.Device, ch prefillChunks, group int) (*gpu.Pipeline, error) {
	// The memo's chunk key holds both chunks (each < 2¹⁶).
	return c.pipeline(d, attnPrefill, kernelShape{chunk: ch.dk<<16 | ch.dv, group: group}, true, func() gpu.Consts {
		return gpu.Consts{"D": uint32(c.D), "DK": uint32(ch.dk), "DV": uint32(ch.dv), "KVS": uint32(ch.kvs()), "GROUP": uint32(group)}
	})
}
