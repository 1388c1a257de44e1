// attention_prefill.wgsl: causal GQA attention for T query rows of one
// sequence (rows row0 … row0+T-1 of a batch's buffers) over the paged KV cache, tiled (flash-attention style: online
// softmax, the score matrix never leaves workgroup memory).
//
// Row t (position pos[t]) attends to the positions 0 … pos[t] of sequence
// `seq` (its block-table row): the cache must already hold every position up
// to the largest pos, including the rows' own (qkv_rope_kv.wgsl). Query head h
// reads kv head h / group. For each row:
//   out[t][h] = Σ_j softmax_j((q[t][h] · k_j) · scale) · v_j
//
// Buffers:
//   q       (row0+T, heads, D) f32, after q_norm and RoPE
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32 or f16 pairs (see qkv_rope_kv.wgsl)
//   table   (seqs, max_blocks) u32
//   pos     (row0+T) u32, the rows' positions
//   out     (row0+T, heads, D) f32
//
// Dispatch: (heads, ceil(T / BR), 1) workgroups of WG = BR·BC threads. A
// workgroup takes BR rows of one query head and walks the keys in tiles of
// BC: all threads load the tile's keys into workgroup memory; thread (r, c)
// scores row r against key c; one thread per row updates the running max
// and sum and turns scores into weights while all threads load the values
// into the same memory; then thread (r, ·) adds the weighted values into
// its D/BC output values (kept in registers). BR = BC = 16 gives 256
// threads, and the tile (BC·D floats) plus scores stay at 9 KiB for
// D = 128, under WebGPU's 16 KiB default workgroup memory.

const BR: u32 = 16u;
const BC: u32 = 16u;
const WG: u32 = BR * BC;
const D: u32 = 128u;
const TILE: u32 = BC * D;
const OUT: u32 = D / BC; // output values per thread
const KV_F16: u32 = 0u; // 1: the KV cache holds f16 pairs (specialized by the host)

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    BS: u32,         // positions per block
    max_blocks: u32, // row stride of table
    seq: u32,        // the sequence's table row
    scale: f32,      // 1/sqrt(D)
    row0: u32,       // the sequence's first row in q, pos and out
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kcache: array<u32>;
@group(0) @binding(3) var<storage, read> vcache: array<u32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read> pos: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// The KV cache holds f32 words, or with KV_F16 = 1 IEEE halves packed two
// to a u32 (pack2x16float; no shader-f16 needed): element i of either cache.
fn kv_load(i: u32, values: bool) -> f32 {
    var w: u32;
    if values {
        w = vcache[select(i, i >> 1u, KV_F16 == 1u)];
    } else {
        w = kcache[select(i, i >> 1u, KV_F16 == 1u)];
    }
    if KV_F16 == 1u {
        let pair = unpack2x16float(w);
        return select(pair.x, pair.y, (i & 1u) == 1u);
    }
    return bitcast<f32>(w);
}

var<workgroup> tile: array<f32, TILE>; // (BC, D) keys, then values
var<workgroup> w: array<f32, WG>;      // (BR, BC) scores, then weights
var<workgroup> m: array<f32, BR>;      // running max per row
var<workgroup> l: array<f32, BR>;      // running sum per row
var<workgroup> alpha: array<f32, BR>;  // rescale of the row's output this tile
var<workgroup> keys: u32;              // keys the tile walk must cover

// load fills tile with the D values of kv head kvh for keys c0 … c0+BC-1,
// from the key cache or the value cache (keys from `keys` on as 0).
fn load(c0: u32, kvh: u32, lid: u32, values: bool) {
    for (var i = lid; i < TILE; i += WG) {
        let j = c0 + i / D;
        var x = 0.0;
        if j < keys {
            let b = ((table[p.seq * p.max_blocks + j / p.BS] * p.kv_heads + kvh) * p.BS + j % p.BS) * D + i % D;
            x = kv_load(b, values);
        }
        tile[i] = x;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let kvh = h / (p.heads / p.kv_heads);
    let r0 = wid.y * BR;
    let r = lid / BC;              // this thread's row of the tile
    let c = lid % BC;              // its key (scores), its output slice (values)
    let t = p.row0 + min(r0 + r, p.T - 1u); // rows past T redo row T-1, unwritten
    let visible = pos[t] + 1u;     // keys row t may see
    let qbase = (t * p.heads + h) * D;

    if lid == 0u {
        var most = 0u;
        for (var rr = 0u; rr < BR; rr++) {
            most = max(most, pos[p.row0 + min(r0 + rr, p.T - 1u)] + 1u);
        }
        keys = most;
    }
    if lid < BR {
        var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
        m[lid] = bitcast<f32>(neg_inf_bits);
        l[lid] = 0.0;
    }
    let nkeys = workgroupUniformLoad(&keys); // (a barrier too)

    var o = array<f32, OUT>();
    for (var c0 = 0u; c0 < nkeys; c0 += BC) {
        load(c0, kvh, lid, false);
        workgroupBarrier();
        var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
        var s = bitcast<f32>(neg_inf_bits);
        if c0 + c < visible {
            var acc = 0.0;
            for (var d = 0u; d < D; d++) {
                acc += q[qbase + d] * tile[c * D + d];
            }
            s = acc * p.scale;
        }
        w[lid] = s;
        workgroupBarrier();
        // Online softmax, one thread per row: key 0 is visible to every
        // row, so the running max is finite from the first tile on.
        if lid < BR {
            var most = m[lid];
            for (var cc = 0u; cc < BC; cc++) {
                most = max(most, w[lid * BC + cc]);
            }
            var sum = 0.0;
            for (var cc = 0u; cc < BC; cc++) {
                let e = exp(w[lid * BC + cc] - most);
                w[lid * BC + cc] = e;
                sum += e;
            }
            let a = exp(m[lid] - most);
            l[lid] = l[lid] * a + sum;
            m[lid] = most;
            alpha[lid] = a;
        }
        load(c0, kvh, lid, true); // the keys are no longer needed
        workgroupBarrier();
        let a = alpha[r];
        for (var i = 0u; i < OUT; i++) {
            let d = c + i * BC;
            var acc = o[i] * a;
            for (var cc = 0u; cc < BC; cc++) {
                acc += w[r * BC + cc] * tile[cc * D + d];
            }
            o[i] = acc;
        }
        workgroupBarrier();
    }
    if r0 + r < p.T {
        for (var i = 0u; i < OUT; i++) {
            out[qbase + c + i * BC] = o[i] / l[r];
        }
    }
}
