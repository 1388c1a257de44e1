// advance_rows.wgsl: moves T line rows of a rows buffer (prelude.wgsl's Row,
// written by the host with kernels.PutRow) one position on — each row's
// slot, position and base +1, its sequence and mask as they are — so that
// the next pass of a chain drafted on the device reads the positions after
// the last pass's without the host writing them again (engine/webgpu's
// chains: several passes in one submission).
//
// Buffers:
//   rows (≥ T) Row, updated in place
//
// Dispatch: (ceil(T / WG), 1, 1) workgroups of WG threads, a thread a row.

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> p: WordsParams;
@group(0) @binding(1) var<storage, read_write> rows: array<Row>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if t < p.n {
        var r = rows[t];
        r.slot += 1u;
        r.pos += 1u;
        r.base += 1u;
        rows[t] = r;
    }
}
