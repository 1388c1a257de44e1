// argmax.wgsl: greedy token choice, ids[t] = argmax_v logits[t][v] for
// t < T rows of V logits: the first index of the largest value (as
// torch.argmax and reference.Argmax). A row holding a NaN yields
// 0xffffffff, which the host turns into an error.
//
// Buffers:
//   logits (T, V) f32
//   ids    (T) u32
//
// Dispatch: (T, 1, 1) workgroups of WG threads, one row each: thread i
// scans v = i, i+WG, … (coalesced) keeping its best (value, index), then a
// tree in workgroup memory merges the WG candidates, ties to the lower
// index. WG = 256: a 151936-word row is ~600 strided loads per thread, and
// 256 threads keep enough loads in flight on one compute unit.

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct Params {
    T: u32,
    V: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> nan_seen: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * p.V;
    var bv = 0.0;
    var bi = NONE; // no candidate yet
    var nan = 0u;
    for (var v = lid; v < p.V; v += WG) {
        let x = logits[base + v];
        if (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u { // NaN (x != x may be folded away)
            nan = 1u;
        } else if bi == NONE || x > bv {
            bv = x;
            bi = v;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    nan_seen[lid] = nan;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if lid < stride {
            let ov = best_v[lid + stride];
            let oi = best_i[lid + stride];
            let mine = best_i[lid];
            if oi != NONE && (mine == NONE || ov > best_v[lid] || (ov == best_v[lid] && oi < mine)) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
            nan_seen[lid] |= nan_seen[lid + stride];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        ids[wid.x] = select(best_i[0], NONE, nan_seen[0] != 0u);
    }
}
