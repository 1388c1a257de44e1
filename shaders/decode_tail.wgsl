// decode_tail.wgsl: one row's decoder layer after attention, in one
// persistent dispatch — the four matrix-vector products that the dispatch
// path runs as four dispatches, separated here by grid barriers:
//   phase 0:  x  += W_o · attn                           (o_proj, residual)
//   phase 1:  gu  = W_gu · rmsnorm(x) · post_norm        (gate_proj | up_proj)
//   phase 2:  x  += W_d · (silu(gu[:I]) · gu[I:])        (down_proj, residual)
//   phase 3:  qkv = W_qkv · rmsnorm(x) · in_norm         (the next layer's
//             q|k|v projection; skipped when NQKV = 0, the last layer)
//   W[n][k] = (code(n, k) − 8) · scale(n, k / GS)        (CONTRACTS.md §2)
// rmsnorm(x) = x / sqrt(mean_k x[k]² + eps), applied as matvec_int4.wgsl
// does: x·norm is staged and the row's sum scaled by 1/rms.
//
// Why: at one row a decode step is a chain of small dependent dispatches,
// and on the H200 the boundary between two of them costs ~4.6 µs more than
// a barrier across the workgroups of one dispatch (BenchmarkGridSync in
// package gpu). This kernel trades three of those boundaries a layer for
// three grid barriers.
//
// The grid barrier is outside WebGPU's guarantees: a workgroup waits,
// polling an atomic, until every other has arrived, so all p.groups
// workgroups must be resident on the GPU at once (package kernels probes
// how many are, with this pipeline, before it uses it), and storageBarrier
// must order memory across the device (gpu.Device.DeviceScopeBarrier: naga
// emits a Device-scope OpControlBarrier, MEMBAR.SC.GPU on NVIDIA). Data
// that crosses a barrier (x, gu) is read and written with atomics, which
// go to the device's coherent cache. A workgroup that polls p.spins times
// in vain gives up: it counts a timeout in sync[2] and writes NaN into x,
// so the step's logits come out NaN and the host reports it.
//
// Barrier words (sync): [0] arrivals modulo p.groups — the last to arrive
// of a round subtracts p.groups, so the count is zero between dispatches
// and a round's early arrivals may land before the previous round's
// subtraction; [1] the generation, which the last arrival advances and the
// others wait on; [2] timeouts. With p.H = 0 the dispatch only passes one
// barrier (the host's probe of how many workgroups run at once).
//
// Memory across barriers: x is read and written with atomics (strong
// loads, past any stale L1 line). gu is written in phase 1 and first read
// in phase 2, so no SM can hold a stale line of it and plain loads see
// what the barrier made visible; it is the big one (2I values a
// workgroup).
//
// Buffers:
//   sync     3+ u32 words, above
//   x        (H) f32 as u32 bits, read and written (the hidden state)
//   attn     (QD) f32: the attention's output, o_proj's input
//   gu       (2I) f32, written then read: gate | up
//   qkv      (NQKV) f32, written
//   wo_q …   per matrix (N, K/32) vec4<u32> codes (column k's in bits
//            4(k%8)… of word (k%32)/8 of vec4 k/32) and (N, K/GS) f16
//            scales read as u32 pairs: o (H, QD), gate|up (2I, H),
//            down (H, I), the next layer's q|k|v (NQKV, H)
//   post_norm, in_norm  (H) f32 RMSNorm weights (in_norm: the next
//            layer's input_layernorm)
//
// Dispatch: (p.groups, 1, 1) workgroups of WG threads. In each phase a
// workgroup takes tiles of WG / LANES · rt weight rows, p.groups tiles
// apart: LANES threads share rt neighbouring rows and read their vec4s
// lane, lane + LANES, … (coalesced), wpt of them a row. The host picks rt
// a phase so that the tiles about match the workgroups — one round of
// loads a phase, every thread's loads in flight at once — within WR
// vec4s a thread (wpt · rt ≤ WR). A workgroup issues its tile's weight
// loads, then stages the phase's input in workgroup memory, KC values at a
// time — swizzled as in matvec_int4.wgsl — while they are in flight,
// multiplies with the exponent trick (bitcast(0x4B000000 | code) − (2²³ +
// 8) = code − 8), and sums each row's LANES partial sums in workgroup
// memory. A workgroup with no tile in a phase goes on to the barrier.
//
// Occupancy: every workgroup must be resident, and on the H200 NVIDIA's
// driver fits about 56 KB of workgroup memory an SM (1 KB → 16 workgroups
// an SM, 8 KB → 6, 12 KB → 4, 20–24 KB → 2, 28 KB or more → 1; measured),
// hence WG = 128 and the input staged in chunks of KC (~11 KB in all).
//
// wpt and rt are constants specialized by the host from the model's
// shapes; WR bounds the loops over a thread's weights, so that the
// register arrays are indexed by constants (see phase).

const WG: u32 = 128u;
const LANES: u32 = 32u;                // threads a row group (along K)
const KC: u32 = 2048u;                 // input values staged at a time, a multiple of 32 · LANES
const WPT_QD: u32 = 2u;                // code vec4s a lane a row at K = QD: ceil(QD / 32 / LANES)
const WPT_H: u32 = 2u;                 // … at K = H
const WPT_I: u32 = 6u;                 // … at K = I
const RT_O: u32 = 1u;                  // weight rows a thread: o_proj
const RT_GU: u32 = 6u;                 // gate|up
const RT_D: u32 = 1u;                  // down
const RT_QKV: u32 = 2u;                // the next q|k|v
const RTMAX: u32 = 6u;                 // the largest of the four, at least 2
const WR: u32 = 12u;                   // weight vec4s a thread holds: wpt · rt ≤ WR
const XS: u32 = KC / 4u;               // staged vec4s
const SPT: u32 = (XS + WG - 1u) / WG;  // staged vec4s a thread
const RED: u32 = WG * RTMAX;           // a tile's partial sums, or WG + 16 sums of squares

struct Params {
    H: u32,       // hidden size; 0: probe (one barrier, nothing else)
    QD: u32,      // o_proj's inputs (heads · head_dim)
    I: u32,       // intermediate size
    NQKV: u32,    // the next layer's q|k|v rows; 0: no phase 3
    GS: u32,      // int4 group size, a multiple of 32
    groups: u32,  // workgroups in the dispatch
    eps: f32,     // RMSNorm's epsilon
    spins: u32,   // polls a barrier waits at most
    phases: u32,  // bit k: run phase k (all four but in BenchmarkDecodeTail's breakdown)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> sync: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> x: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read> attn: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> gu: array<f32>;
@group(0) @binding(5) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(6) var<storage, read> wo_q: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> wo_s: array<u32>;
@group(0) @binding(8) var<storage, read> wgu_q: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> wgu_s: array<u32>;
@group(0) @binding(10) var<storage, read> wd_q: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> wd_s: array<u32>;
@group(0) @binding(12) var<storage, read> wqkv_q: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read> wqkv_s: array<u32>;
@group(0) @binding(14) var<storage, read> post_norm: array<vec4<f32>>;
@group(0) @binding(15) var<storage, read> in_norm: array<vec4<f32>>;

var<workgroup> xs: array<vec4<f32>, XS>;    // the phase's input
var<workgroup> red: array<f32, RED>;       // a tile's partial sums [row][lane]; the input's sums of squares
var<workgroup> gen: u32;                    // the barrier's generation, read by thread 0

const MAGIC: u32 = 0x4B000000u; // the bits of 2²³: a code ORed in is 2²³ + code
const BIAS: f32 = 8388616.0;    // 2²³ + 8
const NAN_BITS: u32 = 0x7FC00000u;

// grid_barrier returns once every workgroup of the dispatch has called it
// as often, with their writes before it visible to this workgroup's reads
// after it (see the header).
fn grid_barrier(lid: u32) {
    storageBarrier();
    if lid == 0u {
        let g = atomicLoad(&sync[1]);
        if atomicAdd(&sync[0], 1u) % p.groups == p.groups - 1u {
            atomicSub(&sync[0], p.groups);
            atomicAdd(&sync[1], 1u);
        } else {
            for (var n = 0u; atomicLoad(&sync[1]) == g; n++) {
                if n == p.spins {
                    atomicAdd(&sync[2], 1u);
                    atomicStore(&x[0], NAN_BITS);
                    break;
                }
            }
        }
    }
    storageBarrier();
}

// codes returns the four codes of nibbles shift/4 … shift/4+3 of word w,
// minus 8, as floats.
fn codes(w: u32, shift: u32) -> vec4<f32> {
    let n = (vec4<u32>(w) >> vec4<u32>(shift, shift + 4u, shift + 8u, shift + 12u)) & vec4<u32>(15u);
    return bitcast<vec4<f32>>(n | vec4<u32>(MAGIC)) - BIAS;
}

// swizzle places vec4 j = 8v + m of the staged input at 8v + (m + v) % 8,
// so that lanes reading the same m of consecutive v hit different banks.
fn swizzle(j: u32) -> u32 {
    return (j & ~7u) | ((j + (j >> 3u)) & 7u);
}

// Matrix m's code vec4 i and f16 scale i (m is the phase).
fn code_vec4(m: u32, i: u32) -> vec4<u32> {
    switch m {
        case 0u: { return wo_q[i]; }
        case 1u: { return wgu_q[i]; }
        case 2u: { return wd_q[i]; }
        default: { return wqkv_q[i]; }
    }
}

fn scale(m: u32, i: u32) -> f32 {
    var pair: u32;
    switch m {
        case 0u: { pair = wo_s[i >> 1u]; }
        case 1u: { pair = wgu_s[i >> 1u]; }
        case 2u: { pair = wd_s[i >> 1u]; }
        default: { pair = wqkv_s[i >> 1u]; }
    }
    let h = unpack2x16float(pair);
    return select(h.x, h.y, (i & 1u) == 1u);
}

fn load_x(i: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(atomicLoad(&x[4u * i])), bitcast<f32>(atomicLoad(&x[4u * i + 1u])),
        bitcast<f32>(atomicLoad(&x[4u * i + 2u])), bitcast<f32>(atomicLoad(&x[4u * i + 3u])));
}

fn load_gu(i: u32) -> vec4<f32> {
    return vec4<f32>(gu[4u * i], gu[4u * i + 1u], gu[4u * i + 2u], gu[4u * i + 3u]);
}

// stage puts phase m's input values k0 … k0 + kc into xs and returns
// their sum of squares where the phase normalizes its input, else 0.
fn stage(m: u32, k0: u32, kc: u32, lid: u32) -> f32 {
    var ss = 0.0;
    // All loads first, in a loop of a fixed count, so that a thread's
    // loads go out together (looping to kc / 4, each waited for the one
    // before: 3–4 L2 round trips a chunk).
    var a: array<vec4<f32>, SPT>; // the input, or the gate half
    var b: array<vec4<f32>, SPT>; // the up half, or the norm weight
    for (var s = 0u; s < SPT; s++) {
        let i = lid + s * WG;
        if i < kc / 4u {
            let j = k0 / 4u + i;
            switch m {
                case 0u: {
                    a[s] = attn[j];
                }
                case 2u: {
                    a[s] = load_gu(j);
                    b[s] = load_gu(p.I / 4u + j);
                }
                default: {
                    a[s] = load_x(j);
                    b[s] = select(in_norm[j], post_norm[j], m == 1u);
                }
            }
        }
    }
    for (var s = 0u; s < SPT; s++) {
        let i = lid + s * WG;
        if i < kc / 4u {
            var v = a[s];
            switch m {
                case 0u: {}
                case 2u: {
                    v = v / (1.0 + exp(-v)) * b[s];
                }
                default: {
                    ss += dot(v, v);
                    v *= b[s];
                }
            }
            xs[swizzle(i)] = v;
        }
    }
    if m != 1u && m != 3u {
        return 0.0;
    }
    red[lid] = ss;
    workgroupBarrier();
    if lid < 16u {
        var s = 0.0;
        for (var i = 0u; i < WG / 16u; i++) {
            s += red[lid * (WG / 16u) + i];
        }
        red[WG + lid] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < 16u; i++) {
        total += red[WG + i];
    }
    workgroupBarrier(); // red is the tiles' again
    return total;
}

// Item i of a thread: the code vec4 lane + (i % wpt) · LANES of weight row
// n0 + i / wpt (rows past N repeat row N − 1), and its scale. Items past
// wpt · rt, or past the row's end, are zero and add nothing.
struct Item {
    w: vec4<u32>,
    s: f32,
    v: u32,   // the vec4's index in the row
    ok: bool,
}

fn load_item(m: u32, i: u32, n0: u32, N: u32, K: u32, lane: u32, wpt: u32, rt: u32) -> Item {
    var it: Item;
    it.v = lane + (i % wpt) * LANES;
    it.ok = i < wpt * rt && it.v < K / 32u;
    if it.ok {
        let n = min(n0 + i / wpt, N - 1u);
        it.w = code_vec4(m, n * (K / 32u) + it.v);
        it.s = scale(m, n * (K / p.GS) + it.v * 32u / p.GS);
    }
    return it;
}

// dot_item returns item it's codes times the staged input, if its vec4
// lies in the chunk that starts at vec4 v0 of the row (else 0).
fn dot_item(it: Item, v0: u32) -> f32 {
    var d = 0.0;
    if it.ok && it.v >= v0 && it.v < v0 + KC / 32u {
        for (var c = 0u; c < 8u; c++) { // columns 32v + 4c … 32v + 4c + 3
            d += dot(codes(it.w[c >> 1u], (c & 1u) * 16u), xs[swizzle(8u * (it.v - v0) + c)]);
        }
    }
    return d;
}

// add_red adds item i's product into its row's partial sum.
fn add_red(i: u32, prod: f32, at: u32, lane: u32, wpt: u32, rt: u32) {
    if i < wpt * rt {
        red[(at + i / wpt) * LANES + lane] += prod;
    }
}

// phase computes the N rows of matrix m over K inputs, tile by tile, wpt
// code vec4s a lane a row and rt rows a thread, wpt · rt ≤ WR = 12 items a
// thread. The items are twelve variables, not an array: with arrays and
// loops the driver kept them in local memory (cmd/nvsass).
fn phase(m: u32, N: u32, K: u32, wpt: u32, rt: u32, wid: u32, lid: u32) {
    let rows = WG / LANES * rt;
    let tiles = (N + rows - 1u) / rows;
    if wid >= tiles {
        return;
    }
    let lane = lid % LANES;
    let grp = lid / LANES;
    var ss = 0.0; // the input's sum of squares (normalized phases)
    for (var tile = wid; tile < tiles; tile += p.groups) {
        if K > KC {
            ss = 0.0; // staged again, chunk by chunk, for each tile
        }
        let n0 = tile * rows + grp * rt;
        let i0 = load_item(m, 0u, n0, N, K, lane, wpt, rt);
        let i1 = load_item(m, 1u, n0, N, K, lane, wpt, rt);
        let i2 = load_item(m, 2u, n0, N, K, lane, wpt, rt);
        let i3 = load_item(m, 3u, n0, N, K, lane, wpt, rt);
        let i4 = load_item(m, 4u, n0, N, K, lane, wpt, rt);
        let i5 = load_item(m, 5u, n0, N, K, lane, wpt, rt);
        let i6 = load_item(m, 6u, n0, N, K, lane, wpt, rt);
        let i7 = load_item(m, 7u, n0, N, K, lane, wpt, rt);
        let i8 = load_item(m, 8u, n0, N, K, lane, wpt, rt);
        let i9 = load_item(m, 9u, n0, N, K, lane, wpt, rt);
        let i10 = load_item(m, 10u, n0, N, K, lane, wpt, rt);
        let i11 = load_item(m, 11u, n0, N, K, lane, wpt, rt);
        // The input, a chunk at a time (once a phase when it fits one),
        // while the loads are in flight.
        var d0 = 0.0; var d1 = 0.0; var d2 = 0.0; var d3 = 0.0; var d4 = 0.0; var d5 = 0.0;
        var d6 = 0.0; var d7 = 0.0; var d8 = 0.0; var d9 = 0.0; var d10 = 0.0; var d11 = 0.0;
        for (var k0 = 0u; k0 < K; k0 += KC) {
            if tile == wid || K > KC {
                ss += stage(m, k0, min(KC, K - k0), lid);
                workgroupBarrier();
            }
            let v0 = k0 / 32u;
            d0 += dot_item(i0, v0);
            d1 += dot_item(i1, v0);
            d2 += dot_item(i2, v0);
            d3 += dot_item(i3, v0);
            d4 += dot_item(i4, v0);
            d5 += dot_item(i5, v0);
            d6 += dot_item(i6, v0);
            d7 += dot_item(i7, v0);
            d8 += dot_item(i8, v0);
            d9 += dot_item(i9, v0);
            d10 += dot_item(i10, v0);
            d11 += dot_item(i11, v0);
            if K > KC {
                workgroupBarrier(); // before the next chunk is staged
            }
        }
        // Each row's partial sum: its items' scaled products, in workgroup
        // memory at [row of the tile][lane].
        let at = grp * rt;
        for (var r = 0u; r < rt; r++) {
            red[(at + r) * LANES + lane] = 0.0;
        }
        add_red(0u, i0.s * d0, at, lane, wpt, rt);
        add_red(1u, i1.s * d1, at, lane, wpt, rt);
        add_red(2u, i2.s * d2, at, lane, wpt, rt);
        add_red(3u, i3.s * d3, at, lane, wpt, rt);
        add_red(4u, i4.s * d4, at, lane, wpt, rt);
        add_red(5u, i5.s * d5, at, lane, wpt, rt);
        add_red(6u, i6.s * d6, at, lane, wpt, rt);
        add_red(7u, i7.s * d7, at, lane, wpt, rt);
        add_red(8u, i8.s * d8, at, lane, wpt, rt);
        add_red(9u, i9.s * d9, at, lane, wpt, rt);
        add_red(10u, i10.s * d10, at, lane, wpt, rt);
        add_red(11u, i11.s * d11, at, lane, wpt, rt);
        workgroupBarrier();
        let n = tile * rows + lid;
        if lid < rows && n < N {
            var sum = 0.0;
            for (var l = 0u; l < LANES; l++) {
                sum += red[lid * LANES + (l + lid) % LANES];
            }
            if m == 1u || m == 3u {
                sum *= 1.0 / sqrt(ss / f32(K) + p.eps);
            }
            switch m {
                case 1u: {
                    gu[n] = sum;
                }
                case 3u: {
                    qkv[n] = sum;
                }
                default: {
                    atomicStore(&x[n], bitcast<u32>(bitcast<f32>(atomicLoad(&x[n])) + sum));
                }
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if p.H == 0u {
        grid_barrier(lid);
        return;
    }
    if (p.phases & 1u) != 0u {
        phase(0u, p.H, p.QD, WPT_QD, RT_O, wid.x, lid);
    }
    grid_barrier(lid);
    if (p.phases & 2u) != 0u {
        phase(1u, 2u * p.I, p.H, WPT_H, RT_GU, wid.x, lid);
    }
    grid_barrier(lid);
    if (p.phases & 4u) != 0u {
        phase(2u, p.H, p.I, WPT_I, RT_D, wid.x, lid);
    }
    if p.NQKV > 0u {
        grid_barrier(lid);
        if (p.phases & 8u) != 0u {
            phase(3u, p.NQKV, p.H, WPT_H, RT_QKV, wid.x, lid);
        }
    }
}
