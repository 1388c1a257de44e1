package cpu

import (
	"fmt"
	"testing"

	"webdraft/engine/cpu/ops"
	"webdraft/engine/enginetest"
)

// TestHeadTree: enginetest.HeadTree, token trees drafted through Verify
// held to reference.Head — levels of several children a node to depth 3,
// the tree in one call, a line past the target read out, KeepPath and a
// dropped tree.
func TestHeadTree(t *testing.T) {
	testHeadTree(t, newHeadRig(t, false))
}

// TestHeadTreeInt4: the same over a head quantized to int4, on both
// kernels.
func TestHeadTreeInt4(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			defer ops.SetFixed(ops.SetFixed(fixed))
			testHeadTree(t, newHeadRig(t, true))
		})
	}
}

func testHeadTree(t *testing.T, rig *headRig) {
	enginetest.HeadTree(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head, 1e-4)
}

// TestHeadTreeBatch: enginetest.HeadTreeBatch, trees drafted in one batch
// against each drafted alone.
func TestHeadTreeBatch(t *testing.T) {
	rig := newHeadRig(t, false)
	enginetest.HeadTreeBatch(t, rig.head, rig.target, 1e-5)
}

// TestHeadTreeRefusals: enginetest.HeadTreeRefusals, what Verify refuses
// and that a refusal changes nothing.
func TestHeadTreeRefusals(t *testing.T) {
	rig := newHeadRig(t, false)
	plain, _, _, _ := tinyTarget(t, enginetest.HeadLayers, nil)
	other := enginetest.NewSequence(t, plain)
	enginetest.TargetStep(t, plain, other, 1, 2, 3)
	enginetest.HeadTreeRefusals(t, rig.head, rig.target, other)
}
