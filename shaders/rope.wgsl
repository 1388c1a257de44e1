// rope.wgsl: rotary position embedding in place, split-halves layout
// (transformers' rotate_half), for T rows of `heads` heads of D values:
//   a = pos[t] · inv_freq[i]                      (f32, as transformers)
//   y[i]       ← y[i]·cos a − y[i + D/2]·sin a
//   y[i + D/2] ← y[i + D/2]·cos a + y[i]·sin a     for i < D/2
//
// inv_freq is theta^(−2i/D), computed on the host exactly as
// reference.RopeInvFreq does. The angle is reduced to about [−π, π] with a
// two-constant 2π (Cody–Waite) before sin and cos, because GPU sin/cos are
// only accurate near zero and angles reach the thousands of radians.
//
// Buffers:
//   y        (T, heads, D) f32, rotated in place
//   pos      (T) u32 absolute positions
//   inv_freq (D/2) f32
//
// Dispatch: (ceil(heads·D/2 / WG), T, 1) workgroups of WG threads, one
// thread per rotated pair. WG = 64: elementwise.

const WG: u32 = 64u;

struct Params {
    T: u32,
    heads: u32,
    D: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> pos: array<u32>;
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>;

// reduced returns pos·f minus the nearest multiple of 2π. 2π = HI + LO,
// where HI = 6.28125 has 8 significant bits, so k·HI is exact for k < 2^16.
fn reduced(pos: u32, f: f32) -> f32 {
    let a = f32(pos) * f;
    let k = round(a * 0.15915494309189535);
    return (a - k * 6.28125) - k * 0.0019353071795864769;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.D / 2u;
    let j = gid.x; // pair index within the row: head j / half, i = j % half
    let t = gid.y;
    if j >= p.heads * half {
        return;
    }
    let i = j % half;
    let base = t * p.heads * p.D + (j / half) * p.D;
    let a = reduced(pos[t], inv_freq[i]);
    let c = cos(a);
    let s = sin(a);
    let x1 = y[base + i];
    let x2 = y[base + i + half];
    y[base + i] = x1 * c - x2 * s;
    y[base + i + half] = x2 * c + x1 * s;
}
