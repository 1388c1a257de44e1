// fma.wgsl: the arithmetic yardsticks beside copy.wgsl — each thread runs
// p.iters rounds of dependent-free multiply-adds on eight vec4
// accumulators in registers (32 independent chains, 8·4·2 = 64 operations
// a round) and stores one word, so that the time is the device's
// multiply-add rate: in f32 (entry main), the limit a prefill's matmuls
// are compared with; in 32-bit integers (entry imad), what integer dot
// products of unpacked int4 codes would run at.
//
//   main: out[i] = Σ over the accumulators after p.iters rounds of a ← a·m + c (f32)
//   imad: out[i] = the same in u32 arithmetic (wrapping), m = p.iters | 1, c = bits of p.c
//
// Buffers:
//   out (threads) f32 (main) or u32 (imad): one word a thread (kept so no
//   round is optimized away)
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

@compute @workgroup_size(WG)
fn imad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let seed = gid.x & 255u;
    var a0 = vec4<u32>(seed, seed + 1u, seed + 2u, seed + 3u);
    var a1 = a0 + 10u;
    var a2 = a0 + 20u;
    var a3 = a0 + 30u;
    var a4 = a0 + 40u;
    var a5 = a0 + 50u;
    var a6 = a0 + 60u;
    var a7 = a0 + 70u;
    let m = vec4<u32>(p.iters | 1u); // uniform: the compiler cannot turn the products into shifts
    let c = vec4<u32>(bitcast<u32>(p.c));
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
    out[gid.x] = bitcast<f32>(s.x + s.y + s.z + s.w);
}
