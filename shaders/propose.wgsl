// propose.wgsl: a sampled drafter's proposals — sampling.Dist and
// sampling.DrawDistinct on the GPU. For read-out row r of a drafter's
// logits, after sample.wgsl has read the row out (its argmax and nucleus
// threshold θ), with T and top_p the row's and n ≤ MAXD uniforms u_k:
//   q(i)  = e_i / W, e_i = exp((l_i − max) · (1/T)) for the kept tokens
//           (l_i / T ≥ θ, sample.wgsl's rule), 0 for the others, W = Σ e;
//           a one-hot at the argmax for a greedy row (T ≤ 0)
//   x_k   = the token where u_k · (what is left of W) falls in the
//           cumulative sums of e over the kept tokens not yet drawn, in
//           token order (the inverse CDF of q with x_0 … x_{k−1} removed);
//           the draws stop when nothing is left (fewer kept tokens than n)
//   out   = x_k and log q(x_k) = (l − max) · (1/T) − log W, and q written
//           densely over the vocabulary at the row's slot of the Q store,
//           for the target's tree walk (tree_walk.wgsl) to read
// The logits are a vocabulary-wide row: a head over part of the vocabulary
// (lm_head.token_ids) has been scattered into −∞ (scatter.wgsl), as for
// sample.wgsl, so the inverse CDF runs in vocabulary token order and the
// other tokens have q = 0 — sampling.DrawDistinct over sampling.Dist of
// the scattered row, in f32 where those sum in float64.
//
// What sample.wgsl found is reused, not recomputed: the argmax (so max is
// logits[argmax]), θ, the NaN flag. Its per-chunk sums are not: a chunk's
// weight here is the sum of exactly the terms the draw's element scan adds
// (the kept e_i), which sample.wgsl's records give only for chunks kept
// whole. Three entry points, one after the other:
//   weights: workgroup (c, r) sums e over chunk c of row r (CHUNK logits,
//            PER a thread, coalesced) into W_c.
//   draw:    workgroup r draws the row's tokens: W = Σ W_c (written for
//            dense); per draw a scan over the chunks' weights, then over
//            the elements of the chunk it falls in (PER a thread, in
//            token order, loaded once), as sample.wgsl's merge draws; the
//            chunk's weight is then summed again from the threads'
//            weights without the token drawn (a difference of sums could
//            round it away).
//   dense:   workgroup (c, r) writes q over chunk c at the row's slot.
//
// Buffers:
//   logits  (rows, V) f32
//   sampled (rows, 8) u32: sample.wgsl's out for the same rows (argmax,
//           flags, θ bits read)
//   temps   (rows) vec2<f32>: T, top_p (sample.wgsl's)
//   props   (rows, PROP) u32: n (≤ MAXD), the row's Q-store slot (NONE or
//           ≥ slots: keep no q), 2 unused, then MAXD uniforms' bits
//   drawn   (rows, MAXD) vec2<u32>: token, log q bits; (NONE, NONE) past
//           the tokens drawn
//   qstore  (slots, V) f32: q of row r at row props[r].slot
//   wsum    (rows·chunks + rows) f32 scratch: the chunk weights W_c, row
//           by row, then each row's W
//
// Dispatch: weights (chunks, rows, 1), draw (rows, 1, 1), dense (chunks,
// rows, 1); chunks = ceil(V / CHUNK) ≤ MAXG. WG = 256 and CHUNK = 2,048
// as in sample.wgsl: a 151,936-token row is 75 workgroups in the
// row-wide passes, and a draw's element scan is PER = 8 loads a thread.
// The draw's workgroup holds the chunk weights in workgroup memory (MAXG
// of them, 2 KB) and the tokens drawn; a draw costs it two scans, two
// one-pass searches and a sum over the workgroup (about 60 barriers: ~8 µs
// a draw on the H200, where the draws dominate 20 of them) and, per
// thread, PER · (tokens drawn) comparisons — about 10k loop iterations
// for 20 draws, well within lavapipe's 65,535.

const WG: u32 = 256u;
const PER: u32 = 8u;
const CHUNK: u32 = WG * PER;
const MAXD: u32 = 20u;  // tokens a row draws at most (engine.MaxTopN)
const MAXG: u32 = 512u; // chunks a row at most: V ≤ 1,048,576
const PROP: u32 = 24u;  // props words a row: 4 + MAXD
const NONE: u32 = 0xffffffffu;
const S_WORDS: u32 = 8u; // sample.wgsl's out words a row
const S_NAN: u32 = 2u;   // its NaN flag
const F32_MAX: f32 = 3.402823466e38;

// A row's mode.
const SAMPLED: u32 = 0u;
const GREEDY: u32 = 1u;
const SKIP: u32 = 2u; // a row with a NaN (or no finite logit): no q, no draws

struct ProposeParams {
    V: u32,      // the row length (the vocabulary)
    chunks: u32, // ceil(V / CHUNK)
    slots: u32,  // rows of the Q store
    rows: u32,   // rows read out (wsum's rows)
}

@group(0) @binding(0) var<uniform> p: ProposeParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> sampled: array<u32>;
@group(0) @binding(3) var<storage, read> temps: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read> props: array<u32>;
@group(0) @binding(5) var<storage, read_write> drawn: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> qstore: array<f32>;
@group(0) @binding(7) var<storage, read_write> wsum: array<f32>;

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_v: array<u32, WG>;
var<workgroup> cw: array<f32, MAXG>;   // draw: the chunks' weights, what is left of them
var<workgroup> taken: array<u32, MAXD>; // draw: the tokens drawn so far

// at_excl and at_incl are scan's sums before and through the thread.
var<private> at_excl: f32;
var<private> at_incl: f32;

@compute @workgroup_size(WG)
fn weights(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x;
    let r = wid.y;
    let V = p.V;
    let s = stats(r);
    let base = r * V;
    let v0 = c * CHUNK + lid;
    var xs: array<f32, PER>;
    for (var j = 0u; j < PER; j++) { // all loads first, then the sums
        xs[j] = logits[base + min(v0 + j * WG, V - 1u)];
    }
    var w = 0.0;
    for (var j = 0u; j < PER; j++) {
        if v0 + j * WG < V {
            w += e_of(s, xs[j], v0 + j * WG);
        }
    }
    w = sum_all(lid, w);
    if lid == 0u {
        wsum[r * p.chunks + c] = w;
    }
}

// drawn_before reports whether token i is among the first n drawn.
fn drawn_before(i: u32, n: u32) -> bool {
    for (var k = 0u; k < n; k++) {
        if taken[k] == i {
            return true;
        }
    }
    return false;
}

@compute @workgroup_size(WG)
fn draw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    let V = p.V;
    let G = p.chunks;
    let s = stats(r);
    let base = r * V;
    let pr = r * PROP;
    let count = min(props[pr], MAXD);
    for (var c = lid; c < G; c += WG) {
        cw[c] = wsum[r * G + c];
    }
    workgroupBarrier();
    // Thread lid's contiguous run of chunks, for the scans in token order.
    let CG = (G + WG - 1u) / WG;
    let c0 = min(lid * CG, G);
    let c1 = min(c0 + CG, G);
    var own = 0.0;
    for (var c = c0; c < c1; c++) {
        own += cw[c];
    }
    let W = sum_all(lid, own);
    if lid == 0u {
        wsum[p.rows * G + r] = W;
    }

    var n = 0u;
    if s.mode == GREEDY && count > 0u { // q is a one-hot: its one token, then nothing left
        if lid == 0u {
            drawn[r * MAXD] = vec2<u32>(s.argmax, 0u); // log 1
        }
        n = 1u;
    }
    if s.mode == SAMPLED {
        for (var k = 0u; k < count; k++) {
            own = 0.0;
            for (var c = c0; c < c1; c++) {
                own += cw[c];
            }
            let left = scan(lid, own);
            if !(left > 0.0) { // every kept token drawn
                break;
            }
            let goal = bitcast<f32>(props[pr + 4u + k]) * left;
            let at = hit(lid, own, goal);
            if at.y == 0u {
                break;
            }
            // The chunk the goal falls in and what is left of the goal there.
            workgroupBarrier();
            if lid == at.x {
                var acc = at_excl;
                var hit = NONE;
                var last = NONE;
                var before = 0.0;
                for (var c = c0; c < c1; c++) {
                    let w = cw[c];
                    if w > 0.0 {
                        last = c;
                        before = acc;
                        acc += w;
                        if goal < acc {
                            hit = c;
                            break;
                        }
                    }
                }
                red_u[0] = select(last, hit, hit != NONE);
                red_f[0] = goal - before;
            }
            let cs = workgroupUniformLoad(&red_u[0]);
            let rest = workgroupUniformLoad(&red_f[0]);

            // Then over the elements of that chunk, PER to a thread in
            // token order, their weights loaded once (the loads together).
            let e0 = cs * CHUNK + lid * PER;
            var ls: array<f32, PER>;
            for (var j = 0u; j < PER; j++) {
                ls[j] = logits[base + min(e0 + j, V - 1u)];
            }
            var ws: array<f32, PER>;
            var mine = 0.0;
            for (var j = 0u; j < PER; j++) {
                ws[j] = 0.0;
                if e0 + j < V && !drawn_before(e0 + j, n) {
                    ws[j] = e_of(s, ls[j], e0 + j);
                }
                mine += ws[j];
            }
            scan(lid, mine);
            let at2 = hit(lid, mine, rest);
            if at2.y == 0u { // the chunk's weight was all rounding
                break;
            }
            workgroupBarrier();
            if lid == at2.x {
                var acc = at_excl;
                var z = NONE;
                for (var j = 0u; j < PER; j++) {
                    if ws[j] > 0.0 {
                        acc += ws[j];
                        z = e0 + j;
                        if rest < acc {
                            break;
                        }
                    }
                }
                red_u[0] = z;
            }
            let y = workgroupUniformLoad(&red_u[0]);
            if lid == 0u {
                taken[n] = y;
                let lq = (logits[base + y] - s.m) * s.inv_t - log(W);
                drawn[r * MAXD + n] = vec2<u32>(y, bitcast<u32>(lq));
            }
            n++;
            // The chunk's weight without the tokens drawn from it.
            mine = 0.0;
            for (var j = 0u; j < PER; j++) {
                if e0 + j != y {
                    mine += ws[j];
                }
            }
            let w = sum_all(lid, mine);
            if lid == 0u {
                cw[cs] = w;
            }
            workgroupBarrier();
        }
    }
    for (var k = n + lid; k < MAXD; k += WG) {
        drawn[r * MAXD + k] = vec2<u32>(NONE, NONE);
    }
}

@compute @workgroup_size(WG)
fn dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x;
    let r = wid.y;
    let V = p.V;
    let slot = props[r * PROP + 1u];
    if slot >= p.slots {
        return;
    }
    let s = stats(r);
    let W = wsum[p.rows * p.chunks + r];
    let base = r * V;
    let v0 = c * CHUNK + lid;
    var xs: array<f32, PER>;
    for (var j = 0u; j < PER; j++) {
        xs[j] = logits[base + min(v0 + j * WG, V - 1u)];
    }
    for (var j = 0u; j < PER; j++) {
        let i = v0 + j * WG;
        if i < V {
            var q = 0.0;
            if W > 0.0 {
                q = e_of(s, xs[j], i) / W;
            }
            qstore[slot * V + i] = q;
        }
    }
}
