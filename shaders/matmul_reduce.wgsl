// matmul_reduce.wgsl: the second half of a split-K matmul (gemm_int4.wgsl,
// skinny_int4.wgsl or matvec_batch_int4.wgsl with splits > 1): out (+)= Σ_s part[s], scaled by the RMSNorm factor when
// the input was normalized. (The q|k|v projection skips it:
// qkv_rope_kv.wgsl sums its partials the same way as it loads them.)
//
// For t < T, n < N:
//   out[t*ldo + n] = (accumulate ? out[t*ldo + n] : 0)
//                    + r[t] · Σ_{s < splits} part[(s*T + t)*N + n]
//   r[t] = NORM ? 1 / sqrt(Σ_s part[splits*T*N + s*T + t] / K + eps) : 1
//
// Buffers:
//   part  (splits, T, N) f32 partial sums, then (splits, T) sums of squares
//   out   rows of ldo f32
//
// Dispatch: (ceil(N / 256), T, 1) workgroups of 256 threads, a thread per
// output; neighbouring threads read neighbouring partial sums. A thread
// loads SB splits' sums before it adds any (in split order, as before):
// splits is a param, and a loop to it went one load at a time.

const SB: u32 = 8u; // splits a thread loads at once (specialized by the host)

struct Params {
    T: u32,
    N: u32,
    splits: u32,
    ldo: u32,
    accumulate: u32,
    norm: u32,       // 1: scale by the inverse RMS of the input row
    K: u32,          // NORM: the row length the sums of squares cover
    eps: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = wid.x * 256u + lid;
    let t = wid.y;
    if n >= p.N || t >= p.T {
        return;
    }
    var v = split_sum(t * p.N + n, p.T * p.N);
    if p.norm != 0u {
        v *= 1.0 / sqrt(split_sum(p.splits * p.T * p.N + t, p.T) / f32(p.K) + p.eps);
    }
    let o = t * p.ldo + n;
    if p.accumulate != 0u {
        v += out[o];
    }
    out[o] = v;
}
