package kernels

import (
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

// A token tree drafted on the device: tree_expand.wgsl grows each
// sequence's node table a drafter pass at a time and writes the next
// frontier's tokens and masks to its feed; tree_select.wgsl picks the
// nodes the target verifies and writes their rows to the feed. The
// buffers' layouts are in the kernels' headers; these are their sizes.
const (
	TreeShapeWords = 8  // a sequence's shape (PutTreeShape)
	TreeStateWords = 32 // a sequence's node count and frontier
	TreeNodeWords  = 10 // a node (TreeNode)
	TreeFeedRows   = 64 // a sequence's feed rows (treemask.MaxNodes)
	TreeFeedWords  = 4  // a feed row: token, position (tree_select) or parent row (tree_expand), mask low, mask high
	// MaxTreeWidth bounds b, a node's children (tree_expand.wgsl's MAXB).
	MaxTreeWidth = 16
	// MaxTreeTable bounds a sequence's node table (tree_select.wgsl's
	// MAXC).
	MaxTreeTable = 1024
)

// treeNone is the kernels' NONE.
const treeNone = math.MaxUint32

var treeExpandKernel = gpu.Kernel{
	Module: "tree_expand.wgsl", Source: shaders.TreeExpand, Entry: "main", Params: reflect.TypeFor[treeExpandParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite}, // shape, top, state, nodes, feed
}

type treeExpandParams struct{ Seqs, Level, C, TopN uint32 }

var treeSelectKernel = gpu.Kernel{
	Module: "tree_select.wgsl", Source: shaders.TreeSelect, Entry: "main", Params: reflect.TypeFor[treeSelectParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite}, // shape, state, nodes, feed
}

type treeSelectParams struct{ Seqs, C, _, _ uint32 }

// TreeTable is the node-table rows a sequence needs for a tree b wide and
// levels deep: b children of the root, then b² a level.
func TreeTable(b, levels int) int { return b + (levels-1)*b*b }

// PutTreeShape writes a sequence's shape (TreeShapeWords words): b
// children a node, levels drafter passes, n nodes verified, out0 the read-out
// row of its first frontier row in the pass at hand (−1: none there), and
// pos0 the position of the target's last line token.
func PutTreeShape(dst []uint32, b, levels, n, out0, pos0 int) {
	o := uint32(treeNone)
	if out0 >= 0 {
		o = uint32(out0)
	}
	dst[0], dst[1], dst[2], dst[3], dst[4] = uint32(b), uint32(levels), uint32(n), o, uint32(pos0)
	dst[5], dst[6], dst[7] = 0, 0, 0
}

// PutTreeParentRows sets a shape's row base for its feed's parent rows
// (tree_expand.wgsl): a frontier node's feed row names its parent's row
// as base + the parent's dslot, where a drafter that reads its own output
// at a node's parent keeps the fed nodes' outputs (PutTreeShape sets 0).
func PutTreeParentRows(dst []uint32, base int) { dst[5] = uint32(base) }

// TreeNode is a node of a tree drafted on the device, as the kernels
// leave it.
type TreeNode struct {
	Token   int
	Parent  int // the parent's index in the table; −1: the root
	Depth   int // 1 for the root's children
	Score   float32
	Logprob float32
	DSlot   int    // its index among the drafter's tree slots; −1: not fed
	DMask   uint64 // its drafter row's mask over them (DSlot ≥ 0)
	Row     int    // its row among the target's verified nodes; −1: not verified
}

// ReadTreeNodes decodes the first n nodes of a node table.
func ReadTreeNodes(w []uint32, n int) []TreeNode {
	idx := func(v uint32) int {
		if v == treeNone {
			return -1
		}
		return int(v)
	}
	out := make([]TreeNode, n)
	for k := range out {
		r := w[k*TreeNodeWords:]
		out[k] = TreeNode{
			Token: int(r[0]), Parent: idx(r[1]), Depth: int(r[2]),
			Score: math.Float32frombits(r[3]), Logprob: math.Float32frombits(r[4]),
			DSlot: idx(r[5]), DMask: uint64(r[6]) | uint64(r[7])<<32, Row: idx(r[8]),
		}
	}
	return out
}

// TreeExpand records one level of device-side tree drafting for seqs
// sequences (tree_expand.wgsl): the children of each sequence's frontier,
// read from top (the pass's read-out rows' most likely tokens, topN a
// row), join its node table of C rows; where another level follows, the
// next frontier's tokens and masks go to feed.
func TreeExpand(b *gpu.Batch, shape, top, state, nodes, feed *gpu.Buffer, seqs, level, C, topN int) error {
	op := "tree_expand"
	if seqs <= 0 || level < 0 || C <= 0 || C > MaxTreeTable || topN <= 0 {
		return fmt.Errorf("kernels: %s: %d sequences, level %d, %d nodes, top %d", op, seqs, level, C, topN)
	}
	if err := needTree(op, shape, state, nodes, feed, seqs, C); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(treeExpandKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{shape.All(), top.All(), state.All(), nodes.All(), feed.All()}
	params := &treeExpandParams{Seqs: uint32(seqs), Level: uint32(level), C: uint32(C), TopN: uint32(topN)}
	if err := gpu.Dispatch(b, p, params, binds, uint32(seqs), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// TreeSelect records the choice of each sequence's verified nodes and
// their target rows (tree_select.wgsl), written to feed.
func TreeSelect(b *gpu.Batch, shape, state, nodes, feed *gpu.Buffer, seqs, C int) error {
	op := "tree_select"
	if seqs <= 0 || C <= 0 || C > MaxTreeTable {
		return fmt.Errorf("kernels: %s: %d sequences, %d nodes", op, seqs, C)
	}
	if err := needTree(op, shape, state, nodes, feed, seqs, C); err != nil {
		return err
	}
	p, err := b.Device().Pipeline(treeSelectKernel, nil)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{shape.All(), state.All(), nodes.All(), feed.All()}
	if err := gpu.Dispatch(b, p, &treeSelectParams{Seqs: uint32(seqs), C: uint32(C)}, binds, uint32(seqs), 1, 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// needTree checks the sizes of a device tree's buffers for seqs sequences
// of node tables of C rows.
func needTree(op string, shape, state, nodes, feed *gpu.Buffer, seqs, C int) error {
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"shape", shape, seqs * TreeShapeWords}, {"state", state, seqs * TreeStateWords}, {"nodes", nodes, seqs * C * TreeNodeWords},
		{"feed", feed, seqs * TreeFeedRows * TreeFeedWords}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	return nil
}
