// rmsnorm.wgsl: Qwen3RMSNorm over rows, in f32:
//   out[r·ldo + col0 + i] = weight[i] · (x[r][i] · 1/sqrt(mean_i(x[r][i]²) + eps))
// for r < R rows of n values, written to columns col0 … col0+n−1 of rows
// of ldo values (ldo = n, col0 = 0: rows as they came). Serves the hidden
// norms (R = T, n = H), the per-head q/k norms (R = T·heads, n = D), and
// the halves of an EAGLE-3 head's 2H-wide input, [input_layernorm(e);
// hidden_norm(h)] (ldo = 2H, col0 = 0 or H).
//
// Four entry points: main normalizes x's rows 0 … R−1; gathered
// normalizes x's rows rows[0], …, rows[R−1] (a pass's read-out rows,
// before its head), so that no copy of them comes first; pair normalizes
// x's rows 0 … R−1 by weight into columns col0 … and x2's by weight2 into
// columns col0 + n … (an EAGLE-3 head's two halves in one dispatch);
// pair_embed is pair with the first half's rows the int4 embedding
// table's rows ids[0], …, ids[R−1], dequantized as they are read (an
// EAGLE-3 head's whole input in one dispatch, no embedding gather first;
// an id outside [0, V) gives that half NaN, as embed.wgsl's row would).
//
// Buffers:
//   x      (R, n) f32; gathered: (rows of x, n) f32
//   weight (n) f32
//   out    (R, ldo) f32, columns col0 … col0+n−1 of each row written (may
//          not alias x: WebGPU forbids a writable binding overlapping
//          another)
//   rows   (R) u32, gathered only: the rows of x normalized, each < x's rows
//   x2, weight2  pair, pair_embed: the second half's rows and weight, as
//          x and weight (x2 at rows' binding, which they do not use)
//   ids    pair_embed only: (R) u32 token ids, at x's binding
//   qweight, scales  pair_embed only: the int4 table, (V, n/8) u32 codes
//          and (V, n/G) f16 scales read as u32 pairs (docs/reference.md,
//          "The int4 scheme")
//
// Dispatch: (R, 1, 1) workgroups of WG threads (pair, pair_embed: (R, 2,
// 1), grid y the half), one row each: threads sum
// strided squares, a tree in workgroup memory adds the WG sums, then all
// threads scale the row. WG = 256 for hidden rows (2048–4096 values: 8–16
// per thread); package kernels specializes WG = 64 for head rows (128).

const WG: u32 = 256u;

struct Params {
    R: u32,
    n: u32,
    eps: f32,
    ldo: u32,  // out's row length
    col0: u32, // the first column of out written
    V: u32,    // pair_embed: the table's rows
    G: u32,    // pair_embed: its int4 group size, a multiple of 8
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> rows: array<u32>;
@group(0) @binding(4) var<storage, read> x2: array<f32>;
@group(0) @binding(5) var<storage, read> weight2: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(6) var<storage, read> qweight: array<u32>;
@group(0) @binding(7) var<storage, read> scales: array<u32>;

var<workgroup> sums: array<f32, WG>;

// inv_rms returns 1/sqrt(mean of squares + eps) of a row whose threads'
// sums of squares are ss.
fn inv_rms(ss: f32, lid: u32) -> f32 {
    sums[lid] = ss;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            sums[lid] += sums[lid + stride];
        }
        workgroupBarrier();
    }
    return 1.0 / sqrt(sums[0] / f32(p.n) + p.eps);
}

// norm_row writes row r of out from the row of x at base.
fn norm_row(base: u32, r: u32, lid: u32) {
    var ss = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    let inv = inv_rms(ss, lid);
    let dst = r * p.ldo + p.col0;
    for (var i = lid; i < p.n; i += WG) {
        out[dst + i] = weight[i] * (x[base + i] * inv);
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    norm_row(wid.x * p.n, wid.x, lid);
}

@compute @workgroup_size(WG)
fn gathered(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    norm_row(rows[wid.x] * p.n, wid.x, lid);
}

@compute @workgroup_size(WG)
fn pair(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if wid.y == 0u {
        norm_row(wid.x * p.n, wid.x, lid);
        return;
    }
    norm_second(wid.x, lid);
}

// norm_second writes the second half of row r of out: x2's row r by
// weight2 into columns col0 + n ….
fn norm_second(r: u32, lid: u32) {
    let base = r * p.n;
    var ss = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x2[base + i];
        ss += v * v;
    }
    let inv = inv_rms(ss, lid);
    let dst = r * p.ldo + p.col0 + p.n;
    for (var i = lid; i < p.n; i += WG) {
        out[dst + i] = weight2[i] * (x2[base + i] * inv);
    }
}

// embedded returns column i of the table's row id, dequantized: NaN for
// an id outside [0, V) (every thread of the row gets it, so no branch
// around the barriers differs between them).
fn embedded(id: u32, i: u32) -> f32 {
    var nan_bits = 0x7fc00000u; // a var: Chrome rejects a constant NaN
    let row = min(id, p.V - 1u);
    let code = f32((qweight[row * (p.n / 8u) + i / 8u] >> (4u * (i % 8u))) & 15u) - 8.0;
    return select(code * scale(row * (p.n / p.G) + i / p.G), bitcast<f32>(nan_bits), id >= p.V);
}

@compute @workgroup_size(WG)
fn pair_embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if wid.y == 1u {
        norm_second(wid.x, lid);
        return;
    }
    let id = ids[wid.x];
    var ss = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = embedded(id, i);
        ss += v * v;
    }
    let inv = inv_rms(ss, lid);
    let dst = wid.x * p.ldo + p.col0;
    for (var i = lid; i < p.n; i += WG) {
        out[dst + i] = weight[i] * (embedded(id, i) * inv);
    }
}
