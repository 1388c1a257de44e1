// embed.wgsl: the embedding gather out[t][c] = E[ids[t]][c] for t < T, c < K,
// from an int4 table dequantized on the fly (entry point int4) or a dense
// f16 (dense_f16) or f32 (dense_f32) one.
//
// A token id outside [0, V) yields a row of NaN, so that a bad id cannot
// pass unnoticed (the host checks ids it uploads; ids written by
// argmax.wgsl are in range). A table too large for one binding is bound in
// blocks of rows [row0, row0+n): each dispatch writes the rows whose ids
// fall in its block (and the block at row0 = 0 the NaN rows).
//
// Buffers (the entry points share bindings 1 and 3; binding 2 is the table
// in each one's form):
//   ids     (T) u32 token ids
//   qweight int4: (n, K/8) u32 codes, rows row0 … row0+n-1 of E
//           (docs/reference.md, "The int4 scheme")
//   dense   dense: (n, K) as vec4<u32>, eight halves (f16) or four floats
//           (f32) each
//   out     (T, K) f32, written as vec4s
//   scales  int4: (n, K/G) f16, read as u32 pairs (scale)
//
// Dispatch: (ceil(K/8 / WG), T, 1) workgroups of WG threads; each thread
// writes eight columns of one row. WG = 64: a gather is a pure copy, any
// size that fills a wave serves.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: EmbedParams;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> qweight: array<u32>;
@group(0) @binding(2) var<storage, read> dense: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> scales: array<u32>;

// destination returns the index in out of columns [8u, 8u+4) of row t, and
// the row of the bound block to read — ≥ V for a bad id (after writing its
// NaN), another block's row, or u past the row's words.
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
fn int4(@builtin(global_invocation_id) gid: vec3<u32>) {
    let dst = destination(gid.x, gid.y);
    if dst.y >= p.V {
        return;
    }
    let q = qweight[dst.y * (p.K / 8u) + gid.x];
    let s = scale(dst.y * (p.K / p.G) + gid.x / (p.G / 8u));
    out[dst.x] = (vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - 8.0) * s;
    out[dst.x + 1u] = (vec4<f32>((vec4<u32>(q) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - 8.0) * s;
}

@compute @workgroup_size(WG)
fn dense_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    gather_dense(gid, true);
}

@compute @workgroup_size(WG)
fn dense_f32(@builtin(global_invocation_id) gid: vec3<u32>) {
    gather_dense(gid, false);
}

// gather_dense is the dense entry points' body: eight columns, one
// vec4<u32> of halves (f16) or two of floats.
fn gather_dense(gid: vec3<u32>, halves: bool) {
    let dst = destination(gid.x, gid.y);
    if dst.y >= p.V {
        return;
    }
    let u = dst.y * (p.K / 8u) + gid.x; // the eight columns' unit in the block
    if halves {
        let h = dense[u];
        out[dst.x] = vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
        out[dst.x + 1u] = vec4<f32>(unpack2x16float(h.z), unpack2x16float(h.w));
    } else {
        out[dst.x] = bitcast<vec4<f32>>(dense[2u * u]);
        out[dst.x + 1u] = bitcast<vec4<f32>>(dense[2u * u + 1u]);
    }
}
