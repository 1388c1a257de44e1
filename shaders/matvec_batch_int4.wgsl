// matvec_batch_int4.wgsl: out (+)= x · Wᵀ for an int4 weight W and 1–4
// activation rows (T ≤ TT ≤ 4: decode of a small batch, or of one sequence
// over rows of more than 2,048 inputs) — the sibling of matvec_int4.wgsl
// for several rows: one weight row a thread rather than several, so that
// the TT activation rows' sums stay few registers. Each staged input read
// here serves one weight row (matvec_int4.wgsl's serve RT), which costs at
// one short row and not at two to four, where the H200's decode steps are
// faster with this kernel; nor at one row of more than 2,048 inputs, where
// staging 2,048 of them at a time leaves room for more workgroups an SM
// than matvec_int4.wgsl's whole rows (Qwen3-4B's and 8B's shapes).
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
// Dispatch: (ceil(N / ROWS), 1, splits) workgroups of WG = ROWS·LANES threads.
// Per chunk of KC input columns, the workgroup first stages x' for its TT
// rows in workgroup memory (computing SwiGLU or the norm's sum of squares
// once, not once per weight row; scaled by PLACE for codes_in_place), then
// LANES threads share each weight row: lane l reads the row's vec4s l,
// l+LANES, … (neighbouring lanes, neighbouring 16-byte words: coalesced),
// turns each into 32 weights with the exponent trick, each code in place
// in its half word (codes_in_place: one AND-OR and a subtraction a code, no
// shift and no int→float conversion, a quarter-rate instruction), and
// multiplies them with x' from workgroup memory, stored swizzled so that
// the eight lanes of a quarter-warp touch eight different bank quads.
// Finally each (row, activation row) adds up its LANES partial sums.
//
// Sizes (LANES, ROWS, KC: kernels/matvec_batch.go's layout). 16 lanes of
// 16-byte loads read a Qwen3-1.7B row of 2048 inputs (1 KiB) in 4
// independent loads per thread, and 16 rows a workgroup give 128…768
// workgroups for its projections (the H200 has 132 SMs); KC·TT·4 bytes of
// staged input (8 KiB) leave room for several workgroups per SM. A thread loads its weights of a chunk (KC / 32 /
// LANES vec4s) before staging x', so that their latency overlaps it.

const LANES: u32 = 16u;             // threads per weight row
const ROWS: u32 = 16u;              // weight rows per workgroup
const WG: u32 = 256u;               // ROWS · LANES
const TT: u32 = 1u;                 // activation rows the workgroup holds (T ≤ TT ≤ 4)
const KC: u32 = 2048u;              // input columns staged per chunk, a multiple of 32·LANES
const SWIGLU: u32 = 0u;             // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;               // 1: the input is rmsnorm(x) · g
const STAGED: u32 = TT * KC / 4u;   // vec4s of staged input
const SPT: u32 = (STAGED + WG - 1u) / WG; // … a thread stages per chunk, at most
const WPT: u32 = KC / 32u / LANES;  // weight vec4s a thread reads per chunk (KC a multiple of 32·LANES)
const PARTIAL: u32 = TT * WG;       // one partial sum per (activation row, thread)
const SUMSQ: u32 = TT * ROWS;       // NORM's sums of squares, LANES threads' each

@group(0) @binding(0) var<uniform> p: SplitParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;

var<workgroup> xs: array<vec4<f32>, STAGED>;
var<workgroup> partial: array<f32, PARTIAL>;
var<workgroup> sumsq: array<f32, SUMSQ>;
var<workgroup> ssq: array<f32, TT>;       // NORM: each activation row's sum of squares over the slice


// slice_sums sums workgroup wid's weight rows over its slice of K: after
// it, partial[(t·ROWS + r)·LANES + lane] holds thread (r, lane)'s sum for
// activation row t and, with NORM, ssq[t] the slice's sum of squares of
// row t (both published by a barrier). All threads call it.
fn slice_sums(wid: vec3<u32>, lid: u32) {
    let lane = lid % LANES;
    let kbeg = wid.z * p.kps;            // this workgroup's slice of K
    let kend = min(p.K, kbeg + p.kps);
    let r = lid / LANES;
    let n = min(wid.x * ROWS + r, p.N - 1u); // rows past N repeat row N-1; not written
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
    var acc = array<f32, TT>();
    var ss = vec4<f32>(); // NORM: row t's sum of squares of what this thread staged, in ss[t]
    var wq: array<vec4<u32>, WPT>; // this thread's weights of a chunk
    var wscale: array<f32, WPT>;   // and their scales
    for (var c0 = kbeg; c0 < kend; c0 += KC) {
        let kc4 = min(KC, kend - c0) / 4u; // vec4s of x' per row in this chunk
        // This thread's weights of the chunk, loaded first: they do not
        // depend on x', so their latency hides behind its staging.
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                let gv = c0 / 32u + v; // the vec4's index within the row
                wq[j] = qweight[n * row_vec4s + gv];
                wscale[j] = scale(n * groups + gv / vec4s_per_group);
            }
        }
        // Stage x'[t][c0 … c0+kc) for t < TT; rows past T repeat row T-1.
        // One loop of a fixed count over the (t, j) slots, so that the
        // driver unrolls it and issues all of a thread's loads at once (a
        // loop over t around one over j to kc4 waits for each load in
        // turn).
        for (var i = 0u; i < SPT; i++) {
            let e = lid + i * WG;
            let t = e / (KC / 4u);
            let j = e % (KC / 4u);
            if t < TT && j < kc4 {
                var v = input4(min(t, p.T - 1u), c0 / 4u + j);
                if NORM == 1u {
                    // By select: ss indexed by t, a lane's value, would go
                    // to local memory.
                    ss += select(vec4<f32>(), vec4<f32>(dot(v, v)), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(t));
                    v *= norm[c0 / 4u + j];
                }
                xs[t * (KC / 4u) + swizzle(j)] = v * PLACE;
            }
        }
        workgroupBarrier();
        let magic = bitcast<u32>(partial[0]);
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                var dots = array<f32, TT>();
                for (var m = 0u; m < 8u; m++) { // columns 32v + 4m … 32v + 4m + 3
                    let w = codes_in_place(wq[j][m >> 1u] >> ((m & 1u) * 16u), magic);
                    for (var t = 0u; t < TT; t++) {
                        dots[t] += dot(w, xs[t * (KC / 4u) + swizzle_at(v, m)]);
                    }
                }
                for (var t = 0u; t < TT; t++) {
                    acc[t] += wscale[j] * dots[t];
                }
            }
        }
        workgroupBarrier();
    }

    if NORM == 1u {
        // The threads' sums of squares: ROWS threads add LANES each, then
        // one thread adds those (two barriers, not a tree's eight).
        for (var t = 0u; t < TT; t++) {
            partial[t * WG + lid] = ss[t];
        }
        workgroupBarrier();
        if lid < TT * ROWS {
            var v = 0.0;
            for (var l = 0u; l < LANES; l++) {
                v += partial[(lid / ROWS) * WG + (lid % ROWS) * LANES + l];
            }
            sumsq[lid] = v;
        }
        workgroupBarrier();
        if lid < TT {
            var v = 0.0;
            for (var i = 0u; i < ROWS; i++) {
                v += sumsq[lid * ROWS + i];
            }
            ssq[lid] = v;
        }
        workgroupBarrier();
    }

    for (var t = 0u; t < TT; t++) {
        partial[(t * ROWS + r) * LANES + lane] = acc[t];
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
    if lid < TT * ROWS {
        let t = lid / ROWS;
        let rr = lid % ROWS;
        let nn = wid.x * ROWS + rr;
        if t < p.T && nn < p.N {
            let v = row_sum(t, rr, lid);
            if p.splits > 1u {
                out[(wid.z * p.T + t) * p.N + nn] = v;
            } else {
                finish(t, nn, v, ssq[t]);
            }
        }
    }
}
