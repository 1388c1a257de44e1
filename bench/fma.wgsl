// fma.wgsl: the arithmetic yardstick beside copy.wgsl — each thread runs
// p.iters rounds of dependent-free f32 multiply-adds on eight vec4
// accumulators in registers (32 independent chains, 8·4·2 = 64 flops a
// round) and stores one word, so that the time is the device's f32
// multiply-add rate, the limit a prefill's matmuls are compared with.
//
//   out[i] = Σ over the accumulators after p.iters rounds of a ← a·m + c
//
// Buffers:
//   out (threads) f32: one word a thread (kept so no round is optimized away)
//
// Dispatch: (groups, 1, 1) workgroups of WG = 256 threads. The round count
// is a uniform, not a constant: with a constant count the H200's compiler
// may unroll all 1,024 rounds into ~8k instructions, which no instruction
// cache holds, and the yardstick would read below the GEMM it is meant to
// bound.

const WG: u32 = 256u;

struct Params {
    m: f32,     // multiplier, just below 1 so values stay finite
    c: f32,
    iters: u32, // rounds
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let seed = f32(gid.x & 255u) * 0.001;
    var a0 = vec4<f32>(seed, seed + 0.1, seed + 0.2, seed + 0.3);
    var a1 = a0 + 1.0;
    var a2 = a0 + 2.0;
    var a3 = a0 + 3.0;
    var a4 = a0 + 4.0;
    var a5 = a0 + 5.0;
    var a6 = a0 + 6.0;
    var a7 = a0 + 7.0;
    let m = vec4<f32>(p.m);
    let c = vec4<f32>(p.c);
    for (var i = 0u; i < p.iters; i++) {
        a0 = a0 * m + c;
        a1 = a1 * m + c;
        a2 = a2 * m + c;
        a3 = a3 * m + c;
        a4 = a4 * m + c;
        a5 = a5 * m + c;
        a6 = a6 * m + c;
        a7 = a7 * m + c;
    }
    let s = (a0 + a1) + (a2 + a3) + (a4 + a5) + (a6 + a7);
    out[gid.x] = s.x + s.y + s.z + s.w;
}
