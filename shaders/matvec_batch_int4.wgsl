// matvec_batch_int4.wgsl: out (+)= x · Wᵀ for an int4 weight W and 1–4
// activation rows a workgroup (TT ≤ 4: decode of a small batch, or of one
// sequence over rows of 2,048 inputs or more; more rows in blocks of TT,
// grid y: a small model's verification) — the sibling of matvec_int4.wgsl
// that stages its input a chunk at a time (2,048 values over the
// activation rows), leaving room for more workgroups an SM than
// matvec_int4.wgsl's whole rows (Qwen3-4B's and 8B's shapes), and that
// sums each weight's products in vec4s, one multiply-add a weight.
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0) + Σ_k x'[t][k] · W[n][k]
//   W[n][k] = (code(n, k) − 8) · scale(n, k / G)      (docs/reference.md, "The int4 scheme")
// where x' is x, or with SWIGLU = 1 silu(gate) · up from the (T, 2K) output
// of the stacked gate/up projection, or with NORM = 1 Qwen3's RMSNorm
// x[t][k] · g[k] / sqrt(mean_k x[t][k]² + eps) — the same three inputs as
// matmul_rowtile.wgsl, which handles every shape this kernel does not —,
// or with MERGE = 1 the attention output that attention_merge.wgsl would
// write from attention_decode.wgsl's splits (o_proj of one decode row, the
// merge dispatch saved): for head h = k / AD and d = k % AD,
//   x'[t][k] = Σ_s exp(m_s − M) · o_s[d]  /  Σ_s exp(m_s − M) · l_s,  M = max_s m_s
// over the p.msplits splits of (t, h). Each workgroup merges all of its
// input itself, which reads the splits' partials once a workgroup (from
// the L2 cache: they are small) where the merge dispatch read them once.
// Unlike attention_merge.wgsl it has no rows to mark a row whose context
// the splits do not cover: the caller's split count covers its rows.
//
// Buffers (as in matmul_rowtile.wgsl's int4 entry, with W read 16 bytes at a time):
//   x       (T, K) f32, read as vec4s; (T, 2K) gate | up with SWIGLU; with
//           MERGE attention_decode.wgsl's partials, (T, K / AD, msplits,
//           AD + 4) f32: o, m, l and two unused words a split
//   qweight (N, K/32) vec4<u32>: 32 codes, column k's in bits 4(k%8)… of
//           word (k%32)/8 of vec4 k/32
//   out     rows of ldo f32; this call writes columns [0, N) of rows [0, T)
//   norm    (K) f32 RMSNorm weight g (bound but unread when NORM = 0)
//   scales  (N, K/G) f16, read as u32 pairs
// The Go side uses it when K % 32 = 0 and G % 32 = 0, so that a vec4 of
// codes lies in one scale group.
//
// Split-K (as skinny_int4.wgsl): with splits > 1, workgroup z sums only
// inputs [z·kps, (z+1)·kps) (kps a multiple of 32·LANES) and writes its
// partial sums, unscaled, to out as (splits, T, N), followed with NORM by
// its slice's sums of squares as (splits, T) — matmul_reduce.wgsl (or
// qkv_rope_kv.wgsl) adds them up. It gives a projection of few rows (Qwen3-
// 8B's o_proj and down_proj: 256 workgroups) more workgroups, each with
// fewer chunks one after another — which on the H200 does not pay
// (kernels/plan.go), so a plan splits only where measured faster.
//
// Dispatch: (ceil(N / ROWS), ceil(T / TT), splits) workgroups of WG = ROWS
// / RT · LANES threads, grid y the block of TT activation rows. The loop is slice_sums (prelude.wgsl; qkv_fused_int4.wgsl
// runs it too). Per chunk of KC input columns, each thread first loads its
// weights of the chunk (KC / 32 / LANES vec4s of each of its RT rows: they
// do not depend on x', so their latency overlaps what follows), the
// workgroup stages x' for its TT rows in workgroup memory (computing
// SwiGLU or the norm's sum of squares once, not once per weight row;
// scaled by PLACE for codes_in_place), then the LANES threads of a row
// group share its RT neighbouring weight rows: lane l reads each row's
// vec4s l, l+LANES, … (neighbouring lanes, neighbouring 16-byte words:
// coalesced), turns each into 32 weights with the exponent trick, each code
// in place in its half word (codes_in_place: one AND-OR and a subtraction
// a code, no shift and no int→float conversion, a quarter-rate
// instruction), and multiplies them into vec4 sums — one multiply-add a
// weight, each staged read serving RT rows — which it adds up and scales
// once a vec4 of codes. Finally each (weight row, activation row) adds up
// its LANES partial sums.
//
// Sizes (LANES, ROWS, RT, KC: kernels/matvec_batch.go's layout, the plan's
// by shape). 16 lanes of 16-byte loads read a Qwen3-1.7B row of 2048
// inputs (1 KiB) in 4 independent loads per thread; KC·TT·4 bytes of
// staged input (8 KiB) leave room for several workgroups per SM; RT rows a
// thread take RT times the registers for weights and sums.

const LANES: u32 = 16u;             // threads per weight row
const ROWS: u32 = 16u;              // weight rows per workgroup
const RT: u32 = 1u;                 // weight rows a thread (neighbouring rows)
const WG: u32 = 256u;               // ROWS / RT · LANES
const TT: u32 = 1u;                 // activation rows the workgroup holds (TT ≤ 4; rows t0 … t0 + TT − 1)
const KC: u32 = 2048u;              // input columns staged per chunk, a multiple of 32·LANES
const SWIGLU: u32 = 0u;             // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;               // 1: the input is rmsnorm(x) · g
const MERGE: u32 = 0u;              // 1: x is attention_decode.wgsl's splits, and the input their merge
const AD: u32 = 128u;               // MERGE: the attention's head_dim, a multiple of 4
const MB: u32 = 16u;                // MERGE: splits loaded at once
const GROUPS: u32 = WG / LANES;     // row groups: LANES threads sharing RT weight rows
const KC32: u32 = KC / 32u;         // 32-column blocks a chunk
const XS: u32 = 8u * TT;            // staged vec4 places over the activation rows
const RTT: u32 = RT * TT;           // a thread's (weight row, activation row) sums
const SPT: u32 = (TT * KC / 4u + WG - 1u) / WG; // vec4s of x' a thread stages per chunk, at most
const WPT: u32 = KC32 / LANES;      // weight vec4s a thread reads per chunk and row (KC a multiple of 32·LANES)
const WR: u32 = WPT * RT;           // weight vec4s a thread holds
const PARTIAL: u32 = TT * ROWS * LANES; // one partial sum per (activation row, weight row, lane)
const SUMSQ: u32 = TT * GROUPS;     // NORM's sums of squares, LANES threads' each

@group(0) @binding(0) var<uniform> p: SplitParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;

// x'[t][c0 + 32v + 4m + e] at xs[8t + m][v][e]: a vec4 by its place m in
// its 32 columns, then its block v. The LANES lanes of a row group read the
// same m of neighbouring v — neighbouring vec4s, no bank conflicts — and,
// nested, each read is indexed by v and constants of the unrolled loops:
// naga clamps each dynamic index into a workgroup array (min(i, len − 1)),
// here once a block (v), and the constants fold into the reads' offsets.
var<workgroup> xs: array<array<vec4<f32>, KC32>, XS>;
var<workgroup> partial: array<f32, PARTIAL>;
var<workgroup> sumsq: array<f32, SUMSQ>;
var<workgroup> ssq: array<f32, TT>;       // NORM: each activation row's sum of squares over the slice

// input_norm4 is vec4 i of the RMSNorm weight g (NORM; slice_sums).
fn input_norm4(i: u32) -> vec4<f32> {
    return norm[i];
}


// staged4 is vec4 j of activation row `row` of x' before the norm
// (slice_sums): input4's, or with MERGE the attention output's, merged as
// attention_merge.wgsl merges — the loads of MB splits' o and (m, l) go out
// together, and blocks of MB fold into running sums rescaled to the
// largest m so far (online softmax). The splits of one head are loaded
// alike by the AD / 4 threads that stage it: m and l are broadcasts.
fn staged4(row: u32, j: u32) -> vec4<f32> {
    if MERGE == 0u {
        return input4(row, j);
    }
    let h = j / (AD / 4u);
    let first = (row * (p.K / AD) + h) * p.msplits * (AD / 4u + 1u); // split 0 of (row, h), in vec4s
    let o = j % (AD / 4u);
    var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
    let neg_inf = bitcast<f32>(neg_inf_bits);
    var M = neg_inf;
    var den = 0.0;
    var num = vec4<f32>();
    for (var s0 = 0u; s0 < p.msplits; s0 += MB) {
        // Loads past the last split repeat it; they weigh nothing below.
        var ml: array<vec2<f32>, MB>;
        var v: array<vec4<f32>, MB>;
        for (var i = 0u; i < MB; i++) {
            let at = first + min(s0 + i, p.msplits - 1u) * (AD / 4u + 1u);
            v[i] = x[at + o];
            ml[i] = x[at + AD / 4u].xy;
        }
        var top = M;
        for (var i = 0u; i < MB; i++) {
            if s0 + i < p.msplits {
                top = max(top, ml[i].x);
            }
        }
        // As attention_merge.wgsl: against 0 while every split is hidden.
        let base = select(top, 0.0, top == neg_inf);
        let keep = exp(M - base);
        den *= keep;
        num *= keep;
        for (var i = 0u; i < MB; i++) {
            if s0 + i < p.msplits {
                let w = exp(ml[i].x - base);
                den += w * ml[i].y;
                num += w * v[i];
            }
        }
        M = top;
    }
    return num / den;
}

// finish writes out[t][nn] from the sum v over all of K and row t's sum of
// squares (NORM).
fn finish(t: u32, nn: u32, sum: f32, sumsq_t: f32) {
    var v = sum;
    if NORM == 1u {
        v *= 1.0 / sqrt(sumsq_t / f32(p.K) + p.eps);
    }
    let o = t * p.ldo + nn;
    if p.accumulate != 0u {
        v += out[o];
    }
    out[o] = v;
}

// main writes out, or with splits > 1 the partial sums for
// matmul_reduce.wgsl (or qkv_rope_kv.wgsl).
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t0 = wid.y * TT; // the workgroup's first activation row
    slice_sums(wid, lid, t0);
    if p.splits > 1u && NORM == 1u && wid.x == 0u && lid < TT && t0 + lid < p.T {
        out[p.splits * p.T * p.N + wid.z * p.T + t0 + lid] = ssq[lid];
    }
    for (var i = lid; i < TT * ROWS; i += WG) {
        let t = i / ROWS; // t0 + t is the activation row
        let rr = i % ROWS;
        let nn = wid.x * ROWS + rr;
        if t0 + t < p.T && nn < p.N {
            let v = row_sum(t, rr, i);
            if p.splits > 1u {
                out[(wid.z * p.T + t0 + t) * p.N + nn] = v;
            } else {
                finish(t0 + t, nn, v, ssq[t]);
            }
        }
    }
}
