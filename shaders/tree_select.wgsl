// tree_select.wgsl: the nodes of a token tree drafted on the device
// (tree_expand.wgsl) that the target verifies, and their rows: the N
// best-scored nodes of each sequence's table — ties to the shallower, then
// to the lower index, so that the set is closed under ancestors (no child
// outscores its parent) — ordered parents first (by depth, then index) as
// the target's tree rows 0 … N−1; each one's token, position and ancestor
// mask over those rows written to feed for the target's pass to gather.
//
// Buffers (NONE = 0xffffffff; layouts in tree_expand.wgsl):
//   shape  (seqs, TreeShapeWords) u32: N is word 2 (at most FEEDROWS), the
//          position of the target's last line token word 4; a sequence
//          of no levels (word 1) has no tree, and is skipped
//   state  (seqs, TreeStateWords) u32: word 0 the node count M ≤ MAXC
//   nodes  (seqs, C, TreeNodeWords) u32: trow (word 8) is written, the
//          node's target row (NONE: not verified)
//   feed   (seqs, FEEDROWS, 4) u32: row r's token, position (the last line
//          position plus the node's depth), mask low and high words (bit
//          i: row i, the node's ancestors and itself)
//
// Each thread takes nodes tid, tid + WG, …: a node's rank is how many
// nodes beat it, its row how many chosen nodes come before it; M ≤ MAXC
// keeps each thread's loops within lavapipe's loop budget.
//
// Dispatch: (seqs, 1, 1) workgroups of WG = 256 threads.

const WG: u32 = 256u;
const MAXC: u32 = 1024u;
const NONE: u32 = 0xffffffffu;

struct Params {
    seqs: u32,
    C: u32, // node-table rows a sequence
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> shape: array<u32>;
@group(0) @binding(2) var<storage, read> state: array<u32>;
@group(0) @binding(3) var<storage, read_write> nodes: array<u32>;
@group(0) @binding(4) var<storage, read_write> feed: array<u32>;

var<workgroup> score: array<f32, MAXC>;
var<workgroup> depth: array<u32, MAXC>;
var<workgroup> row: array<u32, MAXC>; // 1 where chosen, then the target row (NONE: not chosen)
var<workgroup> head: array<u32, 2>;   // levels, the node count

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let s = wg.x;
    let sh = s * TREE_SHAPE_WORDS;
    if tid == 0u {
        head[0] = shape[sh + 1u];
        head[1] = state[s * TREE_STATE_WORDS];
    }
    // Loaded uniformly, so that a skipped sequence's threads all leave.
    if workgroupUniformLoad(&head[0]) == 0u {
        return;
    }
    let M = min(workgroupUniformLoad(&head[1]), MAXC);
    let N = min(min(shape[sh + 2u], M), TREE_FEED_ROWS);
    let pos0 = shape[sh + 4u];
    for (var k = tid; k < M; k += WG) {
        let at = tree_node(s, k);
        score[k] = bitcast<f32>(nodes[at + 3u]);
        depth[k] = nodes[at + 2u];
    }
    workgroupBarrier();
    for (var k = tid; k < M; k += WG) {
        var rank = 0u;
        for (var j = 0u; j < M; j++) {
            if score[j] > score[k] || (score[j] == score[k] && (depth[j] < depth[k] || (depth[j] == depth[k] && j < k))) {
                rank++;
            }
        }
        row[k] = select(0u, 1u, rank < N);
    }
    workgroupBarrier();
    var mine: array<u32, 4>; // this thread's rows, at most MAXC / WG nodes
    for (var i = 0u; i < 4u; i++) {
        let k = tid + i * WG;
        mine[i] = NONE;
        if k < M && row[k] == 1u {
            var r = 0u;
            for (var j = 0u; j < M; j++) {
                if row[j] == 1u && (depth[j] < depth[k] || (depth[j] == depth[k] && j < k)) {
                    r++;
                }
            }
            mine[i] = r;
        }
    }
    workgroupBarrier();
    for (var i = 0u; i < 4u; i++) {
        let k = tid + i * WG;
        if k < M {
            row[k] = mine[i];
        }
    }
    workgroupBarrier();
    for (var k = tid; k < M; k += WG) {
        let at = tree_node(s, k);
        let r = row[k];
        nodes[at + 8u] = r;
        if r == NONE {
            continue;
        }
        var mlo = 0u;
        var mhi = 0u;
        var a = k;
        // Up the ancestors, each chosen (the set is closed under them), at
        // most one a level.
        for (var d = 0u; d < 64u && a != NONE; d++) {
            let ra = row[a];
            if ra < 32u {
                mlo |= 1u << ra;
            } else if ra < 64u {
                mhi |= 1u << (ra - 32u);
            }
            a = nodes[tree_node(s, a) + 1u];
        }
        let fr = (s * TREE_FEED_ROWS + r) * 4u;
        feed[fr] = nodes[at];
        feed[fr + 1u] = pos0 + depth[k];
        feed[fr + 2u] = mlo;
        feed[fr + 3u] = mhi;
    }
}
