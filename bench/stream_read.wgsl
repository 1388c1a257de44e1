// stream_read.wgsl: each thread sums (wrapping, as u32) the words of the
// V vec4s of src it reads and writes the sum — a pass that reads its bytes
// once and writes a thirty-second of them: the floor of a kernel phase
// whose inputs must come from memory (`webdraft bench engine`'s batch-1
// step floor, a decode step's dependent phases reduced to reading their
// bytes).
//
// For thread i = wid·WG + lid and j < V:
//   sums[i] = Σ_j Σ_c src[wid·WG·V + j·WG + lid][c]   (mod 2³²; 0 past n)
//
// Buffers:
//   src  (n) vec4<u32>
//   sums (groups·WG) u32, read_write: passes over one sums buffer are
//        dependent, each waiting for the one before (as a decode step's
//        phases do)
//
// Dispatch: (groups, 1, 1) workgroups of WG threads, groups = ceil(n /
// (WG·V)). A workgroup reads WG·V consecutive vec4s, thread lid the ones at
// lid + j·WG (a warp's loads coalesce), all V issued before any is used.
// WG = 256 and V = 8: 32 KB a workgroup, as the copy streams.

const WG: u32 = 256u;
const V: u32 = 8u;

@group(0) @binding(0) var<uniform> p: WordsParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> sums: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * WG * V + lid;
    var w: array<vec4<u32>, V>;
    for (var j = 0u; j < V; j++) {
        let i = base + j * WG;
        w[j] = select(vec4<u32>(), src[min(i, p.n - 1u)], i < p.n);
    }
    var s = vec4<u32>();
    for (var j = 0u; j < V; j++) {
        s += w[j];
    }
    sums[wid.x * WG + lid] = s.x + s.y + s.z + s.w;
}
