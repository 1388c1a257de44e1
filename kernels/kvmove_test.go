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
// (KVSeq.KeepPath), made by RecordMoves on the device in every layer and
// every feature buffer, against the same moves made one after another in
// plain Go on the buffers' images — random words everywhere, and the
// moves' destinations that no move reads poisoned first; f32 and f16
// caches, a head_dim and a feature width whose words do not fill a
// workgroup. One sequence is truncated after KeepPath (its moves to the
// dropped positions are dropped) and one released (its moves are
// dropped).
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
	const features, width = 2, 72
	c, err := NewKVCache(d, KVShape{Layers: 2, KVHeads: 2, D: D, BlockSize: bs, Blocks: 64, Seqs: seqs, MaxBlocks: 14, F16: half,
		Features: features, FeatureWidth: width})
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

	// The buffers' images: random words, and the destinations no move
	// reads poisoned. A layer's slot holds kv_heads runs of dw words; a
	// feature buffer's one run of width words, at its pool row.
	dw := D * c.ElemBytes() / 4
	type image struct {
		buf      *gpu.Buffer
		name     string
		heads, w int
	}
	var imgs []image
	for l := range c.Layers {
		imgs = append(imgs, image{c.k[l], fmt.Sprintf("layer %d k", l), c.KVHeads, dw}, image{c.v[l], fmt.Sprintf("layer %d v", l), c.KVHeads, dw})
	}
	for i := range features {
		imgs = append(imgs, image{c.Feature(i), fmt.Sprintf("features %d", i), 1, width})
	}
	at := func(s *KVSeq, j, h int, img image) int {
		if img.heads == 1 && img.w == width {
			row, err := s.PoolRow(j)
			if err != nil || row != int(s.blocks[j/bs])*bs+j%bs {
				t.Fatalf("PoolRow(%d) = %d, %v: want block %d's row %d", j, row, err, s.blocks[j/bs], j%bs)
			}
			return row * width
		}
		return ((int(s.blocks[j/bs])*img.heads+h)*bs + j%bs) * img.w
	}
	words := make([][]uint32, len(imgs))
	for i, img := range imgs {
		words[i] = make([]uint32, img.buf.Size()/4)
		for j := range words[i] {
			words[i][j] = r.Uint32()
		}
		for _, s := range live {
			for _, m := range s.moves {
				if slices.IndexFunc(s.moves, func(o treemask.Move) bool { return o.From == m.To }) < 0 {
					for h := range img.heads {
						for w := range img.w {
							words[i][at(s, m.To, h, img)+w] = gpu.NaN32
						}
					}
				}
			}
		}
		if err := img.buf.WriteU32(0, words[i]); err != nil {
			t.Fatal(err)
		}
	}
	// The plain-Go twin: each sequence's moves one after another.
	want := make([][]uint32, len(imgs))
	for i, img := range imgs {
		want[i] = slices.Clone(words[i])
		for _, s := range live {
			for _, m := range s.moves {
				for h := range img.heads {
					from, to := at(s, m.From, h, img), at(s, m.To, h, img)
					copy(want[i][to:to+img.w], want[i][from:from+img.w])
				}
			}
		}
	}
	run(t, d, "kv_move", func(b *gpu.Batch) error {
		if err := c.RecordMoves(b); err != nil {
			return err
		}
		// One dispatch a layer and one a feature buffer, or none where the
		// sequences left nothing to move.
		if n := b.Len(); n != 0 && n != c.Layers+features {
			t.Errorf("%d dispatches recorded, want one a layer and one a feature buffer (%d), or none", n, c.Layers+features)
		}
		return nil
	})
	for i, img := range imgs {
		got, err := img.buf.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		for j, w := range want[i] {
			if got[j] != w {
				t.Fatalf("%s: word %d = %#x, want %#x", img.name, j, got[j], w)
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
