// sample.wgsl: a verifier's read-out of rows of logits — what
// sampling.Choose and sampling.Top compute: the argmax (the first index of
// the largest logit), the log-probabilities at temperature 1, the topn most
// likely tokens, and, for a row sampled at a temperature, the acceptance of
// the drafter's proposal and a draw. For row r with temperature T > 0 and
// nucleus top_p:
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
// Where X is the only token kept (or the others' mass rounds away) the
// draw is X itself, and the row accepts it. A COUPLED row instead
// (sampling's coupled draws) takes U's and V's bits as the key of a Gumbel
// noise g_i a token (prelude's gumbel):
//   sample = the kept token with the largest l_i / T + g_i, the lower
//            index on a tie (the Gumbel-max draw from p)
//   accept = X = sample
//
// Two entry points, dispatched one after the other, so that a
// vocabulary-sized row is read by many workgroups at once rather than by
// one, which would pass over it once for each statistic:
//   partial: workgroup (c, r) reads logits[r][c·CHUNK, (c+1)·CHUNK) once —
//            each thread PER values, coalesced, kept in registers — and
//            writes the chunk's record: its best logit and first index, a
//            NaN flag, Σ exp(l − best) and Σ exp((l − best) / T), the
//            smallest l / T, for a coupled row its best l / T + g and
//            that token, and its most likely tokens in order (topn of
//            them, or M for a nucleus row), each round a tree reduction.
//   merge:   workgroup r merges the row's records: the argmax, logsumexp
//            and Σ e by rescaling each chunk's sums to the row's best; the
//            top-n from the chunks' lists; θ by bisection over the chunks'
//            lists, exact when no list was cut off at or above θ, else by
//            bisection over the whole row (the flag WIDE says so); the draw
//            by a scan over the chunks' weights and then over the
//            elements of the one chunk it falls in — a coupled row's
//            from the chunks' best noisy tokens, or, where the best of them
//            lies outside the nucleus, by a pass over the row's kept
//            tokens.
// θ's bisection runs over the order of f32 bit patterns (at most 33
// rounds), exact to the element. A greedy row without topn is argmax.wgsl's
// job; this kernel is for the rows that need the rest. Every reduction ends
// in workgroupUniformLoad, so that the branches and loops that depend on it
// are uniform and may hold barriers.
//
// Buffers:
//   logits (rows, V) f32
//   draws  (rows) vec4<u32>: X (NONE: no proposal), U bits, V bits, flags
//          (GREEDY: no draw; OUTCOME: ids and lps take the token that
//          comes out of a sampled row — X when accepted, else the draw —
//          and its log p, so that a chain of passes feeds on, and a chained
//          speculative step accepts by, what the row sampled; COUPLED: the
//          row's draw is coupled, U and V bits its key)
//   temps  (rows) vec2<f32>: T, top_p
//   parts  (rows, chunks, REC) u32: partial's records (HEAD words, then M
//          (index, logit bits) pairs)
//   out    (rows, 8) u32: argmax, sample, flags (ACCEPT, NAN, WIDE), θ bits,
//          logsumexp bits, log p(argmax), log p(X), log p(sample) (f32
//          bits, at temperature 1)
//   top    (rows, max(topn, 1)) vec2<u32>: token, log p bits, most likely
//          first, the lower index first on ties
//   ids    (rows) u32, lps (rows) f32: the argmax (NONE for a NaN row) and
//          its log p again — a sampled OUTCOME row's outcome and its log p —,
//          laid out as argmax.wgsl writes them, so that a chain of passes
//          reads this kernel's tokens as that one's
//
// Dispatch: partial (chunks, rows, 1), merge (rows, 1, 1); WG = 256
// threads, CHUNK = WG·PER = 2,048 logits (a 151,936-logit row: 75
// workgroups), chunks = ceil(V / CHUNK). M = 32 ≥ the engine's most listed
// tokens (20): a nucleus of up to 32 tokens in every chunk is found from
// the lists alone.

const WG: u32 = 256u;
const PER: u32 = 8u;
const CHUNK: u32 = WG * PER;
const M: u32 = 32u;          // a chunk's most likely tokens listed for a nucleus row
const HEAD: u32 = 10u;       // a record's words before its list
const REC: u32 = HEAD + 2u * M;
const NONE: u32 = 0xffffffffu;
const NEG_INF: u32 = 0xff800000u; // −Inf's bits
const GREEDY: u32 = 1u;           // draws' flags
const OUTCOME: u32 = 2u;
const COUPLED: u32 = 4u;
const ACCEPT: u32 = 1u;           // out's flags
const NAN: u32 = 2u;
const WIDE: u32 = 4u;
const F32_MAX: f32 = 3.402823466e38;

struct Params {
    V: u32,      // the row length
    topn: u32,   // most likely tokens to list
    chunks: u32, // ceil(V / CHUNK)
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> draws: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> temps: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> parts: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;
@group(0) @binding(6) var<storage, read_write> top: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> ids: array<u32>;
@group(0) @binding(8) var<storage, read_write> lps: array<f32>;

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_v: array<u32, WG>; // hit's second reduction

// at_excl and at_incl are scan's sums before and through the thread.
var<private> at_excl: f32;
var<private> at_incl: f32;

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

// after reports whether a comes after prev in the order better ranks.
fn after(a: Cand, prev: Cand) -> bool {
    return a.v < prev.v || (a.v == prev.v && a.i > prev.i);
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

// sampled reports whether row r draws: a temperature above 0 and no
// GREEDY flag.
fn sampled(r: u32) -> bool {
    return (draws[r].w & GREEDY) == 0u && temps[r].x > 0.0;
}

// coupled reports whether row r's draw is coupled.
fn coupled(r: u32) -> bool {
    return sampled(r) && (draws[r].w & COUPLED) != 0u;
}

// nucleus reports whether row r's draw keeps only part of the row.
fn nucleus(r: u32) -> bool {
    let tp = temps[r].y;
    return sampled(r) && tp > 0.0 && tp < 1.0;
}

// A record's head words.
const R_BEST: u32 = 0u;  // the chunk's best logit (bits)
const R_IDX: u32 = 1u;   // its first index
const R_NAN: u32 = 2u;   // 1: the chunk holds a NaN
const R_S1: u32 = 3u;    // Σ exp(l − best) (bits)
const R_ST: u32 = 4u;    // Σ exp((l − best) / T) (bits; 0 for a greedy row)
const R_SMIN: u32 = 5u;  // min l / T (bits)
const R_COUNT: u32 = 6u; // how many tokens the list holds
const R_SIZE: u32 = 7u;  // the chunk's logits
const R_GV: u32 = 8u;    // a coupled row's: the chunk's best l / T + g (bits)
const R_GI: u32 = 9u;    // and its token

@compute @workgroup_size(WG)
fn partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x;
    let r = wid.y;
    let V = p.V;
    let base = r * V;
    let rec = (r * p.chunks + c) * REC;
    let v0 = c * CHUNK + lid;
    let T = select(1.0, temps[r].x, sampled(r));
    var xs: array<f32, PER>;
    for (var j = 0u; j < PER; j++) { // all loads first, then the compares
        xs[j] = logits[base + min(v0 + j * WG, V - 1u)];
    }
    var best = Cand(0.0, NONE);
    var nan = 0u;
    for (var j = 0u; j < PER; j++) {
        let i = v0 + j * WG;
        if i < V {
            if is_nan(xs[j]) {
                nan = 1u;
            } else if better(Cand(xs[j], i), best) {
                best = Cand(xs[j], i);
            }
        }
    }
    let size = min(CHUNK, V - c * CHUNK);
    if max_u(lid, nan) != 0u {
        if lid == 0u {
            parts[rec + R_NAN] = 1u;
            parts[rec + R_COUNT] = 0u;
            parts[rec + R_SIZE] = size;
        }
        return;
    }
    best = best_all(lid, best);
    let m = best.v;
    var s1 = 0.0;
    var st = 0.0;
    var smin = F32_MAX;
    for (var j = 0u; j < PER; j++) {
        if v0 + j * WG < V {
            // A chunk of −∞ (a partial head's other tokens) sums to 0, not
            // to exp(−∞ + ∞).
            if m > -F32_MAX {
                s1 += exp(xs[j] - m);
                st += exp((xs[j] - m) / T);
            }
            smin = min(smin, xs[j] / T);
        }
    }
    s1 = sum_all(lid, s1);
    st = sum_all(lid, st);
    smin = min_f(lid, smin);
    var noisy = Cand(0.0, NONE);
    if coupled(r) {
        let d = draws[r];
        for (var j = 0u; j < PER; j++) {
            let i = v0 + j * WG;
            if i < V {
                let g = Cand(xs[j] / T + gumbel(d.y, d.z, i), i);
                if better(g, noisy) {
                    noisy = g;
                }
            }
        }
        noisy = best_all(lid, noisy);
    }

    // The list: each round the best after the last.
    let n = select(p.topn, max(p.topn, M), nucleus(r));
    var prev = best;
    var count = 0u;
    for (var k = 0u; k < n; k++) {
        if k > 0u {
            var b = Cand(0.0, NONE);
            for (var j = 0u; j < PER; j++) {
                let i = v0 + j * WG;
                if i < V && after(Cand(xs[j], i), prev) && better(Cand(xs[j], i), b) {
                    b = Cand(xs[j], i);
                }
            }
            prev = best_all(lid, b);
        }
        if prev.i == NONE {
            break;
        }
        if lid == 0u {
            parts[rec + HEAD + 2u * k] = prev.i;
            parts[rec + HEAD + 2u * k + 1u] = bitcast<u32>(prev.v);
        }
        count = k + 1u;
    }
    if lid == 0u {
        parts[rec + R_BEST] = bitcast<u32>(m);
        parts[rec + R_IDX] = best.i;
        parts[rec + R_NAN] = 0u;
        parts[rec + R_S1] = bitcast<u32>(s1);
        parts[rec + R_ST] = bitcast<u32>(select(0.0, st, sampled(r)));
        parts[rec + R_SMIN] = bitcast<u32>(smin);
        parts[rec + R_COUNT] = count;
        parts[rec + R_SIZE] = size;
        parts[rec + R_GV] = bitcast<u32>(noisy.v);
        parts[rec + R_GI] = noisy.i;
    }
}

// The merge's row-wide values, read by its helpers.
var<private> row_rec: u32;   // the row's first record
var<private> row_base: u32;  // the row's first logit
var<private> row_m: f32;     // the row's best logit
var<private> row_t: f32;     // its temperature

// rescaled is chunk c's sum in word w (R_S1 at temperature 1, R_ST at the
// row's), taken at its own best, rescaled to the row's best.
fn rescaled(c: u32, w: u32) -> f32 {
    let rec = row_rec + c * REC;
    let mc = bitcast<f32>(parts[rec + R_BEST]);
    let s = bitcast<f32>(parts[rec + w]);
    if !(s > 0.0) {
        return 0.0;
    }
    return s * exp((mc - row_m) / select(1.0, row_t, w == R_ST));
}

// listed returns entry k of chunk c's list.
fn listed(c: u32, k: u32) -> Cand {
    let o = row_rec + c * REC + HEAD + 2u * k;
    return Cand(bitcast<f32>(parts[o + 1u]), parts[o]);
}

// weight is e_i when l is kept (l / T ≥ threshold) and i is not the
// proposal x, else 0.
fn weight(l: f32, i: u32, threshold: f32, x: u32) -> f32 {
    if l / row_t >= threshold && i != x {
        return exp((l - row_m) / row_t);
    }
    return 0.0;
}

@compute @workgroup_size(WG)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    let V = p.V;
    let G = p.chunks;
    row_base = r * V;
    row_rec = r * G * REC;
    let d = draws[r];
    let tp = temps[r];
    let o = r * 8u;

    // The largest logit and its first index; a NaN anywhere poisons the row.
    var best = Cand(0.0, NONE);
    var nan = 0u;
    for (var c = lid; c < G; c += WG) { // chunks in order: ties keep the lower index
        let rec = row_rec + c * REC;
        if parts[rec + R_NAN] != 0u {
            nan = 1u;
        } else if better(Cand(bitcast<f32>(parts[rec + R_BEST]), parts[rec + R_IDX]), best) {
            best = Cand(bitcast<f32>(parts[rec + R_BEST]), parts[rec + R_IDX]);
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
    row_m = m;
    row_t = 1.0;
    var s = 0.0;
    for (var c = lid; c < G; c += WG) {
        s += rescaled(c, R_S1);
    }
    let lse = m + log(sum_all(lid, s));
    if lid == 0u {
        out[o] = best.i;
        out[o + 4u] = bitcast<u32>(lse);
        out[o + 5u] = bitcast<u32>(m - lse);
        ids[r] = best.i;
        lps[r] = m - lse;
    }

    // The topn most likely tokens: each round the best after the last, from
    // the chunks' lists (each holds its chunk's first topn, or all of it).
    var prev = best;
    for (var k = 0u; k < p.topn; k++) {
        if k > 0u {
            var b = Cand(0.0, NONE);
            for (var c = lid; c < G; c += WG) {
                let n = parts[row_rec + c * REC + R_COUNT];
                for (var j = 0u; j < n; j++) {
                    let e = listed(c, j);
                    if after(e, prev) {
                        if better(e, b) {
                            b = e;
                        }
                        break; // the list is in order: its first after prev is its best
                    }
                }
            }
            prev = best_all(lid, b);
        }
        if lid == 0u {
            top[r * p.topn + k] = vec2<u32>(prev.i, bitcast<u32>(prev.v - lse));
        }
    }

    if !sampled(r) {
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
    row_t = T;
    var e_sum = 0.0;
    var s_min = F32_MAX;
    for (var c = lid; c < G; c += WG) {
        e_sum += rescaled(c, R_ST);
        s_min = min(s_min, bitcast<f32>(parts[row_rec + c * REC + R_SMIN]));
    }
    let total = sum_all(lid, e_sum);
    s_min = min_f(lid, s_min);

    // θ: the largest key whose tokens hold at least top_p of the mass; the
    // kept tokens' smallest scaled logit and their mass.
    var lo = key(s_min);
    var threshold = s_min;
    var kept_total = total;
    var wide = false;
    if nucleus(r) {
        let goal = tp.y * total;
        var hi = key(m / T);
        for (var it = 0u; it < 33u && lo < hi; it++) { // a u32 range halves to one in 32 steps
            let mid = lo + (hi - lo + 1u) / 2u;
            let th = unkey(mid);
            var mass = 0.0;
            for (var k = lid; k < G * M; k += WG) { // the lists' entries, spread over the threads
                if k % M < parts[row_rec + (k / M) * REC + R_COUNT] {
                    let e = listed(k / M, k % M);
                    mass += weight(e.v, e.i, th, NONE);
                }
            }
            if sum_all(lid, mass) >= goal {
                lo = mid;
            } else {
                hi = mid - 1u;
            }
        }
        // Exact if every token left off a list lies below θ: each cut-off
        // list's last entry does.
        var cut = 0u;
        for (var c = lid; c < G; c += WG) {
            let rec = row_rec + c * REC;
            let n = parts[rec + R_COUNT];
            if n < parts[rec + R_SIZE] && (n == 0u || listed(c, n - 1u).v / T >= unkey(lo)) {
                cut = 1u;
            }
        }
        wide = max_u(lid, cut) != 0u;
        if wide { // the whole row, pass after pass
            lo = key(s_min);
            hi = key(m / T);
            for (var it = 0u; it < 33u && lo < hi; it++) {
                let mid = lo + (hi - lo + 1u) / 2u;
                let th = unkey(mid);
                var mass = 0.0;
                for (var i = lid; i < V; i += WG) {
                    mass += weight(logits[row_base + i], i, th, NONE);
                }
                if sum_all(lid, mass) >= goal {
                    lo = mid;
                } else {
                    hi = mid - 1u;
                }
            }
        }
        let theta = unkey(lo);
        var kmin = F32_MAX;
        var kept = 0.0;
        if wide {
            for (var i = lid; i < V; i += WG) {
                let sv = logits[row_base + i] / T;
                if sv >= theta {
                    kmin = min(kmin, sv);
                    kept += weight(logits[row_base + i], i, theta, NONE);
                }
            }
        } else {
            for (var k = lid; k < G * M; k += WG) {
                if k % M < parts[row_rec + (k / M) * REC + R_COUNT] {
                    let e = listed(k / M, k % M);
                    if e.v / T >= theta {
                        kmin = min(kmin, e.v / T);
                        kept += weight(e.v, e.i, theta, NONE);
                    }
                }
            }
        }
        threshold = min_f(lid, kmin);
        kept_total = sum_all(lid, kept);
    }

    if coupled(r) {
        coupled_draw(r, lid, T, threshold, lse, wide);
        return;
    }

    // The proposal: its acceptance, and the weight of its chunk without it
    // (from the chunk's logits: a difference of sums could round it away).
    let x = d.x;
    var accept = false;
    var x_lp = 0.0;
    var x_w = 0.0;
    if x != NONE {
        let lx = logits[row_base + x];
        x_lp = lx - lse;
        if lx / T >= threshold {
            accept = bitcast<f32>(d.y) < exp((lx - m) / T) / kept_total;
        }
        let e0 = min((x / CHUNK) * CHUNK + lid * PER, V);
        let e1 = min(e0 + PER, V);
        var mine = 0.0;
        for (var i = e0; i < e1; i++) {
            mine += weight(logits[row_base + i], i, threshold, x);
        }
        x_w = sum_all(lid, mine);
    }

    // The draw, first over chunks: thread lid's contiguous run of them,
    // its weight, a scan of the runs.
    let CG = (G + WG - 1u) / WG;
    let c0 = min(lid * CG, G);
    let c1 = min(c0 + CG, G);
    var own = 0.0;
    for (var c = c0; c < c1; c++) {
        own += chunk_weight(c, threshold, x, x_w, wide);
    }
    let goal = bitcast<f32>(d.z) * sum_all(lid, own);
    _ = scan(lid, own);
    let at = hit(lid, own, goal);
    // The chunk the goal falls in and what is left of the goal there.
    workgroupBarrier();
    if lid == at.x && at.y != 0u {
        var acc = at_excl;
        var found = NONE;
        var last = NONE;
        var before = 0.0;
        for (var c = c0; c < c1; c++) {
            let w = chunk_weight(c, threshold, x, x_w, wide);
            if w > 0.0 {
                last = c;
                before = acc;
                acc += w;
                if goal < acc {
                    found = c;
                    break;
                }
            }
        }
        red_u[0] = select(last, found, found != NONE);
        red_f[0] = goal - before;
    }
    let cs = workgroupUniformLoad(&red_u[0]);
    let rest = workgroupUniformLoad(&red_f[0]);

    // Then over the elements of that chunk, PER to a thread in index order.
    var y = NONE;
    if at.y != 0u {
        let e0 = min(cs * CHUNK + lid * PER, V);
        let e1 = min(e0 + PER, min((cs + 1u) * CHUNK, V));
        var mine = 0.0;
        for (var i = e0; i < e1; i++) {
            mine += weight(logits[row_base + i], i, threshold, x);
        }
        _ = scan(lid, mine);
        let at2 = hit(lid, mine, rest);
        workgroupBarrier();
        if lid == at2.x && at2.y != 0u {
            var acc = at_excl;
            var z = NONE;
            for (var i = e0; i < e1; i++) {
                let w = weight(logits[row_base + i], i, threshold, x);
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
        if at2.y == 0u && lid == 0u { // a chunk whose weight rounds away
            red_u[0] = NONE;
        }
        y = workgroupUniformLoad(&red_u[0]);
    }
    if y == NONE { // X is the only token kept (or its mass rounds the rest away)
        y = select(x, best.i, x == NONE);
    }
    if x != NONE && y == x { // then X comes out either way: accepted surely
        accept = true;
    }
    if lid == 0u {
        let y_lp = logits[row_base + min(y, V - 1u)] - lse;
        out[o + 1u] = y;
        out[o + 2u] = select(0u, ACCEPT, accept) | select(0u, WIDE, wide);
        out[o + 3u] = bitcast<u32>(threshold);
        out[o + 6u] = bitcast<u32>(x_lp);
        out[o + 7u] = bitcast<u32>(y_lp);
        if (d.w & OUTCOME) != 0u {
            ids[r] = select(y, x, accept);
            lps[r] = select(y_lp, x_lp, accept);
        }
    }
}

// chunk_weight is chunk c's share of the draw: Σ e over its kept tokens
// but the proposal x — x_w for the proposal's chunk; from its record when
// every token is kept, from its list when the nucleus came from the
// lists, else from its logits.
fn chunk_weight(c: u32, threshold: f32, x: u32, x_w: f32, wide: bool) -> f32 {
    let rec = row_rec + c * REC;
    let first = c * CHUNK;
    if x != NONE && x / CHUNK == c {
        return x_w;
    }
    if threshold <= bitcast<f32>(parts[rec + R_SMIN]) { // every token of the chunk kept
        return rescaled(c, R_ST);
    }
    var w = 0.0;
    if wide {
        let n = parts[rec + R_SIZE];
        for (var i = first; i < first + n; i++) {
            w += weight(logits[row_base + i], i, threshold, x);
        }
    } else {
        let n = parts[rec + R_COUNT];
        for (var j = 0u; j < n; j++) {
            let e = listed(c, j);
            w += weight(e.v, e.i, threshold, x);
        }
    }
    return w;
}

// coupled_draw finishes a coupled row r's merge: its sample is the kept
// token with the largest l / T + g — the best of the chunks' noisy tokens
// where that one is kept, else found by a pass over the row's kept
// tokens —, the proposal accepted iff it is that token.
fn coupled_draw(r: u32, lid: u32, T: f32, threshold: f32, lse: f32, wide: bool) {
    let d = draws[r];
    let V = p.V;
    let base = r * V;
    let rec0 = r * p.chunks * REC;
    var y = Cand(0.0, NONE);
    for (var c = lid; c < p.chunks; c += WG) {
        let rec = rec0 + c * REC;
        let g = Cand(bitcast<f32>(parts[rec + R_GV]), parts[rec + R_GI]);
        if better(g, y) {
            y = g;
        }
    }
    y = best_all(lid, y);
    if logits[base + y.i] / T < threshold {
        var k = Cand(0.0, NONE);
        for (var i = lid; i < V; i += WG) {
            let l = logits[base + i];
            if l / T >= threshold {
                let g = Cand(l / T + gumbel(d.y, d.z, i), i);
                if better(g, k) {
                    k = g;
                }
            }
        }
        y = best_all(lid, k);
    }
    if lid == 0u {
        let x = d.x;
        let accept = x != NONE && x == y.i;
        let y_lp = logits[base + y.i] - lse;
        out[r * 8u + 1u] = y.i;
        out[r * 8u + 2u] = select(0u, ACCEPT, accept) | select(0u, WIDE, wide);
        out[r * 8u + 3u] = bitcast<u32>(threshold);
        out[r * 8u + 6u] = select(0u, bitcast<u32>(logits[base + min(x, V - 1u)] - lse), x != NONE);
        out[r * 8u + 7u] = bitcast<u32>(y_lp);
        if (d.w & OUTCOME) != 0u {
            ids[r] = y.i;
            lps[r] = y_lp;
        }
    }
}
