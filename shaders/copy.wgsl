// copy.wgsl: dst[i] = src[i] for i < n, in 16-byte words — the measure of a
// device's memory bandwidth that every kernel's speed is compared with.
//
// Buffers:
//   src (n) vec4<u32>
//   dst (n) vec4<u32>
//
// Dispatch: (min(G, 65535), ceil(G / 65535), 1) workgroups of WG threads,
// G = ceil(n / WG): a thread per word, the grid folded into two dimensions
// so a gigabyte fits the per-dimension limit. WG = 256: a streaming copy.

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: WordsParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * WG + gid.x;
    if i < p.n {
        dst[i] = src[i];
    }
}
