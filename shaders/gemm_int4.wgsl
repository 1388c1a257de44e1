// gemm_int4.wgsl: out (+)= x · Wᵀ for an int4 weight W and many activation
// rows (prefill, and batched decode where the adapter's plan gives it
// those rows rather than to skinny_int4.wgsl) — the compute-bound case: each weight is
// dequantized once per workgroup into workgroup memory and used for BM
// activation rows, and each thread keeps a TM × TN tile of outputs in
// registers, so that one multiply-add costs well under one load.
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x'[t][k] · W[n][k]
//   W[n][k] = (code(n, k) − 8) · scale(n, k / G)      (docs/reference.md, "The int4 scheme")
// where x' is x, or with SWIGLU = 1 silu(gate) · up from the (T, 2K) output
// of the stacked gate/up projection, or with NORM = 1 Qwen3's RMSNorm
// x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps) — the inputs of
// matmul_rowtile.wgsl, which handles the shapes this kernel does not.
//
// Split-K: with splits > 1, workgroup z sums only inputs [z·kps, (z+1)·kps)
// and writes its partial sums, unscaled, to out as (splits, T, N), followed
// by NORM's partial sums of squares as (splits, T) (written by the
// workgroups of the first column tile); matmul_reduce.wgsl adds them up
// (or, for the q|k|v projection, qkv_rope_kv.wgsl as it loads them).
// That gives a matrix of few rows enough workgroups to fill the GPU.
//
// Buffers:
//   x       (T, K) f32, read as vec4s; (T, 2K) gate | up with SWIGLU
//   qweight (N, K/8) u32: column k's code is bits 4(k%8)…4(k%8)+3 of word k/8
//   out     rows of ldo f32 (splits = 1), or the split-K partials
//   norm    (K) f32 RMSNorm weight g (bound but unread when NORM = 0)
//   scales  (N, K/G) f16, read as u32 pairs
// The Go side uses it when K % 32 = 0 and G % 32 = 0 (a BK-column tile of
// a row lies in one scale group).
//
// Dispatch: (ceil(N / BN), ceil(T / BM), splits) workgroups of 256 threads
// as a 16 × 16 grid: thread (ty, tx) owns activation rows ty·TM … +TM and
// features 4tx … 4tx+3 (and, at TN = 8, 64 + 4tx … +3) of the workgroup's
// BM × BN tile, BM = 16·TM, BN = 16·TN. Per BK = 128 / TN inputs, the
// workgroup stages x' (BM × BK, transposed to [k][t] so a thread reads its
// rows as vectors) and W dequantized (BK × BN as [k][n]: code − 8 by the
// exponent trick, bitcast(0x4B000000 | code) − (2²³ + 8), with no
// int→float conversion) in workgroup memory — one u32 word of W (8 codes)
// a thread — then multiplies, with the next tile's global loads already
// issued into registers, so that their latency hides behind the multiply.
//
// Why these sizes: TM × TN = 2 × 4 fits 32 sequences of a batched decode in
// one tile, and 2 × 8 (32 × 128 tiles) takes half the loads a multiply-add;
// both serve devices whose workgroup memory does not take 4 × 4. 4 × 4
// (64-row tiles) gives prefill 16 outputs a thread, two 16-byte loads per
// 16 multiply-adds. (8 × 8, the classic register tile of an f32 GEMM,
// compiles too but spills on the H200: the Go side does not offer it.)
// Workgroup memory: BK·(BM + 4)·4 bytes of x'
// (4 of padding per k row spread the transposed stores over the banks) +
// BK·BN·4 of W + BM·BK + 4·BM for the norm's sums: 13.6 KiB at 2 × 4,
// 11.1 KiB at 2 × 8, 18.8 KiB at 4 × 4 and 8 × 8 (package kernels picks a size only where the
// device allows it; WebGPU's default is 16 KiB).
//
// SWIGLU and NORM stay constants here, unlike in skinny_int4.wgsl: as
// params they made a 64-sequence decode step slower on the H200 (the
// branches stay in the multiply loop).

const TM: u32 = 2u;                  // activation rows per thread: 2, 4 or 8 (TM ≤ TN)
const TN: u32 = 4u;                  // features per thread: 4 or 8
const BM: u32 = 16u * TM;            // activation rows per workgroup
const BN: u32 = 16u * TN;            // features per workgroup
const BK: u32 = 128u / TN;           // inputs per stage: BN·BK/8 = 256 words of W, one a thread
const KQ: u32 = BK / 4u;             // vec4s of a staged row of x'
const SX: u32 = BM + 4u;             // the staged x' row stride, floats
const SX4: u32 = SX / 4u;            // … in vec4s
const BN4: u32 = BN / 4u;            // vec4s of a staged row of W
const XVEC4S: u32 = BM * KQ;         // vec4s of x' a stage
const XLOADS: u32 = (XVEC4S + 255u) / 256u; // … each thread stages (at 2 × 8 half the threads one)
const SWIGLU: u32 = 0u;              // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;                // 1: the input is rmsnorm(x) · g
const SQ: u32 = BM * KQ;             // NORM: per row, KQ threads' sums of squares

@group(0) @binding(0) var<uniform> p: SplitParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;

// Staged tiles, indexed [k][…] rather than by a flat k·stride + i: naga
// clamps every dynamic index into a workgroup array (min(i, len − 1)). With
// k outermost the clamp of the thread's part is hoisted out of the
// multiply loop and one clamp of k serves a step's reads; flat, each read
// cost an add-min and a shift (seen in skinny_int4.wgsl's SASS on the
// H200, lab/nvsass).
var<workgroup> xs: array<array<vec4<f32>, SX4>, BK>; // x'[t0 + t][k0 + k] at xs[k][t / 4][t % 4]
var<workgroup> ws: array<array<vec4<f32>, BN4>, BK>; // W[n0 + n][k0 + k] at ws[k][n / 4][n % 4]
var<workgroup> sq: array<f32, SQ>;
var<workgroup> inv_rms: array<f32, BM>;


// The next tile's global loads, held in registers (private variables):
// prefetch issues them before the multiply of the current tile so that
// their latency hides behind it. xa is x (or gate), xb up (SWIGLU), xg the
// norm weight (NORM), for each staging slot of the thread; q and s its W
// word and scale.
var<private> xa: array<vec4<f32>, XLOADS>;
var<private> xb: array<vec4<f32>, XLOADS>;
var<private> xg: array<vec4<f32>, XLOADS>;
var<private> q: u32;
var<private> s: f32;
var<private> ss: array<f32, XLOADS>; // NORM: the sums of squares of the thread's staging slots

// prefetch loads tile k0's inputs for thread lid of the workgroup whose
// tile starts at row t0 (rows past T repeat row T-1) and W row wrow.
fn prefetch(k0: u32, t0: u32, lid: u32, wrow: u32) {
    for (var i = 0u; i < XLOADS; i++) {
        let idx = min(lid + i * 256u, XVEC4S - 1u); // past the stage: a copy of its last slot, not stored
        let row = min(t0 + idx / KQ, p.T - 1u);
        let kq = idx % KQ;
        if SWIGLU == 1u {
            let g = row * (p.K / 2u) + k0 / 4u + kq; // gate; up is K/4 vec4s further
            xa[i] = x[g];
            xb[i] = x[g + p.K / 4u];
        } else {
            xa[i] = x[row * (p.K / 4u) + k0 / 4u + kq];
        }
        if NORM == 1u {
            xg[i] = norm[k0 / 4u + kq];
        }
    }
    let wj = lid / BN;
    q = qweight[wrow * (p.K / 8u) + k0 / 8u + wj];
    s = scale(wrow * (p.K / p.G) + k0 / p.G);
}

// rows_sumsq leaves in sq[t·KQ + j] the KQ staging threads' sums of squares
// of row t (NORM).
fn rows_sumsq(lid: u32) {
    for (var i = 0u; i < XLOADS; i++) {
        if lid + i * 256u < XVEC4S {
            sq[lid + i * 256u] = ss[i]; // slot lid + 256i: row (lid + 256i) / KQ
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tx = lid % 16u;
    let ty = lid / 16u;
    let n0 = wid.x * BN;
    let t0 = wid.y * BM;
    let kbeg = wid.z * p.kps;
    let kend = min(p.K, kbeg + p.kps);
    // The W word this thread stages: row wn, word wj of the tile's BK / 8.
    let wn = lid % BN;
    let wj = lid / BN;
    let wrow = min(n0 + wn, p.N - 1u); // rows past N repeat row N-1; not written

    // acc0[m]: row ty·TM + m, features 4tx … +3; acc1[m] the same at 64 + 4tx (TN = 8).
    var acc0: array<vec4<f32>, TM>;
    var acc1: array<vec4<f32>, TM>;
    for (var k0 = kbeg; k0 < kend; k0 += BK) {
        if k0 == kbeg { // the first tile: nothing to hide its loads behind
            prefetch(k0, t0, lid, wrow);
        }
        // x'[t0 + t][k0 + 4kq … +4] → xs, transposed.
        for (var i = 0u; i < XLOADS; i++) {
            let idx = lid + i * 256u;
            if idx >= XVEC4S {
                break;
            }
            let t = idx / KQ;
            let kq = idx % KQ;
            var v = xa[i];
            if SWIGLU == 1u {
                v = swiglu(xa[i], xb[i]);
            }
            if NORM == 1u {
                ss[i] += dot(v, v);
                v *= xg[i];
            }
            for (var e = 0u; e < 4u; e++) {
                xs[4u * kq + e][t / 4u][t % 4u] = v[e];
            }
        }
        // W[wrow][k0 + 8wj … +8], dequantized → ws.
        let lo = codes(q, 0u);
        let hi = codes(q, 16u);
        for (var e = 0u; e < 4u; e++) {
            ws[8u * wj + e][wn / 4u][wn % 4u] = lo[e] * s;
            ws[8u * wj + e + 4u][wn / 4u][wn % 4u] = hi[e] * s;
        }
        workgroupBarrier();
        let k1 = k0 + BK;
        if k1 < kend {
            prefetch(k1, t0, lid, wrow);
        }
        for (var k = 0u; k < BK; k++) {
            let b0 = ws[k][tx];
            var b1 = b0;
            if TN == 8u {
                b1 = ws[k][16u + tx];
            }
            // This thread's TM rows of x'[k]: half a vec4 at TM = 2 — picked
            // by select, not by a lane-dependent index into a vector (which
            // would go through local memory) —, one at 4, two at 8.
            let ai = ty * TM / 4u;
            var a0 = xs[k][ai];
            var a1 = a0;
            if TM == 2u {
                let h = select(a0.xy, a0.zw, (ty & 1u) == 1u);
                a0 = vec4<f32>(h, h);
            }
            if TM == 8u {
                a1 = xs[k][ai + 1u];
            }
            for (var m = 0u; m < TM; m++) {
                let a = select(a0[m & 3u], a1[m & 3u], m >= 4u);
                acc0[m] += a * b0;
                if TN == 8u {
                    acc1[m] += a * b1;
                }
            }
        }
        workgroupBarrier();
    }

    if p.splits > 1u {
        // Partial sums (and sums of squares) for matmul_reduce.wgsl.
        let base = wid.z * p.T * p.N;
        for (var m = 0u; m < TM; m++) {
            let t = t0 + ty * TM + m;
            for (var j = 0u; j < TN / 4u; j++) {
                let v = select(acc0[m], acc1[m], j == 1u);
                for (var e = 0u; e < 4u; e++) {
                    let n = n0 + 64u * j + 4u * tx + e;
                    if t < p.T && n < p.N {
                        out[base + t * p.N + n] = v[e];
                    }
                }
            }
        }
        if NORM == 1u && wid.x == 0u {
            rows_sumsq(lid);
            workgroupBarrier();
            if lid < BM && t0 + lid < p.T {
                var v = 0.0;
                for (var j = 0u; j < KQ; j++) {
                    v += sq[lid * KQ + j];
                }
                out[p.splits * p.T * p.N + wid.z * p.T + t0 + lid] = v;
            }
        }
        return;
    }

    if NORM == 1u {
        // inv_rms of each row from the KQ threads that staged it.
        rows_sumsq(lid);
        workgroupBarrier();
        if lid < BM {
            var v = 0.0;
            for (var j = 0u; j < KQ; j++) {
                v += sq[lid * KQ + j];
            }
            inv_rms[lid] = 1.0 / sqrt(v / f32(p.K) + p.eps);
        }
        workgroupBarrier();
    }
    for (var m = 0u; m < TM; m++) {
        let t = t0 + ty * TM + m;
        for (var j = 0u; j < TN / 4u; j++) {
            var v = select(acc0[m], acc1[m], j == 1u);
            if NORM == 1u {
                v *= inv_rms[ty * TM + m];
            }
            for (var e = 0u; e < 4u; e++) {
                let n = n0 + 64u * j + 4u * tx + e;
                if t < p.T && n < p.N {
                    let o = t * p.ldo + n;
                    var r = v[e];
                    if p.accumulate != 0u {
                        r += out[o];
                    }
                    out[o] = r;
                }
            }
        }
    }
}
