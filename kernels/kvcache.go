package kernels

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"webdraft/gpu"
	"webdraft/treemask"
)

// KVCache is the paged key/value cache of every layer, shared by the
// sequences of one engine, and the one owner of everything about it: its
// buffers, the pool of blocks, each sequence's block table, and how a
// sequence grows, rolls back and ends. The pool holds Blocks blocks of
// BlockSize positions per layer; each sequence has a slot, a row of
// MaxBlocks entries of the table mapping its logical blocks to pool blocks
// (qkv_rope_kv.wgsl documents the layout):
//
//	k[l], v[l]  (blocks, kv_heads, block_size, D) f32 — or, with F16, IEEE
//	            halves packed two to a u32 — a buffer per layer
//	table       (seqs, max_blocks) u32
//
// A buffer per layer keeps each under the device's buffer and binding
// limits however large the whole cache grows. An f16 cache halves the
// memory and the bytes attention reads, at f16 storage precision; it needs
// no shader-f16 (pack2x16float / unpack2x16float).
//
// Where its shape asks (Features), the cache also keeps rows of f32
// features beside the keys and values, slot by slot — what an EAGLE-3
// head reads of its target (engine/webgpu) —, a buffer each:
//
//	feat[i]     (blocks·block_size, feature_width) f32: slot j of a
//	            sequence at row block·block_size + j % block_size, block
//	            its table's (KVSeq.PoolRow)
//
// The passes write and read them (GatherRows); the cache moves them with
// the keys and values (RecordMoves).
//
// A forward pass over some sequences first Reserves the blocks its new
// positions need (all or nothing), writes the tables that changed
// (SyncTables), records the moves of paths kept since the last pass
// (RecordMoves) before its kernels, runs, and then Commits each sequence's
// new length; a pass that fails, or a rejected draft, rolls a sequence
// back with Truncate. Reserve, Truncate, KeepPath and Release may be
// called from any goroutine.
type KVCache struct {
	KVShape
	k, v     []*gpu.Buffer // per layer
	feat     []*gpu.Buffer // per feature (KVShape.Features)
	table    *gpu.Buffer
	wgMemory int // the device's workgroup memory, bytes

	pipes gpu.PipelineMemo[cachePipelineKey] // see pipeline

	mu     sync.Mutex
	free   []uint32 // pool blocks no sequence maps, taken from the end
	slots  []int    // table rows no sequence holds, taken from the end
	moving []*KVSeq // sequences with moves pending, in KeepPath's order
	closed bool

	moveList *gpu.Buffer // RecordMoves' list, grown on demand
}

// KVShape sizes a KVCache.
type KVShape struct {
	Layers, KVHeads, D int
	BlockSize          int // positions a block
	Blocks             int // blocks in the pool
	Seqs               int // sequence slots (table rows)
	MaxBlocks          int // blocks one sequence may map (max_position_embeddings / BlockSize, rounded up)
	F16                bool
	// Features is how many buffers of f32 rows, FeatureWidth values a
	// slot, the cache keeps beside the keys and values (0: none).
	Features, FeatureWidth int
}

// ErrKVFull reports a cache whose pool or sequence slots are used up:
// release or truncate sequences and try again.
var ErrKVFull = errors.New("KV cache full")

// KVSeq is one sequence's part of a KVCache: its slot (table row), the
// pool blocks it maps, how many positions it holds, the token tree among
// them (package treemask), and the moves of a kept path not made yet.
type KVSeq struct {
	c      *KVCache // nil once released
	slot   int
	blocks []uint32 // logical block i → pool block
	len    int
	dirty  bool // blocks changed since the slot's table row was written
	tree   treemask.Tree
	moves  []treemask.Move // KeepPath's, for the next pass to make (RecordMoves)
	// Positions whose blocks stay mapped beyond len: until the moves are
	// made, those they read (the last one's From + 1); until a Truncate,
	// those Reserve mapped for a call's passes.
	hold, reserved int
	// featuresOnly: positions whose keys and values nobody computed, only
	// their features written (MarkFeaturesOnly), until truncated to none.
	featuresOnly bool
}

// NewKVCache allocates a zeroed cache and an all-zero block table, every
// block and slot free.
func NewKVCache(d *gpu.Device, s KVShape) (*KVCache, error) {
	c := &KVCache{KVShape: s, wgMemory: int(d.Limits().MaxComputeWorkgroupStorageSize)}
	for _, v := range []int{s.Layers, s.KVHeads, s.D, s.BlockSize, s.Blocks, s.Seqs, s.MaxBlocks} {
		if v <= 0 {
			return nil, fmt.Errorf("kernels: kv cache: non-positive size in %+v", s)
		}
	}
	if c.layerBytes() > d.Limits().MaxStorageBufferBindingSize {
		return nil, fmt.Errorf("kernels: kv cache: a layer's %d bytes exceed one binding (%d)", c.layerBytes(), d.Limits().MaxStorageBufferBindingSize)
	}
	if s.Features < 0 || s.Features > 0 && s.FeatureWidth <= 0 {
		return nil, fmt.Errorf("kernels: kv cache: %d features of %d values", s.Features, s.FeatureWidth)
	}
	if c.featureBytes() > d.Limits().MaxStorageBufferBindingSize {
		return nil, fmt.Errorf("kernels: kv cache: a feature buffer's %d bytes exceed one binding (%d)", c.featureBytes(), d.Limits().MaxStorageBufferBindingSize)
	}
	for l := range s.Layers {
		for _, kv := range []struct {
			dst  *[]*gpu.Buffer
			name string
		}{{&c.k, "k"}, {&c.v, "v"}} {
			buf, err := d.NewBuffer(fmt.Sprintf("kv.%s.%d", kv.name, l), c.layerBytes())
			if err != nil {
				c.Release()
				return nil, err
			}
			*kv.dst = append(*kv.dst, buf)
		}
	}
	for i := range s.Features {
		buf, err := d.NewBuffer(fmt.Sprintf("kv.features.%d", i), c.featureBytes())
		if err != nil {
			c.Release()
			return nil, err
		}
		c.feat = append(c.feat, buf)
	}
	var err error
	if c.table, err = d.NewBuffer("kv.table", uint64(s.Seqs*s.MaxBlocks)*4); err != nil {
		c.Release()
		return nil, err
	}
	for b := s.Blocks - 1; b >= 0; b-- {
		c.free = append(c.free, uint32(b))
	}
	for sl := s.Seqs - 1; sl >= 0; sl-- {
		c.slots = append(c.slots, sl)
	}
	return c, nil
}

// layerBytes is the size of one layer's slice of K or V.
func (c *KVCache) layerBytes() uint64 {
	return uint64(c.Blocks) * uint64(c.KVHeads*c.BlockSize*c.D) * uint64(c.ElemBytes())
}

// featureBytes is the size of one feature buffer (0 without features).
func (c *KVCache) featureBytes() uint64 {
	if c.Features == 0 {
		return 0
	}
	return uint64(c.Blocks) * uint64(c.BlockSize) * uint64(c.FeatureWidth) * 4
}

// Feature is feature buffer i (KVShape.Features): (blocks·block_size,
// feature_width) f32, a sequence's slot j at its row KVSeq.PoolRow(j).
func (c *KVCache) Feature(i int) *gpu.Buffer { return c.feat[i] }

// ElemBytes is the size of one cached value: 4 (f32) or 2 (f16).
func (c *KVCache) ElemBytes() int {
	if c.F16 {
		return 2
	}
	return 4
}

// Capacity is how many positions the sequences can hold together for
// certain: every sequence wastes less than a block, so the blocks beyond
// one a slot.
func (c *KVCache) Capacity() int { return (c.Blocks - c.Seqs) * c.BlockSize }

// Release frees the cache's buffers; its sequences must not be used in a
// forward pass afterwards (their Release still may be called).
func (c *KVCache) Release() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	for _, b := range append(append(append([]*gpu.Buffer{c.table, c.moveList}, c.k...), c.v...), c.feat...) {
		if b != nil {
			b.Release()
		}
	}
}

// NewSeq takes a free slot for an empty sequence (ErrKVFull when none is
// left).
func (c *KVCache) NewSeq() (*KVSeq, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("kernels: kv cache: released")
	}
	if len(c.slots) == 0 {
		return nil, fmt.Errorf("all %d sequence slots in use: %w", c.Seqs, ErrKVFull)
	}
	sl := c.slots[len(c.slots)-1]
	c.slots = c.slots[:len(c.slots)-1]
	return &KVSeq{c: c, slot: sl}, nil
}

// Reserve maps the blocks seqs[i] needs to hold lens[i] positions, for
// every i or, when the pool is short (ErrKVFull) or a length passes
// MaxBlocks blocks, for none. Lengths stay as they were: Commit sets them
// once the positions are written.
func (c *KVCache) Reserve(seqs []*KVSeq, lens []int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	need := 0
	for i, s := range seqs {
		if s.c != c {
			return fmt.Errorf("kernels: kv cache: sequence %d is not this cache's", i)
		}
		nb := c.blocksFor(lens[i])
		if nb > c.MaxBlocks {
			return fmt.Errorf("kernels: kv cache: %d positions take %d blocks, a sequence maps at most %d", lens[i], nb, c.MaxBlocks)
		}
		need += max(0, nb-len(s.blocks))
	}
	if need > len(c.free) {
		return fmt.Errorf("%d more KV blocks needed, %d free: %w", need, len(c.free), ErrKVFull)
	}
	for i, s := range seqs {
		if n := c.blocksFor(lens[i]) - len(s.blocks); n > 0 {
			s.blocks = append(s.blocks, c.free[len(c.free)-n:]...)
			c.free = c.free[:len(c.free)-n]
			s.dirty = true
		}
		s.reserved = max(s.reserved, lens[i])
	}
	return nil
}

// SyncTables writes the table rows of the seqs whose blocks changed; the
// write is ordered before the next submitted batch.
func (c *KVCache) SyncTables(seqs []*KVSeq) error {
	for _, s := range seqs {
		if !s.dirty {
			continue
		}
		if err := c.table.WriteU32(uint64(s.slot*c.MaxBlocks)*4, s.blocks); err != nil {
			return fmt.Errorf("kernels: kv cache: block table of slot %d: %w", s.slot, err)
		}
		s.dirty = false
	}
	return nil
}

func (c *KVCache) blocksFor(positions int) int { return (positions + c.BlockSize - 1) / c.BlockSize }

// Len is the number of cached positions.
func (s *KVSeq) Len() int { return s.len }

// Slot is the sequence's table row (the rows buffer the kernels over the
// cache take holds it for each of its rows: PutRow).
func (s *KVSeq) Slot() int { return s.slot }

// Cache is the cache the sequence belongs to (nil once released).
func (s *KVSeq) Cache() *KVCache { return s.c }

// Line is the positions of the sequence's line: Len, or where it holds a
// token tree, the tree's base — the positions that are its text.
func (s *KVSeq) Line() int {
	if s.tree.Len() > 0 {
		return s.tree.Base()
	}
	return s.len
}

// PoolRow is the row of the sequence's slot j in the pool's
// (blocks·block_size) rows — block·block_size + j % block_size, its block
// the one the sequence's table maps —, where the feature buffers keep the
// slot's features; an error for a slot whose block is not mapped.
func (s *KVSeq) PoolRow(j int) (int, error) {
	c := s.c
	if c == nil {
		return 0, errors.New("kernels: kv cache: a released sequence")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if j < 0 || j/c.BlockSize >= len(s.blocks) {
		return 0, fmt.Errorf("kernels: kv cache: slot %d of a sequence with %d blocks of %d mapped", j, len(s.blocks), c.BlockSize)
	}
	return int(s.blocks[j/c.BlockSize])*c.BlockSize + j%c.BlockSize, nil
}

// Place returns how T tokens fed next are placed — their positions and
// masks, treemask.Tree.Plan at the sequence's length, with parents (nil:
// every token continues the line, which a tree's nodes may not precede) —
// without changing the sequence: Commit records them.
func (s *KVSeq) Place(T int, parents []int) ([]treemask.Row, error) {
	if parents == nil && s.tree.Len() == 0 {
		return treemask.LineRows(s.len, T), nil
	}
	if parents == nil {
		parents = make([]int, T)
		for i := range parents {
			parents[i] = treemask.Line
		}
	}
	if len(parents) != T {
		return nil, fmt.Errorf("kernels: kv cache: %d parents for %d tokens", len(parents), T)
	}
	return s.tree.Plan(s.len, parents)
}

// Commit records that the sequence now holds n positions, all of them in
// blocks Reserve mapped; rows, where not nil, are how the positions from
// its old length on were placed (Place), so that the tree nodes among them
// join its token tree.
func (s *KVSeq) Commit(n int, rows []treemask.Row) error {
	if n < 0 || len(s.blocks)*s.c.BlockSize < n {
		return fmt.Errorf("kernels: kv cache: %d positions committed, %d mapped", n, len(s.blocks)*s.c.BlockSize)
	}
	if rows != nil && s.len+len(rows) != n {
		return fmt.Errorf("kernels: kv cache: %d rows placed from position %d, committing %d", len(rows), s.len, n)
	}
	s.tree.Commit(s.len, rows)
	s.len = n
	return nil
}

// Truncate drops positions from n on (a rejected draft rolls back), and
// the token tree's nodes among them, and returns the blocks past those the
// positions left need, reserved ones included: Truncate(Len()) undoes a
// Reserve. A move KeepPath left pending to a dropped position is dropped;
// the blocks the moves still pending read stay mapped until the next pass
// has made them (RecordMoves). A negative n is ignored.
func (s *KVSeq) Truncate(n int) {
	if n < 0 || s.c == nil {
		return
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	s.len = min(s.len, n)
	s.featuresOnly = s.featuresOnly && s.len > 0
	s.tree.Truncate(s.len)
	// Moves write increasing positions (treemask.Tree.KeepPath): those
	// kept are a prefix, which the ones dropped do not change.
	kept := 0
	for kept < len(s.moves) && s.moves[kept].To < s.len {
		kept++
	}
	s.moves = s.moves[:kept]
	s.hold, s.reserved = 0, 0
	for _, m := range s.moves {
		s.hold = max(s.hold, m.From+1)
	}
	s.trim()
}

// trim returns the blocks past those the sequence's positions, its pending
// moves and its reservation need; c.mu is held.
func (s *KVSeq) trim() {
	c := s.c
	if keep := c.blocksFor(max(s.len, s.hold, s.reserved)); keep < len(s.blocks) {
		c.free = append(c.free, s.blocks[keep:]...)
		s.blocks = s.blocks[:keep]
	}
}

// KeepPath ends the sequence's token tree keeping the nodes of path —
// slots, a root first, each the child of the one before — whose keys and
// values are moved to follow the line (treemask.Tree.KeepPath): the cache
// then holds what feeding the path's tokens as a line would have left. The
// moves are not made here: the next pass over the cache records them
// before anything else (RecordMoves), so KeepPath submits nothing, and
// every later read sees them moved. A path that is not one of the tree's
// is refused (treemask.ErrPath) and changes nothing; an empty path drops
// the tree.
func (s *KVSeq) KeepPath(path []int) error {
	c := s.c
	if c == nil {
		return errors.New("kernels: kv cache: keep path: a released sequence")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	moves, n, err := s.tree.KeepPath(s.len, path)
	if err != nil {
		return err
	}
	if len(moves) > 0 {
		if len(s.moves) == 0 {
			c.moving = append(c.moving, s)
		}
		s.moves = append(s.moves, moves...)
		s.hold = max(s.hold, moves[len(moves)-1].From+1)
	}
	s.len, s.reserved = n, 0
	s.trim()
	return nil
}

// MarkFeaturesOnly records that the sequence holds positions whose keys
// and values were never computed (their features written from elsewhere):
// FeaturesOnly until the sequence is truncated to no positions.
func (s *KVSeq) MarkFeaturesOnly() { s.featuresOnly = true }

// FeaturesOnly reports whether the sequence holds positions of features
// only (MarkFeaturesOnly).
func (s *KVSeq) FeaturesOnly() bool { return s.featuresOnly }

// Release returns the sequence's blocks and slot, and drops its pending
// moves; it must not be used afterwards (a second Release does nothing).
func (s *KVSeq) Release() {
	c := s.c
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.free = append(c.free, s.blocks...)
	c.slots = append(c.slots, s.slot)
	if len(s.moves) > 0 {
		c.moving = slices.DeleteFunc(c.moving, func(m *KVSeq) bool { return m == s })
	}
	s.blocks, s.c, s.moves, s.hold, s.featuresOnly = nil, nil, nil, 0, false
	s.tree = treemask.Tree{}
}

// RowWords is the u32 words of one row of a rows buffer: Row in
// prelude.wgsl (PutRow).
const RowWords = 6

// PutRow writes into dst (RowWords words) how a row sits in the cache: its
// sequence's table row (KVSeq.Slot), the position slot its key and value
// go to, and its placement r — the position it is rotated at and the slots
// it attends to (treemask.Row; treemask.LineRow(slot) for a line token).
func PutRow(dst []uint32, seq, slot int, r treemask.Row) {
	dst[0], dst[1], dst[2], dst[3] = uint32(seq), uint32(slot), uint32(r.Pos), uint32(r.Base)
	dst[4], dst[5] = uint32(r.Mask), uint32(r.Mask>>32)
}

// consts specializes a KV-reading or -writing kernel for the element type.
func (c *KVCache) consts(more gpu.Consts) gpu.Consts {
	out := gpu.Consts{"KV_F16": wgslBool(c.F16)}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// layer binds layer l of K and of V.
func (c *KVCache) layer(l int) (k, v gpu.Binding) { return c.k[l].All(), c.v[l].All() }

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
	direct, merge, input     bool
	fused                    [7]uint32 // qkv_fused_int4.wgsl's constants (qkvFusedConsts)
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

// checkRows checks the rows buffer (PutRow) of T rows shared by the
// kernels over the cache.
func (c *KVCache) checkRows(op string, layer, T int, rows *gpu.Buffer) error {
	if c == nil {
		return fmt.Errorf("kernels: %s: nil cache", op)
	}
	if layer < 0 || layer >= c.Layers || T <= 0 {
		return fmt.Errorf("kernels: %s: layer %d of %d, T = %d", op, layer, c.Layers, T)
	}
	return need(op, "rows", rows, T*RowWords)
}

// checkHeads checks the head layout for attention over c.
func (c *KVCache) checkHeads(op string, heads int) error {
	if heads <= 0 || heads%c.KVHeads != 0 {
		return fmt.Errorf("kernels: %s: %d query heads for %d kv heads", op, heads, c.KVHeads)
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
