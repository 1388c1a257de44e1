// spec_rows.wgsl: the places of a chained speculative step's rows, from
// the state spec_accept.wgsl left, written on the device so that the host
// records the step before the step before it has run (engine/webgpu's
// Head.DraftVerifyN). For each of B sequences, with L its verification's
// first position, n the drafts accepted at the step before and
// P = L − n − 1 where that step's verification started:
//   - the target's K+1 verified rows at positions L … L+K (prelude.wgsl's
//     Row: its table row, slot = position, base = position + 1: a line)
//     and the pool rows where their features go (the target's block
//     table: block · block_size + position % block_size), as the pairs
//     (pool row, row) the feature layers' gather.wgsl takes;
//   - an EAGLE-3 head's K+1 rows over the step before's verified
//     positions P … P+K (a head's row r reads the target's features at
//     position r and embeds the token at r + 1: row P + n is the bonus
//     token's, whose output drafts the next token; rows past it are
//     overwritten before any row at or after their position reads them);
//   - the head's pair (store row, row P+n's index in its pass) that keeps
//     that output in the hidden store, and the row of its first chained
//     pass, at position L.
//
// Buffers:
//   state  (B) vec4<u32>: (L, n, target slot, head slot)
//   table  (seqs, max_blocks) u32: the target's block table
//   trows  (B·(K+1)) Row: the target's rows, sequence i's from i·(K+1)
//   tfeat  (B·(K+1)) vec2<u32>: (pool row, row)
//   hrows  (B·(K+1)) Row: the head's first pass's rows, laid out as trows
//   hsave  (B) vec2<u32>: (store_row + head slot, i·(K+1) + n)
//   hchain (B) Row: the head's first chained row of sequence i
//
// Dispatch: (ceil(B·(K+1) / WG), 1, 1) workgroups of WG threads, a thread
// a row.

const WG: u32 = 64u;

struct Params {
    b: u32,          // sequences
    k: u32,          // drafted tokens a sequence
    max_blocks: u32, // the table's row length
    block_size: u32, // positions a block
    store_row: u32,  // the head's hidden store's first row
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> trows: array<Row>;
@group(0) @binding(4) var<storage, read_write> tfeat: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read_write> hrows: array<Row>;
@group(0) @binding(6) var<storage, read_write> hsave: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> hchain: array<Row>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    let rows = p.k + 1u;
    let i = r / rows;
    if i >= p.b {
        return;
    }
    let t = r % rows;
    let s = state[i];
    let L = s.x;
    let n = s.y;
    let pos = L + t;
    trows[r] = line_row(s.z, pos);
    let block = table[s.z * p.max_blocks + pos / p.block_size];
    tfeat[r] = vec2<u32>(block * p.block_size + pos % p.block_size, r);
    hrows[r] = line_row(s.w, L - n - 1u + t);
    if t == 0u {
        hsave[i] = vec2<u32>(p.store_row + s.w, i * rows + n);
        hchain[i] = line_row(s.w, L);
    }
}
