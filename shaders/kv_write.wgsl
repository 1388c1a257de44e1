// kv_write.wgsl: append T rows of keys and values to the paged KV cache.
//
// The cache (one layer's slice, bound here) is a pool of blocks of BS
// positions; kv head h of position j of a sequence lives at
//   ((block · kv_heads + h) · BS + j % BS) · D
// where block = table[seq · max_blocks + j / BS] is the physical block the
// sequence's block table maps its logical block j / BS to. Keys and values
// share the layout. Within a block one head's positions are contiguous, so
// attention reads a head's keys as runs of BS·D floats. Sequences share
// nothing but the pool, and a prefix shared by two sequences can map to the
// same blocks.
//
// For t < T, i < kv_heads·D, with j = pos[t]:
//   kcache[slot(seq[t], j) + i] = k[t][i];  vcache[…] = v[t][i]
//
// Buffers:
//   k, v    (T, kv_heads, D) f32: k_proj (after k_norm and RoPE) and v_proj
//   table   (seqs, max_blocks) u32 block tables
//   seq     (T) u32: the table row of each activation row
//   pos     (T) u32: its position
//   kcache, vcache  (blocks, kv_heads, BS, D) f32, or f16 packed in pairs (KV_F16)
//
// Dispatch: (ceil(kv_heads·D / WG), T, 1) workgroups of WG threads, a
// thread per value of K and of V. WG = 64: a scatter copy.

const WG: u32 = 64u;
const KV_F16: u32 = 0u; // 1: the KV cache holds f16 pairs (specialized by the host)

struct Params {
    T: u32,
    kv_heads: u32,
    D: u32,
    BS: u32,         // positions per block
    max_blocks: u32, // row stride of table
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> table: array<u32>;
@group(0) @binding(4) var<storage, read> seq: array<u32>;
@group(0) @binding(5) var<storage, read> pos: array<u32>;
@group(0) @binding(6) var<storage, read_write> kcache: array<u32>;
@group(0) @binding(7) var<storage, read_write> vcache: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    let width = p.kv_heads * p.D;
    if i >= width {
        return;
    }
    let j = pos[t];
    let block = table[seq[t] * p.max_blocks + j / p.BS];
    let h = i / p.D;
    let dst = ((block * p.kv_heads + h) * p.BS + j % p.BS) * p.D + i % p.D;
    let src = t * width + i;
    if KV_F16 == 1u {
        // A thread per pair of halves (D is even, so pairs never straddle heads).
        if (i & 1u) == 1u {
            return;
        }
        kcache[dst >> 1u] = pack2x16float(vec2<f32>(k[src], k[src + 1u]));
        vcache[dst >> 1u] = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
        return;
    }
    kcache[dst] = bitcast<u32>(k[src]);
    vcache[dst] = bitcast<u32>(v[src]);
}
