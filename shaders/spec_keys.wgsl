// spec_keys.wgsl: the coupled keys of a chained speculative step's rows,
// from the positions spec_accept.wgsl left (engine/webgpu's DraftVerifyN
// at a temperature): the row that decides the token at position pos draws
// under its generation's key of pos (prelude.wgsl's position_key,
// sampling.Keys.At), whichever step reaches it, so that a seed's tokens do
// not depend on how many drafts the steps before accepted. For each of B
// sequences, with L its verification's first position, verified row t
// (0 … K) decides position L + t + 1, and draft t (t < K) is verified by
// row t, so it is drafted under the same key.
//
// Buffers:
//   state  (B) vec4<u32>: (L, n, ·, ·), spec_accept.wgsl's
//   draws  (B·(K+1)) vec4<u32>: the step's verification draws
//          (sample.wgsl's: X, U bits, V bits, flags), sequence i's from
//          i·(K+1); a coupled row (flags COUPLED, not GREEDY) holds its
//          generation's seed words (sampling.Keys' S0, S1) where its key
//          goes, and gets its key in their place
//   dkeys  the chain's draft keys (argmax.wgsl's keys, 4 words a row):
//          draft t's region at word dkey0 + t·dstride, sequence i's key
//          at 4i there; where its fourth word is set (a coupled draft)
//          its first two get the key of row t. Unwritten where dkey0 is
//          NONE.
//
// Dispatch: (ceil(B·(K+1) / WG), 1, 1) workgroups of WG threads, a thread
// a row.

const WG: u32 = 64u;
const NONE: u32 = 0xffffffffu;
const GREEDY: u32 = 1u;  // sample.wgsl's draws' flags
const COUPLED: u32 = 4u;

struct Params {
    b: u32,       // sequences
    k: u32,       // drafted tokens a sequence
    dkey0: u32,   // the first draft's keys' first word (NONE: no draft keys)
    dstride: u32, // words from one draft's keys to the next's
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> draws: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dkeys: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let rows = p.k + 1u;
    let i = r / rows;
    if i >= p.b {
        return;
    }
    let t = r % rows;
    let d = draws[r];
    if (d.w & GREEDY) != 0u || (d.w & COUPLED) == 0u {
        return;
    }
    let key = position_key(d.y, d.z, state[i].x + t + 1u);
    draws[r] = vec4<u32>(d.x, key.x, key.y, d.w);
    if p.dkey0 != NONE && t < p.k {
        let w = p.dkey0 + t * p.dstride + 4u * i;
        if dkeys[w + 3u] != 0u {
            dkeys[w] = key.x;
            dkeys[w + 1u] = key.y;
        }
    }
}
