// qkv_fused_int4.wgsl: a decoder layer's attention input in one pass from
// its hidden rows — input_layernorm, the stacked q|k|v projection of an
// int4 weight, then what qkv_rope_kv.wgsl does with the projected rows
// (q_norm/k_norm, RoPE, the append of keys and values to the paged KV
// cache) — so that a decode step spends one dispatch on it, not two (a
// matmul kernel, then qkv_rope_kv.wgsl). Each workgroup computes one head
// vector (its D weight rows) of up to TT activation rows with
// matvec_batch_int4.wgsl's loop (slice_sums: the input staged a chunk at a
// time, one multiply-add a weight), then normalizes, rotates and stores it.
//
// For row t < T and head vector h (query heads, then key heads, then value
// heads; width W = (heads + 2·kv_heads)·D):
//   xn[k]        = x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps)   (input_layernorm;
//                  with NORM = 0 the rows as they come: xn = x)
//   y[i]         = Σ_k xn[k] · W[h·D + i][k],  i < D               (W int4: docs/reference.md)
//   q[t][h]      ← rope(rmsnorm(y) · q_norm)    query heads
//   kcache[t][h] ← rope(rmsnorm(y) · k_norm)    key heads
//   vcache[t][h] ← y                            value heads
// with qk_norm = 0 the heads are rotated as they come (an EAGLE-3 head's
// midlayer, whose input the host normalizes in halves). RoPE, the angle's
// reduction and the cache layout are qkv_rope_kv.wgsl's (read its header);
// the normalized head is rounded to f32 before the rotation, as there. The
// input norm's factor multiplies each sum over K, as matvec_batch_int4.wgsl
// applies it.
//
// Buffers:
//   x       (T, K) f32 hidden rows, read as vec4s
//   qweight (W, K/32) vec4<u32>: 32 codes, column k's in bits 4(k%8)… of
//           word (k%32)/8 of vec4 k/32
//   scales  (W, K/G) f16, read as u32 pairs (G a multiple of 32: a vec4 of
//           codes lies in one scale group)
//   consts  (2·D + D/2 + K) f32: q_norm (D), k_norm (D), inv_freq (D/2),
//           input_layernorm's weight g (K; none with NORM = 0)
//   rows    (T) Row: each row's sequence, slot and position
//   table   (seqs, max_blocks) u32 block tables
//   q       (T, heads, D) f32, written
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32, or f16 packed
//           in pairs (KV_F16)
//
// Dispatch: (heads + 2·kv_heads, ceil(T / TT), 1) workgroups of WG = ROWS /
// RT · LANES threads, ROWS = D (kernels/qkv.go's layout: LANES threads
// share RT neighbouring weight rows, KC input columns staged at a time).
// After the sums, for each of its rows in turn the workgroup gathers the
// head vector in workgroup memory and thread i < D/2 finishes the pair
// (i, i + D/2).

const LANES: u32 = 16u;             // threads per weight row
const ROWS: u32 = 64u;              // weight rows per workgroup: D, one head vector
const RT: u32 = 1u;                 // weight rows a thread (neighbouring rows)
const WG: u32 = 1024u;              // ROWS / RT · LANES
const TT: u32 = 1u;                 // activation rows the workgroup holds (≤ 4)
const KC: u32 = 2048u;              // input columns staged per chunk, a multiple of 32·LANES
const KV_F16: u32 = 0u;             // 1: the KV cache holds f16 pairs (specialized by the host)
const SWIGLU: u32 = 0u;             // (input4) the input is x itself
const NORM: u32 = 1u;               // 1: the input is rmsnorm(x) · g; 0: x (specialized by the host)
const GROUPS: u32 = WG / LANES;     // row groups: LANES threads sharing RT weight rows
const KC32: u32 = KC / 32u;         // 32-column blocks a chunk
const XS: u32 = 8u * TT;            // staged vec4 places over the activation rows
const RTT: u32 = RT * TT;           // a thread's (weight row, activation row) sums
const SPT: u32 = (TT * KC / 4u + WG - 1u) / WG; // vec4s of x' a thread stages per chunk, at most
const WPT: u32 = KC32 / LANES;      // weight vec4s a thread reads per chunk and row
const WR: u32 = WPT * RT;           // weight vec4s a thread holds
const PARTIAL: u32 = TT * ROWS * LANES; // one partial sum per (activation row, weight row, lane)
const SUMSQ: u32 = TT * GROUPS;     // the norm's sums of squares, LANES threads' each

struct Params {
    T: u32,          // activation rows
    N: u32,          // W: rows of the stacked weight
    K: u32,          // inputs, a multiple of 32
    G: u32,          // group size, a multiple of 32
    kps: u32,        // inputs per split: K (one split)
    magic: u32,      // MAGIC, for codes_in_place
    heads: u32,
    kv_heads: u32,
    D: u32,          // head_dim = ROWS
    BS: u32,         // slots per cache block
    max_blocks: u32, // row stride of table
    eps: f32,        // input_layernorm's, q_norm's and k_norm's epsilon
    qk_norm: u32,    // 1: q_norm and k_norm before RoPE; 0: RoPE alone
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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

var<workgroup> xs: array<array<vec4<f32>, KC32>, XS>; // slice_sums' staged input
var<workgroup> partial: array<f32, PARTIAL>;
var<workgroup> sumsq: array<f32, SUMSQ>;
var<workgroup> ssq: array<f32, TT>;
var<workgroup> red_f: array<f32, WG>;   // sum_all's
var<workgroup> head: array<f32, ROWS>;  // a row's head vector

// staged4 is vec4 j of activation row `row` of the input (slice_sums):
// the x binding's.
fn staged4(row: u32, j: u32) -> vec4<f32> {
    return input4(row, j);
}

// input_norm4 is vec4 i of input_layernorm's weight, after the rest of
// consts.
fn input_norm4(i: u32) -> vec4<f32> {
    let g = 2u * p.D + p.D / 2u + 4u * i;
    return vec4<f32>(consts[g], consts[g + 1u], consts[g + 2u], consts[g + 3u]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t0 = wid.y * TT;
    let D = p.D;
    let half = D / 2u;
    let is_q = h < p.heads;
    let is_v = h >= p.heads + p.kv_heads;

    slice_sums(wid, lid, t0);

    for (var tt = 0u; tt < TT; tt++) {
        let t = t0 + tt;
        if t >= p.T {
            break; // uniform: every thread of the workgroup alike
        }
        // The cache slot and the pair's norm weights and rotation, loaded
        // before the barrier so that they wait on memory beside the sums.
        var dst = 0u;
        if !is_q {
            dst = head_slot(t, select(h - p.heads, h - p.heads - p.kv_heads, is_v), D);
        }
        var at = RopeAt(1.0, 1.0, 1.0, 0.0);
        if !is_v && lid < half {
            at = rope_at(lid, t, is_q, D);
        }
        // The row's head vector: each weight row's lanes added up and
        // scaled by the input norm's factor (NORM).
        var r = 1.0;
        if NORM == 1u {
            r = 1.0 / sqrt(ssq[tt] / f32(p.K) + p.eps);
        }
        for (var i = lid; i < ROWS; i += WG) {
            head[i] = r * row_sum(tt, i, i);
        }
        workgroupBarrier();
        if is_v {
            store_head(lid, dst, true, D);
        } else {
            var x1 = 0.0;
            var x2 = 0.0;
            var s = 0.0;
            if lid < half {
                x1 = head[lid];
                x2 = head[lid + half];
                s = x1 * x1 + x2 * x2;
            }
            var inv = 1.0;
            if p.qk_norm != 0u { // uniform: the reduction's barriers only where its sum is used
                inv = 1.0 / sqrt(sum_all(lid, s) / f32(D) + p.eps);
            }
            if lid < half {
                rope_store(x1, x2, inv, at, lid, t, h, is_q, D);
            }
            if !is_q {
                workgroupBarrier();
                store_head(lid, dst, false, D);
            }
        }
        workgroupBarrier(); // head and red_f free for the next row
    }
}
