// embed_dense.wgsl: embedding gather from a dense f16 (entry point
// dense_f16) or f32 (entry point dense_f32) table: out[t][c] = E[ids[t]][c]
// for t < T, c < K. A token id outside [0, V) yields a row of NaN. A table
// too large for one binding is bound in blocks of rows [row0, row0+n), as in
// embed_int4.wgsl.
//
// Buffers:
//   ids (T) u32 token ids
//   e   (n, K) as vec4<u32>: rows row0 … row0+n-1, eight halves (f16) or
//       four floats (f32) each
//   out (T, K) f32, written as vec4s
//
// Dispatch: (ceil(K/8 / WG), T, 1) workgroups of WG threads; each thread
// copies eight columns of one row. WG = 64: a pure copy.

const WG: u32 = 64u;

struct Params {
    T: u32,
    V: u32, // rows of E
    K: u32, // columns, a multiple of 8
    _pad0: u32,
    row0: u32, // first row of E bound
    n: u32,    // rows bound
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> e: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

// destination returns the index in out of columns [8u, 8u+4) of row t, and the
// row of E to read (≥ V for a bad id, after writing NaN); u past the row
// returns V too.
fn destination(u: u32, t: u32) -> vec2<u32> {
    if u >= p.K / 8u {
        return vec2<u32>(0u, p.V);
    }
    let o = t * (p.K / 4u) + 2u * u;
    let id = ids[t];
    if id >= p.V {
        if p.row0 == 0u {
            var nan_bits = 0x7fc00000u; // a var: Chrome rejects a constant NaN
            let nan = bitcast<f32>(nan_bits);
            out[o] = vec4<f32>(nan);
            out[o + 1u] = vec4<f32>(nan);
        }
        return vec2<u32>(0u, p.V);
    }
    if id < p.row0 || id >= p.row0 + p.n {
        return vec2<u32>(0u, p.V); // another block's row
    }
    return vec2<u32>(o, id - p.row0);
}

@compute @workgroup_size(WG)
fn dense_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let dst = destination(gid.x, gid.y);
    if dst.y >= p.V {
        return;
    }
    let h = e[dst.y * (p.K / 8u) + gid.x];
    out[dst.x] = vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
    out[dst.x + 1u] = vec4<f32>(unpack2x16float(h.z), unpack2x16float(h.w));
}

@compute @workgroup_size(WG)
fn dense_f32(@builtin(global_invocation_id) gid: vec3<u32>) {
    let dst = destination(gid.x, gid.y);
    if dst.y >= p.V {
        return;
    }
    let base = dst.y * (p.K / 4u) + 2u * gid.x;
    out[dst.x] = bitcast<vec4<f32>>(e[base]);
    out[dst.x + 1u] = bitcast<vec4<f32>>(e[base + 1u]);
}
