// argmax.wgsl: greedy token choice, ids[t] = argmax_v logits[t][v] for
// t < T rows of V logits: the first index of the largest value (as
// torch.argmax and sampling.Choose), its log-probability lp[t] =
// logits[t][ids[t]] − logsumexp(logits[t]), and the row's
// lp[lse0 + t] = logsumexp(logits[t]). A row holding a NaN yields
// ids[t] = 0xffffffff, which the host turns into an error. With mapped = 1
// the rows are a head's over part of the vocabulary: logit v is token
// tokens[v]'s, the rest of the vocabulary −∞, and ids[t] is the token —
// the first of the largest in token order, as over the whole vocabulary.
// With coupled = 1, a row whose keys word w is set is a coupled draft
// (sampling.CoupledChoice): ids[t] is the token with the largest
// logit / T + gumbel(key, token) (prelude's gumbel, keyed by the row's
// (k0, k1), the token in the target's vocabulary where mapped), the
// lower token on a tie, and lp[t] its log-probability at temperature 1.
//
// Two entry points, dispatched one after the other, so that a
// vocabulary-sized row is read by many workgroups at once rather than by
// one, which would wait on one load after another:
//   partial: workgroup (c, t) finds the best of logits[t][c·CHUNK, (c+1)·CHUNK)
//            — each thread PER values, independent loads, coalesced — and
//            the sum of exp(logit − that best) over the chunk, and writes
//            cand[(t·chunks + c)·S] = (value bits, index, sum bits, 0),
//            index NAN_SEEN if the chunk holds a NaN; S = 1 + coupled, and
//            a coupled row's second word cand[(t·chunks + c)·S + 1] =
//            (its best noisy value bits, that token, its logit bits, 0).
//   merge:   workgroup t merges the row's chunks candidates into ids[t]
//            (a coupled row's from their second words), and their sums,
//            each rescaled to the row's largest value, into lp[t] and
//            lp[lse0 + t].
// Both reduce through a tree in workgroup memory, ties to the lower index.
//
// Buffers:
//   logits (T, V) f32
//   cand   (T, chunks, 1 + coupled) vec4<u32>
//   ids    (T) u32
//   lp     (lse0 + T) f32: the log-probabilities, then from word lse0 ≥ T
//          the log-sum-exps
//   tokens (V) u32: mapped = 1, the token of each logit; else unread
//   keys   (T, 4) u32: coupled = 1, a row's key k0, k1, its temperature's
//          bits and 1 where it is coupled (0: greedy); else unread
//
// Dispatch: partial (chunks, T, 1), merge (T, 1, 1); WG = 256 threads, and
// CHUNK = WG·PER = 4,096 logits (a 151,936-word row: 38 workgroups).

const WG: u32 = 256u;
const PER: u32 = 16u;
const CHUNK: u32 = WG * PER;
const NONE: u32 = 0xffffffffu;     // no candidate; ids' NaN mark
const NAN_SEEN: u32 = 0xfffffffeu; // a candidate's index when its chunk held a NaN

struct Params {
    T: u32,
    V: u32,
    chunks: u32, // ceil(V / CHUNK)
    lse0: u32,   // the word of lp where the log-sum-exps start
    mapped: u32, // 1: logit v is token tokens[v]'s
    coupled: u32, // 1: keys holds the rows' keys
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> cand: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> lp: array<f32>;
@group(0) @binding(5) var<storage, read> tokens: array<u32>;
@group(0) @binding(6) var<storage, read> keys: array<u32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> nan_seen: array<u32, WG>;
var<workgroup> sums: array<f32, WG>;

// better reports whether candidate (ov, oi) beats (v, i): NONE loses to
// everything; a larger value wins, an equal one with a lower index.
fn better(ov: f32, oi: u32, v: f32, i: u32) -> bool {
    return oi != NONE && (i == NONE || ov > v || (ov == v && oi < i));
}

// reduce merges the WG threads' candidates (and NaN flags) into slot 0.
fn reduce(lid: u32, bv: f32, bi: u32, nan: u32) {
    best_v[lid] = bv;
    best_i[lid] = bi;
    nan_seen[lid] = nan;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            if better(best_v[lid + stride], best_i[lid + stride], best_v[lid], best_i[lid]) {
                best_v[lid] = best_v[lid + stride];
                best_i[lid] = best_i[lid + stride];
            }
            nan_seen[lid] |= nan_seen[lid + stride];
        }
        workgroupBarrier();
    }
}

// sum adds the WG threads' values into sums[0].
fn sum(lid: u32, v: f32) {
    sums[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            sums[lid] += sums[lid + stride];
        }
        workgroupBarrier();
    }
}

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; // (x != x may be folded away)
}

@compute @workgroup_size(WG)
fn partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    let v0 = wid.x * CHUNK + lid;
    var xs: array<f32, PER>;
    for (var i = 0u; i < PER; i++) { // all loads first, then the compares
        xs[i] = logits[t * p.V + min(v0 + i * WG, p.V - 1u)];
    }
    var bv = 0.0;
    var bi = NONE;
    var nan = 0u;
    for (var i = 0u; i < PER; i++) {
        let v = v0 + i * WG;
        if v < p.V {
            if is_nan(xs[i]) {
                nan = 1u;
            } else {
                var id = v;
                if p.mapped != 0u {
                    id = tokens[v];
                }
                if better(xs[i], id, bv, bi) {
                    bv = xs[i];
                    bi = id;
                }
            }
        }
    }
    reduce(lid, bv, bi, nan);
    let top = best_v[0];
    let top_i = best_i[0];
    let nan_any = nan_seen[0];
    var s = 0.0;
    // A chunk of −∞ (a partial head's other tokens) sums to 0, not to
    // exp(−∞ + ∞).
    if top_i != NONE && nan_any == 0u && top > -3.402823466e38 {
        for (var i = 0u; i < PER; i++) {
            if v0 + i * WG < p.V {
                s += exp(xs[i] - top);
            }
        }
    }
    sum(lid, s);
    let S = 1u + p.coupled;
    let at = (t * p.chunks + wid.x) * S;
    if lid == 0u {
        cand[at] = vec4<u32>(bitcast<u32>(top), select(top_i, NAN_SEEN, nan_any != 0u), bitcast<u32>(sums[0]), 0u);
    }
    if is_coupled(t) {
        // The best logit / T + noise: its value, token and logit.
        let k = vec4<u32>(keys[4u * t], keys[4u * t + 1u], keys[4u * t + 2u], keys[4u * t + 3u]);
        let T = bitcast<f32>(k.z);
        var nv = 0.0;
        var ni = NONE;
        var nl = 0.0;
        for (var i = 0u; i < PER; i++) {
            let v = v0 + i * WG;
            if v < p.V && !is_nan(xs[i]) {
                var id = v;
                if p.mapped != 0u {
                    id = tokens[v];
                }
                let g = xs[i] / T + gumbel(k.x, k.y, id);
                if better(g, id, nv, ni) {
                    nv = g;
                    ni = id;
                    nl = xs[i];
                }
            }
        }
        reduce(lid, nv, ni, 0u);
        // The winner's logit: the thread that held it.
        if ni != NONE && best_i[0] == ni {
            sums[0] = nl;
        }
        workgroupBarrier();
        if lid == 0u {
            cand[at + 1u] = vec4<u32>(bitcast<u32>(best_v[0]), best_i[0], bitcast<u32>(sums[0]), 0u);
        }
    }
}

// is_coupled reports whether row t is a coupled draft.
fn is_coupled(t: u32) -> bool {
    return p.coupled != 0u && keys[4u * t + 3u] != 0u;
}

@compute @workgroup_size(WG)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let S = 1u + p.coupled;
    var bv = 0.0;
    var bi = NONE;
    var nan = 0u;
    for (var c = lid; c < p.chunks; c += WG) { // chunks in order: ties keep the lower index
        let o = cand[(t * p.chunks + c) * S];
        if o.y == NAN_SEEN {
            nan = 1u;
        } else if better(bitcast<f32>(o.x), o.y, bv, bi) {
            bv = bitcast<f32>(o.x);
            bi = o.y;
        }
    }
    reduce(lid, bv, bi, nan);
    let top = best_v[0];
    var id = best_i[0];
    let nan_any = nan_seen[0];
    var s = 0.0;
    if nan_any == 0u {
        for (var c = lid; c < p.chunks; c += WG) {
            let o = cand[(t * p.chunks + c) * S];
            s += bitcast<f32>(o.z) * exp(bitcast<f32>(o.x) - top);
        }
    }
    sum(lid, s);
    let lse = top + log(sums[0]);
    var lpv = -log(sums[0]); // logits[id] − (top + log Σ exp(logit − top))
    if is_coupled(t) {
        // The best noisy token of the chunks, and its logit.
        var nv = 0.0;
        var ni = NONE;
        var nl = 0.0;
        for (var c = lid; c < p.chunks; c += WG) {
            let o = cand[(t * p.chunks + c) * S + 1u];
            if better(bitcast<f32>(o.x), o.y, nv, ni) {
                nv = bitcast<f32>(o.x);
                ni = o.y;
                nl = bitcast<f32>(o.z);
            }
        }
        workgroupBarrier();
        reduce(lid, nv, ni, 0u);
        if ni != NONE && best_i[0] == ni {
            sums[0] = nl;
        }
        workgroupBarrier();
        id = best_i[0];
        lpv = sums[0] - lse;
    }
    if lid == 0u {
        ids[t] = select(id, NONE, nan_any != 0u);
        lp[t] = lpv;
        lp[p.lse0 + t] = lse;
    }
}
