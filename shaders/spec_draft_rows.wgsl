// spec_draft_rows.wgsl: the rows of a chained speculative step drafted by
// a standalone drafter, from the state spec_accept.wgsl left
// (engine/webgpu's Engine.DraftVerifyN), so that the host records the
// step before the step before it has run. With L the position of the
// step's verification's first token, the bonus, for each of B sequences:
//   - FIRST: the drafter's first pass's two rows, the bonus at L (row i)
//     and the token before it at L − 1 (row B + i), so that read-out row i
//     is the bonus's, as a chained pass's; and the target's K+1 verified
//     rows at L … L+K (rows i·(K+1) …);
//   - else the drafter's first chained pass's row, at L + 1 (row i), which
//     advance_rows.wgsl moves on pass by pass.
// All are prelude.wgsl's line rows: slot = position, base = position + 1.
//
// Buffers:
//   state (B) vec4<u32>: (L, n, target slot, drafter slot)
//   rows  (2·B, or B) Row: the drafter's rows
//   trows (B·(K+1)) Row, FIRST: the target's rows (else unwritten)
//
// Dispatch: (ceil(B / WG), 1, 1) workgroups of WG threads, a thread a
// sequence.

const WG: u32 = 64u;

const FIRST: u32 = 1u; // specialized: 1 for the first pass's rows, 0 for a chained pass's

struct Params {
    b: u32, // sequences
    k: u32, // drafted tokens a sequence
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> state: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> rows: array<Row>;
@group(0) @binding(3) var<storage, read_write> trows: array<Row>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if i >= p.b {
        return;
    }
    let s = state[i];
    if FIRST == 1u {
        rows[i] = line_row(s.w, s.x);
        rows[p.b + i] = line_row(s.w, s.x - 1u);
        for (var t = 0u; t <= p.k; t += 1u) {
            trows[i * (p.k + 1u) + t] = line_row(s.z, s.x + t);
        }
    } else {
        rows[i] = line_row(s.w, s.x + 1u);
    }
}
