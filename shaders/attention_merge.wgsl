// attention_merge.wgsl: merges the splits of attention_decode.wgsl:
//   M = max_s m_s
//   out[t][h] = Σ_s exp(m_s − M) · o_s  /  Σ_s exp(m_s − M) · l_s
// A split the row sees no key of has m = −inf, l = 0, o = 0 and weighs 0
// (every row sees its own slot, so M is finite). A row whose context
// (rows[t].slot + 1) is longer than the splits cover gets NaN, so that a
// wrong split count cannot pass unnoticed.
//
// Buffers:
//   part (T, heads, splits, D + 2) f32 from attention_decode.wgsl
//   rows (T) Row (prelude.wgsl): the rows' slots
//   out  (T, heads, D) f32
//
// Dispatch: (heads, T, 1) workgroups of WG threads, threads over D. WG = 64:
// two values each for D = 128; the split loops are short.

const WG: u32 = 64u;
const D: u32 = 128u;
const CHUNK: u32 = 64u;

struct Params {
    T: u32,
    heads: u32,
    splits: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<Row>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let first = (t * p.heads + h) * p.splits * (D + 2u);
    let o = (t * p.heads + h) * D;
    if rows[t].slot + 1u > p.splits * CHUNK {
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
