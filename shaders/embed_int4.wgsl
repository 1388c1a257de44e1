// embed_int4.wgsl: embedding gather from an int4 table, dequantized on the
// fly: out[t][c] = E[ids[t]][c] for t < T, c < K.
//
// E is (V, K) in the int4 format of CONTRACTS.md §2; a token id outside
// [0, V) yields a row of NaN, so that a bad id cannot pass unnoticed (the
// host checks ids it uploads; ids written by argmax.wgsl are in range).
// A table too large for one binding is bound in blocks of rows
// [row0, row0+n): each dispatch writes the rows whose ids fall in its block
// (and the block at row0 = 0 the NaN rows).
//
// Buffers:
//   ids     (T) u32 token ids
//   qweight (n, K/8) u32 codes: rows row0 … row0+n-1 of E
//   scales  (n, K/G) f16, read as u32 pairs (see matmul_int4.wgsl)
//   out     (T, K) f32, written as vec4s
//
// Dispatch: (ceil(K/8 / WG), T, 1) workgroups of WG threads; each thread
// dequantizes one word (eight columns) of one row. WG = 64: a gather is a
// pure copy, any size that fills a wave serves.

const WG: u32 = 64u;

struct Params {
    T: u32,
    V: u32, // rows of E
    K: u32, // columns, a multiple of 8 and of G
    G: u32, // group size
    row0: u32, // first row of E bound
    n: u32,    // rows bound
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> qweight: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;

fn scale(i: u32) -> f32 {
    let pair = unpack2x16float(scales[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = gid.x;      // word within the row
    let t = gid.y;
    let words = p.K / 8u;
    if w >= words {
        return;
    }
    let o = t * (p.K / 4u) + 2u * w;
    let id = ids[t];
    if id >= p.V {
        if p.row0 == 0u {
            var nan_bits = 0x7fc00000u; // a var: Chrome rejects a constant NaN
            let nan = bitcast<f32>(nan_bits);
            out[o] = vec4<f32>(nan);
            out[o + 1u] = vec4<f32>(nan);
        }
        return;
    }
    if id < p.row0 || id >= p.row0 + p.n {
        return; // another block's row
    }
    let r = id - p.row0;
    let q = qweight[r * words + w];
    let s = scale(r * (p.K / p.G) + w / (p.G / 8u));
    out[o] = (vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - 8.0) * s;
    out[o + 1u] = (vec4<f32>((vec4<u32>(q) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - 8.0) * s;
}
