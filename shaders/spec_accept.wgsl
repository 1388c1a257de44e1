// spec_accept.wgsl: a speculative step accepted on the device, so that
// the next step of a chain of them (engine/webgpu's DraftVerifyN, a head's
// or a standalone drafter's) starts where this one's verdict leaves it
// without the host reading it. For each of B sequences: n, how many of its
// K drafted tokens the target's verification agrees with — draft c
// accepted while it equals the target's token at the row before it: its
// greedy token, or for a sampled row what the row sampled (sample.wgsl's
// OUTCOME: the draft where the rule accepts it, else a draw that is not
// the draft), as the host's rule —, its state moved on (L += n + 1: the
// position after the accepted tokens and the target's own token there,
// the bonus, which the next verification feeds first) and that bonus
// written at the sequence's first row of the target's input ids. With
// DRAFTER, the ids of a standalone drafter's next first pass too: the
// bonus, and the token before it — the last accepted draft, or the bonus
// the step began with where none was —, whose row the drafter computes
// again (its chain fed the drafts up to the last but one).
//
// Buffers:
//   state  (B) vec4<u32>: (L, n, target slot, drafter slot) — L the position
//          of the verification's first row (its bonus token's), n the
//          drafts accepted at the last step; updated in place
//   drafts u32 words: sequence i's draft c, in the target's vocabulary, at
//          word drafts_at + c·draft_stride + i (a drafter chain's results)
//   verify (B·(K+1)) u32: the target's token at each verified row (its
//          greedy token, or a sampled row's outcome), sequence i's at rows
//          i·(K+1) … i·(K+1)+K (argmax.wgsl's or sample.wgsl's ids)
//   ids    u32: the target's input ids; word i·(K+1) is written
//   dids   (2·B) u32, with DRAFTER: the drafter's input ids, sequence i's
//          bonus at word i and the token before it at word B + i
//
// Dispatch: (ceil(B / WG), 1, 1) workgroups of WG threads, a thread a
// sequence (a batch is a few sequences: one workgroup).

const WG: u32 = 64u;

const DRAFTER: u32 = 0u; // specialized: 1 with a standalone drafter's ids

struct Params {
    b: u32,            // sequences
    k: u32,            // drafted tokens a sequence
    drafts_at: u32,    // the first draft's word
    draft_stride: u32, // words from one draft of a sequence to its next
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> state: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> drafts: array<u32>;
@group(0) @binding(3) var<storage, read> verify: array<u32>;
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;
@group(0) @binding(5) var<storage, read_write> dids: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if i >= p.b {
        return;
    }
    let row0 = i * (p.k + 1u);
    var n = 0u;
    loop {
        if n >= p.k || drafts[p.drafts_at + n * p.draft_stride + i] != verify[row0 + n] {
            break;
        }
        n += 1u;
    }
    var s = state[i];
    s.x += n + 1u;
    s.y = n;
    state[i] = s;
    let bonus = verify[row0 + n];
    if DRAFTER == 1u {
        var before = ids[row0];
        if n > 0u {
            before = drafts[p.drafts_at + (n - 1u) * p.draft_stride + i];
        }
        dids[i] = bonus;
        dids[p.b + i] = before;
    }
    ids[row0] = bonus;
}
