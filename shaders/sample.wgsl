// sample.wgsl: a verifier's read-out of rows of logits, one workgroup a
// row — what sampling.Choose and sampling.Top compute: the argmax (the
// first index of the largest logit), the log-probabilities at temperature
// 1, the topn most likely tokens, and, for a row sampled at a temperature,
// the acceptance of the drafter's proposal and a draw. For row r with
// temperature T > 0 and nucleus top_p:
//   e_i    = exp((l_i − max) / T)                  the unnormalized softmax
//   kept   = {i : l_i / T ≥ θ}, θ the largest scaled logit of the row whose
//            tokens at or above it hold at least top_p of Σ e (every token
//            when top_p ≥ 1)
//   p(i)   = e_i / Σ_kept e                        for i kept, else 0
//   accept = U < p(X)                              (false with no proposal)
//   sample = the token where V · W falls in the cumulative sums of e over
//            kept \ {X}, in index order, W their total (X itself when it
//            is the only token kept)
// The drafter proposes its greedy token, a point mass q on X, so this is
// speculative sampling's rule (accept with min(1, p/q), else draw from
// norm(max(0, p − q))): the token that comes out is distributed as p.
// θ is found by bisection over the order of f32 bit patterns (at most 32
// passes over the row, each a masked sum), exact to the element. A greedy
// row without topn is argmax.wgsl's job, which spreads a row over many
// workgroups; this kernel is for the rows that need the rest.
//
// Buffers:
//   logits (rows, V) f32
//   draws  (rows) vec4<u32>: X (NONE: no proposal), U bits, V bits, flags
//          (GREEDY: no draw)
//   temps  (rows) vec2<f32>: T, top_p
//   out    (rows, 8) u32: argmax, sample, flags (ACCEPT, NAN), θ bits,
//          logsumexp bits, log p(argmax), log p(X), log p(sample) (f32
//          bits, at temperature 1)
//   top    (rows, max(topn, 1)) vec2<u32>: token, log p bits, most likely
//          first, the lower index first on ties
//   ids    (rows) u32, lps (rows) f32: the argmax (NONE for a NaN row) and
//          its log p again, laid out as argmax.wgsl writes them, so that a
//          chain of passes reads this kernel's tokens as that one's
//
// Dispatch: (rows, 1, 1) workgroups of WG threads. Every pass strides the
// row by WG, but the draw's, which gives thread i the contiguous slice
// [i·C, (i+1)·C), C = ceil(V / WG), so that a scan over the threads'
// sums is a scan in index order. Every reduction ends in
// workgroupUniformLoad, so that the branches and loops that depend on it
// are uniform and may hold barriers.

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
const NEG_INF: u32 = 0xff800000u; // −Inf's bits
const GREEDY: u32 = 1u;           // draws' flags
const ACCEPT: u32 = 1u;           // out's flags
const NAN: u32 = 2u;

struct Params {
    V: u32,    // the row length
    topn: u32, // most likely tokens to list
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> draws: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> temps: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> top: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> ids: array<u32>;
@group(0) @binding(7) var<storage, read_write> lps: array<f32>;

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; // (x != x may be folded away)
}

// key maps an f32 to a u32 of the same order (negative values reversed).
fn key(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn unkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// sum_all returns the sum of the threads' values.
fn sum_all(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            red_f[lid] += red_f[lid + stride];
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_f[0]);
}

// min_f returns the smallest of the threads' values.
fn min_f(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            red_f[lid] = min(red_f[lid], red_f[lid + stride]);
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_f[0]);
}

// min_u returns the smallest of the threads' values.
fn min_u(lid: u32, v: u32) -> u32 {
    workgroupBarrier();
    red_u[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            red_u[lid] = min(red_u[lid], red_u[lid + stride]);
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_u[0]);
}

// max_u returns the largest of the threads' values.
fn max_u(lid: u32, v: u32) -> u32 {
    return ~min_u(lid, ~v);
}

struct Cand {
    v: f32,
    i: u32, // NONE: no candidate
}

// better reports whether a beats b: NONE loses to everything; a larger
// value wins, an equal one with a lower index.
fn better(a: Cand, b: Cand) -> bool {
    return a.i != NONE && (b.i == NONE || a.v > b.v || (a.v == b.v && a.i < b.i));
}

// best_all returns the best of the threads' candidates.
fn best_all(lid: u32, c: Cand) -> Cand {
    workgroupBarrier();
    red_f[lid] = c.v;
    red_u[lid] = c.i;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride && better(Cand(red_f[lid + stride], red_u[lid + stride]), Cand(red_f[lid], red_u[lid])) {
            red_f[lid] = red_f[lid + stride];
            red_u[lid] = red_u[lid + stride];
        }
        workgroupBarrier();
    }
    let i = workgroupUniformLoad(&red_u[0]);
    return Cand(workgroupUniformLoad(&red_f[0]), i);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    let V = p.V;
    let base = r * V;
    let d = draws[r];
    let tp = temps[r];
    let o = r * 8u;

    // The largest logit and its first index; a NaN anywhere poisons the row.
    var best = Cand(0.0, NONE);
    var nan = 0u;
    for (var i = lid; i < V; i += WG) {
        let l = logits[base + i];
        if is_nan(l) {
            nan = 1u;
        } else if better(Cand(l, i), best) {
            best = Cand(l, i);
        }
    }
    if max_u(lid, nan) != 0u {
        if lid == 0u {
            out[o] = NONE;
            out[o + 2u] = NAN;
            ids[r] = NONE;
        }
        return;
    }
    best = best_all(lid, best);
    let m = best.v;
    var s = 0.0;
    for (var i = lid; i < V; i += WG) {
        s += exp(logits[base + i] - m);
    }
    let lse = m + log(sum_all(lid, s));
    if lid == 0u {
        out[o] = best.i;
        out[o + 4u] = bitcast<u32>(lse);
        out[o + 5u] = bitcast<u32>(m - lse);
        ids[r] = best.i;
        lps[r] = m - lse;
    }

    // The topn most likely tokens: each round the best after the last.
    var prev = best;
    for (var k = 0u; k < p.topn; k++) {
        if k > 0u {
            var c = Cand(0.0, NONE);
            for (var i = lid; i < V; i += WG) {
                let l = logits[base + i];
                if (l < prev.v || (l == prev.v && i > prev.i)) && better(Cand(l, i), c) {
                    c = Cand(l, i);
                }
            }
            prev = best_all(lid, c);
        }
        if lid == 0u {
            top[r * p.topn + k] = vec2<u32>(prev.i, bitcast<u32>(prev.v - lse));
        }
    }

    if (d.w & GREEDY) != 0u || !(tp.x > 0.0) {
        if lid == 0u {
            out[o + 1u] = best.i;
            out[o + 2u] = 0u;
            out[o + 3u] = NEG_INF;
            out[o + 6u] = 0u;
            out[o + 7u] = bitcast<u32>(m - lse);
        }
        return;
    }
    let T = tp.x;
    var e_sum = 0.0;
    var s_min = 3.402823466e38;
    for (var i = lid; i < V; i += WG) {
        let l = logits[base + i];
        e_sum += exp((l - m) / T);
        s_min = min(s_min, l / T);
    }
    let total = sum_all(lid, e_sum);
    s_min = min_f(lid, s_min);

    // θ: the largest key whose tokens hold at least top_p of the mass.
    var lo = key(s_min);
    if tp.y < 1.0 && tp.y > 0.0 {
        var hi = key(m / T);
        let goal = tp.y * total;
        for (var it = 0u; it < 33u && lo < hi; it++) { // a u32 range halves to one in 32 steps
            let mid = lo + (hi - lo + 1u) / 2u;
            let th = unkey(mid);
            var mass = 0.0;
            for (var i = lid; i < V; i += WG) {
                let l = logits[base + i];
                if l / T >= th {
                    mass += exp((l - m) / T);
                }
            }
            if sum_all(lid, mass) >= goal {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
    }
    let theta = unkey(lo);
    // The smallest kept scaled logit, and the kept mass.
    var kmin = 3.402823466e38;
    var kept = 0.0;
    for (var i = lid; i < V; i += WG) {
        let sv = logits[base + i] / T;
        if sv >= theta {
            kmin = min(kmin, sv);
            kept += exp((logits[base + i] - m) / T);
        }
    }
    let threshold = min_f(lid, kmin);
    let kept_total = sum_all(lid, kept);

    // The proposal: its acceptance, and its mass left out of the draw.
    let x = d.x;
    var accept = false;
    var weight = kept_total;
    var x_lp = 0.0;
    if x != NONE {
        let lx = logits[base + x];
        x_lp = lx - lse;
        if lx / T >= threshold {
            let ex = exp((lx - m) / T);
            accept = bitcast<f32>(d.y) < ex / kept_total;
            weight -= ex;
        }
    }

    // The draw: thread lid's slice of the row, its weight, a scan of them.
    let C = (V + WG - 1u) / WG;
    let c0 = min(lid * C, V);
    let c1 = min(c0 + C, V);
    var own = 0.0;
    for (var i = c0; i < c1; i++) {
        let l = logits[base + i];
        if l / T >= threshold && i != x {
            own += exp((l - m) / T);
        }
    }
    workgroupBarrier();
    red_f[lid] = own;
    workgroupBarrier();
    for (var stride = 1u; stride < WG; stride <<= 1u) { // inclusive scan (Hillis–Steele)
        var v = red_f[lid];
        if lid >= stride {
            v += red_f[lid - stride];
        }
        workgroupBarrier();
        red_f[lid] = v;
        workgroupBarrier();
    }
    let incl = red_f[lid];
    let excl = incl - own;
    let goal = bitcast<f32>(d.z) * weight;
    // The slice the goal falls in; past the end (rounding), the last slice
    // that has weight; none has any when X is the only token kept.
    let hit = min_u(lid, select(NONE, lid, own > 0.0 && excl <= goal && goal < incl));
    let last = max_u(lid, select(0u, lid + 1u, own > 0.0)); // 1 + the last slice with weight; 0: none
    workgroupBarrier(); // every thread has read red_u[0] before it is written
    if last == 0u {
        if lid == 0u {
            red_u[0] = x;
        }
    } else if lid == select(last - 1u, hit, hit != NONE) {
        var acc = excl;
        var y = NONE;
        for (var i = c0; i < c1; i++) {
            let l = logits[base + i];
            if l / T >= threshold && i != x {
                acc += exp((l - m) / T);
                y = i;
                if goal < acc {
                    break;
                }
            }
        }
        red_u[0] = y;
    }
    let y = workgroupUniformLoad(&red_u[0]);
    if lid == 0u {
        out[o + 1u] = y;
        out[o + 2u] = select(0u, ACCEPT, accept);
        out[o + 3u] = bitcast<u32>(threshold);
        out[o + 6u] = bitcast<u32>(x_lp);
        out[o + 7u] = bitcast<u32>(logits[base + min(y, V - 1u)] - lse);
    }
}
