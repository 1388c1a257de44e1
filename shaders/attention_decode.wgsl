// attention_decode.wgsl: GQA attention of single query rows over the paged
// KV cache, each row with its own sequence and mask, split over the context
// (flash-decoding). The splits are merged by attention_merge.wgsl; or, with
// MERGE, by the last of a row's splits to finish, in this dispatch; or,
// when there is one split (DIRECT), the kernel writes the output itself.
//
// Row t (query q[t], placement rows[t]: Row in prelude.wgsl) attends to
// the slots j ≤ rows[t].slot of sequence rows[t].seq that it sees
// (visible): all of them for a line token (causal), the line and its
// ancestors for a token-tree node. Query head h reads kv head h / GROUP
// (repeat_kv). Split s covers slots [s·CHUNK, (s+1)·CHUNK); for each query
// head it stores, unnormalized, over the keys j of the split the row sees,
//   m = max_j score_j,  l = Σ_j exp(score_j − m),  o = Σ_j exp(score_j − m) · v_j
// with score_j = (q · k_j) · scale: a hidden key scores −inf. A split past
// the row's context, or whose keys the row sees none of, stores m = −inf,
// l = 0, o = 0 (its weights are taken against 0, not m, so that
// exp(−inf − (−inf)) makes no NaN); the merge weighs it 0.
//
// With INPUT the kernel also does qkv_rope_kv.wgsl's work for its rows,
// which must see no other row's new slot (one row, or rows of distinct
// sequences): each workgroup normalizes (q_norm) and rotates (RoPE at the
// row's position) its group's query heads from the row's q|k|v as the
// projection left it, and the workgroup of the split holding the row's
// slot does the same to its kv head's key and appends the key and the value
// to the cache there before it scores (a storageBarrier orders the
// append before the workgroup's reads). The formulas are qkv_rope_kv.wgsl's
// (prelude.wgsl's rope_at and reduced), so the cache and the scores equal
// the two-dispatch path's.
//
// Buffers:
//   q       (T, heads, D) f32, after q_norm and RoPE; with INPUT the rows of
//           q_proj | k_proj | v_proj, (T, (heads + 2·kv_heads)·D) f32
//   kcache, vcache  one layer's (blocks, kv_heads, BS, D) f32 or f16 pairs
//           (layout in qkv_rope_kv.wgsl), read (and with INPUT written)
//           as 16-byte words
//   table   (seqs, max_blocks) u32
//   rows    (T) Row: the rows' sequences, slots and masks
//   part    from word part0 on, (T, heads, splits, PS) f32 bits: o, then
//           m and l, and two words unused, so that each split's o starts
//           16-byte aligned where part0 is a multiple of 4 (a merge may
//           read it in vec4s); unwritten with DIRECT; read and written as
//           atomics (see MERGE)
//   out     (T, heads, D) f32, written with MERGE (by the last split) or
//           DIRECT (one split, no merge: o / l, and NaN for a row the split
//           does not cover); else left to attention_merge.wgsl
//   consts  INPUT: q_norm (D), k_norm (D), inv_freq (D/2) f32
//           (kernels.UploadQKNormRope); else unread
//
// MERGE (where gpu.Device.DeviceScopeBarrier holds): words 0 … T·kv_heads − 1
// of part count the splits of row t and kv head g that have written their
// partials. Each workgroup writes them, then storageBarrier (a device-scope
// release there), then one thread adds 1 to the count. The one that finds
// splits − 1 there is the last: after another storageBarrier (acquire) it
// reads every split's partials, merges them by attention_merge.wgsl's
// formula (M over all splits first, then the weighted sums), writes out,
// and sets the count back to 0 for the next dispatch. part is read and
// written only through atomics, which bypass caches that another
// workgroup's writes would not reach.
//
// Dispatch: (kv_heads, splits, T) workgroups of WG threads. A workgroup
// takes one kv head for the GROUP query heads that share it, so each key
// and value is read once for all of them, in three phases:
//   scores  thread c scores keys c, c + WG, … of the chunk against the
//           group's queries (in workgroup memory), reading each key in
//           16-byte loads, its GROUP dot products in registers; a key the
//           row does not see scores −inf (a line row's keys are all below
//           its base: one comparison a key);
//   softmax the max and the sum of exponentials of each head: each thread's
//           own, then RG = WG/16 partials a head (each folding 16 threads'),
//           then every thread folds the RG partials — two barriers each;
//   values  D/8 threads cover one value vector, eight elements each from
//           one 16-byte load (f16) or two (f32), so KP = WG·8/D keys are
//           summed side by side into registers. A thread loads VB keys'
//           values before it uses any (keys past the chunk's end repeat its
//           last key, weighted 0), so VB loads wait on memory together
//           rather than one after another; then the KP sums are added up
//           in workgroup memory in KP rounds.
// D (head_dim, a multiple of 8), GROUP (query heads per kv head), CHUNK
// (64 … 256, picked by package kernels so that there are enough workgroups
// and the workgroup memory fits) and VB are constants, so every loop over
// them has a fixed count. WG = 64 threads (a power of two, at least 16 and
// at least D/8). MERGE takes at most MAXS splits.

const WG: u32 = 64u;
const D: u32 = 128u;
const GROUP: u32 = 2u;
const CHUNK: u32 = 64u;
const VB: u32 = 8u;                // values a thread loads before it uses them
const KV_F16: u32 = 0u;            // 1: the KV cache holds f16 pairs (specialized by the host)
const DIRECT: u32 = 0u;            // 1: one split (splits = 1) writes the output itself to part
const MERGE: u32 = 0u;             // 1: the last split merges (specialized by the host)
const MAXS: u32 = 64u;             // MERGE: the most splits
const INPUT: u32 = 0u;             // 1: the rows' q/k norms, RoPE and cache append here (specialized by the host)
const IP: u32 = (D / 2u + WG - 1u) / WG; // INPUT: a head vector's pairs a thread
const KVN: u32 = INPUT * 2u * D + 1u - INPUT; // INPUT: the new key and value
const KW: u32 = D / 8u * (2u - KV_F16); // INPUT: 16-byte words of a key or value in the cache
const PS: u32 = D + 4u;            // a split's partials: o, m, l and two words unused
const LANES: u32 = D / 8u;         // threads per value vector
const KP: u32 = WG / LANES;        // value vectors summed side by side
const RG: u32 = WG / 16u;          // a reduction's partials per head
const QS: u32 = GROUP * D / 4u;    // vec4s of the group's queries
const SC: u32 = GROUP * CHUNK;     // scores, then exp(score − m)
const RED: u32 = GROUP * WG;       // per-thread maxima, then sums
const RED2: u32 = GROUP * RG;      // their partials
const SB: u32 = 8u;                // MERGE: splits' values a thread loads at once
const OUTS: u32 = (GROUP * D + WG - 1u) / WG; // MERGE: outputs a thread

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    BS: u32,         // slots per block
    max_blocks: u32, // row stride of table
    splits: u32,
    scale: f32,      // 1/sqrt(D)
    part0: u32,      // the first word of the partials in part (after MERGE's counts)
    eps: f32,        // INPUT: q_norm's and k_norm's epsilon
    qk_norm: u32,    // INPUT: 1 (Qwen3's q_norm and k_norm; rope_at reads it)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> kcache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> vcache: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> table: array<u32>;
@group(0) @binding(5) var<storage, read> rows: array<Row>;
@group(0) @binding(6) var<storage, read_write> part: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read> consts: array<f32>;

var<workgroup> qs: array<vec4<f32>, QS>;
var<workgroup> sc: array<f32, SC>;
var<workgroup> base: array<u32, CHUNK>;  // cache offset of each key of the chunk
var<workgroup> red: array<f32, RED>;     // each thread's value of a reduction
var<workgroup> red2: array<f32, RED2>;
var<workgroup> ov: array<array<Vec8, LANES>, GROUP>; // the value sums [head][lane]
var<workgroup> is_last: bool;                         // MERGE: this workgroup merges
var<workgroup> ms: array<array<f32, MAXS>, GROUP>;    // MERGE: each split's m, then exp(m − M)
var<workgroup> ls: array<array<f32, MAXS>, GROUP>;    // MERGE: each split's l
var<workgroup> kv_new: array<f32, KVN>;              // INPUT: the row's key (normalized, rotated), then its value

fn store_part(i: u32, v: f32) {
    atomicStore(&part[i], bitcast<u32>(v));
}

fn load_part(i: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&part[i]));
}

// Eight cache elements e … e+7 (e a multiple of 8) in 16-byte loads.
struct Vec8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn load8(e: u32, values: bool) -> Vec8 {
    if KV_F16 == 1u {
        var w: vec4<u32>;
        if values {
            w = vcache[e >> 3u];
        } else {
            w = kcache[e >> 3u];
        }
        return Vec8(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
    }
    if values {
        return Vec8(bitcast<vec4<f32>>(vcache[e >> 2u]), bitcast<vec4<f32>>(vcache[(e >> 2u) + 1u]));
    }
    return Vec8(bitcast<vec4<f32>>(kcache[e >> 2u]), bitcast<vec4<f32>>(kcache[(e >> 2u) + 1u]));
}

fn combine(a: f32, b: f32, is_max: bool) -> f32 {
    return select(a + b, max(a, b), is_max);
}

// reduce returns, to every thread, the max or the sum over the workgroup's
// threads of v[hh], for every head hh. All threads call it (it holds
// barriers); the first barrier also publishes what they wrote before.
fn reduce(lid: u32, v: array<f32, GROUP>, is_max: bool) -> array<f32, GROUP> {
    var mine = v; // naga indexes a value only by constants, a variable by anything
    for (var hh = 0u; hh < GROUP; hh++) {
        red[hh * WG + lid] = mine[hh];
    }
    workgroupBarrier();
    if lid < GROUP * RG { // partial g of head hh folds threads g, g + RG, …
        let hh = lid / RG;
        let at = hh * WG + lid % RG;
        var acc = red[at];
        for (var i = 1u; i < 16u; i++) {
            acc = combine(acc, red[at + i * RG], is_max);
        }
        red2[lid] = acc;
    }
    workgroupBarrier();
    var r = array<f32, GROUP>();
    for (var hh = 0u; hh < GROUP; hh++) {
        var acc = red2[hh * RG];
        for (var g = 1u; g < RG; g++) {
            acc = combine(acc, red2[hh * RG + g], is_max);
        }
        r[hh] = acc;
    }
    return r;
}

// key_offset is the cache offset of kv head g's key (or value) at slot j
// of row t's sequence, through its block table.
fn key_offset(t: u32, g: u32, j: u32) -> u32 {
    return ((table[rows[t].seq * p.max_blocks + j / p.BS] * p.kv_heads + g) * p.BS + j % p.BS) * D;
}

// score_keys scores keys j0 + c (c = lid, lid + WG, … < n) of kv head g
// against row t's group of queries into sc, and their cache offsets into
// base, and returns the thread's maximum per head; with masked, a key the
// row does not see (visible) scores −inf; key0 is key j0 + lid's cache
// offset (key_offset), looked up by the caller. It is called with a constant
// masked, so that each call compiles to a loop of its own and a line
// row's has no test.
fn score_keys(t: u32, g: u32, j0: u32, n: u32, lid: u32, masked: bool, key0: u32) -> array<f32, GROUP> {
    var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
    let neg_inf = bitcast<f32>(neg_inf_bits);
    var m = array<f32, GROUP>();
    for (var hh = 0u; hh < GROUP; hh++) {
        m[hh] = neg_inf;
    }
    for (var c = lid; c < n; c += WG) {
        let j = j0 + c;
        var b = key0;
        if c != lid {
            b = key_offset(t, g, j);
        }
        base[c] = b;
        // Explicitly zeroed: the bundled naga zeroes an uninitialized
        // variable once per invocation, not at each loop iteration.
        var acc = array<f32, GROUP>();
        for (var d = 0u; d < D; d += 8u) {
            let k = load8(b + d, false);
            for (var hh = 0u; hh < GROUP; hh++) {
                let qi = (hh * D + d) >> 2u;
                acc[hh] += dot(qs[qi], k.lo) + dot(qs[qi + 1u], k.hi);
            }
        }
        let seen = !masked || visible(rows[t], j);
        for (var hh = 0u; hh < GROUP; hh++) {
            let score = select(neg_inf, acc[hh] * p.scale, seen);
            sc[hh * CHUNK + c] = score;
            m[hh] = max(m[hh], score);
        }
    }
    return m;
}

// stage_input is INPUT's start (all threads call it; it holds barriers):
// the group's query heads of row t normalized and rotated into qs, and,
// in the workgroup whose split (from slot j0 on) holds the row's slot, kv
// head g's key normalized and rotated and its value appended to the cache
// at that slot. Each thread holds pairs (i, i + D/2), i = lid, lid + WG, …
// of every head vector.
fn stage_input(t: u32, g: u32, lid: u32, j0: u32) {
    let row = t * (p.heads + 2u * p.kv_heads) * D;
    let h0 = g * GROUP;
    let slot = rows[t].slot;
    let half = D / 2u;
    var at = array<RopeAt, IP>();
    var atk = array<RopeAt, IP>();
    var x1: array<array<f32, IP>, GROUP>;
    var x2: array<array<f32, IP>, GROUP>;
    var k1 = array<f32, IP>();
    var k2 = array<f32, IP>();
    var ss = array<f32, GROUP>();
    var ssk = array<f32, GROUP>(); // the key's in element 0 (reduce takes GROUP values)
    for (var j = 0u; j < IP; j++) {
        let i = min(lid + j * WG, half - 1u); // threads past half repeat the last pair, counted 0
        let w = select(0.0, 1.0, lid + j * WG < half);
        at[j] = rope_at(i, t, true, D);
        atk[j] = rope_at(i, t, false, D);
        for (var hh = 0u; hh < GROUP; hh++) {
            let src = row + (h0 + hh) * D + i;
            x1[hh][j] = q[src];
            x2[hh][j] = q[src + half];
            ss[hh] += w * (x1[hh][j] * x1[hh][j] + x2[hh][j] * x2[hh][j]);
        }
        let src = row + (p.heads + g) * D + i;
        k1[j] = q[src];
        k2[j] = q[src + half];
        ssk[0] += w * (k1[j] * k1[j] + k2[j] * k2[j]);
    }
    for (var i = lid; i < D; i += WG) {
        kv_new[D + i] = q[row + (p.heads + p.kv_heads + g) * D + i];
    }
    ss = reduce(lid, ss, false);
    let sk = reduce(lid, ssk, false)[0];
    for (var j = 0u; j < IP; j++) {
        let i = lid + j * WG;
        if i < half {
            for (var hh = 0u; hh < GROUP; hh++) {
                let inv = 1.0 / sqrt(ss[hh] / f32(D) + p.eps);
                let y = rotate_pair(x1[hh][j], x2[hh][j], inv, at[j]);
                let e = hh * D + i;
                qs[e >> 2u][e & 3u] = y.x;
                qs[(e + half) >> 2u][(e + half) & 3u] = y.y;
            }
            let y = rotate_pair(k1[j], k2[j], 1.0 / sqrt(sk / f32(D) + p.eps), atk[j]);
            kv_new[i] = y.x;
            kv_new[i + half] = y.y;
        }
    }
    workgroupBarrier();
    // The append: KW words of the key and of the value.
    if slot >= j0 && slot < j0 + CHUNK {
        let w0 = key_offset(t, g, slot) >> (2u + KV_F16);
        for (var w = lid; w < 2u * KW; w += WG) {
            let kv = w / KW; // 0: the key, 1: the value
            let e = kv * D + (w % KW) * (4u << KV_F16);
            var word: vec4<u32>;
            if KV_F16 == 1u {
                word = vec4<u32>(pack2x16float(vec2<f32>(kv_new[e], kv_new[e + 1u])), pack2x16float(vec2<f32>(kv_new[e + 2u], kv_new[e + 3u])),
                    pack2x16float(vec2<f32>(kv_new[e + 4u], kv_new[e + 5u])), pack2x16float(vec2<f32>(kv_new[e + 6u], kv_new[e + 7u])));
            } else {
                word = bitcast<vec4<u32>>(vec4<f32>(kv_new[e], kv_new[e + 1u], kv_new[e + 2u], kv_new[e + 3u]));
            }
            if kv == 0u {
                kcache[w0 + w % KW] = word;
            } else {
                vcache[w0 + w % KW] = word;
            }
        }
    }
    storageBarrier();
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let s = wid.y;
    let t = wid.z;
    let h0 = g * GROUP;                  // first query head of the group
    let L = rows[t].slot + 1u;           // context length of row t
    let tree0 = rows[t].base;            // keys from here on go by the row's mask: none for a line row (its base is L)
    let j0 = s * CHUNK;
    let n = select(0u, min(CHUNK, L - j0), j0 < L); // keys of this split: 0 past the context

    // The cache offset of the thread's first key, looked up before the
    // queries are staged, so that the block table's read waits on memory
    // beside theirs rather than after the barrier.
    var key0 = 0u;
    if lid < n {
        key0 = key_offset(t, g, j0 + lid);
    }
    if INPUT == 1u {
        stage_input(t, g, lid, j0);
    } else {
        for (var i = lid; i < GROUP * D; i += WG) {
            qs[i >> 2u][i & 3u] = q[(t * p.heads + h0) * D + i];
        }
    }
    workgroupBarrier();

    // Scores, and each thread's maximum per head: through the mask only
    // where a key of the split passes the row's base (never for a line
    // row, whose loop has no test).
    var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
    let neg_inf = bitcast<f32>(neg_inf_bits);
    var m: array<f32, GROUP>;
    if j0 + n > tree0 {
        m = score_keys(t, g, j0, n, lid, true, key0);
    } else {
        m = score_keys(t, g, j0, n, lid, false, key0);
    }
    m = reduce(lid, m, true);

    // exp(score − m) in place, and each thread's sum per head; against 0
    // where the row sees no key of the split (m = −inf, every score −inf:
    // every weight 0).
    var mz = array<f32, GROUP>();
    for (var hh = 0u; hh < GROUP; hh++) {
        mz[hh] = select(m[hh], 0.0, m[hh] == neg_inf);
    }
    var l = array<f32, GROUP>();
    for (var c = lid; c < n; c += WG) {
        for (var hh = 0u; hh < GROUP; hh++) {
            let e = exp(sc[hh * CHUNK + c] - mz[hh]);
            sc[hh * CHUNK + c] = e;
            l[hh] += e;
        }
    }
    l = reduce(lid, l, false); // its first barrier also publishes sc

    // Values: thread (kp, lane) sums elements 8·lane … 8·lane+7 of the
    // values of keys kp, kp + KP, … for every head (threads past KP·LANES,
    // when LANES does not divide WG, idle), VB keys a round.
    let lane = lid % LANES;
    let kp = lid / LANES;
    var o = array<Vec8, GROUP>();
    if kp < KP && n > 0u {
        for (var c0 = kp; c0 < n; c0 += KP * VB) {
            var v: array<Vec8, VB>;
            for (var i = 0u; i < VB; i++) {
                v[i] = load8(base[min(c0 + i * KP, n - 1u)] + 8u * lane, true);
            }
            for (var i = 0u; i < VB; i++) {
                let c = c0 + i * KP;
                for (var hh = 0u; hh < GROUP; hh++) {
                    let e = select(0.0, sc[hh * CHUNK + min(c, CHUNK - 1u)], c < n);
                    o[hh].lo += e * v[i].lo;
                    o[hh].hi += e * v[i].hi;
                }
            }
        }
    }
    // Add up the KP key slots' sums in workgroup memory, a slot a round.
    for (var k = 0u; k < KP; k++) {
        if kp == k {
            for (var hh = 0u; hh < GROUP; hh++) {
                if k == 0u {
                    ov[hh][lane] = o[hh];
                } else {
                    let w = ov[hh][lane];
                    ov[hh][lane] = Vec8(w.lo + o[hh].lo, w.hi + o[hh].hi);
                }
            }
        }
        workgroupBarrier();
    }

    if DIRECT == 1u { // one split: the output itself, o / l
        var nan_bits = 0x7fc00000u; // a var: Chrome rejects a constant NaN
        let beyond = L > CHUNK;     // a context the split does not cover: NaN, as attention_merge.wgsl
        for (var i = lid; i < GROUP * D; i += WG) {
            let hh = i / D;
            let d = i % D;
            let w = ov[hh][d / 8u];
            let o = select(w.hi, w.lo, d % 8u < 4u)[d % 4u] / l[hh];
            out[(t * p.heads + h0) * D + i] = select(o, bitcast<f32>(nan_bits), beyond);
        }
        return;
    }

    // Write o, m, l of each head.
    let stride = p.splits * PS;                                    // to the next head
    let first = p.part0 + (t * p.heads + h0) * p.splits * PS;      // split 0 of head h0
    let out0 = first + s * PS;                                     // this split
    for (var i = lid; i < GROUP * D; i += WG) {
        let hh = i / D;
        let d = i % D;
        let w = ov[hh][d / 8u];
        store_part(out0 + hh * stride + d, select(w.hi, w.lo, d % 8u < 4u)[d % 4u]);
    }
    if lid == 0u {
        for (var hh = 0u; hh < GROUP; hh++) {
            store_part(out0 + hh * stride + D, m[hh]);
            store_part(out0 + hh * stride + D + 1u, l[hh]);
        }
    }
    if MERGE == 0u {
        return;
    }

    // The last split to arrive merges.
    let count = t * p.kv_heads + g;
    storageBarrier(); // release: the partials above before the arrival
    if lid == 0u {
        is_last = atomicAdd(&part[count], 1u) == p.splits - 1u;
    }
    if !workgroupUniformLoad(&is_last) {
        return;
    }
    storageBarrier(); // acquire: the other splits' partials after their arrivals
    for (var i = lid; i < GROUP * p.splits; i += WG) {
        let hh = i / p.splits;
        let at = first + hh * stride + (i % p.splits) * PS + D;
        ms[hh][i % p.splits] = load_part(at);
        ls[hh][i % p.splits] = load_part(at + 1u);
    }
    workgroupBarrier();
    // M, the denominator and each split's weight, as attention_merge.wgsl.
    var M = array<f32, GROUP>();
    var den = array<f32, GROUP>();
    for (var hh = 0u; hh < GROUP; hh++) {
        M[hh] = ms[hh][0];
        for (var s2 = 1u; s2 < p.splits; s2++) {
            M[hh] = max(M[hh], ms[hh][s2]);
        }
        for (var s2 = 0u; s2 < p.splits; s2++) {
            den[hh] += exp(ms[hh][s2] - M[hh]) * ls[hh][s2];
        }
    }
    workgroupBarrier();
    for (var i = lid; i < GROUP * p.splits; i += WG) {
        let hh = i / p.splits;
        ms[hh][i % p.splits] = exp(ms[hh][i % p.splits] - M[hh]);
    }
    workgroupBarrier();
    // Each thread's OUTS outputs, SB splits' values loaded at once.
    var num = array<f32, OUTS>();
    for (var s0 = 0u; s0 < p.splits; s0 += SB) {
        var v: array<array<f32, SB>, OUTS>;
        for (var r = 0u; r < OUTS; r++) {
            let i = min(lid + r * WG, GROUP * D - 1u);
            for (var j = 0u; j < SB; j++) {
                v[r][j] = load_part(first + (i / D) * stride + min(s0 + j, p.splits - 1u) * PS + i % D);
            }
        }
        for (var r = 0u; r < OUTS; r++) {
            let hh = min(lid + r * WG, GROUP * D - 1u) / D;
            for (var j = 0u; j < SB; j++) {
                if s0 + j < p.splits {
                    num[r] += ms[hh][s0 + j] * v[r][j];
                }
            }
        }
    }
    var nan_bits = 0x7fc00000u;
    let beyond = L > p.splits * CHUNK; // as attention_merge.wgsl
    for (var r = 0u; r < OUTS; r++) {
        let i = lid + r * WG;
        if i < GROUP * D {
            out[(t * p.heads + h0) * D + i] = select(num[r] / den[i / D], bitcast<f32>(nan_bits), beyond);
        }
    }
    if lid == 0u {
        atomicStore(&part[count], 0u); // for the next dispatch
    }
}
