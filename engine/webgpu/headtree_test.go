package webgpu

import (
	"testing"

	"webdraft/engine/enginetest"
)

// TestHeadTree: enginetest.HeadTree, token trees drafted through Verify
// held to reference.Head (int4 weights, f32 KV cache) — levels of several
// children a node to depth 3, the tree in one call, a line past the
// target read out, KeepPath and a dropped tree.
func TestHeadTree(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadTree(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head, rig.oracle.lpTol)
}

// TestHeadTreePasses: the same in passes of five rows of which at most
// four are read out (MaxSequences 4), so that a level's rows, and the
// stages of a tree fed in one call, take several passes each.
func TestHeadTreePasses(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{KVBytes: 1 << 20, MaxSequences: 4, MaxRows: 5, KV: "f32"})
	enginetest.HeadTree(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head, rig.oracle.lpTol)
}

// TestHeadTreeBatch: enginetest.HeadTreeBatch, trees drafted in one batch
// against each drafted alone.
func TestHeadTreeBatch(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadTreeBatch(t, rig.head, rig.target, headLogprobTol)
}

// TestHeadTreeRefusals: enginetest.HeadTreeRefusals, what Verify refuses
// and that a refusal changes nothing.
func TestHeadTreeRefusals(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	plain, _, _ := tinyTarget(t, rig.target.g, enginetest.HeadLayers, nil)
	other, _ := plain.NewSequence()
	enginetest.TargetStep(t, plain, other, 1, 2, 3)
	enginetest.HeadTreeRefusals(t, rig.head, rig.target, other)
}
