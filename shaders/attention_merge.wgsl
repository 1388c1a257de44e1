// attention_merge.wgsl: merges the splits of attention_decode.wgsl:
//   M = max_s m_s
//   out[t][h] = Σ_s exp(m_s − M) · o_s  /  Σ_s exp(m_s − M) · l_s
// A split the row sees no key of has m = −inf, l = 0, o = 0 and weighs 0
// (every row sees its own slot, so M is finite). A row whose context
// (rows[t].slot + 1) is longer than the splits cover gets NaN, so that a
// wrong split count cannot pass unnoticed.
//
// The kernel is a few dependent loads long, and they are its time: each
// thread loads SB splits' m, l and its own outputs' values before it uses
// any of them, so that they wait on memory together (one round trip for
// up to SB splits, not one a split), and folds blocks of SB splits into
// running sums rescaled to the largest m so far (online softmax; with one
// block, the formula above). m and l are the same for every thread of a
// workgroup: the loads are broadcasts, and each thread computes the weights
// itself rather than waiting on a barrier. rows[t] is read beside them,
// not before.
//
// Buffers:
//   part (T, heads, splits, D + 4) f32 from attention_decode.wgsl: o, then
//        m and l (and two words unused)
//   rows (T) Row (prelude.wgsl): the rows' slots
//   out  (T, heads, D) f32
//
// Dispatch: (heads, T, 1) workgroups of WG threads; thread i writes outputs
// i, i + WG, … (OUTS of them; two each for D = 128).

const WG: u32 = 64u;
const D: u32 = 128u;
const CHUNK: u32 = 64u;
const PS: u32 = D + 4u;                  // a split's partials: o, m, l, two unused
const SB: u32 = 16u;                       // splits loaded at once
const OUTS: u32 = (D + WG - 1u) / WG;      // outputs a thread

struct Params {
    T: u32,
    heads: u32,
    splits: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<Row>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let first = (t * p.heads + h) * p.splits * PS;
    let o = (t * p.heads + h) * D;
    let beyond = rows[t].slot + 1u > p.splits * CHUNK;
    var neg_inf_bits = 0xff800000u; // a var: Chrome rejects a constant −inf
    let neg_inf = bitcast<f32>(neg_inf_bits);

    var M = neg_inf;           // the largest m so far
    var den = 0.0;             // Σ exp(m_s − M) · l_s so far
    var num = array<f32, OUTS>(); // Σ exp(m_s − M) · o_s of the thread's outputs so far
    for (var s0 = 0u; s0 < p.splits; s0 += SB) {
        // Loads past the last split repeat it; they weigh nothing below.
        var m: array<f32, SB>;
        var l: array<f32, SB>;
        var v: array<array<f32, SB>, OUTS>;
        for (var j = 0u; j < SB; j++) {
            let at = first + min(s0 + j, p.splits - 1u) * PS;
            m[j] = part[at + D];
            l[j] = part[at + D + 1u];
            for (var r = 0u; r < OUTS; r++) {
                v[r][j] = part[at + min(lid + r * WG, D - 1u)];
            }
        }
        var top = M;
        for (var j = 0u; j < SB; j++) {
            if s0 + j < p.splits {
                top = max(top, m[j]);
            }
        }
        // Weights against top, or against 0 while every split so far is
        // hidden (top = −inf: every weight 0, not exp(−inf − (−inf))).
        let base = select(top, 0.0, top == neg_inf);
        let keep = exp(M - base); // the sums so far, rescaled: 0 from M = −inf
        den *= keep;
        for (var r = 0u; r < OUTS; r++) {
            num[r] *= keep;
        }
        for (var j = 0u; j < SB; j++) {
            if s0 + j < p.splits {
                let w = exp(m[j] - base);
                den += w * l[j];
                for (var r = 0u; r < OUTS; r++) {
                    num[r] += w * v[r][j];
                }
            }
        }
        M = top;
    }
    var nan_bits = 0x7fc00000u; // a var: Chrome rejects a constant NaN
    for (var r = 0u; r < OUTS; r++) {
        let d = lid + r * WG;
        if d < D {
            out[o + d] = select(num[r] / den, bitcast<f32>(nan_bits), beyond);
        }
    }
}
