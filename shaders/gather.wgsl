// gather.wgsl: rows picked from one buffer and written at given rows of
// another,
//   dst[pairs[i].x · W + w] = src[pairs[i].y · W + w]   for i < n, w < W
// rows of W u32 words (W = 1: single words). A fused speculative step
// (package engine/webgpu) places the drafter's chained tokens, which never
// leave the device, at the target's input ids and at its read-out rows'
// proposals this way (W = 1); a target that keeps features writes each
// row's hidden state to its cache slot's feature row, and an EAGLE-3 head
// gathers its rows' features, hidden states and outputs (W = H).
//
// The entry point two writes a second destination in the same dispatch,
//   dst2[pairs2[i].x · W + w] = src[pairs2[i].y · W + w]   for i < n, w < W
// (a target's features into its cache and into an EAGLE-3 head's input at
// once).
//
// Buffers:
//   pairs  (n) vec2<u32>: (destination row, source row)
//   src    rows of W u32 words
//   dst    rows of W u32 words; only the rows named in pairs are written
//   pairs2, dst2 (two): as pairs and dst
//
// Dispatch: (min(G, 65535), ceil(G / 65535), 1) workgroups of WG threads,
// G = ceil(n·W / WG): a thread a word — consecutive threads a row's
// consecutive words — the grid folded into two dimensions as copy.wgsl's.
// WG = 64: a few hundred words for W = 1, some thousands of rows of a
// hidden state's for W = H.

const WG: u32 = 64u;

struct Params {
    n: u32,     // pairs
    words: u32, // W: the u32 words of a row
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> pairs: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;
@group(0) @binding(4) var<storage, read> pairs2: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read_write> dst2: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * WG + gid.x;
    if i < p.n * p.words {
        let pr = pairs[i / p.words];
        let w = i % p.words;
        dst[pr.x * p.words + w] = src[pr.y * p.words + w];
    }
}

@compute @workgroup_size(WG)
fn two(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.y * nwg.x * WG + gid.x;
    if i < p.n * p.words {
        let pr = pairs[i / p.words];
        let pr2 = pairs2[i / p.words];
        let w = i % p.words;
        dst[pr.x * p.words + w] = src[pr.y * p.words + w];
        dst2[pr2.x * p.words + w] = src[pr2.y * p.words + w];
    }
}
