package kernels

import (
	"errors"
	"fmt"
	"sync"

	"webdraft/gpu"
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
// A forward pass over some sequences first Reserves the blocks its new
// positions need (all or nothing), writes the tables that changed
// (SyncTables), runs, and then Commits each sequence's new length; a pass
// that fails, or a rejected draft, rolls a sequence back with Truncate.
// Reserve, Truncate and Release may be called from any goroutine.
type KVCache struct {
	KVShape
	k, v     []*gpu.Buffer // per layer
	table    *gpu.Buffer
	wgMemory int // the device's workgroup memory, bytes

	pipes gpu.PipelineMemo[cachePipelineKey] // see pipeline

	mu     sync.Mutex
	free   []uint32 // pool blocks no sequence maps, taken from the end
	slots  []int    // table rows no sequence holds, taken from the end
	closed bool
}

// KVShape sizes a KVCache.
type KVShape struct {
	Layers, KVHeads, D int
	BlockSize          int // positions a block
	Blocks             int // blocks in the pool
	Seqs               int // sequence slots (table rows)
	MaxBlocks          int // blocks one sequence may map (max_position_embeddings / BlockSize, rounded up)
	F16                bool
}

// ErrKVFull reports a cache whose pool or sequence slots are used up:
// release or truncate sequences and try again.
var ErrKVFull = errors.New("KV cache full")

// KVSeq is one sequence's part of a KVCache: its slot (table row), the
// pool blocks it maps, and how many positions it holds.
type KVSeq struct {
	c      *KVCache // nil once released
	slot   int
	blocks []uint32 // logical block i → pool block
	len    int
	dirty  bool // blocks changed since the slot's table row was written
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
	for _, b := range append(append([]*gpu.Buffer{c.table}, c.k...), c.v...) {
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

// Slot is the sequence's table row (the seq buffer the attention kernels
// take holds it for each of its rows).
func (s *KVSeq) Slot() int { return s.slot }

// Cache is the cache the sequence belongs to (nil once released).
func (s *KVSeq) Cache() *KVCache { return s.c }

// Commit records that the sequence now holds n positions, all of them in
// blocks Reserve mapped.
func (s *KVSeq) Commit(n int) error {
	if n < 0 || len(s.blocks)*s.c.BlockSize < n {
		return fmt.Errorf("kernels: kv cache: %d positions committed, %d mapped", n, len(s.blocks)*s.c.BlockSize)
	}
	s.len = n
	return nil
}

// Truncate drops positions from n on (a rejected draft rolls back) and
// returns the blocks past those the positions left need, reserved ones
// included: Truncate(Len()) undoes a Reserve. A negative n is ignored.
func (s *KVSeq) Truncate(n int) {
	if n < 0 || s.c == nil {
		return
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	s.len = min(s.len, n)
	if keep := c.blocksFor(s.len); keep < len(s.blocks) {
		c.free = append(c.free, s.blocks[keep:]...)
		s.blocks = s.blocks[:keep]
	}
}

// KeepPath: token trees are not placed in this cache yet.
func (s *KVSeq) KeepPath(path []int) error {
	if len(path) == 0 {
		return nil
	}
	return errors.New("kernels: kv cache: token trees are not supported yet")
}

// Release returns the sequence's blocks and slot; it must not be used
// afterwards (a second Release does nothing).
func (s *KVSeq) Release() {
	c := s.c
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.free = append(c.free, s.blocks...)
	c.slots = append(c.slots, s.slot)
	s.blocks, s.c = nil, nil
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

// checkRows checks the per-row buffers shared by the kernels over the
// cache.
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
