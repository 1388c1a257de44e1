// prelude.wgsl: what several kernels share, written once. Package shaders
// appends to each kernel the items of this file that the kernel uses (and
// those they use in turn), after the kernel's own text, so that a
// compiler's line numbers stay the kernel file's. An item may use names the
// kernel declares — scale reads the kernel's `scales` binding, split_sum its
// `part` binding, its params `p` and its SB; sum_all, scan and hit reduce
// through its workgroup arrays red_f (and red_u, red_v) of WG values, scan
// leaving each thread's sums in its private at_excl and at_incl, hit
// reading them; stats reads its `sampled`, `logits` and `temps` with its
// S_WORDS, S_NAN and F32_MAX, and returns its modes SAMPLED, GREEDY and
// SKIP; both take NONE from it —, so it is appended only where it is used.
// One item a paragraph: its comment, then one declaration, with no blank
// line inside.

// MatMulParams are the params of the matmul kernels over whole weight rows
// that never split K (matmul_rowtile.wgsl, matvec_int4.wgsl).
struct MatMulParams {
    T: u32,          // activation rows
    N: u32,          // output features (rows of W) in this call
    K: u32,          // input features
    G: u32,          // int4 group size (unused by the dense weights)
    ldo: u32,        // row stride of out, ≥ N
    accumulate: u32, // 1: add into out
    eps: f32,        // RMSNorm's epsilon (NORM = 1)
    magic: u32,      // MAGIC, for codes_in_place (matvec_int4.wgsl)
}

// SplitParams are the params of the matmul kernels that may split K across
// workgroups (gemm_int4.wgsl, skinny_int4.wgsl, matvec_batch_int4.wgsl); with splits > 1 they write
// partial sums for matmul_reduce.wgsl (or qkv_rope_kv.wgsl) instead of out.
struct SplitParams {
    T: u32,          // activation rows
    N: u32,          // output features (rows of W) in this call
    K: u32,          // input features, a multiple of 32
    G: u32,          // group size, a multiple of 32
    ldo: u32,        // row stride of out, ≥ N (splits = 1)
    accumulate: u32, // 1: add into out (splits = 1)
    eps: f32,        // RMSNorm's epsilon (norm, splits = 1)
    splits: u32,     // workgroups along K (grid z)
    kps: u32,        // inputs per split
    swiglu: u32,     // 1: x is gate | up, and the input silu(gate)·up (skinny_int4.wgsl; gemm_int4.wgsl takes SWIGLU)
    norm: u32,       // 1: the input is rmsnorm(x) · g (skinny_int4.wgsl; gemm_int4.wgsl takes NORM)
    magic: u32,      // MAGIC, for codes_in_place (skinny_int4.wgsl, matvec_batch_int4.wgsl)
    msplits: u32,    // MERGE: attention_decode.wgsl's splits the input merges (matvec_batch_int4.wgsl)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// EmbedParams are the params of the embedding gathers (embed.wgsl).
struct EmbedParams {
    T: u32,    // tokens
    V: u32,    // rows of the table
    K: u32,    // columns, a multiple of 8 (and of G for int4)
    G: u32,    // int4 group size (unused by the dense tables)
    row0: u32, // first row of the table bound
    n: u32,    // rows bound
    _pad0: u32,
    _pad1: u32,
}

// WordsParams are the params of the kernels over n 16-byte words of a
// buffer (copy.wgsl; bench's stream_read.wgsl).
struct WordsParams {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// swiglu is Qwen3's MLP activation silu(g) · u, silu(g) = g / (1 + exp(−g)).
fn swiglu(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    return g / (1.0 + exp(-g)) * u;
}

// input4 returns vec4 j of activation row `row` of a matmul's input: the
// kernel's `x` binding (vec4s of p.K values a row), or, with the kernel's
// SWIGLU = 1, silu(gate) · up from the (T, 2K) gate|up row.
fn input4(row: u32, j: u32) -> vec4<f32> {
    if SWIGLU == 1u {
        let g = row * (p.K / 2u) + j; // gate; up is K/4 vec4s further
        return swiglu(x[g], x[g + p.K / 4u]);
    }
    return x[row * (p.K / 4u) + j];
}

// scale returns the i-th f16 of the kernel's `scales` binding, read as u32
// pairs (no shader-f16 needed): the low half of word i/2 when i is even,
// the high half when odd.
fn scale(i: u32) -> f32 {
    let pair = unpack2x16float(scales[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

// MAGIC is the bits of 2²³: a 4-bit code ORed into it is the float 2²³ +
// code, exactly — int4 codes become floats without an int→float
// conversion (a quarter-rate instruction).
const MAGIC: u32 = 0x4B000000u;

// BIAS is 2²³ + 8: bitcast(MAGIC | code) − BIAS is code − 8, the code's
// signed value.
const BIAS: f32 = 8388616.0;

// codes returns the four int4 codes of nibbles shift/4 … shift/4+3 of word
// w, minus 8, as floats (the exponent trick: MAGIC, BIAS).
fn codes(w: u32, shift: u32) -> vec4<f32> {
    let n = (vec4<u32>(w) >> vec4<u32>(shift, shift + 4u, shift + 8u, shift + 12u)) & vec4<u32>(15u);
    return bitcast<vec4<f32>>(n | vec4<u32>(MAGIC)) - BIAS;
}

// codes_in_place returns the four codes in bits 0–15 of h, minus 8, each
// times 16^e for its place e — (h & 0xF·16^e | MAGIC) − (2²³ + 8·16^e),
// exact, with no shift (codes shifts each code down first). A kernel that
// uses it stages its input scaled by 16^−e (PLACE, exact) to match, so
// that each product is the same float as the code's times the input's (the
// scale's product too: scaling by a power of two commutes with rounding).
// magic is MAGIC, not the constant, so that the driver cannot fold it into
// the mask: NVIDIA's three-input LOP3 takes one immediate or constant-bank
// operand, so with both constant the AND and the OR are two instructions a
// code. Taken from the params (in the constant bank) they still are; a
// kernel that passes it through workgroup memory holds it in a register,
// and the AND-OR is one LOP3 (matvec_batch_int4.wgsl; `lab/nvsass`,
// BENCHMARKS.md).
fn codes_in_place(h: u32, magic: u32) -> vec4<f32> {
    let n = vec4<u32>(h) & vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u);
    return bitcast<vec4<f32>>(n | vec4<u32>(magic)) - PLACE_BIAS;
}

// PLACE is 16^−e for column e of four: what codes_in_place's inputs are
// scaled by.
const PLACE: vec4<f32> = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);

// PLACE_BIAS is 2²³ + 8·16^e for column e of four (codes_in_place).
const PLACE_BIAS: vec4<f32> = vec4<f32>(8388616.0, 8388736.0, 8390656.0, 8421376.0);

// swizzle places vec4 j = 8v + m of a row staged in workgroup memory at 8v
// + (m + v) % 8: the eight lanes of a quarter-warp that read the same m of
// eight consecutive v at once would otherwise all fall in one bank quad (a
// stride of 128 bytes). The weights' own order stays fixed, so no register
// is indexed by a lane-dependent value (which would send the vector to
// local memory).
fn swizzle(j: u32) -> u32 {
    return (j & ~7u) | ((j + (j >> 3u)) & 7u);
}

// swizzle_at is swizzle(8v + m) for m < 8, computed as a kernel's loop over
// m wants it: 8v once, then one add and one AND-OR a vec4.
fn swizzle_at(v: u32, m: u32) -> u32 {
    return (v << 3u) | ((v + m) & 7u);
}

// split_sum returns Σ_{s < p.splits} part[at + s·stride] over the kernel's
// `part` binding (a split-K matmul's partial sums), in split order, loading
// SB values before it adds any: splits is a param, and a plain loop to it
// goes one load at a time.
fn split_sum(at: u32, stride: u32) -> f32 {
    var v = 0.0;
    for (var s0 = 0u; s0 < p.splits; s0 += SB) {
        var x: array<f32, SB>;
        for (var i = 0u; i < SB; i++) {
            x[i] = part[at + min(s0 + i, p.splits - 1u) * stride];
        }
        for (var i = 0u; i < SB; i++) {
            if s0 + i < p.splits {
                v += x[i];
            }
        }
    }
    return v;
}

// Row is how one row of a batch sits in its sequence's KV cache (package
// treemask): the table row of its sequence, the cache slot its key and
// value go to, the position RoPE rotates it at, and the slots its
// attention reads — every slot below base, and slot base + i where bit i
// of its mask is set (mask_lo holds bits 0 … 31, mask_hi bits 32 … 63) —
// among slots 0 … slot. A line token at slot s is {pos: s, base: s + 1,
// mask 0} (causal); a token-tree node is rotated at its depth's position
// and sees the line below base and its ancestors, itself included. Package
// kernels writes them (PutRow).
struct Row {
    seq: u32,
    slot: u32,
    pos: u32,
    base: u32,
    mask_lo: u32,
    mask_hi: u32,
}

// line_row is a line token's row at position pos of the sequence in table
// row seq (kernels.PutRow with treemask.LineRow): its slot the position,
// every slot before it visible.
fn line_row(seq: u32, pos: u32) -> Row {
    return Row(seq, pos, pos, pos + 1u, 0u, 0u);
}

// visible reports whether row r's attention reads slot j (j ≤ r.slot):
// j < r.base, else bit j − r.base of its mask. A line row decides at the
// first comparison, so the mask costs it nothing.
fn visible(r: Row, j: u32) -> bool {
    if j < r.base {
        return true;
    }
    let i = j - r.base;
    let word = select(r.mask_lo, r.mask_hi, i >= 32u);
    return i < 64u && ((word >> (i & 31u)) & 1u) == 1u;
}

// TREE_SHAPE_WORDS are the u32 words of a sequence's shape for the token
// tree drafted on the device (tree_expand.wgsl, tree_select.wgsl).
const TREE_SHAPE_WORDS: u32 = 8u;

// TREE_STATE_WORDS are the u32 words of a sequence's drafting state: its
// node count and its frontier (tree_expand.wgsl).
const TREE_STATE_WORDS: u32 = 32u;

// TREE_NODE_WORDS are the u32 words of a node of a token tree drafted on
// the device (tree_expand.wgsl's nodes).
const TREE_NODE_WORDS: u32 = 10u;

// TREE_FEED_ROWS are the rows of a sequence's feed: the tree rows a pass
// gathers (treemask.MaxNodes).
const TREE_FEED_ROWS: u32 = 64u;

// tree_node is the first word of node k in sequence s's node table, of p.C
// nodes a sequence.
fn tree_node(s: u32, k: u32) -> u32 {
    return (s * p.C + k) * TREE_NODE_WORDS;
}

// sum_all returns the sum of the threads' values.
fn sum_all(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    red_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            red_f[lid] += red_f[lid + stride];
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&red_f[0]);
}

// Stats is what e_of needs of a row from sample.wgsl's read-out.
struct Stats {
    m: f32,      // the largest logit
    theta: f32,  // the kept tokens' smallest scaled logit
    T: f32,
    inv_t: f32,  // 1 / T
    argmax: u32,
    mode: u32,   // SAMPLED, GREEDY or SKIP
}

// stats reads row r's Stats.
fn stats(r: u32) -> Stats {
    let o = r * S_WORDS;
    let a = sampled[o];
    if (sampled[o + 2u] & S_NAN) != 0u || a >= p.V {
        return Stats(0.0, 0.0, 1.0, 1.0, NONE, SKIP);
    }
    let m = logits[r * p.V + a];
    let T = temps[r].x;
    if !(m > -F32_MAX) { // every logit −∞: no distribution
        return Stats(m, 0.0, 1.0, 1.0, a, SKIP);
    }
    if !(T > 0.0) {
        return Stats(m, 0.0, 1.0, 1.0, a, GREEDY);
    }
    return Stats(m, bitcast<f32>(sampled[o + 3u]), T, 1.0 / T, a, SAMPLED);
}

// e_of is e_i, token i's weight before normalization: l its logit. The
// kept test is sample.wgsl's expression, so that the tokens kept are those
// its θ was found over (the token at θ is kept here as there, however an
// adapter's division rounds); the exponent is a product, a division's worth
// of instructions less.
fn e_of(s: Stats, l: f32, i: u32) -> f32 {
    if s.mode == GREEDY {
        return select(0.0, 1.0, i == s.argmax);
    }
    if s.mode == SAMPLED && l / s.T >= s.theta {
        return exp((l - s.m) * s.inv_t);
    }
    return 0.0;
}

// scan sums the threads' values in thread order (Hillis–Steele), leaving
// each thread's sums before and through it in at_excl and at_incl, and
// returns the total.
fn scan(lid: u32, own: f32) -> f32 {
    workgroupBarrier();
    red_f[lid] = own;
    workgroupBarrier();
    for (var stride = 1u; stride < WG; stride <<= 1u) {
        var v = red_f[lid];
        if lid >= stride {
            v += red_f[lid - stride];
        }
        workgroupBarrier();
        red_f[lid] = v;
        workgroupBarrier();
    }
    at_incl = red_f[lid];
    at_excl = at_incl - own;
    return workgroupUniformLoad(&red_f[WG - 1u]);
}

// hit returns, after scan, (the thread whose run the goal falls in, or the
// last thread with a value when rounding carries the goal past the end;
// 1 if any thread has a value, else 0), in one reduction of two values.
fn hit(lid: u32, own: f32, goal: f32) -> vec2<u32> {
    workgroupBarrier();
    red_u[lid] = select(NONE, lid, own > 0.0 && at_excl <= goal && goal < at_incl);
    red_v[lid] = select(0u, lid + 1u, own > 0.0); // 1 + the thread; 0: no value
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            red_u[lid] = min(red_u[lid], red_u[lid + stride]);
            red_v[lid] = max(red_v[lid], red_v[lid + stride]);
        }
        workgroupBarrier();
    }
    let h = workgroupUniformLoad(&red_u[0]);
    let last = workgroupUniformLoad(&red_v[0]);
    if last == 0u {
        return vec2<u32>(0u, 0u);
    }
    return vec2<u32>(select(last - 1u, h, h != NONE), 1u);
}

// reduced returns pos·f minus the nearest multiple of 2π, RoPE's angle
// brought near zero for sin and cos (qkv_rope_kv.wgsl's header). 2π = HI
// + LO, where HI = 6.28125 has 8 significant bits, so k·HI is exact for k <
// 2^16.
fn reduced(pos: u32, f: f32) -> f32 {
    let a = f32(pos) * f;
    let kk = round(a * 0.15915494309189535);
    return (a - kk * 6.28125) - kk * 0.0019353071795864769;
}

// RopeAt is what RoPE and the q/k norm need of pair i of a head vector
// besides its values: the norm's weights (where p.qk_norm) and the
// rotation's cos and sin at the row's position.
struct RopeAt {
    w1: f32,
    w2: f32,
    c: f32,
    s: f32,
}

// rope_at loads and computes pair i's RopeAt for row t (a query head's
// when is_q, else a key head's). The kernels call it before their values
// are ready, ahead of their barriers, so that its loads (consts, the row's
// position) wait on memory beside the values' rather than after them.
fn rope_at(i: u32, t: u32, is_q: bool, D: u32) -> RopeAt {
    let w0 = select(D, 0u, is_q); // q_norm or k_norm
    var r = RopeAt(1.0, 1.0, 1.0, 0.0);
    if p.qk_norm != 0u {
        r.w1 = consts[w0 + i];
        r.w2 = consts[w0 + i + D / 2u];
    }
    let a = reduced(rows[t].pos, consts[2u * D + i]);
    r.c = cos(a);
    r.s = sin(a);
    return r;
}

// rope_store finishes pair i of head vector h of row t — x1 = y[i],
// x2 = y[i + D/2], inv the vector's 1/rms, at its RopeAt —: rotate_pair,
// then into q for a query head, else into the workgroup's `head` (for
// store_head).
fn rope_store(x1: f32, x2: f32, inv: f32, at: RopeAt, i: u32, t: u32, h: u32, is_q: bool, D: u32) {
    let half = D / 2u;
    let y = rotate_pair(x1, x2, inv, at);
    if is_q {
        let dst = (t * p.heads + h) * D;
        q[dst + i] = y.x;
        q[dst + i + half] = y.y;
    } else {
        head[i] = y.x;
        head[i + half] = y.y;
    }
}

// rotate_pair is pair (x1, x2) of a head vector — y[i], y[i + D/2], inv
// the vector's 1/rms — normalized by its weights where p.qk_norm and
// rotated at its RopeAt (the normalized value rounded to f32 first, as
// reference.RMSNorm then reference.Rope).
fn rotate_pair(x1: f32, x2: f32, inv: f32, at: RopeAt) -> vec2<f32> {
    var n1 = x1;
    var n2 = x2;
    if p.qk_norm != 0u {
        n1 = at.w1 * (x1 * inv);
        n2 = at.w2 * (x2 * inv);
    }
    return vec2<f32>(n1 * at.c - n2 * at.s, n2 * at.c + n1 * at.s);
}

// head_slot is the cache offset (in elements) of kv head kvh of row t's
// slot: its block from the sequence's block table (the layout in
// qkv_rope_kv.wgsl's header). Like rope_at, the kernels call it early.
fn head_slot(t: u32, kvh: u32, D: u32) -> u32 {
    let j = rows[t].slot;
    let block = table[rows[t].seq * p.max_blocks + j / p.BS];
    return ((block * p.kv_heads + kvh) * p.BS + j % p.BS) * D;
}

// store_head writes the kernel's workgroup `head` (D values) to cache
// offset dst (head_slot) — into vcache when is_v, else kcache —, packed in
// f16 pairs where KV_F16. The kernel's threads (WG) share the writes.
fn store_head(lid: u32, dst: u32, is_v: bool, D: u32) {
    if KV_F16 == 1u {
        for (var i = 2u * lid; i < D; i += 2u * WG) {
            let v = pack2x16float(vec2<f32>(head[i], head[i + 1u]));
            if is_v {
                vcache[(dst + i) >> 1u] = v;
            } else {
                kcache[(dst + i) >> 1u] = v;
            }
        }
        return;
    }
    for (var i = lid; i < D; i += WG) {
        if is_v {
            vcache[dst + i] = bitcast<u32>(head[i]);
        } else {
            kcache[dst + i] = bitcast<u32>(head[i]);
        }
    }
}

// slice_sums sums workgroup wid's weight rows (ROWS from wid.x · ROWS, RT
// a thread, LANES threads a row group) over its slice of K (grid z) for
// activation rows t0 … t0 + TT − 1 (rows past p.T repeat the last), as
// matvec_batch_int4.wgsl's header describes the loop: after it,
// partial[(t·ROWS + rr)·LANES + lane] holds the sum of lane `lane` of the
// workgroup's weight row rr for activation row t0 + t and, with NORM,
// ssq[t] the slice's sum of squares of that row (both published by a
// barrier).
// All threads call it. The kernel declares the layout's constants (LANES,
// ROWS, RT, WG, TT, KC, NORM and those derived from them as
// matvec_batch_int4.wgsl does), the workgroup arrays xs, partial, sumsq and
// ssq, the bindings qweight and scales, params p with T, N, K, G, kps and
// magic, staged4 (vec4 j of activation row `row` of the input before the
// norm: input4's, or another the kernel computes) and input_norm4 (vec4 i
// of the norm's weight).
fn slice_sums(wid: vec3<u32>, lid: u32, t0: u32) {
    let lane = lid % LANES;
    let g = lid / LANES;                 // this thread's row group: weight rows g·RT … g·RT + RT − 1 of the workgroup's
    let kbeg = wid.z * p.kps;            // this workgroup's slice of K
    let kend = min(p.K, kbeg + p.kps);
    let row_vec4s = p.K / 32u;
    let groups = p.K / p.G;
    let vec4s_per_group = p.G / 32u;
    // MAGIC, from the params, passed through workgroup memory (partial's
    // first word, unused until the end) so that the driver keeps it in a
    // register: then each code's mask and OR can be one three-input LOP3
    // (an immediate mask and two registers), where with MAGIC in the
    // constant bank they took two.
    if lid == 0u {
        partial[0] = bitcast<f32>(p.magic);
    }
    var acc = array<f32, RTT>();  // acc[r·TT + t]: weight row g·RT + r, activation row t
    var ss = vec4<f32>(); // NORM: row t's sum of squares of what this thread staged, in ss[t]
    var wq: array<vec4<u32>, WR>; // this thread's weights of a chunk: [j·RT + r]
    var wscale: array<f32, WR>;   // and their scales
    for (var c0 = kbeg; c0 < kend; c0 += KC) {
        let kc4 = min(KC, kend - c0) / 4u; // vec4s of x' per row in this chunk
        // This thread's weights of the chunk, loaded first: they do not
        // depend on x', so their latency hides behind its staging. Rows
        // past N repeat row N − 1 (never written).
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                let gv = c0 / 32u + v; // the vec4's index within the row
                for (var r = 0u; r < RT; r++) {
                    let n = min(wid.x * ROWS + g * RT + r, p.N - 1u);
                    wq[j * RT + r] = qweight[n * row_vec4s + gv];
                    wscale[j * RT + r] = scale(n * groups + gv / vec4s_per_group);
                }
            }
        }
        // Stage x'[t][c0 … c0+kc) for t < TT; rows past T repeat row T-1.
        // One loop of a fixed count over the (t, q) slots, so that the
        // driver unrolls it and issues all of a thread's loads at once (a
        // loop over t around one over q to kc4 waits for each load in
        // turn).
        for (var i = 0u; i < SPT; i++) {
            let e = lid + i * WG;
            let t = e / (KC / 4u);
            let q = e % (KC / 4u); // the chunk's vec4 q = 8v + m
            if t < TT && q < kc4 {
                var v = staged4(min(t0 + t, p.T - 1u), c0 / 4u + q);
                if NORM == 1u {
                    // By select: ss indexed by t, a lane's value, would go
                    // to local memory.
                    ss += select(vec4<f32>(), vec4<f32>(dot(v, v)), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(t));
                    v *= input_norm4(c0 / 4u + q);
                }
                xs[8u * t + q % 8u][q / 8u] = v * PLACE;
            }
        }
        workgroupBarrier();
        let magic = bitcast<u32>(partial[0]);
        for (var j = 0u; j < WPT; j++) {
            let v = lane + j * LANES;
            if v < kc4 / 8u {
                // Each (weight row, activation row)'s products of the 32
                // columns in a vec4, one multiply-add a weight, added up
                // and scaled once after.
                var dots = array<vec4<f32>, RTT>();
                for (var m = 0u; m < 8u; m++) { // columns 32v + 4m … 32v + 4m + 3
                    var xv: array<vec4<f32>, TT>;
                    for (var t = 0u; t < TT; t++) {
                        xv[t] = xs[8u * t + m][v];
                    }
                    for (var r = 0u; r < RT; r++) {
                        let w = codes_in_place(wq[j * RT + r][m >> 1u] >> ((m & 1u) * 16u), magic);
                        for (var t = 0u; t < TT; t++) {
                            dots[r * TT + t] = fma(w, xv[t], dots[r * TT + t]);
                        }
                    }
                }
                for (var r = 0u; r < RT; r++) {
                    for (var t = 0u; t < TT; t++) {
                        let d = dots[r * TT + t];
                        acc[r * TT + t] += wscale[j * RT + r] * ((d.x + d.y) + (d.z + d.w));
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if NORM == 1u {
        // The threads' sums of squares: GROUPS threads add LANES each, then
        // one thread adds those (two barriers, not a tree's eight).
        for (var t = 0u; t < TT; t++) {
            partial[t * WG + lid] = ss[t];
        }
        workgroupBarrier();
        for (var i = lid; i < TT * GROUPS; i += WG) { // more than WG where a thread's lanes are few
            var v = 0.0;
            for (var l = 0u; l < LANES; l++) {
                v += partial[(i / GROUPS) * WG + (i % GROUPS) * LANES + l];
            }
            sumsq[i] = v;
        }
        workgroupBarrier();
        if lid < TT {
            var v = 0.0;
            for (var i = 0u; i < GROUPS; i++) {
                v += sumsq[lid * GROUPS + i];
            }
            ssq[lid] = v;
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < RT; r++) {
        for (var t = 0u; t < TT; t++) {
            partial[(t * ROWS + g * RT + r) * LANES + lane] = acc[r * TT + t];
        }
    }
    workgroupBarrier();
}

// row_sum adds up the LANES partial sums of activation row t and weight
// row rr of the workgroup (after slice_sums).
fn row_sum(t: u32, rr: u32, lid: u32) -> f32 {
    var v = 0.0;
    for (var l = 0u; l < LANES; l++) {
        v += partial[(t * ROWS + rr) * LANES + ((l + lid) % LANES)];
    }
    return v;
}

// mix32 is a 32-bit finalizer with full avalanche (lowbias32, Chris
// Wellons' hash prospector), as package sampling's.
fn mix32(x0: u32) -> u32 {
    var x = x0;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    x ^= x >> 16u;
    return x;
}

// position_key is the coupled key of the row deciding the token at
// position pos of a generation whose keys' seed words are (s0, s1):
// sampling.PositionKey, the two words the bits of floats in [0, 1) of 24
// random bits each.
fn position_key(s0: u32, s1: u32, pos: u32) -> vec2<u32> {
    let a = mix32(s0 ^ mix32(pos ^ mix32(s1 + 0x9e3779b9u)));
    let b = mix32(s1 ^ mix32(a ^ pos));
    return vec2<u32>(bitcast<u32>(f32(a >> 8u) * 5.9604645e-8), bitcast<u32>(f32(b >> 8u) * 5.9604645e-8));
}

// gumbel is token t's Gumbel noise under a coupled row's key (k0, k1) —
// sampling.Gumbel: −log E for the exponential variate E = −log(1 − w),
// w = (h + ½)·2⁻³² (at most the largest f32 below 1) for h, three keyed
// rounds of mix32 over t. Where w < 2⁻⁶, E is its series w + w²/2 + …
// (to w⁵/5: the rest is below f32's precision), not 1 − w's logarithm,
// whose absolute error there would swamp E: the upper tail, where a row's
// largest noisy logits come from, keeps f32's relative precision.
fn gumbel(k0: u32, k1: u32, t: u32) -> f32 {
    let h = mix32(mix32(mix32(t ^ k0) + k1) ^ k0);
    let w = min((f32(h) + 0.5) * 2.3283064e-10, 0.99999994);
    let series = w * (1.0 + w * (0.5 + w * (0.33333334 + w * (0.25 + w * 0.2))));
    let e = select(-log(1.0 - w), series, w < 0.015625);
    return -log(e);
}
