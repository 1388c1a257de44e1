// attention_prefill.wgsl: GQA attention for T query rows of one sequence
// (rows row0 … row0+T-1 of a batch's buffers) over the paged KV cache,
// tiled flash-attention style: online softmax, the score matrix never
// leaves the workgroup.
//
// Row t (placement rows[t]: Row in prelude.wgsl) attends to the slots
// j ≤ rows[t].slot of sequence `seq` (its block-table row) that it sees:
// all of them for a line token (causal), the line below its base and its
// ancestors for a token-tree node. The cache must already hold every slot
// up to the largest, the rows' own included (qkv_rope_kv.wgsl). Query head
// h reads kv head h / GROUP. For each row and head, over the keys j it
// sees:
//   out[t][h] = Σ_j softmax_j((q[t][h] · k_j) · scale) · v_j
//
// Buffers:
//   q       (row0+T, heads, D) f32, after q_norm and RoPE, read as vec4s
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32 or f16 pairs
//           (layout in qkv_rope_kv.wgsl)
//   table   (seqs, max_blocks) u32
//   rows    (row0+T) Row: the rows' slots and masks
//   out     (row0+T, heads, D) f32, written as vec4s
//
// Dispatch: (kv_heads, ceil(T·GROUP / BR), 1) workgroups of WG = 256
// threads. A workgroup takes one kv head and BR = 64 query rows of it —
// the (position, head) pairs t·GROUP + g of the GROUP heads sharing it, so
// each key and value it stages serves all of them — and walks the keys in
// tiles of BC = 32, in three phases a tile:
//   scores  S = Q·Kᵀ (64 × 32), thread (r, c) = (lid / 8, lid % 8) owning
//           rows 2r, 2r+1 and keys 4c … 4c+3 in registers; Q and K are
//           staged DK inputs at a time, transposed, so each step of the
//           dot products is one 8-byte and one 16-byte read of workgroup
//           memory for eight multiply-adds;
//   softmax the scores of keys a row does not see are −inf (a comparison
//           with its base; its mask is read only on tiles with a key past
//           that: see sees); the scores go to workgroup
//           memory; each thread reads its two rows' 32 scores for the
//           running max, turns its own eight into weights exp(s − m) and
//           rescales its output (every thread of a row computes the same
//           max; each keeps a partial row sum, added up at the end; a row
//           that has seen no key yet keeps m = −inf and weighs against 0);
//   values  O += P·V, the values staged DV inputs at a time; the thread
//           keeps its rows' outputs at inputs 4(c + 8j) … +3, so a warp
//           reads 128 consecutive bytes of a value row.
// Workgroups whose rows come later (more keys) start first.
//
// Workgroup memory (specialized by the host to the device's limit): Q
// staged (DK, BR) as pairs of rows, K staged (DK, BC) or V staged (BC, DV)
// in the same KVS vec4s, and the (BR, BC) scores: 4·(64·DK + max(32·DK,
// 32·DV) + 2,048) bytes — 40 KiB at DK = 64, DV = 128 (the H200), 16 KiB
// at DK = 16, DV = 32 (WebGPU's default). D is a multiple of DK and of DV;
// DK of 8, DV of 32.

const BR: u32 = 64u;
const BC: u32 = 32u;
const WG: u32 = 256u;
const D: u32 = 128u;
const DK: u32 = 64u;
const DV: u32 = 128u;
const GROUP: u32 = 2u;
const KVS: u32 = 1024u;           // max(DK·BC, BC·DV) / 4, set by the host with DK and DV
const KV_F16: u32 = 0u;           // 1: the KV cache holds f16 pairs (specialized by the host)
const KVR: u32 = KVS / 8u;        // rows of kv: 8 vec4s (BC keys, or 32 value inputs) a row
const BR2: u32 = BR / 2u;         // pairs of query rows
const BC4: u32 = BC / 4u;         // vec4s of keys
const OV: u32 = D / 32u;          // output vec4s a thread keeps for each of its rows
const VJ: u32 = DV / 32u;         // of which one value chunk covers

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    BS: u32,         // slots per block
    max_blocks: u32, // row stride of table
    seq: u32,        // the sequence's table row
    scale: f32,      // 1/sqrt(D)
    row0: u32,       // the sequence's first row in q, rows and out
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> kcache: array<u32>;
@group(0) @binding(3) var<storage, read> vcache: array<u32>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read> rows: array<Row>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;

// Nested, so that the inner loops index each by a loop constant and the
// thread's own sr or sc: naga clamps every dynamic index into a workgroup
// array (min(i, len − 1)), and a flat index costs an add and a min a read
// that the driver cannot fold into the load (see skinny_int4.wgsl).
var<workgroup> qs: array<array<vec2<f32>, BR2>, DK>; // qs[d][j] = rows 2j, 2j+1 at input d0 + d
// keys: kv[d][j] = keys 4j … 4j+3 at input d0 + d; values: kv[c·VJ + i][j]
// = key c's inputs dv0 + 4(8i + j) … +3
var<workgroup> kv: array<array<vec4<f32>, BC4>, KVR>;
var<workgroup> ps: array<array<vec4<f32>, BC4>, BR>; // ps[r][j] = row r's scores (weights) of keys 4j … 4j+3

// key_base is the cache element index of slot j's input 0 for kv head kvh.
fn key_base(j: u32, kvh: u32) -> u32 {
    return ((table[p.seq * p.max_blocks + j / p.BS] * p.kv_heads + kvh) * p.BS + j % p.BS) * D;
}

// k_pair reads the key cache's elements i and i + 1 (i even).
fn k_pair(i: u32) -> vec2<f32> {
    if KV_F16 == 1u {
        return unpack2x16float(kcache[i >> 1u]);
    }
    return vec2(bitcast<f32>(kcache[i]), bitcast<f32>(kcache[i + 1u]));
}

// v_quad reads the value cache's elements i … i + 3 (i a multiple of 4).
fn v_quad(i: u32) -> vec4<f32> {
    if KV_F16 == 1u {
        return vec4(unpack2x16float(vcache[i >> 1u]), unpack2x16float(vcache[(i >> 1u) + 1u]));
    }
    return vec4(bitcast<f32>(vcache[i]), bitcast<f32>(vcache[i + 1u]), bitcast<f32>(vcache[i + 2u]), bitcast<f32>(vcache[i + 3u]));
}

// q_index is the vec4 index of input d of the tile's row i (flat index
// base + i over the T·GROUP rows, clamped to the last).
fn q_index(base: u32, i: u32, kvh: u32, d: u32) -> u32 {
    let flat = min(base + i, p.T * GROUP - 1u);
    return (((p.row0 + flat / GROUP) * p.heads + kvh * GROUP + flat % GROUP) * D + d) / 4u;
}

fn max4(v: vec4<f32>) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }

// sees reports which of keys key (slots 4c … 4c+3 of a tile) row rows[t]
// attends to, lim = min(its base, its slot + 1) being all a thread keeps
// of it: the keys below lim, and the keys from its base on up to its slot
// that its mask names. The mask is loaded only for a tile with a key at or
// past lim — a line row's (0: it sees none there) only on the tiles past
// its own slot, the causal diagonal.
fn sees(t: u32, lim: u32, key: vec4<u32>) -> vec4<bool> {
    let line = key < vec4(lim);
    if all(line) {
        return line;
    }
    let r = rows[t];
    let i = key - vec4(r.base);
    let word = select(vec4(r.mask_lo), vec4(r.mask_hi), i >= vec4(32u));
    let bit = ((word >> (i & vec4(31u))) & vec4(1u)) == vec4(1u);
    return line | ((key >= vec4(r.base)) & (i < vec4(64u)) & (key <= vec4(r.slot)) & bit);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let kvh = wid.x;
    let base = (nwg.y - 1u - wid.y) * BR; // later rows (more keys) first
    let nrows = p.T * GROUP;
    let sr = lid / 8u; // rows 2sr, 2sr + 1 of the tile
    let sc = lid % 8u; // keys 4sc … 4sc + 3; output vec4s sc + 8j
    let fa = min(base + 2u * sr, nrows - 1u);
    let fb = min(base + 2u * sr + 1u, nrows - 1u);
    let ta = p.row0 + fa / GROUP; // row 2sr's index in rows
    let tb = p.row0 + fb / GROUP;
    let lim_a = min(rows[ta].base, rows[ta].slot + 1u); // keys below it row 2sr sees (sees)
    let lim_b = min(rows[tb].base, rows[tb].slot + 1u);
    var nkeys = 0u; // keys any row of the tile may see
    for (var t = base / GROUP; t <= min(base + BR, nrows) / GROUP && t < p.T; t++) {
        nkeys = max(nkeys, rows[p.row0 + t].slot + 1u);
    }

    var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
    let neg_inf = bitcast<f32>(neg_inf_bits);
    var m_a = neg_inf; // running max of the row
    var m_b = neg_inf;
    var l_a = 0.0; // running sum of this thread's weights of the row
    var l_b = 0.0;
    var o_a = array<vec4<f32>, OV>();
    var o_b = array<vec4<f32>, OV>();

    for (var c0 = 0u; c0 < nkeys; c0 += BC) {
        // scores: S = Q·Kᵀ over D in chunks of DK
        var s_a = vec4(0.0);
        var s_b = vec4(0.0);
        for (var d0 = 0u; d0 < D; d0 += DK) {
            for (var k = lid; k < DK / 4u * BR / 2u; k += WG) {
                let j = k % (BR / 2u);
                let dq = k / (BR / 2u);
                let x = q[q_index(base, 2u * j, kvh, d0 + 4u * dq)];
                let y = q[q_index(base, 2u * j + 1u, kvh, d0 + 4u * dq)];
                qs[4u * dq][j] = vec2(x.x, y.x);
                qs[4u * dq + 1u][j] = vec2(x.y, y.y);
                qs[4u * dq + 2u][j] = vec2(x.z, y.z);
                qs[4u * dq + 3u][j] = vec2(x.w, y.w);
            }
            for (var k = lid; k < BC / 4u * DK / 2u; k += WG) {
                let j = k % (BC / 4u);
                let d = d0 + 2u * (k / (BC / 4u));
                var e = array<vec2<f32>, 4>();
                for (var u = 0u; u < 4u; u++) {
                    let key = c0 + 4u * j + u;
                    if key < nkeys {
                        e[u] = k_pair(key_base(key, kvh) + d);
                    }
                }
                kv[d - d0][j] = vec4(e[0].x, e[1].x, e[2].x, e[3].x);
                kv[d - d0 + 1u][j] = vec4(e[0].y, e[1].y, e[2].y, e[3].y);
            }
            workgroupBarrier();
            for (var d = 0u; d < DK; d++) {
                let qq = qs[d][sr];
                let kk = kv[d][sc];
                s_a = fma(vec4(qq.x), kk, s_a);
                s_b = fma(vec4(qq.y), kk, s_b);
            }
            workgroupBarrier();
        }
        let key = vec4(c0 + 4u * sc) + vec4(0u, 1u, 2u, 3u);
        s_a = select(vec4(neg_inf), s_a * p.scale, sees(ta, lim_a, key));
        s_b = select(vec4(neg_inf), s_b * p.scale, sees(tb, lim_b, key));
        ps[2u * sr][sc] = s_a;
        ps[2u * sr + 1u][sc] = s_b;
        workgroupBarrier();

        // softmax: the rows' new max from all their scores
        var mx_a = m_a;
        var mx_b = m_b;
        for (var j = 0u; j < BC / 4u; j++) {
            mx_a = max(mx_a, max4(ps[2u * sr][j]));
            mx_b = max(mx_b, max4(ps[2u * sr + 1u][j]));
        }
        if DV == D { // stage all the values now: kv is free
            stage_values(c0, 0u, kvh, nkeys, lid);
        }
        workgroupBarrier(); // every thread has read the scores
        // Against 0 while a row has seen no key (mx = −inf): its weights
        // and its rescale of nothing are 0, not exp(−inf − (−inf)) = NaN.
        let mz_a = select(mx_a, 0.0, mx_a == neg_inf);
        let mz_b = select(mx_b, 0.0, mx_b == neg_inf);
        let w_a = exp(s_a - mz_a);
        let w_b = exp(s_b - mz_b);
        let al_a = exp(m_a - mz_a);
        let al_b = exp(m_b - mz_b);
        m_a = mx_a;
        m_b = mx_b;
        l_a = l_a * al_a + dot(w_a, vec4(1.0));
        l_b = l_b * al_b + dot(w_b, vec4(1.0));
        for (var j = 0u; j < OV; j++) {
            o_a[j] *= al_a;
            o_b[j] *= al_b;
        }
        ps[2u * sr][sc] = w_a;
        ps[2u * sr + 1u][sc] = w_b;
        workgroupBarrier();

        // values: O += P·V, DV inputs at a time
        for (var dv0 = 0u; dv0 < D; dv0 += DV) {
            if DV < D {
                stage_values(c0, dv0, kvh, nkeys, lid);
                workgroupBarrier();
            }
            for (var c4 = 0u; c4 < BC / 4u; c4++) {
                let wa = ps[2u * sr][c4];
                let wb = ps[2u * sr + 1u][c4];
                for (var u = 0u; u < 4u; u++) {
                    for (var j = 0u; j < VJ; j++) {
                        let v = kv[(4u * c4 + u) * VJ + j][sc];
                        o_a[dv0 / 32u + j] = fma(vec4(wa[u]), v, o_a[dv0 / 32u + j]);
                        o_b[dv0 / 32u + j] = fma(vec4(wb[u]), v, o_b[dv0 / 32u + j]);
                    }
                }
            }
            workgroupBarrier();
        }
    }

    // the rows' sums: each of its 8 threads holds a part
    ps[2u * sr][sc].x = l_a;
    ps[2u * sr + 1u][sc].x = l_b;
    workgroupBarrier();
    var sum_a = 0.0;
    var sum_b = 0.0;
    for (var j = 0u; j < BC / 4u; j++) {
        sum_a += ps[2u * sr][j].x;
        sum_b += ps[2u * sr + 1u][j].x;
    }
    if base + 2u * sr < nrows {
        for (var j = 0u; j < OV; j++) {
            out[q_index(base, 2u * sr, kvh, 4u * (sc + 8u * j))] = o_a[j] / sum_a;
        }
    }
    if base + 2u * sr + 1u < nrows {
        for (var j = 0u; j < OV; j++) {
            out[q_index(base, 2u * sr + 1u, kvh, 4u * (sc + 8u * j))] = o_b[j] / sum_b;
        }
    }
}

// stage_values fills kv with the values of keys c0 … c0+BC-1 at inputs
// dv0 … dv0+DV-1 (keys from nkeys on as zeros: their weights are zero, and
// a zero weight must not meet a NaN).
fn stage_values(c0: u32, dv0: u32, kvh: u32, nkeys: u32, lid: u32) {
    for (var k = lid; k < BC * DV / 4u; k += WG) {
        let c = k / (DV / 4u);
        let j = k % (DV / 4u);
        var v = vec4(0.0);
        if c0 + c < nkeys {
            v = v_quad(key_base(c0 + c, kvh) + dv0 + 4u * j);
        }
        kv[k / (BC / 4u)][k % (BC / 4u)] = v;
    }
}
