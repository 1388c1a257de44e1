package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/treemask"
)

// TestKVMove: the moves of paths kept in several sequences' token trees
// (KVSeq.KeepPath), made by RecordMoves on the device in every layer,
// against the same moves made one after another in plain Go on the
// layers' images — random words everywhere, and the moves' destinations
// that no move reads poisoned first; f32 and f16 caches, a head_dim whose
// words do not fill a workgroup. One sequence is truncated after KeepPath
// (its moves to the dropped positions are dropped) and one released (its
// moves are dropped).
func TestKVMove(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, half := range []bool{false, true} {
		for _, D := range []int{24, 64} {
			t.Run(fmt.Sprintf("f16=%v/D%d", half, D), func(t *testing.T) { testKVMove(t, d, r, half, D) })
		}
	}
}

func testKVMove(t *testing.T, d *gpu.Device, r *rand.Rand, half bool, D int) {
	const bs, seqs = 8, 4
	c, err := NewKVCache(d, KVShape{Layers: 2, KVHeads: 2, D: D, BlockSize: bs, Blocks: 64, Seqs: seqs, MaxBlocks: 14, F16: half})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	r.Shuffle(len(c.free), func(i, j int) { c.free[i], c.free[j] = c.free[j], c.free[i] })
	// Each sequence: a line of 1 … 40 positions, then a random tree of up
	// to 64 nodes, committed as a pass would; a path from a random node's
	// root kept.
	var all []*KVSeq
	var paths [][]int
	for range seqs {
		s, err := c.NewSeq()
		if err != nil {
			t.Fatal(err)
		}
		P, T := 1+r.IntN(40), 1+r.IntN(treemask.MaxNodes)
		parents := make([]int, T)
		for i := range parents {
			parents[i] = P - 1 + r.IntN(i+1) // the line's last slot (a root) or an earlier node
		}
		if err := c.Reserve([]*KVSeq{s}, []int{P + T}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(P, nil); err != nil {
			t.Fatal(err)
		}
		rows, err := s.Place(T, parents)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(P+T, rows); err != nil {
			t.Fatal(err)
		}
		var path []int
		for n := P + r.IntN(T); n >= P; n = parents[n-P] {
			path = append([]int{n}, path...)
		}
		all, paths = append(all, s), append(paths, path)
	}
	if err := c.SyncTables(all); err != nil {
		t.Fatal(err)
	}
	for i, s := range all {
		base := s.tree.Base()
		if err := s.KeepPath(paths[i]); err != nil {
			t.Fatal(err)
		}
		if s.tree.Len() != 0 || s.Len() != base+len(paths[i]) {
			t.Fatalf("sequence %d: after KeepPath(%v) the tree holds %d nodes, the sequence %d positions", i, paths[i], s.tree.Len(), s.Len())
		}
		if len(s.moves) > 0 && len(s.blocks) < c.blocksFor(s.moves[len(s.moves)-1].From+1) {
			t.Fatalf("sequence %d: %d blocks mapped, the moves read position %d", i, len(s.blocks), s.moves[len(s.moves)-1].From)
		}
		if i == 1 && len(s.moves) > 1 { // truncated: the moves to positions from its new length on go
			keep := s.moves[:1]
			s.Truncate(keep[0].To + 1)
			if !slices.Equal(s.moves, keep) {
				t.Fatalf("after Truncate(%d): moves %v, want %v", keep[0].To+1, s.moves, keep)
			}
		}
		t.Logf("sequence %d: path %v, moves %v", i, paths[i], s.moves)
	}
	all[2].Release() // its moves go with it
	live := []*KVSeq{all[0], all[1], all[3]}

	// The layers' images: random words, and the destinations no move reads
	// poisoned.
	dw := D * c.ElemBytes() / 4
	at := func(s *KVSeq, j, h int) int {
		return ((int(s.blocks[j/bs])*c.KVHeads+h)*bs + j%bs) * dw
	}
	imgs := make([][]uint32, 2*c.Layers) // k, v of each layer
	for i := range imgs {
		imgs[i] = make([]uint32, c.layerBytes()/4)
		for j := range imgs[i] {
			imgs[i][j] = r.Uint32()
		}
		for _, s := range live {
			for _, m := range s.moves {
				if slices.IndexFunc(s.moves, func(o treemask.Move) bool { return o.From == m.To }) < 0 {
					for h := range c.KVHeads {
						for w := range dw {
							imgs[i][at(s, m.To, h)+w] = gpu.NaN32
						}
					}
				}
			}
		}
	}
	for l := range c.Layers {
		for i, buf := range []*gpu.Buffer{c.k[l], c.v[l]} {
			if err := buf.WriteU32(0, imgs[2*l+i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The plain-Go twin: each sequence's moves one after another.
	want := make([][]uint32, len(imgs))
	for i, img := range imgs {
		want[i] = slices.Clone(img)
		for _, s := range live {
			for _, m := range s.moves {
				for h := range c.KVHeads {
					from, to := at(s, m.From, h), at(s, m.To, h)
					copy(want[i][to:to+dw], want[i][from:from+dw])
				}
			}
		}
	}
	run(t, d, "kv_move", func(b *gpu.Batch) error {
		if err := c.RecordMoves(b); err != nil {
			return err
		}
		if b.Len() != c.Layers {
			t.Errorf("%d dispatches recorded, want one a layer (%d)", b.Len(), c.Layers)
		}
		return nil
	})
	for l := range c.Layers {
		for i, buf := range []*gpu.Buffer{c.k[l], c.v[l]} {
			got, err := buf.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			for j, w := range want[2*l+i] {
				if got[j] != w {
					t.Fatalf("layer %d %s: word %d = %#x, want %#x", l, []string{"k", "v"}[i], j, got[j], w)
				}
			}
		}
	}
	for i, s := range live {
		if len(s.moves) != 0 || len(s.blocks) != c.blocksFor(s.Len()) {
			t.Errorf("live sequence %d after its moves: %d pending, %d blocks for %d positions", i, len(s.moves), len(s.blocks), s.Len())
		}
	}
	run(t, d, "kv_move again", func(b *gpu.Batch) error {
		if err := c.RecordMoves(b); err != nil {
			return err
		}
		if b.Len() != 0 {
			t.Errorf("%d dispatches recorded with no moves pending", b.Len())
		}
		return nil
	})
}
