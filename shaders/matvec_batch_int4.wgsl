// matvec_batch_int4.wgsl: out (+)= x · Wᵀ for an int4 weight W and 1–4
// activation rows (T ≤ TT ≤ 4: decode of a small batch, or of one sequence
// over rows of more than 2,048 inputs) — the sibling of matvec_int4.wgsl
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
// matmul_rowtile.wgsl, which handles every shape this kernel does not.
//
// Buffers (as in matmul_rowtile.wgsl's int4 entry, with W read 16 bytes at a time):
//   x       (T, K) f32, read as vec4s; (T, 2K) gate | up with SWIGLU
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
// Dispatch: (ceil(N / ROWS), 1, splits) workgroups of WG = ROWS / RT ·
// LANES threads. Per chunk of KC input columns, each thread first loads its
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
const TT: u32 = 1u;                 // activation rows the workgroup holds (T ≤ TT ≤ 4)
const KC: u32 = 2048u;              // input columns staged per chunk, a multiple of 32·LANES
const SWIGLU: u32 = 0u;             // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;               // 1: the input is rmsnorm(x) · g
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


// slice_sums sums workgroup wid's weight rows over its slice of K: after
// it, partial[(t·ROWS + rr)·LANES + lane] holds the sum of lane `lane` of
// the workgroup's weight row rr for activation row t and, with NORM, ssq[t]
// the slice's sum of squares of row t (both published by a barrier). All
// threads call it.
fn slice_sums(wid: vec3<u32>, lid: u32) {
    let lane = lid % LANES;
    let g = lid / LANES;                 // this thread's row group: weight rows g·RT … g·RT + RT − 1 of the workgroup's
    let kbeg = wid.z * p.kps;            // this workgroup's slice of K
    let kend = min(p.K, kbeg + p.kps);
    let row_vec4s = p.K / 32u;
    let groups = p.K / p.G;
    let vec4s_per_group = p.G / 32u;

    // MAGIC, from the params, passed through workgroup memory (partial's
    // first word, unused until the end) so that the driver keeps it in a
    // register: then each code's mask and OR can be one three-input LOP3
    // (an immediate mask and two registers), where with MAGIC in the
    // constant bank they took two.
    if lid == 0u {
        partial[0] = bitcast<f32>(p.magic);
    }
    var acc = array<f32, RTT>();  // acc[r·TT + t]: weight row g·RT + r, activation row t
    var ss = vec4<f32>(); // NORM: row t's sum of squares of what this thread staged, in ss[t]
    var wq: array<vec4<u32>, WR>; // this thread's weights of a chunk: [j·RT + r]
    var wscale: array<f32, WR>;   // and their scales
    for (var c0 = kbeg; c0 < kend; c0 += KC) {
        let kc4 = min(KC, kend - c0) / 4u; // vec4s of x' per row in this chunk
        // This thread's weights of the chunk, loaded first: they do not
        // depend on x', so their latency hides behind its staging. Rows
        // past N repeat row N − 1 (never written).
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                let gv = c0 / 32u + v; // the vec4's index within the row
                for (var r = 0u; r < RT; r++) {
                    let n = min(wid.x * ROWS + g * RT + r, p.N - 1u);
                    wq[j * RT + r] = qweight[n * row_vec4s + gv];
                    wscale[j * RT + r] = scale(n * groups + gv / vec4s_per_group);
                }
            }
        }
        // Stage x'[t][c0 … c0+kc) for t < TT; rows past T repeat row T-1.
        // One loop of a fixed count over the (t, q) slots, so that the
        // driver unrolls it and issues all of a thread's loads at once (a
        // loop over t around one over q to kc4 waits for each load in
        // turn).
        for (var i = 0u; i < SPT; i++) {
            let e = lid + i * WG;
            let t = e / (KC / 4u);
            let q = e % (KC / 4u); // the chunk's vec4 q = 8v + m
            if t < TT && q < kc4 {
                var v = input4(min(t, p.T - 1u), c0 / 4u + q);
                if NORM == 1u {
                    // By select: ss indexed by t, a lane's value, would go
                    // to local memory.
                    ss += select(vec4<f32>(), vec4<f32>(dot(v, v)), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(t));
                    v *= norm[c0 / 4u + q];
                }
                xs[8u * t + q % 8u][q / 8u] = v * PLACE;
            }
        }
        workgroupBarrier();
        let magic = bitcast<u32>(partial[0]);
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                // Each (weight row, activation row)'s products of the 32
                // columns in a vec4, one multiply-add a weight, added up
                // and scaled once after.
                var dots = array<vec4<f32>, RTT>();
                for (var m = 0u; m < 8u; m++) { // columns 32v + 4m … 32v + 4m + 3
                    var xv: array<vec4<f32>, TT>;
                    for (var t = 0u; t < TT; t++) {
                        xv[t] = xs[8u * t + m][v];
                    }
                    for (var r = 0u; r < RT; r++) {
                        let w = codes_in_place(wq[j * RT + r][m >> 1u] >> ((m & 1u) * 16u), magic);
                        for (var t = 0u; t < TT; t++) {
                            dots[r * TT + t] = fma(w, xv[t], dots[r * TT + t]);
                        }
                    }
                }
                for (var r = 0u; r < RT; r++) {
                    for (var t = 0u; t < TT; t++) {
                        let d = dots[r * TT + t];
                        acc[r * TT + t] += wscale[j * RT + r] * ((d.x + d.y) + (d.z + d.w));
                    }
                }
            }
        }
        workgroupBarrier();
    }

    if NORM == 1u {
        // The threads' sums of squares: GROUPS threads add LANES each, then
        // one thread adds those (two barriers, not a tree's eight).
        for (var t = 0u; t < TT; t++) {
            partial[t * WG + lid] = ss[t];
        }
        workgroupBarrier();
        if lid < TT * GROUPS {
            var v = 0.0;
            for (var l = 0u; l < LANES; l++) {
                v += partial[(lid / GROUPS) * WG + (lid % GROUPS) * LANES + l];
            }
            sumsq[lid] = v;
        }
        workgroupBarrier();
        if lid < TT {
            var v = 0.0;
            for (var i = 0u; i < GROUPS; i++) {
                v += sumsq[lid * GROUPS + i];
            }
            ssq[lid] = v;
        }
        workgroupBarrier();
    }

    for (var r = 0u; r < RT; r++) {
        for (var t = 0u; t < TT; t++) {
            partial[(t * ROWS + g * RT + r) * LANES + lane] = acc[r * TT + t];
        }
    }
    workgroupBarrier();
}

// row_sum adds up the LANES partial sums of activation row t and weight
// row rr of the workgroup (after slice_sums).
fn row_sum(t: u32, rr: u32, lid: u32) -> f32 {
    var v = 0.0;
    for (var l = 0u; l < LANES; l++) {
        v += partial[(t * ROWS + rr) * LANES + ((l + lid) % LANES)];
    }
    return v;
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
    slice_sums(wid, lid);
    if p.splits > 1u && NORM == 1u && wid.x == 0u && lid < min(TT, p.T) {
        out[p.splits * p.T * p.N + wid.z * p.T + lid] = ssq[lid];
    }
    for (var i = lid; i < TT * ROWS; i += WG) {
        let t = i / ROWS;
        let rr = i % ROWS;
        let nn = wid.x * ROWS + rr;
        if t < p.T && nn < p.N {
            let v = row_sum(t, rr, i);
            if p.splits > 1u {
                out[(wid.z * p.T + t) * p.N + nn] = v;
            } else {
                finish(t, nn, v, ssq[t]);
            }
        }
    }
}
