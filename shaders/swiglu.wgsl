// swiglu.wgsl: the Qwen3 MLP's gating, out[t][i] = silu(gate[t][i]) · up[t][i]
// with silu(g) = g / (1 + exp(−g)), for t < T, i < I.
//
// gate and up are rows with a stride ld and up starting up_off values into
// its buffer, so that one kernel serves separate gate/up buffers (ld = I,
// up_off = 0) and one fused (T, 2I) gate_up buffer bound twice (ld = 2I,
// up_off = I).
//
// Buffers:
//   gate (T, ld) f32
//   up   (T, ld) f32 from up_off
//   out  (T, I) f32
//
// Dispatch: (ceil(I / WG), T, 1) workgroups of WG threads, a thread per
// value. WG = 64: elementwise.

const WG: u32 = 64u;

struct Params {
    T: u32,
    I: u32,
    ld: u32,
    up_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if i >= p.I {
        return;
    }
    let g = gate[t * p.ld + i];
    out[t * p.I + i] = g / (1.0 + exp(-g)) * up[p.up_off + t * p.ld + i];
}
