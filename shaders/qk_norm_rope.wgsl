// qk_norm_rope.wgsl: Qwen3's q_norm/k_norm and RoPE fused, in place, for
// the T rows of the query and key projections — one pass instead of four:
//   y ← rmsnorm(y) · weight            (over head_dim, f32 math)
//   y[i], y[i + D/2] ← y[i]·cos a − y[i + D/2]·sin a, y[i + D/2]·cos a + y[i]·sin a
//   a = pos[t] · inv_freq[i]           (i < D/2; split-halves layout)
// for every query head (weight q_norm) and key head (weight k_norm). The
// normalized value is rounded to f32 before the rotation, exactly as the
// two separate steps (reference.RMSNorm, then reference.Rope) compute it;
// the angle is reduced as in rope.wgsl.
//
// Buffers:
//   q        (T, heads, D) f32, in place
//   k        (T, kv_heads, D) f32, in place
//   q_norm, k_norm (D) f32
//   pos      (T) u32 positions
//   inv_freq (D/2) f32 (as reference.RopeInvFreq)
//
// Dispatch: (heads + kv_heads, T, 1) workgroups of WG threads, one head
// vector each: thread i holds the pairs (i, i + D/2), (i + WG, …), … in
// registers across the sum of squares (reduced in workgroup memory) and
// the rotation. WG = 64 = D/2 for Qwen3's head_dim 128: one pair a thread.

const WG: u32 = 64u;
const PAIRS: u32 = 2u; // pairs per thread at most: D/2 ≤ WG·PAIRS

struct Params {
    T: u32,
    heads: u32,
    kv_heads: u32,
    D: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
@group(0) @binding(3) var<storage, read> q_norm: array<f32>;
@group(0) @binding(4) var<storage, read> k_norm: array<f32>;
@group(0) @binding(5) var<storage, read> pos: array<u32>;
@group(0) @binding(6) var<storage, read> inv_freq: array<f32>;

var<workgroup> sums: array<f32, WG>;

// reduced returns pos·f minus the nearest multiple of 2π (see rope.wgsl).
fn reduced(pos: u32, f: f32) -> f32 {
    let a = f32(pos) * f;
    let kk = round(a * 0.15915494309189535);
    return (a - kk * 6.28125) - kk * 0.0019353071795864769;
}

// load returns element i of the head vector at base (q when is_q, else k).
fn load(is_q: bool, i: u32) -> f32 {
    if is_q {
        return q[i];
    }
    return k[i];
}

fn store(is_q: bool, i: u32, v: f32) {
    if is_q {
        q[i] = v;
    } else {
        k[i] = v;
    }
}

fn weight(is_q: bool, i: u32) -> f32 {
    if is_q {
        return q_norm[i];
    }
    return k_norm[i];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    let is_q = wid.x < p.heads;
    let half = p.D / 2u;
    var base = (t * p.heads + wid.x) * p.D;
    if !is_q {
        base = (t * p.kv_heads + wid.x - p.heads) * p.D;
    }

    var x1 = array<f32, PAIRS>();
    var x2 = array<f32, PAIRS>();
    var ss = 0.0;
    for (var j = 0u; j < PAIRS; j++) {
        let i = lid + j * WG;
        if i < half {
            x1[j] = load(is_q, base + i);
            x2[j] = load(is_q, base + i + half);
            ss += x1[j] * x1[j] + x2[j] * x2[j];
        }
    }
    sums[lid] = ss;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            sums[lid] += sums[lid + stride];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(sums[0] / f32(p.D) + p.eps);

    let position = pos[t];
    for (var j = 0u; j < PAIRS; j++) {
        let i = lid + j * WG;
        if i < half {
            let n1 = weight(is_q, i) * (x1[j] * inv);
            let n2 = weight(is_q, i + half) * (x2[j] * inv);
            let a = reduced(position, inv_freq[i]);
            let c = cos(a);
            let s = sin(a);
            store(is_q, base + i, n1 * c - n2 * s);
            store(is_q, base + i + half, n2 * c + n1 * s);
        }
    }
}
