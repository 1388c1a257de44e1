// kv_move.wgsl: copies one layer's cached keys and values from slot to
// slot within sequences, every kv head — a token tree's accepted path
// brought to follow the line (treemask.Tree.KeepPath), on the device, with
// nothing recomputed or read back:
//   kcache[seq][to] ← kcache[seq][from],  vcache[seq][to] ← vcache[seq][from]
// for each move (from, to) of each sequence, in the sequence's order.
//
// Buffers:
//   list    G groups, one a sequence: words 4g … 4g+3 hold its block-table
//           row, its first move, its move count and 0; from word moves0
//           on, move i is (from, to) at words moves0 + 2i, moves0 + 2i + 1
//   table   (seqs, max_blocks) u32 block tables
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32, or f16 pairs
//           (layout in qkv_rope_kv.wgsl), moved as u32 words: a head's DW
//           words a slot (D, or D/2 for f16)
//
// Thread x of group g owns word x of a slot's kv_heads·DW words (kv head
// x / DW, word x % DW) and applies the group's moves to it one after
// another, so the moves of a sequence take effect in order even where a
// later one writes a slot an earlier one read (KeepPath's moves do: path
// slots 11, 12 over base 10 move 11 → 10, then 12 → 11); each word is read
// and written by its own thread only. A group has at most 63 moves (a tree
// holds 64 nodes), so a thread's loop is short.
//
// Entry point rows makes the same moves in one buffer of rows of DW words
// a slot, kcache alone bound: a cache's features (kernels.KVCache,
// KVShape.Features), laid out as one kv head's slots (kv_heads = 1, DW
// their width), a dispatch a feature buffer.
//
// Dispatch: (ceil(kv_heads·DW / WG), G, 1) workgroups of WG = 64 threads,
// one dispatch a layer (each layer is a buffer of its own), or a feature
// buffer (rows).

const WG: u32 = 64u;

struct Params {
    G: u32,          // groups (sequences)
    kv_heads: u32,
    DW: u32,         // u32 words of a head's slot
    BS: u32,         // slots per block
    max_blocks: u32, // row stride of table
    moves0: u32,     // the first word of the moves in list
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> list: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(4) var<storage, read_write> vcache: array<u32>;

// word is the cache word of kv head h, word w of slot j of the sequence
// whose table row is seq.
fn word(seq: u32, j: u32, h: u32, w: u32) -> u32 {
    let block = table[seq * p.max_blocks + j / p.BS];
    return ((block * p.kv_heads + h) * p.BS + j % p.BS) * p.DW + w;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = gid.x;
    if x >= p.kv_heads * p.DW {
        return;
    }
    let h = x / p.DW;
    let w = x % p.DW;
    let g = gid.y;
    let seq = list[4u * g];
    let first = list[4u * g + 1u];
    let n = list[4u * g + 2u];
    for (var i = 0u; i < n; i++) {
        let at = p.moves0 + 2u * (first + i);
        let src = word(seq, list[at], h, w);
        let dst = word(seq, list[at + 1u], h, w);
        kcache[dst] = kcache[src];
        vcache[dst] = vcache[src];
    }
}

@compute @workgroup_size(WG)
fn rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = gid.x;
    if x >= p.kv_heads * p.DW {
        return;
    }
    let h = x / p.DW;
    let w = x % p.DW;
    let g = gid.y;
    let seq = list[4u * g];
    let first = list[4u * g + 1u];
    let n = list[4u * g + 2u];
    for (var i = 0u; i < n; i++) {
        let at = p.moves0 + 2u * (first + i);
        kcache[word(seq, list[at + 1u], h, w)] = kcache[word(seq, list[at], h, w)];
    }
}
