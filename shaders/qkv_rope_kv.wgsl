// qkv_rope_kv.wgsl: everything between the stacked q/k/v projection and
// attention, in one pass — the projection's split-K reduce when it split,
// Qwen3's q_norm/k_norm and RoPE, and the append of keys and values to the
// paged KV cache:
//   q[t]        ← rope(rmsnorm(qkv[t].q_h) · q_norm)     for each query head h
//   kcache[t]   ← rope(rmsnorm(qkv[t].k_h) · k_norm)     for each kv head h
//   vcache[t]   ← qkv[t].v_h
// With qk_norm = 0 the heads are rotated as they come, q[t] ← rope(qkv[t].q_h)
// and kcache[t] ← rope(qkv[t].k_h): a Llama layer's attention input (an
// EAGLE-3 head's midlayer), consts' q_norm and k_norm unread.
//   rope: y[i], y[i + D/2] ← y[i]·cos a − y[i + D/2]·sin a, y[i + D/2]·cos a + y[i]·sin a,
//         a = rows[t].pos · inv_freq[i] (i < D/2; split-halves layout)
// The normalized value is rounded to f32 before the rotation, exactly as
// reference.RMSNorm then reference.Rope compute it. inv_freq is
// theta^(−2i/D), computed on the host (qwen3.Config.RopeInvFreq). The angle is reduced to about [−π, π] with a two-constant 2π
// (Cody–Waite, see reduced) before sin and cos, because GPU sin/cos are only
// accurate near zero and angles reach the thousands of radians.
//
// Row t's key and value go to cache slot rows[t].slot of the sequence whose
// block table is row rows[t].seq, and it is rotated at rows[t].pos (Row in
// prelude.wgsl): the slot itself for a line token, its parent's position
// plus one for a token-tree node, whose slot lies further on.
//
// The KV cache (one layer's slice, bound here) is a pool of blocks of BS
// slots; kv head h of slot j of the sequence with table row s lives at
//   ((block · kv_heads + h) · BS + j % BS) · D
// where block = table[s · max_blocks + j / BS] is the physical block the
// sequence's block table maps its logical block j / BS to. Keys and values
// share the layout. Within a block one head's slots are contiguous, so
// attention reads a head's keys as runs of BS·D values. Sequences share
// nothing but the pool, and a prefix shared by two sequences can map to the
// same blocks. An f16 cache packs two halves per u32 word, the even element
// in the low half (pack2x16float).
//
// The q|k|v rows arrive in one of two forms (binding 1, part):
//   splits = 1: the rows themselves, qkv[t·W + n], W = heads·D + 2·kv_heads·D;
//   splits > 1: the split-K partials of the projection of the normalized
//     input (gemm_int4.wgsl or skinny_int4.wgsl, input norm on), summed here
//     as each head vector is loaded, in the order matmul_reduce.wgsl sums
//     them, and scaled by the input's RMSNorm factor computed as it does:
//       qkv[t][n] = r[t] · Σ_{s < splits} part[(s·T + t)·W + n]
//       r[t]      = 1 / sqrt(Σ_s part[splits·T·W + s·T + t] / K + norm_eps)
// so that the rows equal what the reduce would have written.
//
// Buffers:
//   part    (T, heads·D + 2·kv_heads·D) f32: rows of q_proj | k_proj | v_proj
//           (splits = 1); or (splits, T, W) f32 partial sums, then
//           (splits, T) partial sums of squares of the input rows
//   consts  (2·D + D/2) f32: q_norm (D), k_norm (D), inv_freq (D/2); the
//           norms unread when qk_norm = 0
//   rows    (T) Row: each row's sequence, slot and position (its mask is
//           attention's)
//   table   (seqs, max_blocks) u32 block tables
//   q       (T, heads, D) f32, written
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32, or f16 packed
//           in pairs (KV_F16)
//
// Dispatch: (heads + 2·kv_heads, T, 1) workgroups of WG threads, one head
// vector each. Thread i holds the pairs (i, i + D/2), (i + WG, …), … in
// registers across the sum of squares (reduced in workgroup memory) and the
// rotation; cache writes go through workgroup memory so that f16 halves are
// packed in neighbouring pairs. WG = 64 = D/2 for Qwen3's head_dim 128.
// With partials each thread sums its own values' splits (and the row's
// sums of squares): splits is small (the projection splits only while its
// tiles are too few to fill the GPU), and no value is read twice.

const WG: u32 = 64u;
const PAIRS: u32 = 2u;  // pairs per thread at most: D/2 ≤ WG·PAIRS
const KV_F16: u32 = 0u; // 1: the KV cache holds f16 pairs (specialized by the host)
const SB: u32 = 8u;     // splits' partial sums a thread loads at once (specialized by the host)

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    D: u32,
    eps: f32,
    BS: u32,         // slots per cache block
    max_blocks: u32, // row stride of table
    splits: u32,     // 1: qkv holds rows; > 1: split-K partials of that many splits
    K: u32,          // splits > 1: the input row length the sums of squares cover
    norm_eps: f32,   // splits > 1: the input RMSNorm's epsilon
    qk_norm: u32,    // 1: q_norm and k_norm before RoPE; 0: RoPE alone
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> consts: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<Row>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read_write> q: array<f32>;
@group(0) @binding(6) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(7) var<storage, read_write> vcache: array<u32>;

var<workgroup> sums: array<f32, WG>;
var<workgroup> head: array<f32, 256>; // 2·WG·PAIRS: one head vector for the cache write

// row_scale returns the input RMSNorm factor r[t] of row t: 1 for plain
// rows, else from the partial sums of squares (after the partial sums of
// width values a row).
fn row_scale(t: u32, width: u32) -> f32 {
    if p.splits <= 1u {
        return 1.0;
    }
    return 1.0 / sqrt(split_sum(p.splits * p.T * width + t, p.T) / f32(p.K) + p.norm_eps);
}

// load returns value n of q|k|v row t (width values): the row's own, or the
// sum of its partials times r, the row's row_scale.
fn load(t: u32, n: u32, width: u32, r: f32) -> f32 {
    if p.splits <= 1u {
        return part[t * width + n];
    }
    return split_sum(t * width + n, p.T * width) * r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    let h = wid.x;
    let D = p.D;
    let half = D / 2u;
    let is_q = h < p.heads;
    let is_v = h >= p.heads + p.kv_heads;
    let width = (p.heads + 2u * p.kv_heads) * D;
    let src = h * D; // head h's vector in the q|k|v row
    // What does not depend on the values, loaded first so that it waits on
    // memory beside them: the cache slot of a key or value head, and each
    // pair's norm weights and rotation.
    let kvh = select(h - p.heads, h - p.heads - p.kv_heads, is_v);
    var dst = 0u;
    if !is_q {
        dst = head_slot(t, kvh, D);
    }
    var at = array<RopeAt, PAIRS>();
    if !is_v {
        for (var j = 0u; j < PAIRS; j++) {
            let i = lid + j * WG;
            if i < half {
                at[j] = rope_at(i, t, is_q, D);
            }
        }
    }
    let r = row_scale(t, width);

    if !is_v {
        var x1 = array<f32, PAIRS>();
        var x2 = array<f32, PAIRS>();
        var ss = 0.0;
        for (var j = 0u; j < PAIRS; j++) {
            let i = lid + j * WG;
            if i < half {
                x1[j] = load(t, src + i, width, r);
                x2[j] = load(t, src + i + half, width, r);
                ss += x1[j] * x1[j] + x2[j] * x2[j];
            }
        }
        sums[lid] = ss;
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
            if lid < stride {
                sums[lid] += sums[lid + stride];
            }
            workgroupBarrier();
        }
        let inv = 1.0 / sqrt(sums[0] / f32(D) + p.eps);
        for (var j = 0u; j < PAIRS; j++) {
            let i = lid + j * WG;
            if i < half {
                rope_store(x1[j], x2[j], inv, at[j], i, t, h, is_q, D);
            }
        }
        if is_q {
            return; // uniform per workgroup
        }
    } else {
        for (var i = lid; i < D; i += WG) {
            head[i] = load(t, src + i, width, r);
        }
    }
    workgroupBarrier();

    // Write the key or value head to the row's cache slot.
    store_head(lid, dst, is_v, D);
}
