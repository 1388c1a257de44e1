// skinny_int4.wgsl: out (+)= x · Wᵀ for an int4 weight W and a few to some
// tens of activation rows (the decode of a batch of sequences) — the
// "skinny" GEMM, compute-bound but with too few rows for gemm_int4.wgsl's
// tiles to pay for their workgroup-memory traffic. Here each thread keeps
// its own weight rows in registers, dequantizes each weight once, and uses
// it for TT activation rows that every thread of the workgroup reads at the
// same address of workgroup memory (a broadcast: no bank conflicts, one
// transaction a warp), so a multiply-add costs 1/(RT·4) of a load.
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x'[t][k] · W[n][k]
//   W[n][k] = (code(n, k) − 8) · scale(n, k / G)      (docs/reference.md, "The int4 scheme")
// where x' is x, or with swiglu ≠ 0 silu(gate) · up from the (T, 2K) output
// of the stacked gate/up projection, or with norm ≠ 0 Qwen3's RMSNorm
// x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps) — the inputs of
// matmul_rowtile.wgsl.
//
// Split-K (as gemm_int4.wgsl): with splits > 1, workgroup z sums only inputs
// [z·kps, (z+1)·kps) and writes its partial sums, unscaled, to out as
// (splits, T, N), followed by the norm's partial sums of squares as (splits, T)
// (written by the workgroups of the first column tile); matmul_reduce.wgsl
// adds them up (or, for the q|k|v projection, qkv_rope_kv.wgsl as it loads
// them).
//
// Buffers:
//   x       (T, K) f32, read as vec4s; (T, 2K) gate | up with swiglu
//   qweight (N, K/32) vec4<u32>: 32 codes, column k's in bits 4(k%8)… of
//           word (k%32)/8 of vec4 k/32
//   out     rows of ldo f32 (splits = 1), or the split-K partials
//   norm    (K) f32 RMSNorm weight g (bound but unread when norm = 0)
//   scales  (N, K/G) f16, read as u32 pairs
// The Go side uses it when K % 32 = 0 and G % 32 = 0 (a vec4 of codes lies
// in one scale group).
//
// Dispatch: (ceil(N / ROWS), ceil(T / TT), splits) workgroups of WG
// threads, ROWS = WG · RT. Thread lid owns weight rows n0 + lid + r·WG,
// r < RT (neighbouring lanes, neighbouring rows: their stores coalesce), and
// activation rows t0 … t0 + TT − 1. Per chunk of KC inputs:
//   1. each thread loads its rows' first vec4 of codes (32 inputs) and
//      their scales into registers — they do not depend on x', so their
//      latency hides behind step 2;
//   2. the workgroup stages x' (SwiGLU, and the norm's weight and sums of
//      squares, computed here) transposed, as xs[k][t] in vec4s over t
//      (the last vec4 partly unused when TT is not a multiple of 4);
//      thread lid stages row t0 + lid % TT throughout (WG is a multiple of
//      TT), so a warp's stores of one k fall in consecutive banks;
//   3. 32 inputs at a time, the next 32's codes loading meanwhile, each
//      thread turns its codes into floats once — the exponent trick,
//      bitcast(0x4B000000 | code) − (2²³ + 8) is code − 8 exactly, each
//      code in place in its half word, as (code − 8)·16^e against x'
//      staged times 16^−e (codes_in_place) — and multiplies each into the
//      TV vec4s of x'[k] it reads from xs — in the last of them only its
//      TT % 4 rows, so that a tile of exactly a verification's k + 1 rows
//      spends no multiply-adds on padding.
// Registers are indexed only by loops over RT and TV, short enough for the
// compiler to unroll (an array indexed by a rolled loop lives in local
// memory, several times slower).
// Rows past T are staged as zeros and never written; rows past N repeat
// row N − 1 and are never written.
//
// Sizes (set by the Go side, kernels/skinny.go): TT, RT, WG by the
// rows of the batch; KC so that KC·TV vec4s fit the workgroup memory.
// Registers: RT·TV vec4 accumulators (twice that with GS) plus 2·RT vec4s
// of codes a thread. GS (group scale) multiplies each weight row's sums by
// its scale once per 32 inputs rather than each weight by it: one multiply
// a weight fewer, RT·TV vec4 multiply-adds a 32 inputs more — a trade for
// small tiles, where the multiply is a large share of a weight's work.
// The input (plain, SwiGLU, normalized) and accumulate are params, not
// constants: one pipeline serves every projection of a layout, since on the
// H200 a dependent dispatch of another pipeline's long unrolled code costs
// more than the flags' branches (kernels.inputInParams).

const TT: u32 = 32u;       // activation rows a workgroup, dividing WG
const RT: u32 = 2u;        // weight rows a thread
const WG: u32 = 64u;       // threads a workgroup
const KC: u32 = 128u;      // inputs staged a chunk, a multiple of 32
const GS: u32 = 0u;        // 1: products summed unscaled over each 32 inputs, then scaled once (group scale)
const ROWS: u32 = WG * RT; // weight rows a workgroup
const TV: u32 = (TT + 3u) / 4u; // vec4s of activation rows
const TAIL: u32 = TT % 4u; // activation rows in the last vec4 when it is partial (else 0)
const ACC: u32 = RT * TV;  // accumulator vec4s a thread holds
const KC8: u32 = KC / 8u;  // octets of inputs staged a chunk
const SPT: u32 = (TT * KC / 4u + WG - 1u) / WG; // x' vec4s a thread stages a chunk, at most
const TV_FULL: u32 = TT / 4u; // the vec4s of activation rows with four rows each

@group(0) @binding(0) var<uniform> p: SplitParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;

// x'[t0 + 4v + e][c0 + k] at xs[k / 8][k % 8][v][e]. Nested, so that the
// multiply loop's reads index it by one octet index a word and constants:
// naga clamps every dynamic index into a workgroup array (min(i, len − 1)),
// and a flat index k·TV + v cost each 16-byte read an add-min and a shift
// the driver could not fold into the load's offset (read from the H200's
// SASS, lab/nvsass).
var<workgroup> xs: array<array<array<vec4<f32>, TV>, 8>, KC8>;
var<workgroup> sq: array<f32, WG>;       // norm: each thread's sum of squares
var<workgroup> inv_rms: array<f32, TT>;  // norm, splits = 1: each activation row's 1 / rms


// component returns word c of v — by selects, so that a loop over c that
// the compiler keeps rolled indexes no register array.
fn component(v: vec4<u32>, c: u32) -> u32 {
    return select(select(v.x, v.y, c == 1u), select(v.z, v.w, c == 3u), c >= 2u);
}

// madd8 returns a + Σ_i w_i · x_i for the eight weights lo, hi of one
// weight row and the eight inputs' vec4s of four activation rows.
fn madd8(a: vec4<f32>, lo: vec4<f32>, hi: vec4<f32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
    x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> vec4<f32> {
    var s = a;
    s += lo.x * x0;
    s += lo.y * x1;
    s += lo.z * x2;
    s += lo.w * x3;
    s += hi.x * x4;
    s += hi.y * x5;
    s += hi.z * x6;
    s += hi.w * x7;
    return s;
}

// madd8_tail is madd8 for the last vec4 of activation rows when it holds
// only TAIL rows: the multiply-adds of its other components are left out
// (they stay 0), which with TAIL a constant the compiler sees.
fn madd8_tail(a: vec4<f32>, lo: vec4<f32>, hi: vec4<f32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
    x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> vec4<f32> {
    if TAIL == 1u {
        var s = a.x;
        s += lo.x * x0.x;
        s += lo.y * x1.x;
        s += lo.z * x2.x;
        s += lo.w * x3.x;
        s += hi.x * x4.x;
        s += hi.y * x5.x;
        s += hi.z * x6.x;
        s += hi.w * x7.x;
        return vec4<f32>(s, 0.0, 0.0, 0.0);
    }
    if TAIL == 2u {
        var s = a.xy;
        s += lo.x * x0.xy;
        s += lo.y * x1.xy;
        s += lo.z * x2.xy;
        s += lo.w * x3.xy;
        s += hi.x * x4.xy;
        s += hi.y * x5.xy;
        s += hi.z * x6.xy;
        s += hi.w * x7.xy;
        return vec4<f32>(s, 0.0, 0.0);
    }
    var s = a.xyz;
    s += lo.x * x0.xyz;
    s += lo.y * x1.xyz;
    s += lo.z * x2.xyz;
    s += lo.w * x3.xyz;
    s += hi.x * x4.xyz;
    s += hi.y * x5.xyz;
    s += hi.z * x6.xyz;
    s += hi.w * x7.xyz;
    return vec4<f32>(s, 0.0);
}

// load_codes loads the code vec4 gv (inputs 32gv … 32gv + 31) of this
// thread's RT weight rows n0 + r·WG, and its scale; rows past N repeat row
// N − 1 (never written).
fn load_codes(q: ptr<function, array<vec4<u32>, RT>>, s: ptr<function, array<f32, RT>>, n0: u32, gv: u32) {
    for (var r = 0u; r < RT; r++) {
        let n = min(n0 + r * WG, p.N - 1u);
        (*q)[r] = qweight[n * (p.K / 32u) + gv];
        (*s)[r] = scale(n * (p.K / p.G) + gv / (p.G / 32u));
    }
}

// row_sumsq returns the sum of squares activation row t (< TT) of the
// workgroup staged, from the WG/TT threads that staged it.
fn row_sumsq(t: u32) -> f32 {
    var s = 0.0;
    for (var i = t; i < WG; i += TT) {
        s += sq[i];
    }
    return s;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * ROWS + lid; // this thread's weight rows: n0 + r·WG
    let t0 = wid.y * TT;
    let kbeg = wid.z * p.kps;
    let kend = min(p.K, kbeg + p.kps);
    let st = lid % TT;                  // the activation row this thread stages
    let staged = t0 + st < p.T;
    let srow = min(t0 + st, p.T - 1u);

    // MAGIC, from the params, passed through workgroup memory (sq's first
    // word, unused until the end) so that the driver holds it in a
    // register: each code's AND-OR is then one LOP3 (codes_in_place).
    if lid == 0u {
        sq[0] = bitcast<f32>(p.magic);
    }
    var acc = array<vec4<f32>, ACC>(); // acc[r·TV + v][e]: weight row n0 + r·WG, activation row t0 + 4v + e
    var ss = 0.0;                          // norm: the sum of squares of what this thread staged
    for (var c0 = kbeg; c0 < kend; c0 += KC) {
        let words = min(KC, kend - c0) / 32u; // code vec4s of a row in this chunk
        // 1. This thread's codes of the chunk's first 32 inputs.
        var cur: array<vec4<u32>, RT>;
        var cur_scale: array<f32, RT>;
        load_codes(&cur, &cur_scale, n0, c0 / 32u);
        // 2. Stage x'[t0 + st][c0 + 4q … +3] for the chunk's q.
        for (var i = 0u; i < SPT; i++) {
            let q = (lid + i * WG) / TT;
            if q < 8u * words {
                var v = vec4<f32>();
                if staged {
                    if p.swiglu != 0u {
                        let g = srow * (p.K / 2u) + c0 / 4u + q; // gate; up is K/4 vec4s further
                        v = swiglu(x[g], x[g + p.K / 4u]);
                    } else {
                        v = x[srow * (p.K / 4u) + c0 / 4u + q];
                    }
                    if p.norm != 0u {
                        ss += dot(v, v);
                        v *= norm[c0 / 4u + q];
                    }
                }
                v *= PLACE;
                for (var e = 0u; e < 4u; e++) {
                    let k = 4u * q + e;
                    xs[k / 8u][k % 8u][st / 4u][st % 4u] = v[e];
                }
            }
        }
        workgroupBarrier();
        let magic = bitcast<u32>(sq[0]);
        // 3. Multiply, 32 inputs at a time, the next 32's codes loading
        // meanwhile: each weight serves TT activation rows.
        for (var j = 0u; j < words; j++) {
            var next: array<vec4<u32>, RT>;
            var next_scale: array<f32, RT>;
            if j + 1u < words {
                load_codes(&next, &next_scale, n0, c0 / 32u + j + 1u);
            }
            // With GS, the 32 inputs' products unscaled, scaled once below.
            var part = array<vec4<f32>, ACC>();
            for (var c = 0u; c < 4u; c++) { // word c of the vec4: inputs k … k+7
                let k = 32u * j + 8u * c;
                var lo: array<vec4<f32>, RT>;
                var hi: array<vec4<f32>, RT>;
                for (var r = 0u; r < RT; r++) {
                    let w = component(cur[r], c);
                    lo[r] = codes_in_place(w, magic);
                    hi[r] = codes_in_place(w >> 16u, magic);
                    if GS == 0u {
                        lo[r] *= cur_scale[r];
                        hi[r] *= cur_scale[r];
                    }
                }
                let o = k / 8u; // the octet k … k+7
                for (var v = 0u; v < TV; v++) {
                    let x0 = xs[o][0][v];
                    let x1 = xs[o][1][v];
                    let x2 = xs[o][2][v];
                    let x3 = xs[o][3][v];
                    let x4 = xs[o][4][v];
                    let x5 = xs[o][5][v];
                    let x6 = xs[o][6][v];
                    let x7 = xs[o][7][v];
                    for (var r = 0u; r < RT; r++) {
                        var a = acc[r * TV + v];
                        if GS == 1u {
                            a = part[r * TV + v];
                        }
                        if v < TV_FULL {
                            a = madd8(a, lo[r], hi[r], x0, x1, x2, x3, x4, x5, x6, x7);
                        } else {
                            a = madd8_tail(a, lo[r], hi[r], x0, x1, x2, x3, x4, x5, x6, x7);
                        }
                        if GS == 1u {
                            part[r * TV + v] = a;
                        } else {
                            acc[r * TV + v] = a;
                        }
                    }
                }
            }
            if GS == 1u {
                for (var r = 0u; r < RT; r++) {
                    for (var v = 0u; v < TV; v++) {
                        acc[r * TV + v] += cur_scale[r] * part[r * TV + v];
                    }
                }
            }
            cur = next;
            cur_scale = next_scale;
        }
        workgroupBarrier();
    }

    if p.norm != 0u {
        sq[lid] = ss;
        workgroupBarrier();
    }
    if p.splits > 1u {
        // Partial sums (and sums of squares) for matmul_reduce.wgsl.
        let base = wid.z * p.T * p.N;
        for (var r = 0u; r < RT; r++) {
            let n = n0 + r * WG;
            for (var v = 0u; v < TV; v++) {
                for (var e = 0u; e < 4u; e++) {
                    let t = t0 + 4u * v + e;
                    if 4u * v + e < TT && t < p.T && n < p.N {
                        out[base + t * p.N + n] = acc[r * TV + v][e];
                    }
                }
            }
        }
        if p.norm != 0u && wid.x == 0u && lid < TT && t0 + lid < p.T {
            out[p.splits * p.T * p.N + wid.z * p.T + t0 + lid] = row_sumsq(lid);
        }
        return;
    }

    if p.norm != 0u {
        if lid < TT {
            inv_rms[lid] = 1.0 / sqrt(row_sumsq(lid) / f32(p.K) + p.eps);
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < RT; r++) {
        let n = n0 + r * WG;
        for (var v = 0u; v < TV; v++) {
            for (var e = 0u; e < 4u; e++) {
                let t = t0 + 4u * v + e;
                if 4u * v + e < TT && t < p.T && n < p.N {
                    let o = t * p.ldo + n;
                    var s = acc[r * TV + v][e];
                    if p.norm != 0u {
                        s *= inv_rms[4u * v + e];
                    }
                    if p.accumulate != 0u {
                        s += out[o];
                    }
                    out[o] = s;
                }
            }
        }
    }
}
