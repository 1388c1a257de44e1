package tokenizer

import (
	"hash/maphash"
	"math"
	"strings"
	"sync/atomic"
)

// bpe is a byte-level BPE model: a piece's bytes start as one symbol each and
// are merged pairwise, lowest merge rank first (leftmost first among equal
// ranks), until no adjacent pair has a merge.
//
// HF: tokenizers/src/models/bpe/{model.rs,word.rs}. Ids are the ids of the
// vocabulary; the model works on raw bytes, the ByteLevel text is only how
// tokenizer.json spells them.
type bpe struct {
	byteID [256]int32        // id of each single-byte token, -1 if absent
	merges map[uint64]uint64 // pairKey(left, right) → rank<<32 | merged id

	ignoreMerges bool           // look a whole piece up in vocab before merging
	vocab        map[string]int // raw bytes → id; only when ignoreMerges
	unkID        int32          // -1: bytes without a token are dropped, as HF does
	fuseUnk      bool

	cache *pieceCache
}

func pairKey(left, right int32) uint64 { return uint64(uint32(left))<<32 | uint64(uint32(right)) }

const noRank = math.MaxUint32

// merge returns the rank and result of merging left and right, or noRank.
func (m *bpe) merge(left, right int32) (rank uint32, merged int32) {
	v, ok := m.merges[pairKey(left, right)]
	if !ok {
		return noRank, -1
	}
	return uint32(v >> 32), int32(uint32(v))
}

// smallPiece is the longest piece merged with the quadratic scan over a
// stack array; longer pieces use the heap (HF's algorithm), which is
// O(n log n) so a megabyte of one letter stays fast.
const smallPiece = 48

// maxCachedPiece is the longest piece (bytes) kept in the cache.
const maxCachedPiece = 64

// encodePiece appends the ids of one pre-tokenized piece to dst.
func (m *bpe) encodePiece(piece string, dst []int) []int {
	if len(piece) == 1 && m.byteID[piece[0]] >= 0 {
		return append(dst, int(m.byteID[piece[0]]))
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			return append(dst, id)
		}
	}
	cacheable := len(piece) <= maxCachedPiece
	var h uint64
	if cacheable {
		h = m.cache.hash(piece)
		if ids, ok := m.cache.get(piece, h); ok {
			for _, id := range ids {
				dst = append(dst, int(id))
			}
			return dst
		}
	}
	var ids []int32
	if len(piece) <= smallPiece {
		var buf [smallPiece]int32
		ids = m.mergeSmall(piece, buf[:0])
	} else {
		ids = m.mergeHeap(piece)
	}
	if cacheable {
		m.cache.put(piece, h, append([]int32(nil), ids...))
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// initialSymbols appends the single-byte ids of piece to syms, handling
// bytes without a token like HF: replaced by unk (fused if fuseUnk) or
// dropped.
func (m *bpe) initialSymbols(piece string, syms []int32) []int32 {
	for i := 0; i < len(piece); i++ {
		id := m.byteID[piece[i]]
		if id < 0 {
			if m.unkID < 0 {
				continue
			}
			if m.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == m.unkID {
				continue
			}
			id = m.unkID
		}
		syms = append(syms, id)
	}
	return syms
}

// mergeSmall merges in place with a linear scan for the best pair per step.
func (m *bpe) mergeSmall(piece string, syms []int32) []int32 {
	syms = m.initialSymbols(piece, syms)
	n := len(syms)
	if n < 2 {
		return syms
	}
	// ranks[i], merged[i]: the merge of syms[i] and syms[i+1].
	var ranks [smallPiece]uint32
	var merged [smallPiece]int32
	for i := 0; i+1 < n; i++ {
		ranks[i], merged[i] = m.merge(syms[i], syms[i+1])
	}
	for n > 1 {
		best := -1
		bestRank := uint32(noRank)
		for i := 0; i+1 < n; i++ {
			if ranks[i] < bestRank {
				best, bestRank = i, ranks[i]
			}
		}
		if best < 0 {
			break
		}
		syms[best] = merged[best]
		copy(syms[best+1:n], syms[best+2:n])
		copy(ranks[best:n-1], ranks[best+1:n])
		copy(merged[best:n-1], merged[best+1:n])
		n--
		if best > 0 {
			ranks[best-1], merged[best-1] = m.merge(syms[best-1], syms[best])
		}
		if best+1 < n {
			ranks[best], merged[best] = m.merge(syms[best], syms[best+1])
		}
	}
	return syms[:n]
}

// candHeap is a 4-ary min-heap of merge candidates, each packed as
// rank<<32 | pos so that the order is by rank, then by position (leftmost
// first). Eight-byte entries and a shallow tree keep a heap of a million
// candidates cache-friendly.
type candHeap []uint64

func (h *candHeap) push(c uint64) {
	*h = append(*h, c)
	q := *h
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 4
		if q[p] <= c {
			break
		}
		q[i] = q[p]
		i = p
	}
	q[i] = c
}

func (h *candHeap) pop() uint64 {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	*h = q[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

func (h candHeap) down(i int) {
	n := len(h)
	c := h[i]
	for {
		first := 4*i + 1
		if first >= n {
			break
		}
		m := first
		for k := first + 1; k < min(first+4, n); k++ {
			if h[k] < h[m] {
				m = k
			}
		}
		if h[m] >= c {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = c
}

// init orders an unordered heap in O(n).
func (h candHeap) init() {
	if len(h) < 2 {
		return
	}
	for i := (len(h) - 2) / 4; i >= 0; i-- {
		h.down(i)
	}
}

// mergeHeap merges with a priority queue over a linked list of symbols, as
// HF's Word::merge_all does: pop the lowest (rank, pos); skip it if stale.
func (m *bpe) mergeHeap(piece string) []int32 {
	ids := m.initialSymbols(piece, make([]int32, 0, len(piece)))
	n := len(ids)
	prev := make([]int32, n)
	next := make([]int32, n)
	h := make(candHeap, 0, n)
	for i := range n {
		prev[i], next[i] = int32(i-1), int32(i+1)
		if i+1 < n {
			if r, _ := m.merge(ids[i], ids[i+1]); r != noRank {
				h = append(h, uint64(r)<<32|uint64(i))
			}
		}
	}
	if n > 0 {
		next[n-1] = -1
	}
	h.init()
	const dead = -2 // prev of a symbol merged into its predecessor
	for len(h) > 0 {
		c := h.pop()
		rank, p := uint32(c>>32), int32(uint32(c))
		q := next[p]
		if prev[p] == dead || q < 0 {
			continue
		}
		r, merged := m.merge(ids[p], ids[q])
		if r != rank {
			continue // a neighbour changed since this candidate was pushed
		}
		ids[p] = merged
		prev[q] = dead
		next[p] = next[q]
		if nq := next[q]; nq >= 0 {
			prev[nq] = p
		}
		if pp := prev[p]; pp >= 0 {
			if r, _ := m.merge(ids[pp], ids[p]); r != noRank {
				h.push(uint64(r)<<32 | uint64(pp))
			}
		}
		if nq := next[p]; nq >= 0 {
			if r, _ := m.merge(ids[p], ids[nq]); r != noRank {
				h.push(uint64(r)<<32 | uint64(p))
			}
		}
	}
	out := ids[:0]
	for i := int32(0); n > 0 && i >= 0; i = next[i] {
		out = append(out, ids[i])
	}
	return out
}

// pieceCache maps pieces to their ids: a fixed-size, 2-way set-associative
// table of atomic pointers. Reads take no lock and writes only replace a
// pointer, so it is safe for concurrent use, bounded, and never blocks; a
// new piece evicts an old one from its pair of slots. Results do not depend
// on what is cached, only speed does.
type pieceCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[cacheEntry] // len is a power of two
}

type cacheEntry struct {
	piece string
	ids   []int32
}

// cacheSlots bounds the cache: 128 Ki entries (1 MiB of slots, plus the
// entries of at most maxCachedPiece bytes each).
const cacheSlots = 1 << 17

func newPieceCache() *pieceCache {
	return &pieceCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[cacheEntry], cacheSlots)}
}

func (c *pieceCache) hash(piece string) uint64 { return maphash.String(c.seed, piece) }

func (c *pieceCache) get(piece string, h uint64) ([]int32, bool) {
	i := h & (cacheSlots - 1)
	if e := c.slots[i].Load(); e != nil && e.piece == piece {
		return e.ids, true
	}
	if e := c.slots[i^1].Load(); e != nil && e.piece == piece {
		return e.ids, true
	}
	return nil, false
}

func (c *pieceCache) put(piece string, h uint64, ids []int32) {
	i := h & (cacheSlots - 1)
	switch {
	case c.slots[i].Load() == nil:
	case c.slots[i^1].Load() == nil:
		i ^= 1
	default:
		i ^= (h >> 63) // evict one of the pair, chosen by another bit of the hash
	}
	// piece may point into a large text: keep a copy.
	c.slots[i].Store(&cacheEntry{piece: strings.Clone(piece), ids: ids})
}

// reset empties the cache (benchmarks measure a cold cache with it).
func (c *pieceCache) reset() {
	for i := range c.slots {
		c.slots[i].Store(nil)
	}
}
