// matmul_rowtile.wgsl: out = x · Wᵀ (or out += x · Wᵀ), each thread taking
// whole words of the weight rows, for any shape and any weight format: an
// int4 W dequantized on the fly, never expanded in memory (entry point
// int4), or a dense f16 (dense_f16) or f32 (dense_f32) W. Package kernels
// picks it where the int4 kernels for few rows (matvec_int4.wgsl,
// matvec_batch_int4.wgsl) and for many (skinny_int4.wgsl, gemm_int4.wgsl)
// do not serve: one row of a long input (down_proj), and dense weights.
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x[t*K + k] · W[n][k]
//   int4: W[n][k] = (code(n, k) − 8) · scale(n, k / G)   (docs/reference.md, "The int4 scheme")
// The accumulate form adds a residual in place (hidden += o_proj(attn)).
//
// With NORM = 1 the input is Qwen3's RMSNorm of x computed on the fly,
// rmsnorm(x)[t][k] = x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps): each
// workgroup sums the squares of its rows while it reads them, multiplies
// x by g on the fly and scales its sums by the inverse RMS at the end (the
// projection after a norm without a separate normalization pass).
// With SWIGLU = 1 the input is Qwen3's MLP activation computed on the fly,
// x[t][k] = silu(gu[t][k]) · gu[t][K + k], from the (T, 2K) output of the
// stacked gate/up projection (down_proj without a separate pass for the
// activation).
//
// Buffers (the entry points share bindings 1, 3 and 4; binding 2 is the
// weights in each one's form):
//   x       (T, K) f32, read as vec4s; (T, 2K) gate | up with SWIGLU
//   qweight int4: (N, K/8) u32, column k's code in bits 4(k%8)…4(k%8)+3 of
//           word k/8
//   dense   dense: (N, K) as vec4<u32> — eight halves (f16, read with
//           unpack2x16float: no shader-f16 needed) or four floats (f32)
//   out     rows of ldo f32; this call writes columns [0, N) of rows [0, T)
//           (ldo > N lets a matrix too large for one binding be split into
//           row blocks that write column slices of one output)
//   norm    (K) f32 RMSNorm weight g, read as vec4s (bound but unread when
//           NORM = 0)
//   scales  int4: (N, K/G) f16, read as u32 pairs (scale)
//
// Dispatch: (ceil(N / ROWS), ceil(T / TT), 1) workgroups of WG threads.
// A workgroup owns ROWS output features × TT activation rows. Its threads
// split each weight row by eight-column words: thread i reads words i,
// i+WG, …, so neighbouring threads read neighbouring words (coalesced), and
// each word is unpacked once and used for all TT activation rows. The
// ROWS·TT partial sums of each thread are then added up across the
// workgroup in workgroup memory (store; the native WGSL compiler has no
// subgroup operations).
//
// Why these sizes: WG = 64 threads cover one Qwen3-1.7B row (2048 inputs =
// 256 words) in 4 steps, keep the tree reduction at 6 steps, and fit any
// GPU's workgroup limits; for prefill ROWS = 4 rows share each load of x
// and TT is 4 or 8; for decode (T = 1) ROWS = TT = 1, since nothing is
// reused and more workgroups hide more latency (package kernels picks both
// by specializing the constants). Workgroup memory is WG·(ROWS + NORM)·TT·4
// bytes (8 KiB at TT = 8, 10 KiB with NORM).

const WG: u32 = 64u;
const ROWS: u32 = 4u;
const TT: u32 = 1u;
const SWIGLU: u32 = 0u;            // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;              // 1: the input is rmsnorm(x) · g
const ACC: u32 = ROWS * TT;        // partial sums per thread
const SUMS: u32 = ACC + TT * NORM; // and with NORM the sums of squares of the TT rows
const PARTIAL: u32 = WG * SUMS;

@group(0) @binding(0) var<uniform> p: MatMulParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<u32>;
@group(0) @binding(2) var<storage, read> dense: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;

var<workgroup> partial: array<f32, PARTIAL>;

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
fn int4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
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
            xa[t] = input4(row, 2u * w);
            xb[t] = input4(row, 2u * w + 1u);
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
    store(acc, ss, lid, n0, t0);
}

@compute @workgroup_size(WG)
fn dense_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    dense_rows(wid, lid, true);
}

@compute @workgroup_size(WG)
fn dense_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    dense_rows(wid, lid, false);
}

// dense_rows is the dense entry points' body: each thread takes eight
// columns at a time, one vec4<u32> of halves (f16) or two of floats.
fn dense_rows(wid: vec3<u32>, lid: u32, halves: bool) {
    let n0 = wid.x * ROWS;
    let t0 = wid.y * TT;
    let units = p.K / 8u; // eight-column units per weight row
    var acc = array<f32, ACC>();
    var ss = array<f32, TT>();
    for (var u = lid; u < units; u += WG) {
        // x'[t][8u, 8u+8) for the TT activation rows; rows past T repeat
        // row T-1 and their sums are dropped by store.
        var xs: array<array<vec4<f32>, 2>, TT>;
        for (var t = 0u; t < TT; t++) {
            let row = min(t0 + t, p.T - 1u);
            xs[t] = array<vec4<f32>, 2>(input4(row, 2u * u), input4(row, 2u * u + 1u));
            if NORM == 1u { // add the squares, then multiply by g
                ss[t] += dot(xs[t][0], xs[t][0]) + dot(xs[t][1], xs[t][1]);
                xs[t][0] *= norm[2u * u];
                xs[t][1] *= norm[2u * u + 1u];
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            let n = min(n0 + r, p.N - 1u);
            var lo: vec4<f32>;
            var hi: vec4<f32>;
            if halves {
                let h = dense[n * units + u];
                lo = vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
                hi = vec4<f32>(unpack2x16float(h.z), unpack2x16float(h.w));
            } else {
                lo = bitcast<vec4<f32>>(dense[2u * (n * units + u)]);
                hi = bitcast<vec4<f32>>(dense[2u * (n * units + u) + 1u]);
            }
            for (var t = 0u; t < TT; t++) {
                acc[r * TT + t] += dot(lo, xs[t][0]) + dot(hi, xs[t][1]);
            }
        }
    }
    store(acc, ss, lid, n0, t0);
}
