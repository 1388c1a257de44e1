package kernels

import (
	"errors"
	"slices"
	"testing"

	"webdraft/gpu/gputest"
)

// TestKVCachePool: slots and blocks are handed out and come back through
// the cache's one set of operations — Reserve all or nothing, Commit within
// what is mapped, Truncate (a rollback, or undoing a reservation) and
// Release — and the table rows SyncTables writes are the sequences' blocks.
func TestKVCachePool(t *testing.T) {
	d := gputest.Device(t)
	const bs = 4
	c, err := NewKVCache(d, KVShape{Layers: 1, KVHeads: 1, D: 8, BlockSize: bs, Blocks: 6, Seqs: 2, MaxBlocks: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if c.Capacity() != (6-2)*bs {
		t.Errorf("Capacity %d, want %d", c.Capacity(), (6-2)*bs)
	}
	a, err := c.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewSeq(); !errors.Is(err, ErrKVFull) {
		t.Errorf("a third sequence in two slots: %v", err)
	}
	if err := c.Reserve([]*KVSeq{a, b}, []int{9, 2}); err != nil { // 3 + 1 blocks
		t.Fatal(err)
	}
	if err := c.Reserve([]*KVSeq{a, b}, []int{9, 13}); !errors.Is(err, ErrKVFull) { // 3 more for b: 2 free
		t.Errorf("a reservation past the pool: %v", err)
	}
	if len(a.blocks) != 3 || len(b.blocks) != 1 || len(c.free) != 2 {
		t.Errorf("a refused reservation changed the mapping: %d, %d blocks, %d free", len(a.blocks), len(b.blocks), len(c.free))
	}
	if err := c.Reserve([]*KVSeq{a}, []int{21}); err == nil {
		t.Error("a reservation past MaxBlocks was accepted")
	}
	if err := a.Commit(13, nil); err == nil || a.Len() != 0 {
		t.Errorf("a commit past the mapped blocks: %v, Len %d", err, a.Len())
	}
	if err := a.Commit(9, nil); err != nil || a.Len() != 9 {
		t.Fatalf("commit: %v, Len %d", err, a.Len())
	}
	if err := c.SyncTables([]*KVSeq{a, b}); err != nil {
		t.Fatal(err)
	}
	table, err := c.table.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	if got := table[a.Slot()*c.MaxBlocks : a.Slot()*c.MaxBlocks+3]; !slices.Equal(got, a.blocks) {
		t.Errorf("table row %v, blocks %v", got, a.blocks)
	}
	b.Truncate(b.Len()) // undo b's reservation: its block comes back
	if len(b.blocks) != 0 || len(c.free) != 3 {
		t.Errorf("undone reservation: %d blocks kept, %d free", len(b.blocks), len(c.free))
	}
	a.Truncate(5) // rolled back to 5 positions: 2 blocks
	if a.Len() != 5 || len(a.blocks) != 2 || len(c.free) != 4 {
		t.Errorf("after Truncate(5): Len %d, %d blocks, %d free", a.Len(), len(a.blocks), len(c.free))
	}
	// Pool rows: slot j in its block's row; none past the mapped blocks.
	for j := range 2 * bs {
		if row, err := a.PoolRow(j); err != nil || row != int(a.blocks[j/bs])*bs+j%bs {
			t.Errorf("PoolRow(%d) = %d, %v, want %d", j, row, err, int(a.blocks[j/bs])*bs+j%bs)
		}
	}
	if _, err := a.PoolRow(2 * bs); err == nil {
		t.Error("PoolRow of an unmapped slot: no error")
	}
	// The line: the positions without a tree, the tree's base with one.
	if err := c.Reserve([]*KVSeq{a}, []int{7}); err != nil {
		t.Fatal(err)
	}
	place, err := a.Place(2, []int{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(7, place); err != nil {
		t.Fatal(err)
	}
	if a.Line() != 5 || a.Len() != 7 {
		t.Errorf("with a tree of 2 nodes past 5 positions: Line %d, Len %d", a.Line(), a.Len())
	}
	a.Truncate(5)
	if a.Line() != 5 {
		t.Errorf("without a tree: Line %d, want 5", a.Line())
	}
	a.Truncate(-1)
	a.Truncate(100)
	if a.Len() != 5 || len(a.blocks) != 2 {
		t.Errorf("Truncate past the end or below zero changed the sequence: Len %d, %d blocks", a.Len(), len(a.blocks))
	}
	a.Release()
	a.Release()
	b.Release()
	if len(c.free) != 6 || len(c.slots) != 2 {
		t.Errorf("after Release: %d free blocks, %d free slots", len(c.free), len(c.slots))
	}
	if err := c.Reserve([]*KVSeq{a}, []int{1}); err == nil {
		t.Error("a released sequence reserved blocks")
	}
}
