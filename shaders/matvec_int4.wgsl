// matvec_int4.wgsl: out (+)= x · Wᵀ for an int4 weight W and a few
// activation rows (T ≤ TT ≤ 4; package kernels picks it for one row of
// fewer than 2,048 inputs — the decode of one sequence, its logits head — and
// matvec_batch_int4.wgsl for longer rows and 2–4) — the memory-bound case,
// where the whole job is to stream W at full bandwidth and spend as few
// instructions as possible per weight.
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
// Dispatch: (ceil(N / ROWS), 1, 1) workgroups of WG threads; ROWS =
// WG / LANES · RT weight rows a workgroup. LANES threads (a "row group")
// share RT neighbouring weight rows: lane l reads vec4s l, l+LANES, … of
// each of them (neighbouring lanes, neighbouring 16-byte words: coalesced).
// Per chunk of KC input columns:
//   1. each thread loads its weights of the chunk (WPT vec4s of each of its
//      RT rows) into registers — they do not depend on x', so their latency
//      hides behind step 2;
//   2. the workgroup stages x' for its TT activation rows in workgroup
//      memory (SwiGLU, and the norm's weight and sum of squares, computed
//      once a workgroup, not once a weight row), scaled by PLACE for the
//      codes' places, swizzled so that the eight lanes of a quarter-warp
//      reading vec4s 128 bytes apart touch eight different bank quads;
//   3. each thread turns its codes into floats with the exponent trick,
//      each code left in place in its half word — bitcast(0x4B000000 |
//      code·16^e) − (2²³ + 8·16^e) is (code − 8)·16^e exactly, no shift and
//      no int→float conversion (a quarter-rate instruction; codes_in_place)
//      — and multiplies them with x'. Each staged vec4 read serves RT weight rows: the
//      workgroup-memory traffic is 8/RT times the weight bytes (at RT = 1
//      it would equal the L1's bandwidth at the H200's DRAM rate).
// Finally each (weight row, activation row) adds up its LANES partial sums
// (kept as vec4s over the activation rows, in the memory the staged x'
// used, followed with NORM by the threads' sums of squares, which the norm
// needs only now) and, with NORM, scales them by 1 / rms; the residual it
// adds into (accumulate) was read at the start, off the critical path.
//
// Sizes (set by the Go side, kernels/matvec.go): LANES, RT, WG per
// matrix shape; KC ≤ K so that TT·KC floats fit the workgroup memory and a
// thread's WPT·RT weight vec4s its registers.

const LANES: u32 = 16u;             // threads per row group (along K)
const RT: u32 = 4u;                 // weight rows a thread
const WG: u32 = 64u;                // threads per workgroup, a multiple of LANES
const TT: u32 = 1u;                 // activation rows the workgroup holds: 1, 2 or 4 (T ≤ TT)
const KC: u32 = 2048u;              // input columns staged per chunk, a multiple of 32·LANES
const SWIGLU: u32 = 0u;             // 1: x is gate | up, and the input silu(gate)·up
const NORM: u32 = 0u;               // 1: the input is rmsnorm(x) · g
const SHM: u32 = 512u;              // vec4s of workgroup memory: max(TT·KC/4, RT·WG + WG + WG16)
const ROWS: u32 = WG / LANES * RT;  // weight rows per workgroup
const WPT: u32 = KC / 32u / LANES;  // weight vec4s a thread reads per chunk and row
const WG16: u32 = WG / 16u;        // groups of 16 threads
const WR: u32 = WPT * RT;           // weight vec4s a thread holds
const SPT: u32 = (TT * KC / 4u + WG - 1u) / WG; // staged vec4s a thread per chunk, at most

@group(0) @binding(0) var<uniform> p: MatMulParams;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> qweight: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> norm: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> scales: array<u32>;

// Staged x' (TT rows of KC/4 vec4s), then the partial sums (ROWS·LANES =
// RT·WG vec4s over the activation rows) followed, with NORM, by each
// thread's sums of squares (WG vec4s over the activation rows) and those
// of WG/16 groups of 16 threads. One array: on the H200 NVIDIA's driver
// fits about 56 KB of workgroup memory an SM, so each KB a workgroup takes
// decides how many share an SM (8 KB: 6, 10 KB: 5; gate|up's 768
// workgroups fit one wave at 6).
var<workgroup> shm: array<vec4<f32>, SHM>;


// dots returns w · xv[t] for the activation rows t < TT (zero beyond).
fn dots(w: vec4<f32>, xv: array<vec4<f32>, 4>) -> vec4<f32> {
    var d = vec4<f32>(dot(w, xv[0]), 0.0, 0.0, 0.0);
    if TT > 1u {
        d.y = dot(w, xv[1]);
    }
    if TT > 2u {
        d.z = dot(w, xv[2]);
        d.w = dot(w, xv[3]);
    }
    return d;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let n0 = wid.x * ROWS + (lid / LANES) * RT; // this thread's first weight row
    let row_vec4s = p.K / 32u;
    let groups = p.K / p.G;
    let vec4s_per_group = p.G / 32u;

    // The residual this thread's output adds to, read now: nothing before
    // the end depends on it.
    let nout = wid.x * ROWS + lid; // with lid < ROWS: the row this thread writes
    var residual = vec4<f32>();
    if p.accumulate != 0u && lid < ROWS && nout < p.N {
        residual.x = out[nout];
        if TT > 1u && p.T > 1u {
            residual.y = out[p.ldo + nout];
        }
        if TT > 2u && p.T > 2u {
            residual.z = out[2u * p.ldo + nout];
        }
        if TT > 2u && p.T > 3u {
            residual.w = out[3u * p.ldo + nout];
        }
    }

    var acc = array<vec4<f32>, RT>(); // acc[r][t]: row n0 + r, activation row t
    var ss = vec4<f32>();          // NORM: sums of squares of the staged x, by activation row
    var wq: array<vec4<u32>, WR>; // this thread's weights of a chunk: [j·RT + r]
    var wscale: array<f32, WR>;   // and their scales
    for (var c0 = 0u; c0 < p.K; c0 += KC) {
        let kc4 = min(KC, p.K - c0) / 4u; // vec4s of x' per row in this chunk
        // 1. This thread's weights of the chunk; rows past N repeat row
        // N − 1 (never written).
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                let gv = c0 / 32u + v; // the vec4's index within the row
                for (var r = 0u; r < RT; r++) {
                    let n = min(n0 + r, p.N - 1u);
                    wq[j * RT + r] = qweight[n * row_vec4s + gv];
                    wscale[j * RT + r] = scale(n * groups + gv / vec4s_per_group);
                }
            }
        }
        // 2. Stage x'[t][c0 … c0+kc) for t < TT; rows past T repeat row T−1.
        for (var i = 0u; i < SPT; i++) {
            let e = lid + i * WG;   // (t, j): t = e / (KC/4), j = e % (KC/4)
            let t = e / (KC / 4u);
            let j = e % (KC / 4u);
            if t < TT && j < kc4 {
                var v = input4(min(t, p.T - 1u), c0 / 4u + j);
                if NORM == 1u {
                    let s = dot(v, v);
                    ss += select(vec4<f32>(), vec4<f32>(s), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(t));
                    v *= norm[c0 / 4u + j];
                }
                shm[t * (KC / 4u) + swizzle(j)] = v * PLACE;
            }
        }
        workgroupBarrier();
        // 3. Multiply: each staged vec4 serves RT weight rows.
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                var d = array<vec4<f32>, RT>(); // (initialized: naga zeroes uninitialized vars once, not per iteration)
                for (var m = 0u; m < 8u; m++) { // columns 32v + 4m … 32v + 4m + 3
                    var xv = array<vec4<f32>, 4>();
                    for (var t = 0u; t < TT; t++) {
                        xv[t] = shm[t * (KC / 4u) + swizzle_at(v, m)];
                    }
                    for (var r = 0u; r < RT; r++) {
                        d[r] += dots(codes_in_place(wq[j * RT + r][m >> 1u] >> ((m & 1u) * 16u), p.magic), xv);
                    }
                }
                for (var r = 0u; r < RT; r++) {
                    acc[r] += wscale[j * RT + r] * d[r];
                }
            }
        }
        workgroupBarrier();
    }

    // Each (weight row, activation row) adds its LANES partial sums; with
    // NORM the sums of squares follow them, added 16 at a time first.
    for (var r = 0u; r < RT; r++) {
        shm[((lid / LANES) * RT + r) * LANES + lane] = acc[r];
    }
    if NORM == 1u {
        shm[RT * WG + lid] = ss;
    }
    workgroupBarrier();
    if NORM == 1u {
        if lid < WG16 {
            var s = vec4<f32>();
            for (var i = 0u; i < 16u; i++) {
                s += shm[RT * WG + lid * 16u + i];
            }
            shm[RT * WG + WG + lid] = s;
        }
        workgroupBarrier();
    }
    if lid < ROWS && nout < p.N {
        var s = vec4<f32>();
        for (var l = 0u; l < LANES; l++) {
            s += shm[lid * LANES + (l + lid) % LANES];
        }
        if NORM == 1u {
            var sum = vec4<f32>();
            for (var i = 0u; i < WG16; i++) {
                sum += shm[RT * WG + WG + i];
            }
            s *= 1.0 / sqrt(sum / f32(p.K) + p.eps);
        }
        s += residual;
        out[nout] = s.x;
        if TT > 1u && p.T > 1u {
            out[p.ldo + nout] = s.y;
        }
        if TT > 2u && p.T > 2u {
            out[2u * p.ldo + nout] = s.z;
        }
        if TT > 2u && p.T > 3u {
            out[3u * p.ldo + nout] = s.w;
        }
    }
}
