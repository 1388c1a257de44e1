// tree_expand.wgsl: one level of a token tree drafted on the device
// (EAGLE-2's dynamic tree, as package speculative drafts it on the host):
// after a drafter pass whose read-out rows are a sequence's frontier, each
// frontier node's b most likely next tokens join the sequence's node
// table as its children, scored by the path's summed log-probability; and
// where another level follows, the b best-scored of the new nodes become
// the next frontier — their tokens and their rows' ancestor masks written
// to feed, for the next pass to gather (gather.wgsl) — all without the
// host. Level 0's frontier is the context's last token (the root).
//
// Buffers (NONE = 0xffffffff):
//   shape  (seqs, TreeShapeWords) u32: b (children a node, ≤ MAXB), the
//          levels d, the nodes verified N, out0 — the pass's read-out row
//          of the sequence's first frontier row, NONE where the sequence
//          has no frontier in this pass —, the target's line end
//          (tree_select.wgsl), and a row base for feed's parent rows
//          (0 where the caller has no use for them)
//   top    (rows, topN, 2) u32: each read-out row's most likely tokens,
//          (token, log-probability bits), best first (sample.wgsl's top)
//   state  (seqs, TreeStateWords) u32: the node count, then the frontier's
//          node indices
//   nodes  (seqs, C, TreeNodeWords) u32: token, parent (NONE: the root),
//          depth, score (f32), log-probability (f32), dslot (the node's
//          index among the drafter's tree slots, NONE: not fed), the
//          drafter mask's two words (bit i: tree slot i, its ancestors and
//          itself), trow (tree_select.wgsl), 0
//   feed   (seqs, FEEDROWS, 4) u32: the next frontier's rows: token, the
//          parent's row — the row base plus the parent's dslot, NONE for a
//          child of the root: where a drafter that reads its own output
//          at the parent's row (an EAGLE-3 head) keeps the fed nodes'
//          outputs by dslot —, mask low and high words
//
// Thread c of a sequence's workgroup owns candidate c = f·b + r: the r-th
// token of frontier row f. A child's score is its parent's plus its
// log-probability, clamped to ≤ 0 so that no child outscores its parent
// (a set of best-scored nodes is then closed under ancestors). The next
// frontier is the b best-scored candidates, ties to the lower index (the
// host's stable sort), the j-th of them fed at drafter tree slot level·b + j.
//
// Dispatch: (seqs, 1, 1) workgroups of WG = MAXB² threads.

const MAXB: u32 = 16u;
const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct Params {
    seqs: u32,
    level: u32, // the frontier's depth: 0 for the root
    C: u32,     // node-table rows a sequence
    topN: u32,  // row stride of top
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> shape: array<u32>;
@group(0) @binding(2) var<storage, read> top: array<u32>;
@group(0) @binding(3) var<storage, read_write> state: array<u32>;
@group(0) @binding(4) var<storage, read_write> nodes: array<u32>;
@group(0) @binding(5) var<storage, read_write> feed: array<u32>;

var<workgroup> cand: array<f32, WG>;
var<workgroup> head: array<u32, 5>; // b, levels, out0, the node count, the parents' row base

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) c: u32) {
    let s = wg.x;
    let sh = s * TREE_SHAPE_WORDS;
    let st = s * TREE_STATE_WORDS;
    if c == 0u {
        head[0] = min(shape[sh], MAXB);
        head[1] = shape[sh + 1u];
        head[2] = shape[sh + 3u];
        head[3] = state[st];
        head[4] = shape[sh + 5u];
    }
    // Loaded uniformly, so that a skipped sequence's threads all leave.
    let b = workgroupUniformLoad(&head[0]);
    let levels = workgroupUniformLoad(&head[1]);
    let out0 = workgroupUniformLoad(&head[2]);
    if out0 == NONE || p.level >= levels || b == 0u {
        return;
    }
    var F = b;
    var count = workgroupUniformLoad(&head[3]);
    if p.level == 0u {
        F = 1u;
        count = 0u;
    }
    let n = F * b;
    var score = -3.0e38;
    var k = 0u;
    var parent = NONE;
    var tok = 0u;
    if c < n {
        let f = c / b;
        let r = c % b;
        let at = ((out0 + f) * p.topN + r) * 2u;
        tok = top[at];
        let lp = bitcast<f32>(top[at + 1u]);
        var base = 0.0;
        if p.level > 0u {
            parent = state[st + 1u + f];
            base = bitcast<f32>(nodes[tree_node(s, parent) + 3u]);
        }
        score = base + min(lp, 0.0);
        k = count + c;
        let at_k = tree_node(s, k);
        nodes[at_k] = tok;
        nodes[at_k + 1u] = parent;
        nodes[at_k + 2u] = p.level + 1u;
        nodes[at_k + 3u] = bitcast<u32>(score);
        nodes[at_k + 4u] = bitcast<u32>(lp);
        nodes[at_k + 5u] = NONE;
        nodes[at_k + 6u] = 0u;
        nodes[at_k + 7u] = 0u;
        nodes[at_k + 8u] = NONE;
        nodes[at_k + 9u] = 0u;
    }
    cand[c] = score;
    // Every frontier read and every parent's score read above happen
    // before any thread writes the new frontier below.
    workgroupBarrier();
    storageBarrier();
    if c < n && p.level + 1u < levels {
        var rank = 0u;
        for (var j = 0u; j < n; j++) {
            let o = cand[j];
            if o > score || (o == score && j < c) {
                rank++;
            }
        }
        if rank < b {
            let dslot = p.level * b + rank;
            var mlo = 0u;
            var mhi = 0u;
            var prow = NONE;
            if parent != NONE {
                let ap = tree_node(s, parent);
                mlo = nodes[ap + 6u];
                mhi = nodes[ap + 7u];
                prow = head[4] + nodes[ap + 5u];
            }
            if dslot < 32u {
                mlo |= 1u << dslot;
            } else {
                mhi |= 1u << (dslot - 32u);
            }
            let at_k = tree_node(s, k);
            nodes[at_k + 5u] = dslot;
            nodes[at_k + 6u] = mlo;
            nodes[at_k + 7u] = mhi;
            state[st + 1u + rank] = k;
            let fr = (s * TREE_FEED_ROWS + rank) * 4u;
            feed[fr] = tok;
            feed[fr + 1u] = prow;
            feed[fr + 2u] = mlo;
            feed[fr + 3u] = mhi;
        }
    }
    if c == 0u {
        state[st] = count + n;
    }
}
