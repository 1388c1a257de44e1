// gather.wgsl: dst[pairs[i].x] = src[pairs[i].y] for i < n — single u32
// words picked from one buffer and written at given words of another. A
// fused speculative step (package engine/webgpu) places the drafter's
// chained tokens, which never leave the device, at the target's input ids
// and at its read-out rows' proposals this way.
//
// Buffers:
//   pairs (n) vec2<u32>: (destination word, source word)
//   src   u32 words
//   dst   u32 words; only the words named in pairs are written
//
// Dispatch: (ceil(n / WG), 1, 1) workgroups of WG threads, a thread a pair.
// WG = 64: n is a few hundred words at most.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: WordsParams;
@group(0) @binding(1) var<storage, read> pairs: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if i < p.n {
        let pr = pairs[i];
        dst[pr.x] = src[pr.y];
    }
}
