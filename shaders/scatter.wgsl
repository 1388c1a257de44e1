// scatter.wgsl: out[t][cols[j]] = in[t][j] for t < T rows of N values — the
// logits of a head over part of the vocabulary (its rows score the tokens
// cols) placed at their tokens in vocabulary-wide rows of V. The other
// entries of out are left alone (the engine keeps them at −∞).
//
// Buffers:
//   in   (T, N) f32
//   cols (N) u32, each < V, none twice
//   out  (T, V) f32
//
// Dispatch: (ceil(N / WG), T, 1) workgroups of WG threads, a thread per
// value. WG = 256: a streaming copy.

const WG: u32 = 256u;

struct Params {
    N: u32,
    V: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> cols: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let t = gid.y;
    if j < p.N {
        out[t * p.V + cols[j]] = src[t * p.N + j];
    }
}
