// attention_decode.wgsl: causal GQA attention of single query rows over the
// paged KV cache, split over the context (flash-decoding); the splits are
// merged by attention_merge.wgsl.
//
// Row t (query q[t], position pos[t], sequence seq[t]) attends to the
// positions 0 … pos[t] of its sequence. Query head h reads kv head
// h / group (repeat_kv). Split s covers positions [s·CHUNK, (s+1)·CHUNK);
// for each query head it stores, unnormalized,
//   m = max_j score_j,  l = Σ_j exp(score_j − m),  o = Σ_j exp(score_j − m) · v_j
// with score_j = (q · k_j) · scale. A split past the row's context stores
// m = −inf, l = 0, o = 0.
//
// Buffers:
//   q       (T, heads, D) f32, after q_norm and RoPE
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32 or f16 pairs (see qkv_rope_kv.wgsl)
//   table   (seqs, max_blocks) u32, seq (T) u32, pos (T) u32
//   part    (T, heads, splits, D + 2) f32: o, then m and l
//
// Dispatch: (kv_heads, splits, T) workgroups of WG threads. A workgroup
// takes one kv head for the `group` query heads that share it, so each key
// and value is read once for all of them: thread c scores key c of the
// chunk against the group's queries (held in workgroup memory), one thread
// per head then takes the max and the sum, and the threads share out the
// group·D outputs. A key is read in 16-byte loads (eight halves or four
// floats each) when D is a multiple of 8, its dot products kept in registers
// for every head of the group. WG = 64 threads; CHUNK (16 … 256, picked by
// package kernels from the rows and the context length so that there are
// enough workgroups) trades parallelism for merge work. D is a constant
// (head_dim) so that loops over it have a fixed count.

const WG: u32 = 64u;
const D: u32 = 128u;
const CHUNK: u32 = 64u;
const MAX_GROUP: u32 = 8u;
const KV_F16: u32 = 0u; // 1: the KV cache holds f16 pairs (specialized by the host)
const QS: u32 = MAX_GROUP * D / 4u;   // vec4s
const SC: u32 = MAX_GROUP * CHUNK;

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    BS: u32,         // positions per block
    max_blocks: u32, // row stride of table
    splits: u32,
    scale: f32,      // 1/sqrt(D)
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> vcache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read> seq: array<u32>;
@group(0) @binding(6) var<storage, read> pos: array<u32>;
@group(0) @binding(7) var<storage, read_write> part: array<f32>;

// The KV cache holds f32 words, or with KV_F16 = 1 IEEE halves packed two
// to a u32 (pack2x16float; no shader-f16 needed): element i of either cache.
fn kv_load(i: u32, values: bool) -> f32 {
    let wi = select(i, i >> 1u, KV_F16 == 1u); // the u32 word holding element i
    var w: u32;
    if values {
        w = vcache[wi >> 2u][wi & 3u];
    } else {
        w = kcache[wi >> 2u][wi & 3u];
    }
    if KV_F16 == 1u {
        let pair = unpack2x16float(w);
        return select(pair.x, pair.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(w);
}

// Key elements e … e+7 (e a multiple of 8) in 16-byte loads.
struct Key8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn key8(e: u32) -> Key8 {
    if KV_F16 == 1u {
        let w = kcache[e >> 3u];
        return Key8(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
    }
    return Key8(bitcast<vec4<f32>>(kcache[e >> 2u]), bitcast<vec4<f32>>(kcache[(e >> 2u) + 1u]));
}

var<workgroup> qs: array<vec4<f32>, QS>; // (group, D) queries
var<workgroup> sc: array<f32, SC>;      // (group, CHUNK) scores, then exp(score − m)
var<workgroup> base: array<u32, CHUNK>; // cache offset of each key of the chunk
var<workgroup> stat: array<f32, 16>;    // m, then l, of each head (2·MAX_GROUP)

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let s = wid.y;
    let t = wid.z;
    let group = p.heads / p.kv_heads;
    let h0 = g * group;                  // first query head of the group
    let L = pos[t] + 1u;                 // context length of row t
    let j0 = s * CHUNK;
    let out0 = ((t * p.heads + h0) * p.splits + s) * (D + 2u); // part of head h0
    let stride = p.splits * (D + 2u);                          // to the next head

    let n = select(0u, min(CHUNK, L - j0), j0 < L); // keys of this split: 0 past the context

    for (var i = lid; i < group * D; i += WG) {
        qs[i >> 2u][i & 3u] = q[(t * p.heads + h0) * D + i];
    }
    workgroupBarrier();

    // Scores: thread c takes keys c, c+WG, … of the chunk.
    let row = seq[t] * p.max_blocks;
    for (var c = lid; c < n; c += WG) {
        let j = j0 + c;
        let b = ((table[row + j / p.BS] * p.kv_heads + g) * p.BS + j % p.BS) * D;
        base[c] = b;
        // Explicitly zeroed: the bundled naga zeroes an uninitialized
        // variable once per invocation, not at each loop iteration.
        var acc = array<f32, MAX_GROUP>();
        if D % 8u == 0u {
            for (var d = 0u; d < D; d += 8u) {
                let k = key8(b + d);
                for (var hh = 0u; hh < MAX_GROUP; hh++) { // a fixed count: acc stays in registers
                    if hh < group {
                        let qi = (hh * D + d) >> 2u;
                        acc[hh] += dot(qs[qi], k.lo) + dot(qs[qi + 1u], k.hi);
                    }
                }
            }
        } else {
            for (var d = 0u; d < D; d++) {
                let kd = kv_load(b + d, false);
                for (var hh = 0u; hh < group; hh++) {
                    let qi = hh * D + d;
                    acc[hh] += qs[qi >> 2u][qi & 3u] * kd;
                }
            }
        }
        for (var hh = 0u; hh < group; hh++) {
            sc[hh * CHUNK + c] = acc[hh] * p.scale;
        }
    }
    workgroupBarrier();

    // Softmax statistics, one thread per head.
    if lid < group {
        var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
        var m = bitcast<f32>(neg_inf_bits); // −inf, what an empty split stores
        for (var c = 0u; c < n; c++) {
            m = max(m, sc[lid * CHUNK + c]);
        }
        var l = 0.0;
        for (var c = 0u; c < n; c++) {
            let e = exp(sc[lid * CHUNK + c] - m);
            sc[lid * CHUNK + c] = e;
            l += e;
        }
        stat[lid] = m;
        stat[MAX_GROUP + lid] = l;
    }
    workgroupBarrier();

    // o = Σ_c exp(score_c − m) · v_c, the threads sharing the group·D outputs.
    for (var i = lid; i < group * D; i += WG) {
        let hh = i / D;
        let d = i % D;
        var o = 0.0;
        for (var c = 0u; c < n; c++) {
            o += sc[hh * CHUNK + c] * kv_load(base[c] + d, true);
        }
        let dst = out0 + hh * stride;
        part[dst + d] = o;
        if d == 0u {
            part[dst + D] = stat[hh];
            part[dst + D + 1u] = stat[MAX_GROUP + hh];
        }
    }
}
