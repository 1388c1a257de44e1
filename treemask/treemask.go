// Package treemask is the bookkeeping of a token tree in one sequence's KV
// cache, the same for every engine: which cached slots a row attends to,
// the position it is rotated at, and how an accepted path is moved into
// place afterwards.
//
// A sequence's cache is a line of slots 0 … len−1. Past its line it may
// hold a tree: slots Base … len−1 whose tokens are tree nodes, each with a
// parent — Base−1 (the line's last slot) for the tree's roots, else an
// earlier tree slot. A node's position is its parent's plus one (so the
// nodes of one depth share a position), and its row attends to the whole
// line and to its own ancestors in the tree, itself included: never to a
// sibling's branch. A line slot's position is its index, and it attends to
// every slot up to itself (causal): a Row with Base = slot + 1 and no mask.
//
// The tree holds at most MaxNodes slots, so that a row's ancestors fit in
// one 64-bit mask over them (bit i: slot Base + i) — the form the GPU
// kernels read. Once the target has chosen a path, KeepPath moves its
// slots to follow the line (in order, so no move overwrites a slot still
// to be read) and the tree ends: the path's positions equal their new
// slots, so the moved keys keep their rotation.
package treemask

import (
	"errors"
	"fmt"
)

// MaxNodes bounds the slots of a sequence's tree.
const MaxNodes = 64

// Line as a token's parent makes it a line token: the next slot of the
// line, before any tree.
const Line = -1

// Row is how one fed token is placed: the position it is rotated at, and
// the slots it attends to — every slot below Base, and slot Base + i where
// bit i of Mask is set — and its parent slot (Line for a line token).
type Row struct {
	Pos    int
	Base   int
	Mask   uint64
	Parent int
}

// Visible reports whether the row attends to slot j.
func (r Row) Visible(j int) bool {
	if j < r.Base {
		return true
	}
	i := j - r.Base
	return i < MaxNodes && r.Mask>>uint(i)&1 == 1
}

// LineRow is the row of a line token at slot s: position s, causal.
func LineRow(s int) Row { return Row{Pos: s, Base: s + 1, Parent: Line} }

// LineRows are the rows of T line tokens at slots P … P+T-1.
func LineRows(P, T int) []Row {
	rows := make([]Row, T)
	for t := range rows {
		rows[t] = LineRow(P + t)
	}
	return rows
}

// Tree is a sequence's tree: empty while the sequence is a line. Its zero
// value is an empty tree.
type Tree struct {
	base  int
	nodes []node // slot base + i
}

type node struct {
	parent int // slot
	pos    int
	mask   uint64 // ancestors, itself included: bit i is slot base + i
}

// Len is the tree's slot count (0: no tree).
func (t *Tree) Len() int { return len(t.nodes) }

// Base is the tree's first slot (meaningful while Len > 0).
func (t *Tree) Base() int { return t.base }

// Plan places tokens fed at slots at, at+1, … with the given parents (nil:
// all line tokens) without changing t: Commit(rows) then records them. A
// line token may not follow a tree node; a node's parent is an earlier slot
// of the tree or the line's last slot (at − 1 while there is no tree).
func (t *Tree) Plan(at int, parents []int) ([]Row, error) {
	rows := make([]Row, 0, len(parents))
	base, n := t.base, len(t.nodes)
	if n == 0 {
		base = -1
	}
	// pending views the tree as it would be with rows added.
	nodeAt := func(s int) (Row, bool) {
		switch i := s - base; {
		case base < 0 || i < 0:
			return Row{}, false
		case i < n:
			nd := t.nodes[i]
			return Row{Pos: nd.pos, Base: base, Mask: nd.mask, Parent: nd.parent}, true
		default:
			return rows[s-at], true
		}
	}
	for i, p := range parents {
		s := at + i
		if p == Line {
			if base >= 0 {
				return nil, fmt.Errorf("token %d (slot %d): a line token after the tree's nodes", i, s)
			}
			rows = append(rows, LineRow(s))
			continue
		}
		if base < 0 {
			base = s
		}
		if s-base >= MaxNodes {
			return nil, fmt.Errorf("token %d (slot %d): a tree of more than %d nodes", i, s, MaxNodes)
		}
		bit := uint64(1) << uint(s-base)
		if p == base-1 {
			rows = append(rows, Row{Pos: base, Base: base, Mask: bit, Parent: p})
			continue
		}
		if p < base-1 || p >= s {
			return nil, fmt.Errorf("token %d (slot %d): parent slot %d: want a tree slot in [%d, %d) or the line's last slot %d", i, s, p, base, s, base-1)
		}
		par, _ := nodeAt(p)
		rows = append(rows, Row{Pos: par.Pos + 1, Base: base, Mask: par.Mask | bit, Parent: p})
	}
	return rows, nil
}

// Place is Plan for T tokens fed at slot at: parents one a token, or nil
// for T line tokens (which a tree's nodes may not precede).
func (t *Tree) Place(at, T int, parents []int) ([]Row, error) {
	if parents == nil && len(t.nodes) == 0 {
		return LineRows(at, T), nil
	}
	if parents == nil {
		parents = make([]int, T)
		for i := range parents {
			parents[i] = Line
		}
	}
	if len(parents) != T {
		return nil, fmt.Errorf("%d parents for %d tokens", len(parents), T)
	}
	return t.Plan(at, parents)
}

// Commit records rows Plan returned for slots at, at+1, …; at must be the
// slot Plan was given, and nothing committed in between.
func (t *Tree) Commit(at int, rows []Row) {
	for i, r := range rows {
		if r.Parent == Line {
			continue
		}
		if len(t.nodes) == 0 {
			t.base = at + i
		}
		t.nodes = append(t.nodes, node{parent: r.Parent, pos: r.Pos, mask: r.Mask})
	}
}

// Truncate keeps slots below n: the tree loses its nodes from n on, and
// ends when n reaches its base.
func (t *Tree) Truncate(n int) {
	if len(t.nodes) == 0 {
		return
	}
	if n <= t.base {
		t.nodes = t.nodes[:0]
		return
	}
	if i := n - t.base; i < len(t.nodes) {
		t.nodes = t.nodes[:i]
	}
}

// KeepNone ends the tree of a sequence of length n keeping none of its
// nodes, whatever path of it is named — for a drafter whose nodes must be
// computed again once accepted (an EAGLE-3 head's read its own output) —
// and returns the sequence's new length: the tree's base, or n without a
// tree. A path that is not one of the tree's (ErrPath) is refused and
// changes nothing; an empty path drops the tree.
func (t *Tree) KeepNone(n int, path []int) (int, error) {
	base, nodes := t.base, len(t.nodes)
	if _, _, err := t.KeepPath(n, path); err != nil {
		return n, err
	}
	if nodes > 0 {
		return base, nil
	}
	return n, nil
}

// Move is one slot's keys and values copied to another.
type Move struct{ From, To int }

// ErrPath reports a path that is not a root-first chain of the tree's
// nodes.
var ErrPath = errors.New("not a path of the tree")

// KeepPath ends the tree of a sequence of length n, keeping the nodes of
// path (slots, a root first, each the child of the one before): it returns
// the moves that bring them to slots Base, Base+1, … (in order: each reads
// a slot no earlier move wrote) and the sequence's new length. An empty
// path drops the tree. With no tree, only an empty path is kept.
func (t *Tree) KeepPath(n int, path []int) ([]Move, int, error) {
	if len(t.nodes) == 0 {
		if len(path) > 0 {
			return nil, n, fmt.Errorf("%w: the sequence holds no tree", ErrPath)
		}
		return nil, n, nil
	}
	prev := t.base - 1
	var moves []Move
	for d, s := range path {
		i := s - t.base
		if i < 0 || i >= len(t.nodes) || t.nodes[i].parent != prev {
			return nil, n, fmt.Errorf("%w: slot %d at depth %d is not a child of slot %d", ErrPath, s, d, prev)
		}
		if s != t.base+d {
			moves = append(moves, Move{From: s, To: t.base + d})
		}
		prev = s
	}
	t.nodes = t.nodes[:0]
	return moves, t.base + len(path), nil
}
