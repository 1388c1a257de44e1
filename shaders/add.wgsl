// add.wgsl: residual add in place, x[i] += y[i] for i < n.
//
// (The matmul kernels can add into their output directly; this is for a
// residual that no matmul produces.)
//
// Buffers:
//   x (n) f32, updated in place
//   y (n) f32
//
// Dispatch: (ceil(n / WG), 1, 1) workgroups of WG threads, a thread per
// value (n < 65535·WG). WG = 256: elementwise.

const WG: u32 = 256u;

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x < p.n {
        x[gid.x] += y[gid.x];
    }
}
