// tree_walk.wgsl: a target's verification of a tree of sampled proposals
// by the multi-draft rule (recursive rejection sampling) —
// sampling.Verifier.AcceptTree on the GPU, one workgroup a tree, so that
// only the accepted path and the bonus token come back to the host.
//
// At a node on row r, p is the target's distribution there: e_i =
// exp((l_i − max) · (1/T)) over the kept tokens (l_i / T ≥ θ, sample.wgsl's
// rule; a one-hot at the argmax for T ≤ 0), normalized; q is the
// drafter's distribution its children were drawn from, a row of the Q
// store (propose.wgsl writes it). Its children x_1 … x_m, in draw order,
// are tried in turn:
//   accept x_k   iff u_k · q(x_k) < p(x_k)
//   on rejection p ← norm(max(0, p − q)), q ← q with x_k zeroed, normalized
//                (x_k accepted after all when p − q leaves no mass: p = q
//                up to rounding, as sampling.AcceptNode does)
// The walk moves to the accepted child (its token's log p at temperature
// 1, l − logsumexp of the node's row, goes with it) and goes on there;
// at a node that rejects every child, or has none, the bonus token is
// drawn from the last p by the inverse CDF in token order at v.
//
// Two entry points. sums: workgroup (c, r) sums the kept e over chunk c
// of read-out row r (CHUNK logits, PER loads a thread, coalesced), so
// that a node's p needs no pass over its row of its own. main: workgroup
// t walks tree t. A node tests its first child from its row's sums and
// two values, q being a distribution (its sum, 1 up to rounding, is taken
// as 1): a path of accepted children reads no row. The residuals are
// kept unnormalized with their sums (p_i = P_i / Sp); the first rejection
// at a node writes them into res from the logits and the Q store, later
// ones from res, each a pass over the row CHUNK logits at a time, thread
// lid always on the same elements (i ≡ lid mod WG), so that a thread reads
// only residuals it wrote; a storageBarrier after each pass lets thread 0
// read the one it tests and the draw read all. A node that rejected no
// child draws from its p whole: that is sample.wgsl's draw of the row
// with no proposal, and its token is taken from sampled (the caller gives
// the row's sample.wgsl draw the node's v). The draw from a residual
// scans in token order in two levels: each thread's contiguous run of
// ceil(V / WG) elements, then the run the goal falls in split across the
// threads.
//
// What sample.wgsl found for the rows is reused: the argmax (max =
// logits[argmax]), θ, the logsumexp, the NaN flag, the draw.
//
// Buffers:
//   logits  (rows, V) f32: vocabulary-wide rows (a partial head's
//           scattered among −∞)
//   sampled (rows, 8) u32: sample.wgsl's out for the same rows (argmax,
//           sample, flags, θ, logsumexp read), each row drawn at its
//           node's v with no proposal
//   temps   (rows) vec2<f32>: T, top_p (sample.wgsl's)
//   qstore  (slots, V) f32: the drafter's q rows (propose.wgsl)
//   entries (trees) vec4<u32>: the tree's first read-out row (its root's),
//           its first node record, its nodes, unused. Node j is read-out row
//           first + j.
//   nodes   (records, NODE) u32: a node's children count (≤ MAXC), its q's
//           slot, v's bits, unused, then MAXC (child node, child token, u
//           bits), in draw order; a child's node is after its parent's
//   walk    (trees, stride) u32: the path's length L, the bonus token, its
//           log p bits, flags (NAN: a row on the walk holds a NaN; BAD: a
//           malformed tree or a path longer than the record), then `path`
//           words of the accepted nodes (root's child first), then `path`
//           words of their tokens' log p bits
//   res     scratch: (trees, 2, V) f32, a tree's residual P and q; then
//           at psum (rows, chunks) f32, the sums pass's
//
// Dispatch: sums (chunks, rows, 1), then main (trees, 1, 1); WG = 256
// threads, CHUNK = WG · PER = 2,048 as in sample.wgsl, so that a
// 151,936-token pass is 75 workgroups in sums and 75 rounds of 8 coalesced
// loads a thread in main. The walk is one workgroup because its steps are
// sequential and mostly cheap (on the H200 at 151,936: a chain of 8
// accepted in 32 µs with the sums pass, a node whose 4 children are all
// rejected 360 µs: a rejection is a pass over the row on one SM).
// Lavapipe ends an invocation's loops after 65,535 iterations in all: a
// rejection costs
// ceil(V / CHUNK) · (1 + 2 · PER) iterations (1,275 at V = 151,936) and a
// draw from a residual about ceil(V / WG) more, so at that V lavapipe
// holds a walk of about 50 rejections.

const WG: u32 = 256u;
const PER: u32 = 8u;
const CHUNK: u32 = WG * PER;
const MAXC: u32 = 20u; // children a node at most (engine.MaxTopN)
const NODE: u32 = 64u; // node record words: 4 + 3 · MAXC
const NONE: u32 = 0xffffffffu;
const S_WORDS: u32 = 8u; // sample.wgsl's out words a row
const S_NAN: u32 = 2u;   // its NaN flag
const NAN: u32 = 1u;     // walk's flags
const BAD: u32 = 2u;
const F32_MAX: f32 = 3.402823466e38;
// FAULT = 1 is a deliberate mistake for the tests' goodness-of-fit check
// to catch: after a rejection, q's rejected child is zeroed but q is not
// renormalized. 0 in use.
const FAULT: u32 = 0u;

// A row's mode.
const SAMPLED: u32 = 0u;
const GREEDY: u32 = 1u;
const SKIP: u32 = 2u; // a row with a NaN (or no finite logit)

struct WalkParams {
    V: u32,      // the row length (the vocabulary)
    rows: u32,   // read-out rows bound
    slots: u32,  // rows of the Q store
    nodes: u32,  // node records bound
    stride: u32, // words of a tree's walk record: 4 + 2 · path
    path: u32,   // accepted nodes a walk record holds
    chunks: u32, // ceil(V / CHUNK)
    psum: u32,   // where in res the sums pass writes: trees · 2 · V
}

@group(0) @binding(0) var<uniform> p: WalkParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> sampled: array<u32>;
@group(0) @binding(3) var<storage, read> temps: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read> qstore: array<f32>;
@group(0) @binding(5) var<storage, read> entries: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> nodes: array<u32>;
@group(0) @binding(7) var<storage, read_write> walk: array<u32>;
@group(0) @binding(8) var<storage, read_write> res: array<f32>;

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_v: array<u32, WG>;

// at_excl and at_incl are scan's sums before and through the thread.
var<private> at_excl: f32;
var<private> at_incl: f32;

// The node's row-wide values, read by the helpers.
var<private> row_s: Stats;
var<private> row_base: u32; // the node's first logit
var<private> q_base: u32;   // its q's first value in the Q store
var<private> res_p: u32;    // the tree's residual P in res
var<private> res_q: u32;    // and its residual q

// draw_from returns the token where v of the residual p's mass falls in
// its cumulative sums in token order (the last token of weight when
// rounding carries it past the end; the argmax if it has no mass left).
fn draw_from(lid: u32, v: f32) -> u32 {
    let V = p.V;
    let run = (V + WG - 1u) / WG;
    let b0 = min(lid * run, V);
    let b1 = min(b0 + run, V);
    var own = 0.0;
    for (var i0 = b0; i0 < b1; i0 += PER) { // PER loads together
        var ws: array<f32, PER>;
        for (var j = 0u; j < PER; j++) {
            ws[j] = res[res_p + min(i0 + j, b1 - 1u)];
        }
        for (var j = 0u; j < PER; j++) {
            if i0 + j < b1 {
                own += ws[j];
            }
        }
    }
    let goal = v * scan(lid, own);
    let at = hit(lid, own, goal);
    if at.y == 0u {
        return row_s.argmax;
    }
    workgroupBarrier();
    if lid == at.x {
        red_f[0] = goal - at_excl;
    }
    let rest = workgroupUniformLoad(&red_f[0]);
    // The run the goal falls in, split across the threads.
    let r0 = at.x * run;
    let r1 = min(r0 + run, V);
    let sub = (run + WG - 1u) / WG;
    let e0 = min(r0 + lid * sub, r1);
    let e1 = min(e0 + sub, r1);
    var mine = 0.0;
    for (var i = e0; i < e1; i++) {
        mine += res[res_p + i];
    }
    scan(lid, mine);
    let at2 = hit(lid, mine, rest);
    if at2.y == 0u {
        return row_s.argmax;
    }
    workgroupBarrier();
    if lid == at2.x {
        var acc = at_excl;
        var z = NONE;
        for (var i = e0; i < e1; i++) {
            let w = res[res_p + i];
            if w > 0.0 {
                acc += w;
                z = i;
                if rest < acc {
                    break;
                }
            }
        }
        red_u[0] = z;
    }
    return workgroupUniformLoad(&red_u[0]);
}

@compute @workgroup_size(WG)
fn sums(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x;
    let r = wid.y;
    let V = p.V;
    let s = stats(r);
    let v0 = c * CHUNK + lid;
    var ls: array<f32, PER>;
    for (var j = 0u; j < PER; j++) { // all loads first, then the sums
        ls[j] = logits[r * V + min(v0 + j * WG, V - 1u)];
    }
    var a = 0.0;
    for (var j = 0u; j < PER; j++) {
        if v0 + j * WG < V {
            a += e_of(s, ls[j], v0 + j * WG);
        }
    }
    a = sum_all(lid, a);
    if lid == 0u {
        res[p.psum + r * p.chunks + c] = a;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let ent = entries[t];
    let row0 = ent.x;
    let node0 = ent.y;
    let n = ent.z;
    let V = p.V;
    let o = t * p.stride;
    res_p = t * 2u * V;
    res_q = res_p + V;
    var node = 0u;
    var plen = 0u;
    var flags = 0u;
    var bonus = NONE;
    var bonus_lp = 0.0;
    var done = false;
    for (var it = 0u; it < n && !done; it++) { // each move goes to a later node
        let r = row0 + node;
        let rec = (node0 + node) * NODE;
        if r >= p.rows || node0 + node >= p.nodes {
            flags |= BAD;
            break;
        }
        let s = stats(r);
        if s.mode == SKIP {
            flags |= NAN;
            break;
        }
        row_s = s;
        row_base = r * V;
        let nc = nodes[rec];
        let slot = nodes[rec + 1u];
        var ok = nc <= MAXC && (nc == 0u || slot < p.slots);
        for (var k = 0u; k < min(nc, MAXC); k++) {
            let ch = nodes[rec + 4u + 3u * k];
            ok = ok && ch > node && ch < n && nodes[rec + 5u + 3u * k] < V;
        }
        if !ok {
            flags |= BAD;
            break;
        }
        q_base = slot * V;
        let lse = bitcast<f32>(sampled[r * S_WORDS + 4u]);

        // The children in draw order; acc: the one accepted.
        var fresh = true;
        var acc = NONE;
        if nc > 0u {
            // p's kept mass, from the sums pass; q, a distribution, sums to
            // 1 (up to its rounding, which the rule does not resolve).
            var a = 0.0;
            for (var c = lid; c < p.chunks; c += WG) {
                a += res[p.psum + r * p.chunks + c];
            }
            var sp = sum_all(lid, a);
            var sq = 1.0;
            for (var k = 0u; k < nc; k++) {
                let x = nodes[rec + 5u + 3u * k];
                let u = bitcast<f32>(nodes[rec + 6u + 3u * k]);
                if lid == 0u {
                    var px = 0.0;
                    var qx = 0.0;
                    if fresh {
                        px = e_of(s, logits[row_base + x], x);
                        qx = qstore[q_base + x];
                    } else {
                        px = res[res_p + x];
                        qx = res[res_q + x];
                    }
                    red_u[0] = select(0u, 1u, u * (qx / sq) < px / sp);
                }
                if workgroupUniformLoad(&red_u[0]) != 0u {
                    acc = k;
                    break;
                }
                // Rejected: P ← max(0, p − q), q ← q without x.
                var a2 = 0.0;
                var b2 = 0.0;
                for (var c0 = 0u; c0 < V; c0 += CHUNK) {
                    var ps: array<f32, PER>;
                    var qs: array<f32, PER>;
                    for (var j = 0u; j < PER; j++) {
                        let i = min(c0 + j * WG + lid, V - 1u);
                        if fresh {
                            ps[j] = logits[row_base + i];
                            qs[j] = qstore[q_base + i];
                        } else {
                            ps[j] = res[res_p + i];
                            qs[j] = res[res_q + i];
                        }
                    }
                    for (var j = 0u; j < PER; j++) {
                        let i = c0 + j * WG + lid;
                        if i < V {
                            var pi = ps[j];
                            if fresh {
                                pi = e_of(s, pi, i);
                            }
                            let d = max(pi / sp - qs[j] / sq, 0.0);
                            res[res_p + i] = d;
                            a2 += d;
                            let qi = select(qs[j], 0.0, i == x);
                            res[res_q + i] = qi;
                            b2 += qi;
                        }
                    }
                }
                storageBarrier();
                let sp2 = sum_all(lid, a2);
                let sq2 = sum_all(lid, b2);
                fresh = false;
                if !(sp2 > 0.0) { // p = q up to rounding: the exact rule accepts x
                    acc = k;
                    break;
                }
                sp = sp2;
                if FAULT == 0u {
                    sq = sq2;
                }
            }
        }
        if acc != NONE {
            if plen >= p.path {
                flags |= BAD;
                break;
            }
            let ch = nodes[rec + 4u + 3u * acc];
            let x = nodes[rec + 5u + 3u * acc];
            if lid == 0u {
                walk[o + 4u + plen] = ch;
                walk[o + 4u + p.path + plen] = bitcast<u32>(logits[row_base + x] - lse);
            }
            plen++;
            node = ch;
        } else {
            if fresh { // p whole: sample.wgsl's draw at v
                bonus = sampled[r * S_WORDS + 1u];
            } else {
                bonus = draw_from(lid, bitcast<f32>(nodes[rec + 2u]));
            }
            bonus_lp = logits[row_base + min(bonus, V - 1u)] - lse;
            done = true;
        }
    }
    if !done && flags == 0u {
        flags = BAD;
    }
    if lid == 0u {
        walk[o] = plen;
        walk[o + 1u] = select(NONE, bonus, done);
        walk[o + 2u] = bitcast<u32>(bonus_lp);
        walk[o + 3u] = flags;
    }
}
