package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// treeTwin is the plain-Go twin of a sequence's tree drafted on the
// device: its node table and frontier, grown and chosen as tree_expand.wgsl
// and tree_select.wgsl do.
type treeTwin struct {
	b, levels, n, pos0 int
	parentRows         int // the shape's row base for the feed's parent rows
	nodes              []TreeNode
	frontier           []int
	feed               [][TreeFeedWords]uint32 // the last feed written
}

// top is one read-out row's most likely tokens.
type topRow []struct {
	tok int
	lp  float32
}

// expand adds the children the rows gave the frontier (level 0: the
// root's) and, where a level follows, picks the next frontier.
func (t *treeTwin) expand(level int, rows []topRow) {
	var parents []int
	if level == 0 {
		t.nodes, parents = nil, []int{-1}
	} else {
		parents = t.frontier
	}
	first := len(t.nodes)
	for f, p := range parents {
		base := float32(0)
		if p >= 0 {
			base = t.nodes[p].Score
		}
		for r := range t.b {
			c := rows[f][r]
			t.nodes = append(t.nodes, TreeNode{Token: c.tok, Parent: p, Depth: level + 1, Score: base + min(c.lp, 0), Logprob: c.lp, DSlot: -1, Row: -1})
		}
	}
	if level+1 >= t.levels {
		return
	}
	fresh := make([]int, len(t.nodes)-first)
	for i := range fresh {
		fresh[i] = first + i
	}
	sort.SliceStable(fresh, func(i, j int) bool { return t.nodes[fresh[i]].Score > t.nodes[fresh[j]].Score })
	t.frontier = fresh[:t.b]
	t.feed = make([][TreeFeedWords]uint32, t.b)
	for j, k := range t.frontier {
		n := &t.nodes[k]
		n.DSlot = level*t.b + j
		if n.Parent >= 0 {
			n.DMask = t.nodes[n.Parent].DMask
		}
		n.DMask |= 1 << n.DSlot
		parent := uint32(treeNone)
		if n.Parent >= 0 {
			parent = uint32(t.parentRows + t.nodes[n.Parent].DSlot)
		}
		t.feed[j] = [TreeFeedWords]uint32{uint32(n.Token), parent, uint32(n.DMask), uint32(n.DMask >> 32)}
	}
}

// choose picks the verified nodes and their rows.
func (t *treeTwin) choose() {
	order := make([]int, len(t.nodes))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := t.nodes[order[i]], t.nodes[order[j]]
		if a.Score != b.Score {
			return a.Score > b.Score
		}
		return a.Depth < b.Depth
	})
	chosen := slices.Clone(order[:min(t.n, len(order), TreeFeedRows)])
	sort.SliceStable(chosen, func(i, j int) bool {
		a, b := chosen[i], chosen[j]
		if t.nodes[a].Depth != t.nodes[b].Depth {
			return t.nodes[a].Depth < t.nodes[b].Depth
		}
		return a < b
	})
	t.feed = make([][TreeFeedWords]uint32, len(chosen))
	for r, k := range chosen {
		t.nodes[k].Row = r
	}
	for r, k := range chosen {
		var mask uint64
		for a := k; a >= 0; a = t.nodes[a].Parent {
			mask |= 1 << t.nodes[a].Row
		}
		t.feed[r] = [TreeFeedWords]uint32{uint32(t.nodes[k].Token), uint32(t.pos0 + t.nodes[k].Depth), uint32(mask), uint32(mask >> 32)}
	}
}

// randomTop is a read-out row's b most likely tokens: log-probabilities
// descending, with a tie now and then, and now and then the first a
// rounding above 0 (which a score ignores).
func randomTop(r *rand.Rand, b int) topRow {
	row := make(topRow, b)
	lp := float32(0)
	if r.IntN(8) == 0 {
		lp = 1e-6
	}
	for i := range row {
		row[i].tok = r.IntN(151936)
		row[i].lp = lp
		if r.IntN(5) > 0 {
			lp -= float32(r.ExpFloat64())
		}
	}
	return row
}

// TestTreeDraft: sequences of several widths, depths and budgets drafted
// level by level on the device — random read-out rows, poisoned tables
// and feeds — against their plain-Go twins: every node, every frontier's
// feed (its parents' rows past a base where the shape sets one), the
// verified rows' choice and feed.
func TestTreeDraft(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	twins := []*treeTwin{{b: 2, levels: 3, n: 5, pos0: 17}, {b: 4, levels: 2, n: 64, pos0: 3, parentRows: 128},
		{b: 3, levels: 5, n: 11, pos0: 40, parentRows: 7 * 64}, {b: 16, levels: 4, n: 64, pos0: 9}, {b: 1, levels: 6, n: 4, pos0: 0, parentRows: 64}}
	seqs, C, topN, levels := len(twins), 0, 0, 0
	for _, tw := range twins {
		C, topN, levels = max(C, TreeTable(tw.b, tw.levels)), max(topN, tw.b), max(levels, tw.levels)
	}
	const poison = 0xdeadbeef
	buf := func(name string, words int) *gpu.Buffer {
		b, err := d.NewBuffer(name, uint64(words)*4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Release)
		if err := b.Fill(poison); err != nil {
			t.Fatal(err)
		}
		return b
	}
	shape, state := buf("shape", seqs*TreeShapeWords), buf("state", seqs*TreeStateWords)
	nodes, feed := buf("nodes", seqs*C*TreeNodeWords), buf("feed", seqs*TreeFeedRows*TreeFeedWords)
	top := buf("top", seqs*MaxTreeWidth*topN*2)
	readFeed := func(s, rows int) [][TreeFeedWords]uint32 {
		w, err := feed.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		out := make([][TreeFeedWords]uint32, rows)
		for j := range out {
			copy(out[j][:], w[(s*TreeFeedRows+j)*TreeFeedWords:])
		}
		return out
	}
	readNodes := func(s, n int) []TreeNode {
		w, err := nodes.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		return ReadTreeNodes(w[s*C*TreeNodeWords:], n)
	}
	for level := range levels {
		// The pass's read-out rows: each drafting sequence's frontier, in
		// turn, after a row of another entry.
		words := make([]uint32, seqs*TreeShapeWords)
		topWords := make([]uint32, seqs*MaxTreeWidth*topN*2)
		row := 1
		rows := make([][]topRow, seqs)
		for s, tw := range twins {
			out0 := -1
			if level < tw.levels {
				out0 = row
				F := tw.b
				if level == 0 {
					F = 1
				}
				for f := range F {
					tr := randomTop(r, tw.b)
					rows[s] = append(rows[s], tr)
					for k, c := range tr {
						topWords[((row+f)*topN+k)*2], topWords[((row+f)*topN+k)*2+1] = uint32(c.tok), math.Float32bits(c.lp)
					}
				}
				row += F
			}
			PutTreeShape(words[s*TreeShapeWords:], tw.b, tw.levels, tw.n, out0, tw.pos0)
			PutTreeParentRows(words[s*TreeShapeWords:], tw.parentRows)
		}
		if err := shape.WriteU32(0, words); err != nil {
			t.Fatal(err)
		}
		if err := top.WriteU32(0, topWords); err != nil {
			t.Fatal(err)
		}
		run(t, d, "tree_expand", func(b *gpu.Batch) error { return TreeExpand(b, shape, top, state, nodes, feed, seqs, level, C, topN) })
		for s, tw := range twins {
			if level >= tw.levels {
				continue
			}
			tw.expand(level, rows[s])
			if got := readNodes(s, len(tw.nodes)); !slices.Equal(got, tw.nodes) {
				t.Fatalf("sequence %d (b %d), level %d: nodes\n%+v\nwant\n%+v", s, tw.b, level, got, tw.nodes)
			}
			if level+1 < tw.levels {
				if got := readFeed(s, tw.b); !slices.Equal(got, tw.feed) {
					t.Fatalf("sequence %d, level %d: frontier feed %v, want %v", s, level, got, tw.feed)
				}
			}
		}
	}
	run(t, d, "tree_select", func(b *gpu.Batch) error { return TreeSelect(b, shape, state, nodes, feed, seqs, C) })
	for s, tw := range twins {
		tw.choose()
		if got := readNodes(s, len(tw.nodes)); !slices.Equal(got, tw.nodes) {
			t.Errorf("sequence %d: chosen nodes\n%+v\nwant\n%+v", s, got, tw.nodes)
		}
		if got := readFeed(s, len(tw.feed)); !slices.Equal(got, tw.feed) {
			t.Errorf("sequence %d: verified rows' feed %v, want %v", s, got, tw.feed)
		}
	}
}
