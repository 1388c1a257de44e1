// qkv_fused_int4.wgsl: a decoder layer's attention input in one pass from
// its hidden rows, for small layers — input_layernorm, the stacked q|k|v
// projection of an int4 weight, then what qkv_rope_kv.wgsl does with the
// projected rows (q_norm/k_norm, RoPE, the append of keys and values to the
// paged KV cache) — so that a decode step spends one dispatch on it, not
// two (a matmul kernel, then qkv_rope_kv.wgsl). Each workgroup computes one
// head vector of one row, its D weight rows, and reads the whole input row:
// fine while K is small and the rows few (kernels/plan.go picks it), as a
// small model's decode and verification in a browser, where a dispatch
// costs the host more than such a kernel costs the GPU.
//
// For row t < T and head vector h (query heads, then key heads, then value
// heads; width W = (heads + 2·kv_heads)·D):
//   xn[k]        = x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps)   (input_layernorm)
//   y[i]         = Σ_k xn[k] · W[h·D + i][k],  i < D               (W int4: docs/reference.md)
//   q[t][h]      ← rope(rmsnorm(y) · q_norm)    query heads
//   kcache[t][h] ← rope(rmsnorm(y) · k_norm)    key heads
//   vcache[t][h] ← y                            value heads
// with qk_norm = 0 the heads are rotated as they come. RoPE, the angle's
// reduction and the cache layout are qkv_rope_kv.wgsl's (read its header);
// the normalized head is rounded to f32 before the rotation, as there.
//
// Buffers:
//   x       (T, K) f32 hidden rows, read as vec4s
//   qweight (W, K/32) vec4<u32>: 32 codes, column k's in bits 4(k%8)… of
//           word (k%32)/8 of vec4 k/32
//   scales  (W, K/G) f16, read as u32 pairs (G a multiple of 32: a vec4 of
//           codes lies in one scale group)
//   consts  (2·D + D/2 + K) f32: q_norm (D), k_norm (D), inv_freq (D/2),
//           input_layernorm's weight g (K)
//   rows    (T) Row: each row's sequence, slot and position
//   table   (seqs, max_blocks) u32 block tables
//   q       (T, heads, D) f32, written
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32, or f16 packed
//           in pairs (KV_F16)
//
// Dispatch: (heads + 2·kv_heads, T, 1) workgroups of WG threads. The
// workgroup stages xn in workgroup memory (K ≤ KMAX), then LANES threads
// share each weight row (16, or the row's vec4s where fewer: a power of
// two), WG / LANES rows at a time, lane l reading vec4s l, l + LANES, … —
// neighbouring lanes, neighbouring 16-byte words; the lanes' sums meet in
// workgroup memory as the head vector, and the rest is qkv_rope_kv.wgsl's,
// thread i holding the pairs (i, i + D/2) for i < D/2 (D/2 ≤ WG).

const WG: u32 = 128u;
const KMAX: u32 = 2048u; // the longest input row staged (8 KB: within WebGPU's 16 KB default)
const XS: u32 = KMAX / 4u;
const KV_F16: u32 = 0u;  // 1: the KV cache holds f16 pairs (specialized by the host)

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    D: u32,
    K: u32,
    groups: u32,     // scale groups a weight row: K / G
    BS: u32,         // slots per cache block
    max_blocks: u32, // row stride of table
    eps: f32,        // input_layernorm's, q_norm's and k_norm's epsilon
    qk_norm: u32,    // 1: q_norm and k_norm before RoPE; 0: RoPE alone
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> consts: array<f32>;
@group(0) @binding(5) var<storage, read> rows: array<Row>;
@group(0) @binding(6) var<storage, read> table: array<u32>;
@group(0) @binding(7) var<storage, read_write> q: array<f32>;
@group(0) @binding(8) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(9) var<storage, read_write> vcache: array<u32>;

var<workgroup> xs: array<vec4<f32>, XS>; // xn
var<workgroup> red_f: array<f32, WG>; // sum_all's, and the lanes' sums
var<workgroup> head: array<f32, 256>; // the head vector (D ≤ 256)

// dot4 is Σ (code − 8) · xn over the 32 codes of one vec4 of weights,
// against staged columns 32·c … 32·c + 31.
fn dot4(w: vec4<u32>, c: u32) -> f32 {
    var acc = 0.0;
    for (var j = 0u; j < 4u; j++) {
        acc += dot(codes(w[j], 0u), xs[8u * c + 2u * j]) + dot(codes(w[j], 16u), xs[8u * c + 2u * j + 1u]);
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    let h = wid.x;
    let D = p.D;
    let K4 = p.K / 4u;
    let half = D / 2u;
    let is_q = h < p.heads;
    let is_v = h >= p.heads + p.kv_heads;
    let g0 = 2u * D + half; // input_layernorm's weight in consts

    // 1. xn = input_layernorm(x[t]), staged.
    var ss = 0.0;
    for (var i = lid; i < K4; i += WG) {
        let v = x[t * K4 + i];
        xs[i] = v;
        ss += dot(v, v);
    }
    let inv_in = 1.0 / sqrt(sum_all(lid, ss) / f32(p.K) + p.eps);
    for (var i = lid; i < K4; i += WG) {
        let g = vec4<f32>(consts[g0 + 4u * i], consts[g0 + 4u * i + 1u], consts[g0 + 4u * i + 2u], consts[g0 + 4u * i + 3u]);
        xs[i] = g * (xs[i] * inv_in);
    }
    workgroupBarrier();

    // 2. The head vector: D weight rows, LANES threads a row, neighbouring
    // lanes reading neighbouring vec4s of it (coalesced).
    let vecs = p.K / 32u; // weight vec4s a row
    var lanes = 16u;
    while lanes > vecs {
        lanes >>= 1u;
    }
    let per = WG / lanes; // rows at a time
    let lane = lid % lanes;
    let per_group = vecs / p.groups;
    for (var i0 = 0u; i0 < D; i0 += per) {
        let i = i0 + lid / lanes;
        var acc = 0.0;
        if i < D {
            let n = h * D + i;
            for (var c = lane; c < vecs; c += lanes) {
                acc += dot4(qweight[n * vecs + c], c) * scale(n * p.groups + c / per_group);
            }
        }
        red_f[lid] = acc;
        workgroupBarrier();
        if lane == 0u && i < D {
            var y = 0.0;
            for (var l = 0u; l < lanes; l++) {
                y += red_f[lid + l];
            }
            head[i] = y;
        }
        workgroupBarrier();
    }

    // 3. qkv_rope_kv.wgsl's part: norms and RoPE, or the value as it is.
    if !is_v {
        var x1 = 0.0;
        var x2 = 0.0;
        var s = 0.0;
        if lid < half {
            x1 = head[lid];
            x2 = head[lid + half];
            s = x1 * x1 + x2 * x2;
        }
        let inv = 1.0 / sqrt(sum_all(lid, s) / f32(D) + p.eps);
        if lid < half {
            rope_store(x1, x2, inv, lid, t, h, is_q, D);
        }
        if is_q {
            return; // uniform per workgroup
        }
    }
    workgroupBarrier();

    // 4. The key or value head into the row's cache slot.
    let kvh = select(h - p.heads, h - p.heads - p.kv_heads, is_v);
    store_head(lid, t, kvh, is_v, D);
}
