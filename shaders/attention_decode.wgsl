// attention_decode.wgsl: causal GQA attention of single query rows over the
// paged KV cache, split over the context (flash-decoding), with the steps
// before it fused in: Qwen3's q_norm/k_norm and RoPE of the row's own
// query and key, and the append of its key and value to the cache (what
// qkv_rope_kv.wgsl does for prompt rows). The splits are merged by
// attention_merge.wgsl.
//
// Row t (stacked projections qkv[t], position pos[t], sequence seq[t])
// attends to the positions 0 … pos[t] of its sequence. With append = 1 each
// row is a different sequence and the kernel writes its key and value;
// with append = 0 (rows of one prompt, whose later rows read the earlier
// ones' keys) qkv_rope_kv.wgsl has written them before. Query head h reads
// kv head h / GROUP (repeat_kv).
// Split s covers positions [s·CHUNK, (s+1)·CHUNK); for each query head it
// stores, unnormalized,
//   m = max_j score_j,  l = Σ_j exp(score_j − m),  o = Σ_j exp(score_j − m) · v_j
// with score_j = (q · k_j) · scale. A split past the row's context stores
// m = −inf, l = 0, o = 0.
//
// Buffers:
//   qkv     (T, heads·D + 2·kv_heads·D) f32: rows of q_proj | k_proj | v_proj
//   consts  (2·D + D/2) f32: q_norm (D), k_norm (D), inv_freq (D/2)
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32 or f16 pairs
//           (layout in qkv_rope_kv.wgsl), read and written as 16-byte words
//   table   (seqs, max_blocks) u32, seq (T) u32, pos (T) u32
//   part    (T, heads, splits, D + 2) f32: o, then m and l
//
// Dispatch: (kv_heads, splits, T) workgroups of WG threads. A workgroup
// takes one kv head for the GROUP query heads that share it, so each key
// and value is read once for all of them, in four phases:
//   rope    the group's queries and the row's key, normalized (sums of
//           squares reduced as a tree, in the order qkv_rope_kv.wgsl sums
//           them, so both give the same bits) and rotated exactly as there;
//           with append, the workgroup whose split holds pos[t] writes the
//           key and the value to the cache, and a storage barrier makes
//           them visible to its own reads below (no other workgroup reads
//           that position);
//   scores  thread c scores keys c, c + WG, … of the chunk against the
//           group's queries (in workgroup memory), reading each key in
//           16-byte loads, its GROUP dot products in registers;
//   softmax the max and the sum of exponentials of each head, reduced over
//           the threads in workgroup memory (a tree, not a serial loop);
//   values  D/8 threads cover one value vector, eight elements each from
//           one 16-byte load (f16) or two (f32), so KP = WG·8/D keys are
//           summed side by side into registers, then added up in workgroup
//           memory in KP rounds.
// D (head_dim, a multiple of 8), GROUP (query heads per kv head) and CHUNK
// (64 … 256, picked by package kernels so that there are enough workgroups
// and the workgroup memory fits) are constants, so every loop over them has
// a fixed count. WG = 64 threads.

const WG: u32 = 64u;
const D: u32 = 128u;
const GROUP: u32 = 2u;
const CHUNK: u32 = 64u;
const KV_F16: u32 = 0u;            // 1: the KV cache holds f16 pairs (specialized by the host)
const LANES: u32 = D / 8u;         // threads per value vector
const KP: u32 = WG / LANES;        // value vectors summed side by side
const QS: u32 = GROUP * D / 4u;    // vec4s of the group's queries
const SC: u32 = GROUP * CHUNK;     // scores, then exp(score − m)
const RED: u32 = GROUP * WG;       // per-thread maxima, then sums
const OV: u32 = GROUP * D / 4u;    // vec4s of the value sums
const HALF: u32 = D / 2u;          // RoPE rotates pairs (i, i + D/2)
const PAIRS: u32 = (HALF + WG - 1u) / WG; // pairs a thread
const NH: u32 = GROUP + 1u;        // heads normalized: the group's queries, then the key
const XP: u32 = NH * PAIRS;        // a thread's pairs over those heads
const SQN: u32 = NH * WG;          // their sums of squares, per thread
const KVN: u32 = 2u * D;           // the row's own key (rotated) and value

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    BS: u32,         // positions per block
    max_blocks: u32, // row stride of table
    splits: u32,
    scale: f32,      // 1/sqrt(D)
    eps: f32,        // q_norm's and k_norm's epsilon
    append: u32,     // 1: write the rows' keys and values to the cache (0: already there)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> consts: array<f32>;
@group(0) @binding(3) var<storage, read_write> kcache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> vcache: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> table: array<u32>;
@group(0) @binding(6) var<storage, read> seq: array<u32>;
@group(0) @binding(7) var<storage, read> pos: array<u32>;
@group(0) @binding(8) var<storage, read_write> part: array<f32>;

var<workgroup> qs: array<vec4<f32>, QS>;
var<workgroup> sc: array<f32, SC>;
var<workgroup> base: array<u32, CHUNK>; // cache offset of each key of the chunk
var<workgroup> red: array<f32, RED>;
var<workgroup> ov: array<vec4<f32>, OV>;
var<workgroup> sumsq: array<f32, SQN>;
var<workgroup> kv_new: array<f32, KVN>;

// Eight cache elements e … e+7 (e a multiple of 8) in 16-byte loads.
struct Vec8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn load8(e: u32, values: bool) -> Vec8 {
    if KV_F16 == 1u {
        var w: vec4<u32>;
        if values {
            w = vcache[e >> 3u];
        } else {
            w = kcache[e >> 3u];
        }
        return Vec8(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
    }
    if values {
        return Vec8(bitcast<vec4<f32>>(vcache[e >> 2u]), bitcast<vec4<f32>>(vcache[(e >> 2u) + 1u]));
    }
    return Vec8(bitcast<vec4<f32>>(kcache[e >> 2u]), bitcast<vec4<f32>>(kcache[(e >> 2u) + 1u]));
}

// reduced returns pos·f minus the nearest multiple of 2π, as
// qkv_rope_kv.wgsl's reduced does (see there).
fn reduced(pos: u32, f: f32) -> f32 {
    let a = f32(pos) * f;
    let kk = round(a * 0.15915494309189535);
    return (a - kk * 6.28125) - kk * 0.0019353071795864769;
}

// store8 writes cache elements e … e+7 (e a multiple of 8) of keys or
// values from kv_new[src …], in 16-byte words.
fn store8(e: u32, src: u32, values: bool) {
    if KV_F16 == 1u {
        let w = vec4<u32>(pack2x16float(vec2<f32>(kv_new[src], kv_new[src + 1u])),
            pack2x16float(vec2<f32>(kv_new[src + 2u], kv_new[src + 3u])),
            pack2x16float(vec2<f32>(kv_new[src + 4u], kv_new[src + 5u])),
            pack2x16float(vec2<f32>(kv_new[src + 6u], kv_new[src + 7u])));
        if values {
            vcache[e >> 3u] = w;
        } else {
            kcache[e >> 3u] = w;
        }
        return;
    }
    for (var h = 0u; h < 2u; h++) {
        let w = bitcast<vec4<u32>>(vec4<f32>(kv_new[src + 4u * h], kv_new[src + 4u * h + 1u],
            kv_new[src + 4u * h + 2u], kv_new[src + 4u * h + 3u]));
        if values {
            vcache[(e >> 2u) + h] = w;
        } else {
            kcache[(e >> 2u) + h] = w;
        }
    }
}

// rope_row leaves in qs the group's queries of row t and in kv_new the
// row's key, each rmsnorm(x) · weight then rotated, and its value; the
// workgroup holding position pos[t] (its split's range) appends the key and
// the value to the cache. All threads call it (it holds barriers).
fn rope_row(lid: u32, g: u32, t: u32, h0: u32, appends: bool) {
    let position = pos[t];
    let row = t * (p.heads + 2u * p.kv_heads) * D;
    var x1 = array<f32, XP>();
    var x2 = array<f32, XP>();
    for (var hh = 0u; hh < NH; hh++) {
        let src = row + select((h0 + hh) * D, (p.heads + g) * D, hh == GROUP);
        var ss = 0.0;
        for (var j = 0u; j < PAIRS; j++) {
            let i = lid + j * WG;
            if i < HALF {
                let a = qkv[src + i];
                let b = qkv[src + i + HALF];
                x1[hh * PAIRS + j] = a;
                x2[hh * PAIRS + j] = b;
                ss += a * a + b * b;
            }
        }
        sumsq[hh * WG + lid] = ss;
    }
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if lid < stride {
            for (var hh = 0u; hh < NH; hh++) {
                sumsq[hh * WG + lid] += sumsq[hh * WG + lid + stride];
            }
        }
    }
    workgroupBarrier();
    for (var j = 0u; j < PAIRS; j++) {
        let i = lid + j * WG;
        if i < HALF {
            let a = reduced(position, consts[2u * D + i]);
            let c = cos(a);
            let s = sin(a);
            for (var hh = 0u; hh < NH; hh++) {
                let inv = 1.0 / sqrt(sumsq[hh * WG] / f32(D) + p.eps);
                let w0 = select(0u, D, hh == GROUP); // q_norm or k_norm
                let n1 = consts[w0 + i] * (x1[hh * PAIRS + j] * inv);
                let n2 = consts[w0 + i + HALF] * (x2[hh * PAIRS + j] * inv);
                let y1 = n1 * c - n2 * s;
                let y2 = n2 * c + n1 * s;
                if hh < GROUP {
                    let f = hh * D + i;
                    qs[f >> 2u][f & 3u] = y1;
                    qs[(f + HALF) >> 2u][(f + HALF) & 3u] = y2;
                } else {
                    kv_new[i] = y1;
                    kv_new[i + HALF] = y2;
                }
            }
        }
    }
    let vsrc = row + (p.heads + p.kv_heads + g) * D;
    for (var i = lid; i < D; i += WG) {
        kv_new[D + i] = qkv[vsrc + i];
    }
    workgroupBarrier();
    if appends {
        let block = table[seq[t] * p.max_blocks + position / p.BS];
        let dst = ((block * p.kv_heads + g) * p.BS + position % p.BS) * D;
        for (var e = 8u * lid; e < D; e += 8u * WG) {
            store8(dst + e, e, false);
            store8(dst + e, D + e, true);
        }
    }
    storageBarrier();
}

// reduce combines red[hh·WG + i] over i for every head, max or sum, into
// red[hh·WG]. All threads call it (it holds barriers).
fn reduce(lid: u32, is_max: bool) {
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        workgroupBarrier();
        if lid < stride {
            for (var hh = 0u; hh < GROUP; hh++) {
                let a = red[hh * WG + lid];
                let b = red[hh * WG + lid + stride];
                red[hh * WG + lid] = select(a + b, max(a, b), is_max);
            }
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let s = wid.y;
    let t = wid.z;
    let h0 = g * GROUP;                  // first query head of the group
    let L = pos[t] + 1u;                 // context length of row t
    let j0 = s * CHUNK;
    let n = select(0u, min(CHUNK, L - j0), j0 < L); // keys of this split: 0 past the context

    rope_row(lid, g, t, h0, p.append != 0u && j0 <= L - 1u && L - 1u < j0 + CHUNK);

    // Scores, and each thread's maximum per head.
    var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
    let neg_inf = bitcast<f32>(neg_inf_bits);
    var m = array<f32, GROUP>();
    for (var hh = 0u; hh < GROUP; hh++) {
        m[hh] = neg_inf;
    }
    let row = seq[t] * p.max_blocks;
    for (var c = lid; c < n; c += WG) {
        let j = j0 + c;
        let b = ((table[row + j / p.BS] * p.kv_heads + g) * p.BS + j % p.BS) * D;
        base[c] = b;
        // Explicitly zeroed: the bundled naga zeroes an uninitialized
        // variable once per invocation, not at each loop iteration.
        var acc = array<f32, GROUP>();
        for (var d = 0u; d < D; d += 8u) {
            let k = load8(b + d, false);
            for (var hh = 0u; hh < GROUP; hh++) {
                let qi = (hh * D + d) >> 2u;
                acc[hh] += dot(qs[qi], k.lo) + dot(qs[qi + 1u], k.hi);
            }
        }
        for (var hh = 0u; hh < GROUP; hh++) {
            let score = acc[hh] * p.scale;
            sc[hh * CHUNK + c] = score;
            m[hh] = max(m[hh], score);
        }
    }
    for (var hh = 0u; hh < GROUP; hh++) {
        red[hh * WG + lid] = m[hh];
    }
    reduce(lid, true);
    for (var hh = 0u; hh < GROUP; hh++) {
        m[hh] = red[hh * WG];
    }
    workgroupBarrier(); // everyone has read the maxima before red is reused

    // exp(score − m) in place, and each thread's sum per head.
    var l = array<f32, GROUP>();
    for (var c = lid; c < n; c += WG) {
        for (var hh = 0u; hh < GROUP; hh++) {
            let e = exp(sc[hh * CHUNK + c] - m[hh]);
            sc[hh * CHUNK + c] = e;
            l[hh] += e;
        }
    }
    for (var hh = 0u; hh < GROUP; hh++) {
        red[hh * WG + lid] = l[hh];
    }
    reduce(lid, false); // its barriers also publish sc

    // Values: thread (kp, lane) sums elements 8·lane … 8·lane+7 of the
    // values of keys kp, kp + KP, … for every head (threads past KP·LANES,
    // when LANES does not divide WG, idle).
    let lane = lid % LANES;
    let kp = lid / LANES;
    var lo = array<vec4<f32>, GROUP>();
    var hi = array<vec4<f32>, GROUP>();
    if kp < KP {
        for (var c = kp; c < n; c += KP) {
            let v = load8(base[c] + 8u * lane, true);
            for (var hh = 0u; hh < GROUP; hh++) {
                let e = sc[hh * CHUNK + c];
                lo[hh] += e * v.lo;
                hi[hh] += e * v.hi;
            }
        }
    }
    for (var k = 0u; k < KP; k++) {
        if kp == k {
            for (var hh = 0u; hh < GROUP; hh++) {
                let at = (hh * D + 8u * lane) >> 2u;
                if k == 0u {
                    ov[at] = lo[hh];
                    ov[at + 1u] = hi[hh];
                } else {
                    ov[at] += lo[hh];
                    ov[at + 1u] += hi[hh];
                }
            }
        }
        workgroupBarrier();
    }

    // Write o, m, l of each head.
    let stride = p.splits * (D + 2u);                          // to the next head
    let out0 = ((t * p.heads + h0) * p.splits + s) * (D + 2u); // part of head h0
    for (var i = lid; i < GROUP * D; i += WG) {
        let hh = i / D;
        let d = i % D;
        let dst = out0 + hh * stride;
        part[dst + d] = ov[i >> 2u][i & 3u];
        if d == 0u {
            part[dst + D] = m[hh];
            part[dst + D + 1u] = red[hh * WG];
        }
    }
}
