// matmul_dense.wgsl: out = x · Wᵀ (or out += x · Wᵀ) for a dense f16
// (entry point dense_f16) or f32 (entry point dense_f32) weight W.
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x[t*K + k] · W[n][k]
//
// With NORM = 1 the input is Qwen3's RMSNorm of x computed on the fly, as
// in matmul_int4.wgsl.
// With SWIGLU = 1 the input is Qwen3's MLP activation computed on the fly,
// x[t][k] = silu(gu[t][k]) · gu[t][K + k], from the (T, 2K) output of the
// stacked gate/up projection (down_proj without a separate pass for the activation).
//
// Buffers:
//   x   (T, K) f32, read as vec4s; (T, 2K) gate | up with SWIGLU
//   w   (N, K) as vec4<u32>: f16 — eight halves per vec4, read with
//       unpack2x16float (no shader-f16 needed); f32 — four floats per vec4
//   out rows of ldo f32; this call writes columns [0, N) of rows [0, T)
//   norm (K) f32 RMSNorm weight g, read as vec4s (bound but unread when NORM = 0)
//
// Dispatch, tiling and sizes: as matmul_int4.wgsl — (ceil(N / ROWS),
// ceil(T / TT), 1) workgroups of WG threads; each thread takes eight input
// columns at a time (one vec4 of f16, two of f32), neighbouring threads
// neighbouring columns; partial sums are reduced in workgroup memory.

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
    K: u32,          // input features, a multiple of 8
    _unused: u32,    // (the group size in matmul_int4.wgsl)
    ldo: u32,        // row stride of out, ≥ N
    accumulate: u32, // 1: add into out
    eps: f32,        // RMSNorm's epsilon (NORM = 1)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;

var<workgroup> partial: array<f32, PARTIAL>;

// load_x returns x[t][8u, 8u+8) as two vec4s, for the TT rows from t0
// (rows past T repeat row T-1; their sums are dropped by store).
fn load_x(t0: u32, u: u32, t: u32) -> array<vec4<f32>, 2> {
    let row = min(t0 + t, p.T - 1u);
    if SWIGLU == 1u {
        let g = row * (p.K / 2u) + 2u * u; // gate; up is K/4 vec4s further
        return array<vec4<f32>, 2>(swiglu(x[g], x[g + p.K / 4u]), swiglu(x[g + 1u], x[g + 1u + p.K / 4u]));
    }
    let base = row * (p.K / 4u) + 2u * u;
    return array<vec4<f32>, 2>(x[base], x[base + 1u]);
}

// swiglu is silu(g) · u with silu(g) = g / (1 + exp(−g)).
fn swiglu(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    return g / (1.0 + exp(-g)) * u;
}

// store reduces the workgroup's partial sums (and sums of squares) and
// writes its outputs.
fn store(sums: array<f32, ACC>, squares: array<f32, TT>, lid: u32, n0: u32, t0: u32) {
    var acc = sums; // naga indexes only variables with a dynamic index
    var ss = squares;
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

@compute @workgroup_size(WG)
fn dense_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * ROWS;
    let t0 = wid.y * TT;
    let units = p.K / 8u; // vec4<u32> per weight row
    var acc = array<f32, ACC>();
    var ss = array<f32, TT>();
    for (var u = lid; u < units; u += WG) {
        var xs: array<array<vec4<f32>, 2>, TT>;
        for (var t = 0u; t < TT; t++) {
            xs[t] = load_x(t0, u, t);
            if NORM == 1u { // add the squares, then multiply by g
                ss[t] += dot(xs[t][0], xs[t][0]) + dot(xs[t][1], xs[t][1]);
                xs[t][0] *= norm[2u * u];
                xs[t][1] *= norm[2u * u + 1u];
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let h = w[min(n0 + r, p.N - 1u) * units + u];
            let lo = vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
            let hi = vec4<f32>(unpack2x16float(h.z), unpack2x16float(h.w));
            for (var t = 0u; t < TT; t++) {
                acc[r * TT + t] += dot(lo, xs[t][0]) + dot(hi, xs[t][1]);
            }
        }
    }
    store(acc, ss, lid, n0, t0);
}

@compute @workgroup_size(WG)
fn dense_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * ROWS;
    let t0 = wid.y * TT;
    let units = p.K / 8u; // pairs of vec4<u32> per weight row
    var acc = array<f32, ACC>();
    var ss = array<f32, TT>();
    for (var u = lid; u < units; u += WG) {
        var xs: array<array<vec4<f32>, 2>, TT>;
        for (var t = 0u; t < TT; t++) {
            xs[t] = load_x(t0, u, t);
            if NORM == 1u { // add the squares, then multiply by g
                ss[t] += dot(xs[t][0], xs[t][0]) + dot(xs[t][1], xs[t][1]);
                xs[t][0] *= norm[2u * u];
                xs[t][1] *= norm[2u * u + 1u];
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let base = min(n0 + r, p.N - 1u) * (2u * units) + 2u * u;
            let lo = bitcast<vec4<f32>>(w[base]);
            let hi = bitcast<vec4<f32>>(w[base + 1u]);
            for (var t = 0u; t < TT; t++) {
                acc[r * TT + t] += dot(lo, xs[t][0]) + dot(hi, xs[t][1]);
            }
        }
    }
    store(acc, ss, lid, n0, t0);
}
