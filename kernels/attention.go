package kernels

import (
	"fmt"
	"math"

	"webdraft/gpu"
	"webdraft/shaders"
)

var (
	attnDecode = gpu.Kernel{
		Module: "attention_decode.wgsl", Source: shaders.AttentionDecode, Entry: "main", ParamsSize: 32,
		// q, kcache, vcache, table, seq, pos, part, out
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite},
	}
	attnMerge = gpu.Kernel{
		Module: "attention_merge.wgsl", Source: shaders.AttentionMerge, Entry: "main", ParamsSize: 16,
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // part, pos, out
	}
	attnPrefill = gpu.Kernel{
		Module: "attention_prefill.wgsl", Source: shaders.AttentionPrefill, Entry: "main", ParamsSize: 32,
		// q, kcache, vcache, table, pos, out
		Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite},
	}
)

const (
	decodeWG         = 64   // WG in attention_decode.wgsl
	decodeVB         = 8    // VB in attention_decode.wgsl: values a thread loads at once
	prefillRows      = 64   // BR in attention_prefill.wgsl: query rows a workgroup
	prefillKeys      = 32   // BC: keys a tile
	decodeMinChunk   = 64   // context positions per split, at least (fewer splits: a shorter merge)
	decodeMaxChunk   = 256  // and at most
	decodeWorkgroups = 1024 // enough workgroups to keep a large GPU busy
	decodeMergeMax   = 64   // MAXS in attention_decode.wgsl: the most splits its last split merges
	// decodeMergeMinRows is the fewest rows whose splits the last of them
	// merges. At one row the merge dispatch measured faster on the H200
	// (chained batch-1 steps 2.15 against 2.25 ms, while batch 2 went 2.24
	// → 2.19 ms; BENCHMARKS.md, tenth session).
	decodeMergeMinRows = 2
)

// KVCache is the paged key/value cache of every layer, shared by many
// sequences (see qkv_rope_kv.wgsl for the layout). The pool holds Blocks
// blocks of BlockSize positions per layer; each sequence slot has a row of
// MaxBlocks entries in Table mapping its logical blocks to pool blocks.
// Which blocks a sequence gets is the engine's business (SetBlocks).
//
//	K[l], V[l]  (blocks, kv_heads, block_size, D) f32 — or, with F16, IEEE
//	            halves packed two to a u32 — a buffer per layer
//	Table       (seqs, max_blocks) u32
//
// A buffer per layer keeps each under the device's buffer and binding
// limits however large the whole cache grows. An f16 cache halves the
// memory and the bytes attention reads, at f16 storage precision; it needs
// no shader-f16 (pack2x16float / unpack2x16float).
type KVCache struct {
	Layers, KVHeads, D, BlockSize, Blocks int
	Seqs, MaxBlocks                       int
	F16                                   bool
	K, V                                  []*gpu.Buffer // per layer
	Table                                 *gpu.Buffer
	wgMemory                              int // the device's workgroup memory, bytes
	decode                                decodeTuning

	pipes gpu.PipelineMemo[cachePipelineKey] // see pipeline
}

// decodeTuning is attention_decode.wgsl's tuning: threads a workgroup
// (WG, a power of two), the workgroups its splits should add up to at
// least, the longest split (a power of two) and the values a thread loads
// before it uses them (VB). Zero fields take the defaults, decodeWG,
// decodeWorkgroups, decodeMaxChunk and decodeVB; BenchmarkAttentionDecode
// tries others. mergeDispatch merges the splits in a dispatch of their own
// even where the last split could (gpu.Device.DeviceScopeBarrier).
type decodeTuning struct {
	wg, workgroups, maxChunk, vb int
	mergeDispatch                bool
}

func (t decodeTuning) orDefaults() decodeTuning {
	if t.wg == 0 {
		t.wg = decodeWG
	}
	if t.workgroups == 0 {
		t.workgroups = decodeWorkgroups
	}
	if t.maxChunk == 0 {
		t.maxChunk = decodeMaxChunk
	}
	if t.vb == 0 {
		t.vb = decodeVB
	}
	return t
}

// cachePipelineKey names a pipeline of a kernel over the cache by the
// constants its call sites vary.
type cachePipelineKey struct {
	module, entry string
	shape         kernelShape
}

// kernelShape is the constants a kernel over the cache is specialized by
// at its call sites (zero where a kernel has no such constant).
type kernelShape struct {
	chunk, group, wg, vb, sb int
	direct, merge            bool
}

// pipeline returns kernel k specialized by consts() — and by the cache's
// element type when withKV —, through the cache's memo, by shape.
func (c *KVCache) pipeline(d *gpu.Device, k gpu.Kernel, shape kernelShape, withKV bool, consts func() gpu.Consts) (*gpu.Pipeline, error) {
	return c.pipes.Get(d, cachePipelineKey{k.Module, k.Entry, shape}, k, func() gpu.Consts {
		if withKV {
			return c.consts(consts())
		}
		return consts()
	})
}

// NewKVCache allocates a zeroed cache (f32, or f16 when half) and an
// all-zero block table.
func NewKVCache(d *gpu.Device, layers, kvHeads, D, blockSize, blocks, seqs, maxBlocks int, half bool) (*KVCache, error) {
	c := &KVCache{Layers: layers, KVHeads: kvHeads, D: D, BlockSize: blockSize, Blocks: blocks, Seqs: seqs, MaxBlocks: maxBlocks, F16: half,
		wgMemory: int(d.Limits().MaxComputeWorkgroupStorageSize)}
	for _, v := range []int{layers, kvHeads, D, blockSize, blocks, seqs, maxBlocks} {
		if v <= 0 {
			return nil, fmt.Errorf("kernels: kv cache: non-positive size in %+v", *c)
		}
	}
	if c.layerBytes() > d.Limits().MaxStorageBufferBindingSize {
		return nil, fmt.Errorf("kernels: kv cache: a layer's %d bytes exceed one binding (%d)", c.layerBytes(), d.Limits().MaxStorageBufferBindingSize)
	}
	for l := range layers {
		for _, kv := range []struct {
			dst  *[]*gpu.Buffer
			name string
		}{{&c.K, "k"}, {&c.V, "v"}} {
			buf, err := d.NewBuffer(fmt.Sprintf("kv.%s.%d", kv.name, l), c.layerBytes())
			if err != nil {
				c.Release()
				return nil, err
			}
			*kv.dst = append(*kv.dst, buf)
		}
	}
	var err error
	if c.Table, err = d.NewBuffer("kv.table", uint64(seqs*maxBlocks)*4); err != nil {
		c.Release()
		return nil, err
	}
	return c, nil
}

// layerBytes is the size of one layer's slice of K or V.
func (c *KVCache) layerBytes() uint64 {
	return uint64(c.Blocks) * uint64(c.KVHeads*c.BlockSize*c.D) * uint64(c.ElemBytes())
}

// ElemBytes is the size of one cached value: 4 (f32) or 2 (f16).
func (c *KVCache) ElemBytes() int {
	if c.F16 {
		return 2
	}
	return 4
}

// consts specializes a KV-reading or -writing kernel for the element type.
func (c *KVCache) consts(more gpu.Consts) gpu.Consts {
	out := gpu.Consts{"KV_F16": 0}
	if c.F16 {
		out["KV_F16"] = 1
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// layer binds layer l of K and of V.
func (c *KVCache) layer(l int) (k, v gpu.Binding) { return c.K[l].All(), c.V[l].All() }

// SetBlocks writes sequence slot seq's block table: its logical block i is
// pool block blocks[i]. It is ordered before the next submitted batch.
func (c *KVCache) SetBlocks(seq int, blocks []uint32) error {
	if seq < 0 || seq >= c.Seqs || len(blocks) > c.MaxBlocks {
		return fmt.Errorf("kernels: kv cache: slot %d with %d blocks (have %d slots of %d)", seq, len(blocks), c.Seqs, c.MaxBlocks)
	}
	for i, b := range blocks {
		if int(b) >= c.Blocks {
			return fmt.Errorf("kernels: kv cache: slot %d block %d is %d, pool has %d", seq, i, b, c.Blocks)
		}
	}
	return c.Table.WriteU32(uint64(seq*c.MaxBlocks)*4, blocks)
}

// Release frees the cache's buffers.
func (c *KVCache) Release() {
	for _, b := range append(append([]*gpu.Buffer{c.Table}, c.K...), c.V...) {
		if b != nil {
			b.Release()
		}
	}
}

// checkRows checks the per-row buffers shared by the attention kernels.
func (c *KVCache) checkRows(op string, layer, T int, rows map[string]*gpu.Buffer) error {
	if c == nil {
		return fmt.Errorf("kernels: %s: nil cache", op)
	}
	if layer < 0 || layer >= c.Layers || T <= 0 {
		return fmt.Errorf("kernels: %s: layer %d of %d, T = %d", op, layer, c.Layers, T)
	}
	for name, buf := range rows {
		if err := need(op, name, buf, T); err != nil {
			return err
		}
	}
	return nil
}

// attentionScale is 1/sqrt(D) as reference.Attention computes it.
func attentionScale(D int) uint32 { return math.Float32bits(float32(1 / math.Sqrt(float64(D)))) }

// checkHeads checks the head layout for attention over c.
func (c *KVCache) checkHeads(op string, heads int) error {
	if heads <= 0 || heads%c.KVHeads != 0 {
		return fmt.Errorf("kernels: %s: %d query heads for %d kv heads", op, heads, c.KVHeads)
	}
	return nil
}

// DecodeSplits is the number of splits AttentionDecode uses for T rows of
// heads query heads with contexts of up to maxLen positions.
func (c *KVCache) DecodeSplits(T, heads, maxLen int) int {
	chunk := c.decodeChunk(T, heads, maxLen)
	return (maxLen + chunk - 1) / chunk
}

// DecodeScratch is the number of f32 values of partial results
// AttentionDecode keeps in one of the device's scratch buffers, for T rows
// of heads query heads and contexts of up to maxLen positions: (T, heads,
// splits, D + 2).
func (c *KVCache) DecodeScratch(T, heads, maxLen int) int {
	return T * heads * c.DecodeSplits(T, heads, maxLen) * (c.D + 2)
}

// decodeChunk is the context positions per split: the longest power of two
// (64 … 256) that still gives about decodeWorkgroups workgroups — a
// workgroup per kv head, split and row — so that a single sequence's
// decode spreads over the whole GPU while a large batch keeps merges few,
// and whose workgroup memory the device has.
func (c *KVCache) decodeChunk(T, heads, maxLen int) int {
	tune := c.decode.orDefaults()
	chunk := tune.maxChunk
	for chunk > decodeMinChunk && (c.KVHeads*T*((maxLen+chunk-1)/chunk) < tune.workgroups ||
		c.decodeMemory(heads, chunk, false) > c.wgMemory) {
		chunk /= 2
	}
	return chunk
}

// decodeMemory is attention_decode.wgsl's workgroup memory in bytes: the
// group's queries and value sums (GROUP·D each), scores (GROUP·CHUNK), key
// offsets (CHUNK), the reductions (GROUP·WG and GROUP·WG/16) and MERGE's
// m and l of each split (2·GROUP·MAXS; MAXS = 1 without MERGE) and its
// flag.
func (c *KVCache) decodeMemory(heads, chunk int, merge bool) int {
	group, wg := heads/c.KVHeads, c.decode.orDefaults().wg
	maxs := 1
	if merge {
		maxs = decodeMergeMax
	}
	return 4 * (2*group*c.D + group*chunk + chunk + group*wg + group*wg/16 + 2*group*maxs + 1)
}

// lastSplitMerges reports whether AttentionDecode's last split merges the
// splits of T rows (no merge dispatch): where the device orders storage
// device-wide, the rows are enough, the splits more than one and few
// enough, and the workgroup memory holds their m and l.
func (c *KVCache) lastSplitMerges(d *gpu.Device, T, heads, maxLen int) bool {
	splits := c.DecodeSplits(T, heads, maxLen)
	return d.DeviceScopeBarrier() && !c.decode.mergeDispatch && T >= decodeMergeMinRows && splits > 1 && splits <= decodeMergeMax &&
		c.decodeMemory(heads, c.decodeChunk(T, heads, maxLen), true) <= c.wgMemory
}

// AttentionDecode records causal GQA attention for T single query rows,
// each of its own sequence slot and position, over layer's cache — split
// over the context, then merged:
//
//	q        (T, heads, D) f32, after q_norm and RoPE
//	seq, pos (T) u32: row t attends to positions 0 … pos[t] of slot seq[t]
//	maxLen   ≥ pos[t]+1 for every row (a row beyond it comes out NaN)
//	out      (T, heads, D) f32
//
// It is one dispatch when a single split covers maxLen, or when the last
// split to finish can merge them (gpu.Device.DeviceScopeBarrier, at least
// decodeMergeMinRows rows, at most decodeMergeMax splits); else a second
// dispatch merges. The splits' partial results pass through the device's
// scratch buffers (gpu.Device.CountedScratch or Scratch, c.DecodeScratch
// values). The rows' own keys and values must already be in the cache
// (QKVRopeKV).
func AttentionDecode(b *gpu.Batch, out, q *gpu.Buffer, c *KVCache, layer int, seq, pos *gpu.Buffer, T, heads, maxLen int) error {
	op := "attention_decode"
	if err := c.checkRows(op, layer, T, map[string]*gpu.Buffer{"seq": seq, "pos": pos}); err != nil {
		return err
	}
	if err := c.checkHeads(op, heads); err != nil {
		return err
	}
	tune := c.decode.orDefaults()
	wg := tune.wg
	if c.D%8 != 0 || c.D/8 > wg {
		return fmt.Errorf("kernels: %s: head_dim %d: want a multiple of 8, at most %d", op, c.D, 8*wg)
	}
	if wg < 16 || wg&(wg-1) != 0 || tune.vb < 1 {
		return fmt.Errorf("kernels: %s: tuning %+v: want a power-of-two workgroup of at least 16 threads and VB ≥ 1", op, tune)
	}
	if maxLen <= 0 {
		return fmt.Errorf("kernels: %s: maxLen = %d", op, maxLen)
	}
	n := T * heads * c.D
	chunk := c.decodeChunk(T, heads, maxLen)
	splits := c.DecodeSplits(T, heads, maxLen)
	for _, x := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"q", q, n}, {"out", out, n}} {
		if err := need(op, x.name, x.buf, x.n); err != nil {
			return err
		}
	}
	d := b.Device()
	group := heads / c.KVHeads
	direct := splits == 1 // one split: no merge, the kernel writes out itself
	merge := c.lastSplitMerges(d, T, heads, maxLen)
	if err := c.checkWorkgroupMemory(d, op, c.decodeMemory(heads, chunk, merge)); err != nil {
		return err
	}
	maxs := uint32(1)
	if merge {
		maxs = decodeMergeMax
	}
	split, err := c.pipeline(d, attnDecode, kernelShape{chunk: chunk, group: group, wg: wg, vb: tune.vb, direct: direct, merge: merge}, true, func() gpu.Consts {
		return gpu.Consts{"D": uint32(c.D), "CHUNK": uint32(chunk), "GROUP": uint32(group), "WG": uint32(wg), "VB": uint32(tune.vb),
			"DIRECT": wgslBool(direct), "MERGE": wgslBool(merge), "MAXS": maxs}
	})
	if err != nil {
		return err
	}
	// The partials: after T·kv_heads arrival counts with merge.
	partBytes := uint64(c.DecodeScratch(T, heads, maxLen)) * 4
	var scratch *gpu.Buffer
	var part0 uint64
	if merge {
		scratch, part0, err = d.CountedScratch(T*c.KVHeads, partBytes)
	} else {
		scratch, err = d.Scratch(partBytes)
	}
	if err != nil {
		return err
	}
	kc, vc := c.layer(layer)
	rows := uint64(T) * 4
	params := []uint32{uint32(T), uint32(heads), uint32(c.KVHeads), uint32(c.BlockSize), uint32(c.MaxBlocks), uint32(splits), attentionScale(c.D), uint32(part0 / 4)}
	part := scratch.Slice(0, part0+partBytes)
	binds := []gpu.Binding{q.Slice(0, uint64(n)*4), kc, vc, c.Table.All(), seq.Slice(0, rows), pos.Slice(0, rows), part, out.Slice(0, uint64(n)*4)}
	if err := b.Dispatch(split, params, binds, uint32(c.KVHeads), uint32(splits), uint32(T)); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	if direct || merge {
		return nil
	}
	mergePipe, err := c.pipeline(d, attnMerge, kernelShape{chunk: chunk}, false, func() gpu.Consts {
		return gpu.Consts{"D": uint32(c.D), "CHUNK": uint32(chunk)}
	})
	if err != nil {
		return err
	}
	binds = []gpu.Binding{part, pos.Slice(0, rows), out.Slice(0, uint64(n)*4)}
	if err := b.Dispatch(mergePipe, []uint32{uint32(T), uint32(heads), uint32(splits), 0}, binds, uint32(heads), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: merge: %w", op, err)
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

// AttentionPrefill records causal GQA attention for the T query rows
// row0 … row0+T-1 (one sequence's part of a batch) over layer's cache, tiled:
//
//	q    (row0+T, heads, D) f32, after q_norm and RoPE
//	pos  (row0+T) u32: row t attends to positions 0 … pos[t] of slot seq
//	out  (row0+T, heads, D) f32; only the T rows are written
//
// Every position up to the largest pos, the rows' own included, must be in
// the cache (QKVRopeKV). The cache must be PrefillSupported.
func AttentionPrefill(b *gpu.Batch, out, q *gpu.Buffer, c *KVCache, layer, seq int, pos *gpu.Buffer, row0, T, heads int) error {
	op := "attention_prefill"
	if row0 < 0 {
		return fmt.Errorf("kernels: %s: row0 = %d", op, row0)
	}
	if err := c.checkRows(op, layer, row0+T, map[string]*gpu.Buffer{"pos": pos}); err != nil {
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
	// The memo's chunk key holds both chunks (each < 2¹⁶).
	p, err := c.pipeline(b.Device(), attnPrefill, kernelShape{chunk: ch.dk<<16 | ch.dv, group: group}, true, func() gpu.Consts {
		return gpu.Consts{"D": uint32(c.D), "DK": uint32(ch.dk), "DV": uint32(ch.dv), "KVS": uint32(ch.kvs()), "GROUP": uint32(group)}
	})
	if err != nil {
		return err
	}
	kc, vc := c.layer(layer)
	params := []uint32{uint32(T), uint32(heads), uint32(c.KVHeads), uint32(c.BlockSize), uint32(c.MaxBlocks), uint32(seq), attentionScale(c.D), uint32(row0)}
	binds := []gpu.Binding{q.Slice(0, uint64(n)*4), kc, vc, c.Table.All(), pos.Slice(0, uint64(row0+T)*4), out.Slice(0, uint64(n)*4)}
	if err := b.Dispatch(p, params, binds, uint32(c.KVHeads), divCeil(T*group, prefillRows), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// checkWorkgroupMemory reports a kernel whose workgroup memory (bytes, for
// this head_dim) exceeds the device's limit, before WGSL compilation would.
func (c *KVCache) checkWorkgroupMemory(d *gpu.Device, op string, bytes int) error {
	if lim := d.Limits().MaxComputeWorkgroupStorageSize; uint32(bytes) > lim {
		return fmt.Errorf("kernels: %s: head_dim %d needs %d bytes of workgroup memory, the device allows %d", op, c.D, bytes, lim)
	}
	return nil
}

// wgslBool is a boolean WGSL constant's value.
func wgslBool(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
