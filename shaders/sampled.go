package shaders

// The kernels of sampled drafts (a drafter that samples its proposals, a
// target that holds them to the multi-draft rule), each as it is compiled.
var (
	// Propose is propose.wgsl: a sampled drafter's proposals — distinct
	// tokens drawn from each row's distribution q, and q kept densely in a
	// Q store for the target.
	Propose = mustModule("propose.wgsl")
	// TreeWalk is tree_walk.wgsl: a target's walk of a tree of sampled
	// proposals by the multi-draft rule (recursive rejection sampling),
	// one workgroup a tree.
	TreeWalk = mustModule("tree_walk.wgsl")
)
