// matmul_int4_tiled.wgsl: out = x · Wᵀ (or out += x · Wᵀ) for an int4
// weight W and many activation rows (batched decode, prefill): the same
// contract as matmul_int4.wgsl, tiled so that every weight is read and
// dequantized once per 32 activation rows and every thread keeps whole
// dot products in registers (no cross-thread reduction).
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x[t*K + k] · W[n][k]
//   W[n][k] = (code(n, k) − 8) · scale(n, k / G)      (CONTRACTS.md §2)
// With SWIGLU = 1 the input is x[t][k] = silu(gu[t][k]) · gu[t][K + k] from
// the (T, 2K) output of the stacked gate/up projection.
//
// Buffers (as matmul_int4.wgsl):
//   x       (T, K) f32 read as vec4s; (T, 2K) gate | up with SWIGLU
//   qweight (N, K/8) u32, eight 4-bit codes a word, column k in bits 4(k%8)…
//   scales  (N, K/G) f16 as u32 pairs (low half first)
//   out     rows of ldo f32; columns [0, N) of rows [0, T) are written
//
// Dispatch: (ceil(N / BN), ceil(T / BT), 1) workgroups of WG = 64 threads.
// A workgroup owns a BN × BT = 16 × 32 tile of out and walks K in steps of
// BK = 32 columns (G must be a multiple of 32, so one scale per row a step):
// each thread dequantizes one weight word (8 values) into workgroup memory
// and loads four vec4s of x into it, then every thread accumulates its
// 4 (n) × 2 (t) outputs from the shared tiles: 8 multiply-adds for each
// vec4 + vec2 read. Workgroup memory: (BK·BN + BK·BT)·4 = 6 KiB.

const WG: u32 = 64u;
const BN: u32 = 16u; // output features a workgroup
const BT: u32 = 32u; // activation rows a workgroup
const BK: u32 = 32u; // input columns a step
const SWIGLU: u32 = 0u; // 1: x is gate | up, and the input silu(gate)·up

struct Params {
    T: u32,          // activation rows
    N: u32,          // output features (rows of W) in this call
    K: u32,          // input features, a multiple of BK
    G: u32,          // group size, a multiple of BK
    ldo: u32,        // row stride of out, ≥ N
    accumulate: u32, // 1: add into out
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> ws: array<vec4<f32>, 128>; // (BK, BN) dequantized weights, k-major
var<workgroup> xs: array<vec2<f32>, 512>; // (BK, BT) activations, k-major

// scale returns the i-th f16 scale of the scales array.
fn scale(i: u32) -> f32 {
    let pair = unpack2x16float(scales[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

// swiglu is silu(g) · u, as reference.SiLU (g / (1 + e^−g)) times u.
fn swiglu(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    return g / (1.0 + exp(-g)) * u;
}

// load_x returns x[t][4q, 4q+4) (q counts vec4s along K).
fn load_x(t: u32, q: u32) -> vec4<f32> {
    if SWIGLU == 1u {
        let g = t * (p.K / 2u) + q; // gate; up is K/4 vec4s further
        return swiglu(x[g], x[g + p.K / 4u]);
    }
    return x[t * (p.K / 4u) + q];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * BN;
    let t0 = wid.y * BT;
    let tn = lid % 4u; // this thread's outputs: features n0 + 4·tn …
    let tt = lid / 4u; // … and rows t0 + 2·tt, t0 + 2·tt + 1
    let words = p.K / 8u;
    let groups = p.K / p.G;

    // The weight word this thread dequantizes each step: row wr, word ww
    // of the step's four; rows past N repeat row N − 1 (their sums are
    // never written).
    let wr = lid / 4u;
    let ww = lid % 4u;
    let wn = min(n0 + wr, p.N - 1u);

    var acc = array<vec2<f32>, 4>(); // acc[i] = outputs (n0 + 4·tn + i; the two rows)
    for (var k0 = 0u; k0 < p.K; k0 += BK) {
        let q = qweight[wn * words + k0 / 8u + ww];
        let s = scale(wn * groups + k0 / p.G);
        let lo = (vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - 8.0) * s;
        let hi = (vec4<f32>((vec4<u32>(q) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - 8.0) * s;
        for (var j = 0u; j < 4u; j++) {
            // ws[k][n] as vec4s over n: element (k, n) is ws[k·4 + n/4][n%4].
            let k = ww * 8u + j;
            ws[k * 4u + wr / 4u][wr % 4u] = lo[j];
            ws[(k + 4u) * 4u + wr / 4u][wr % 4u] = hi[j];
        }
        // x: BT rows × BK columns = 256 vec4s, four a thread.
        for (var i = 0u; i < 4u; i++) {
            let v = lid + i * WG;
            let t = v / 8u;  // tile row
            let c = v % 8u;  // vec4 within the step
            let xv = load_x(min(t0 + t, p.T - 1u), k0 / 4u + c);
            for (var j = 0u; j < 4u; j++) {
                // xs[k][t] as vec2s over t: element (k, t) is xs[k·16 + t/2][t%2].
                xs[(c * 4u + j) * 16u + t / 2u][t % 2u] = xv[j];
            }
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = ws[k * 4u + tn];
            let b = xs[k * 16u + tt];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }

    for (var i = 0u; i < 4u; i++) {
        let n = n0 + 4u * tn + i;
        for (var j = 0u; j < 2u; j++) {
            let t = t0 + 2u * tt + j;
            if n < p.N && t < p.T {
                let o = t * p.ldo + n;
                var v = acc[i][j];
                if p.accumulate != 0u {
                    v += out[o];
                }
                out[o] = v;
            }
        }
    }
}
