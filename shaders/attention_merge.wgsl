// attention_merge.wgsl: merges the splits of attention_decode.wgsl:
//   M = max_s m_s
//   out[t][h] = Σ_s exp(m_s − M) · o_s  /  Σ_s exp(m_s − M) · l_s
// A row whose context (pos[t] + 1) is longer than the splits cover gets
// NaN, so that a wrong split count cannot pass unnoticed.
//
// With APPEND (attention_decode.wgsl's ROPE), the workgroup of each kv
// head's first query head also appends the row's own key and value, left
// in part from word kv0 on, to the cache at the row's position (layout in
// qkv_rope_kv.wgsl): the append qkv_rope_kv.wgsl would have done.
//
// Buffers:
//   part (T, heads, splits, D + 2) f32 from attention_decode.wgsl; with
//        APPEND (T, kv_heads, 2, D) keys and values from word kv0 on
//   pos  (T) u32
//   out  (T, heads, D) f32
//   seq  (T) u32, table (seqs, max_blocks) u32: APPEND's cache slots
//   kcache, vcache  one layer's cache, f32 or f16 pairs (KV_F16); APPEND
//
// Dispatch: (heads, T, 1) workgroups of WG threads, threads over D. WG = 64:
// two values each for D = 128; the split loops are short.

const WG: u32 = 64u;
const D: u32 = 128u;
const CHUNK: u32 = 64u;
const APPEND: u32 = 0u; // 1: append the rows' own keys and values (specialized by the host)
const KV_F16: u32 = 0u; // 1: the KV cache holds f16 pairs (specialized by the host)

struct Params {
    T: u32,
    heads: u32,
    splits: u32,
    kv_heads: u32,
    BS: u32,         // APPEND: positions per cache block
    max_blocks: u32, // APPEND: row stride of table
    kv0: u32,        // APPEND: the first word of the keys and values in part
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read> table: array<u32>;
@group(0) @binding(6) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(7) var<storage, read_write> vcache: array<u32>;

// append writes row t's own key and value of kv head g to the cache.
fn append(lid: u32, t: u32, g: u32) {
    let src = p.kv0 + (t * p.kv_heads + g) * 2u * D;
    let j = pos[t];
    let block = table[seq[t] * p.max_blocks + j / p.BS];
    let dst = ((block * p.kv_heads + g) * p.BS + j % p.BS) * D;
    if KV_F16 == 1u {
        for (var i = 2u * lid; i < D; i += 2u * WG) {
            kcache[(dst + i) >> 1u] = pack2x16float(vec2<f32>(part[src + i], part[src + i + 1u]));
            vcache[(dst + i) >> 1u] = pack2x16float(vec2<f32>(part[src + D + i], part[src + D + i + 1u]));
        }
        return;
    }
    for (var i = lid; i < D; i += WG) {
        kcache[dst + i] = bitcast<u32>(part[src + i]);
        vcache[dst + i] = bitcast<u32>(part[src + D + i]);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let first = (t * p.heads + h) * p.splits * (D + 2u);
    let o = (t * p.heads + h) * D;
    let group = p.heads / p.kv_heads;
    if APPEND == 1u && h % group == 0u {
        append(lid, t, h / group);
    }
    if pos[t] + 1u > p.splits * CHUNK {
        var nan_bits = 0x7fc00000u; // a var: Chrome rejects a constant NaN
        for (var d = lid; d < D; d += WG) {
            out[o + d] = bitcast<f32>(nan_bits);
        }
        return;
    }
    var M = part[first + D];
    for (var s = 1u; s < p.splits; s++) {
        M = max(M, part[first + s * (D + 2u) + D]);
    }
    var den = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let at = first + s * (D + 2u);
        den += exp(part[at + D] - M) * part[at + D + 1u];
    }
    for (var d = lid; d < D; d += WG) {
        var num = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let at = first + s * (D + 2u);
            num += exp(part[at + D] - M) * part[at + d];
        }
        out[o + d] = num / den;
    }
}
