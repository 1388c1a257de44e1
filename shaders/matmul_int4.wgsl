// matmul_int4.wgsl: out = x · Wᵀ (or out += x · Wᵀ) for an int4 weight W,
// dequantized on the fly, never expanded in memory.
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x[t*K + k] · W[n][k]
//   W[n][k] = (code(n, k) − 8) · scale(n, k / G)      (CONTRACTS.md §2)
// The accumulate form adds a residual in place (hidden += o_proj(attn)).
//
// With NORM = 1 the input is Qwen3's RMSNorm of x computed on the fly,
// rmsnorm(x)[t][k] = x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps): each
// workgroup sums the squares of its rows while it reads them, multiplies
// x by g on the fly and scales its sums by the inverse RMS at the end (the
// projection after a norm without a separate normalization pass).
// With SWIGLU = 1 the input is Qwen3's MLP activation computed on the fly,
// x[t][k] = silu(gu[t][k]) · gu[t][K + k], from the (T, 2K) output of the
// stacked gate/up projection (down_proj without a separate pass for the activation).
//
// Buffers:
//   x       (T, K) f32, read as vec4s; (T, 2K) gate | up with SWIGLU
//   qweight (N, K/8) u32: column k's code is bits 4(k%8)…4(k%8)+3 of word k/8
//   scales  (N, K/G) f16, read as u32 pairs (no shader-f16 needed): scale i
//           is the low half of word i/2 when i is even, the high half if odd
//   out     rows of ldo f32; this call writes columns [0, N) of rows [0, T)
//   norm    (K) f32 RMSNorm weight g, read as vec4s (bound but unread when NORM = 0)
//           (ldo > N lets a matrix too large for one binding be split into
//           row blocks that write column slices of one output)
//
// Dispatch: (ceil(N / ROWS), ceil(T / TT), 1) workgroups of WG threads.
// A workgroup owns ROWS output features × TT activation rows. Its threads
// split each weight row by words: thread i reads words i, i+WG, …, so
// neighbouring threads read neighbouring words (coalesced), and each word is
// dequantized once and used for all TT activation rows. The ROWS·TT partial
// sums of each thread are then added up across the workgroup in workgroup
// memory (the native WGSL compiler has no subgroup operations).
//
// Why these sizes: WG = 64 threads cover one Qwen3-1.7B row (2048 inputs =
// 256 words) in 4 steps, keep the tree reduction at 6 steps, and fit any
// GPU's workgroup limits; for prefill ROWS = 4 rows share each load of x
// and TT is 4 or 8; for decode (T = 1) ROWS = TT = 1, since nothing is
// reused and more workgroups hide more latency (package kernels picks both
// with gpu.Specialize, as it would pick pipeline overrides). Workgroup memory is
// WG·(ROWS + NORM)·TT·4 bytes (8 KiB at TT = 8, 10 KiB with NORM).

const WG: u32 = 64u;
const ROWS: u32 = 4u;
const TT: u32 = 1u;
const SWIGLU: u32 = 0u;          // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;            // 1: the input is rmsnorm(x) · g
const ACC: u32 = ROWS * TT;       // partial sums per thread
const SUMS: u32 = ACC + TT * NORM; // and with NORM the sums of squares of the TT rows
const PARTIAL: u32 = WG * SUMS;

struct Params {
    T: u32,          // activation rows
    N: u32,          // output features (rows of W) in this call
    K: u32,          // input features, a multiple of 8 and of G
    G: u32,          // group size
    ldo: u32,        // row stride of out, ≥ N
    accumulate: u32, // 1: add into out
    eps: f32,        // RMSNorm's epsilon (NORM = 1)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read> norm: array<vec4<f32>>;

var<workgroup> partial: array<f32, PARTIAL>;

// swiglu is silu(g) · u with silu(g) = g / (1 + exp(−g)).
fn swiglu(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    return g / (1.0 + exp(-g)) * u;
}

// scale returns the i-th f16 scale of the scales array.
fn scale(i: u32) -> f32 {
    let pair = unpack2x16float(scales[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * ROWS;
    let t0 = wid.y * TT;
    let words = p.K / 8u;          // words per weight row
    let groups = p.K / p.G;        // scales per weight row
    let words_per_group = p.G / 8u;

    var acc = array<f32, ACC>();
    var ss = array<f32, TT>();
    for (var w = lid; w < words; w += WG) {
        // x[t][8w, 8w+8) for the TT activation rows; rows past T repeat
        // row T-1 and their sums are dropped below.
        var xa: array<vec4<f32>, TT>;
        var xb: array<vec4<f32>, TT>;
        for (var t = 0u; t < TT; t++) {
            let row = min(t0 + t, p.T - 1u);
            if SWIGLU == 1u {
                let g = row * (p.K / 2u) + 2u * w; // gate; up is K/4 vec4s further
                xa[t] = swiglu(x[g], x[g + p.K / 4u]);
                xb[t] = swiglu(x[g + 1u], x[g + 1u + p.K / 4u]);
            } else {
                let base = row * (p.K / 4u) + 2u * w;
                xa[t] = x[base];
                xb[t] = x[base + 1u];
            }
            if NORM == 1u {
                ss[t] += dot(xa[t], xa[t]) + dot(xb[t], xb[t]);
                xa[t] *= norm[2u * w];
                xb[t] *= norm[2u * w + 1u];
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let n = min(n0 + r, p.N - 1u);
            let q = qweight[n * words + w];
            let s = scale(n * groups + w / words_per_group);
            let lo = vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - 8.0;
            let hi = vec4<f32>((vec4<u32>(q) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - 8.0;
            for (var t = 0u; t < TT; t++) {
                acc[r * TT + t] += s * (dot(lo, xa[t]) + dot(hi, xb[t]));
            }
        }
    }

    // Tree reduction of the WG partial sums of each (row, activation row),
    // and of the sums of squares.
    for (var i = 0u; i < ACC; i++) {
        partial[i * WG + lid] = acc[i];
    }
    if NORM == 1u {
        for (var t = 0u; t < TT; t++) {
            partial[(ACC + t) * WG + lid] = ss[t];
        }
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            for (var i = 0u; i < SUMS; i++) {
                partial[i * WG + lid] += partial[i * WG + lid + stride];
            }
        }
        workgroupBarrier();
    }
    if lid < ACC {
        let n = n0 + lid / TT;
        let t = t0 + lid % TT;
        if n < p.N && t < p.T {
            let o = t * p.ldo + n;
            var v = partial[lid * WG];
            if NORM == 1u {
                v *= 1.0 / sqrt(partial[(ACC + lid % TT) * WG] / f32(p.K) + p.eps);
            }
            if p.accumulate != 0u {
                v += out[o];
            }
            out[o] = v;
        }
    }
}
