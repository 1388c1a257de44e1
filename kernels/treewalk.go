package kernels

import (
	"errors"
	"fmt"
	"math"
	"reflect"

	"webdraft/gpu"
	"webdraft/sampling"
	"webdraft/shaders"
)

var (
	treeWalkSums = gpu.Kernel{
		Module: "tree_walk.wgsl", Source: shaders.TreeWalk, Entry: "sums", Params: reflect.TypeFor[walkParams](),
		Storage: walkStorage,
	}
	treeWalkKernel = gpu.Kernel{
		Module: "tree_walk.wgsl", Source: shaders.TreeWalk, Entry: "main", Params: reflect.TypeFor[walkParams](),
		Storage: walkStorage,
	}
	// logits, sampled, temps, qstore, entries, nodes, walk, res
	walkStorage = []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite}
)

// walkParams are tree_walk.wgsl's params.
type walkParams struct{ V, Rows, Slots, Nodes, Stride, Path, Chunks, Psum uint32 }

// walkChunk is how many logits a workgroup of tree_walk.wgsl's sums pass
// covers (its CHUNK).
const walkChunk = 2048

// WalkMaxChildren is the most children a node of TreeWalk's trees has
// (engine.MaxTopN, a drafter row's most proposals).
const WalkMaxChildren = 20

// WalkNodeWords is how many u32 words a node takes in TreeWalk's nodes
// (PutWalkNode), WalkEntryWords a tree in its entries (PutWalkEntry).
const (
	WalkNodeWords  = 4 + 3*WalkMaxChildren
	WalkEntryWords = 4
)

// WalkWords is how many u32 words a tree's record takes in TreeWalk's
// walk when the record holds up to path accepted nodes (a tree of n nodes
// accepts at most n − 1).
func WalkWords(path int) int { return 4 + 2*path }

// tree_walk.wgsl's flags.
const (
	walkNaN = 1 // a row on the walk holds a NaN
	walkBad = 2 // a malformed tree
)

// WalkNode is one node of a tree for TreeWalk.
type WalkNode struct {
	Slot     int       // the Q-store row of the drafter's q its children were drawn from (read only with children)
	Children []int     // the children's nodes in draw order, each after this node
	Tokens   []int     // the children's tokens
	U        []float32 // one uniform in [0, 1) a child
	V        float32   // the uniform of the draw after the node (also Sample's draw of its row: PutWalkSampleRow)
}

// TreeWalk records the target's walk of trees of sampled proposals by the
// multi-draft rule (tree_walk.wgsl; sampling.Verifier.AcceptTree on the
// device), after Sample has read the trees' rows out: a pass sums each
// row's p in chunks, then one workgroup a tree walks it from its root,
// holding each node's children to the rule with the target's p at the node
// (its row under its temperature and top_p, as Sample read it out) and the
// drafter's q (a Q-store row, Propose's, a distribution), and writes the
// accepted path and the bonus token. A node that rejects no child takes
// Sample's draw of its row as its bonus: Sample's draws for the rows must
// hold no proposal and the node's V (PutWalkSampleRow). The residual rows
// and the sums live in the device's scratch buffer (2·V values a tree, and
// a value for each 2,048 logits of a row).
//
//	logits  (rows, V) f32: vocabulary-wide rows; tree t's node j is row
//	        entries[t].row0 + j
//	sampled (rows, SampleWords) u32, temps (rows, SampleTempWords) f32:
//	        Sample's out and temps for the same rows
//	qstore  (slots, V) f32
//	entries (trees, WalkEntryWords) u32: PutWalkEntry
//	nodes   (records, WalkNodeWords) u32: PutWalkNode
//	walk    (trees, WalkWords(path)) u32: WalkResult
func TreeWalk(b *gpu.Batch, walk, logits, sampled, temps, qstore, entries, nodes *gpu.Buffer, trees, rows, V, slots, records, path int) error {
	return treeWalk(b, walk, logits, sampled, temps, qstore, entries, nodes, trees, rows, V, slots, records, path, nil)
}

// treeWalk is TreeWalk with its kernel specialized by consts (the tests'
// FAULT).
func treeWalk(b *gpu.Batch, walk, logits, sampled, temps, qstore, entries, nodes *gpu.Buffer, trees, rows, V, slots, records, path int, consts gpu.Consts) error {
	op := "tree walk"
	if trees <= 0 || rows <= 0 || V <= 0 || slots <= 0 || records <= 0 || path < 0 {
		return fmt.Errorf("kernels: %s: %d trees of %d records over (%d, %d), %d slots, path %d", op, trees, records, rows, V, slots, path)
	}
	words := WalkWords(path)
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"logits", logits, rows * V}, {"sampled", sampled, rows * SampleWords}, {"temps", temps, rows * SampleTempWords},
		{"qstore", qstore, slots * V}, {"entries", entries, trees * WalkEntryWords}, {"nodes", nodes, records * WalkNodeWords},
		{"walk", walk, trees * words}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	d := b.Device()
	chunks := (V + walkChunk - 1) / walkChunk
	psum := trees * 2 * V
	resBytes := uint64(psum+rows*chunks) * 4
	res, err := d.Scratch(resBytes)
	if err != nil {
		return err
	}
	binds := []gpu.Binding{
		logits.Slice(0, uint64(rows*V)*4), sampled.Slice(0, uint64(rows*SampleWords)*4), temps.Slice(0, uint64(rows*SampleTempWords)*4),
		qstore.Slice(0, uint64(slots*V)*4), entries.Slice(0, uint64(trees*WalkEntryWords)*4), nodes.Slice(0, uint64(records*WalkNodeWords)*4),
		walk.Slice(0, uint64(trees*words)*4), res.Slice(0, resBytes),
	}
	params := &walkParams{
		V: uint32(V), Rows: uint32(rows), Slots: uint32(slots), Nodes: uint32(records), Stride: uint32(words), Path: uint32(path),
		Chunks: uint32(chunks), Psum: uint32(psum),
	}
	for _, ps := range []pass{{treeWalkSums, chunks, rows}, {treeWalkKernel, trees, 1}} {
		p, err := d.Pipeline(ps.kernel, consts)
		if err != nil {
			return err
		}
		if err := gpu.Dispatch(b, p, params, binds, uint32(ps.x), uint32(ps.y), 1); err != nil {
			return fmt.Errorf("kernels: %s: %w", op, err)
		}
	}
	return nil
}

// PutWalkSampleRow writes the inputs to Sample of a row that TreeWalk
// walks (a node's): no proposal, and the node's V, which Sample's draw
// uses for the node's bonus when the node rejects no child.
func PutWalkSampleRow(draws []uint32, temps []float32, p sampling.Params, v float32) {
	PutSampleRow(draws, temps, p, sampling.Draw{X: sampling.NoProposal, V: v})
}

// PutWalkEntry writes one tree's entry: its root's read-out row, its
// first node record, and its nodes.
func PutWalkEntry(words []uint32, row0, node0, nodes int) {
	words[0], words[1], words[2], words[3] = uint32(row0), uint32(node0), uint32(nodes), 0
}

// PutWalkNode writes one node's record.
func PutWalkNode(words []uint32, n WalkNode) error {
	k := len(n.Children)
	if k > WalkMaxChildren || len(n.Tokens) != k || len(n.U) != k {
		return fmt.Errorf("kernels: tree walk: %d children, %d tokens, %d uniforms (at most %d children)", k, len(n.Tokens), len(n.U), WalkMaxChildren)
	}
	clear(words[:WalkNodeWords])
	words[0] = uint32(k)
	words[1] = math.MaxUint32
	if k > 0 {
		words[1] = uint32(n.Slot)
	}
	words[2] = math.Float32bits(n.V)
	for i := range k {
		words[4+3*i], words[5+3*i], words[6+3*i] = uint32(n.Children[i]), uint32(n.Tokens[i]), math.Float32bits(n.U[i])
	}
	return nil
}

// ErrWalkTree reports a tree TreeWalk refused: a child not after its node
// or outside the tree, a slot outside the Q store, a token outside the
// vocabulary, or a path longer than the walk record holds.
var ErrWalkTree = errors.New("kernels: tree walk: a malformed tree")

// WalkResult decodes one tree's record of TreeWalk's walk (path as
// passed to it): the accepted nodes, root's child first, each accepted
// token's log-probability under the target at temperature 1, and the
// bonus token with its; sampling.ErrNaN for a tree with a NaN on its walk.
func WalkResult(w []uint32, path int) (nodes []int, logprobs []float32, bonus sampling.TokenLogprob, err error) {
	switch {
	case w[3]&walkNaN != 0:
		return nil, nil, bonus, sampling.ErrNaN
	case w[3]&walkBad != 0 || int(w[0]) > path:
		return nil, nil, bonus, ErrWalkTree
	}
	for k := range int(w[0]) {
		nodes = append(nodes, int(w[4+k]))
		logprobs = append(logprobs, math.Float32frombits(w[4+path+k]))
	}
	return nodes, logprobs, sampling.TokenLogprob{Token: int(w[1]), Logprob: math.Float32frombits(w[2])}, nil
}
