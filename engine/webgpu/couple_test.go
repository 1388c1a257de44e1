package webgpu

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/gpu/gputest"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

// TestHeadCoupledDrafts: where a fused step's verification rows are
// coupled, each of the head's drafts is the coupled draw of its own
// distribution under the key of the row that verifies it
// (sampling.CoupledChoice over the plain-Go head's logits at the draft's
// position, within the noise's slack), the verification accepts a draft
// iff the target's coupled draw is that token, and at temperature 1 the
// drafts are draws, not the greedy tokens.
func TestHeadCoupledDrafts(t *testing.T) {
	rig := newHeadRig(t, false, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(21, 22))
	const n = 4
	notGreedy := 0
	for trial := range 6 {
		prompt := []int{3 + trial, 17, 5, 9, 30 + trial, 200}
		g := newHeadTwins(t, h, target, prompt)
		release := func() {
			for _, s := range []engine.Sequence{g.tF, g.tS, g.hF, g.hS} {
				s.Release()
			}
		}
		T := []float32{1, 0.7}[trial%2]
		draws := make([]sampling.Draw, n+1)
		for k := range draws {
			draws[k] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
		}
		steps := []engine.ChainStep{{
			Draft:  &engine.Entry{Seq: g.hF, Target: g.tF, Tokens: slices.Clone(g.text[g.hF.Len():])},
			Verify: &engine.VerifyEntry{Seq: g.tF, Tokens: slices.Clone(g.text[g.tF.Len():]), Out: n + 1, Sampling: sampling.Params{Temperature: T, TopP: 1}, Draws: draws},
			Take:   n,
		}}
		out, err := engine.DraftVerify(ctx, h, target, steps, n)
		release()
		if err != nil {
			t.Fatal(err)
		}
		drafts := out[0]
		text := append(slices.Clone(g.text), engine.IDs(drafts[:n-1])...)
		rows := rig.oracle.rows(text, g.text[:len(g.text)-1])
		for c, d := range drafts {
			logits := rows[len(g.text)-2+c].Logits
			k0, k1 := draws[c].Key()
			noisy := func(i int) float64 {
				return float64(logits[i]/T) + float64(sampling.Gumbel(k0, k1, int(rig.w.TargetIDs[i])))
			}
			want, err := sampling.CoupledChoice(logits, rig.w.TargetIDs, T, draws[c])
			if err != nil {
				t.Fatal(err)
			}
			got := slices.Index(rig.w.TargetIDs, int32(d.ID))
			if got < 0 {
				t.Fatalf("trial %d, draft %d: token %d is not a draft token", trial, c, d.ID)
			}
			if best := noisy(want); noisy(got) < best-samplingtest.NoiseSlack*max(1, math.Abs(best))-1e-3 {
				t.Errorf("trial %d, draft %d: token %d (%v), the coupled draw is %d (%v)", trial, c, d.ID, noisy(got), rig.w.TargetIDs[want], best)
			}
			if got != slices.Index(logits, slices.Max(logits)) {
				notGreedy++
			}
			row := steps[0].Verify.Rows[c]
			if row.Accept != (row.Sample == d.ID) {
				t.Errorf("trial %d, row %d: accept %v, the target drew %d for draft %d", trial, c, row.Accept, row.Sample, d.ID)
			}
			if !row.Accept {
				break // the rows after a rejection verify drafts past the target's token
			}
		}
	}
	if notGreedy == 0 {
		t.Error("every coupled draft was the head's greedy token")
	}
	t.Logf("coupled drafts other than the greedy token: %d", notGreedy)
}

// TestEngineCoupledDrafts: a standalone drafter's fused steps draft as a
// head's do (TestHeadCoupledDrafts) — each draft the coupled draw of the
// drafter's own distribution (the plain-Go reference's logits of its int4
// weights) under the key of the row that verifies it, a row accepting a
// draft iff the target drew it, drafts other than the greedy tokens at
// temperature 1 — in one fused step (DraftVerify) and in a chain of them
// (DraftVerifyN, its last step's drafts checked); with a chain listing
// top tokens, greedy drafts.
func TestEngineCoupledDrafts(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{})
	dm := load(t, "untied", checkpoint.Int4)
	ref, err := reference.New(dm.Config, dm.Weights)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(23, 24))
	const n = 4
	notGreedy := 0
	for trial := range 8 {
		chained, topN := trial%4 == 1, 0
		if trial%4 == 3 {
			topN = 2
		}
		T := []float32{1, 0.7}[trial%2]
		prompt := p.tokens(5 + trial)
		tq, dq := p.seq(p.target, prompt[:len(prompt)-1]), p.seq(p.drafter, nil)
		m := 1
		if chained {
			m = 2
		}
		draws := make([]sampling.Draw, m*(n+1))
		for k := range draws {
			draws[k] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
		}
		step := engine.ChainStep{
			Draft:  &engine.Entry{Seq: dq, Tokens: slices.Clone(prompt), TopN: topN},
			Verify: &engine.VerifyEntry{Seq: tq, Tokens: prompt[len(prompt)-1:], Out: n + 1, Sampling: sampling.Params{Temperature: T, TopP: 1}, Draws: draws[:n+1]},
			Take:   n,
		}
		text, keys := slices.Clone(prompt), draws[:n+1]
		var drafts []engine.Token
		var rows []engine.VerifyRow
		if chained {
			step.ChainDraws = draws[n+1:]
			out, err := p.drafter.DraftVerifyN(ctx, p.target, []engine.ChainStep{step}, n, m)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != m {
				t.Fatalf("trial %d: %d chained steps, want %d", trial, len(out), m)
			}
			// The last step's drafts follow the text the first accepted.
			first := out[0]
			a := first.Accepted[0]
			text = append(text, engine.IDs(first.Drafts[0][:a])...)
			text = append(text, first.Rows[0][a].Sample)
			drafts, rows, keys = out[1].Drafts[0], out[1].Rows[0], draws[n+1:]
		} else {
			out, err := engine.DraftVerify(ctx, p.drafter, p.target, []engine.ChainStep{step}, n)
			if err != nil {
				t.Fatal(err)
			}
			drafts, rows = out[0], step.Verify.Rows
		}
		for c, d := range drafts {
			logits, err := ref.Forward(ref.NewSequence(), append(slices.Clone(text), engine.IDs(drafts[:c])...))
			if err != nil {
				t.Fatal(err)
			}
			greedy := slices.Index(logits, slices.Max(logits))
			if topN > 0 {
				if d.ID != greedy && logits[d.ID] < logits[greedy]-1e-3 {
					t.Errorf("trial %d, draft %d: token %d, the greedy token with top tokens listed is %d", trial, c, d.ID, greedy)
				}
			} else {
				k0, k1 := keys[c].Key()
				noisy := func(i int) float64 { return float64(logits[i]/T) + float64(sampling.Gumbel(k0, k1, i)) }
				want, err := sampling.CoupledChoice(logits, nil, T, keys[c])
				if err != nil {
					t.Fatal(err)
				}
				if best := noisy(want); noisy(d.ID) < best-samplingtest.NoiseSlack*max(1, math.Abs(best))-1e-3 {
					t.Errorf("trial %d, draft %d: token %d (%v), the coupled draw is %d (%v)", trial, c, d.ID, noisy(d.ID), want, best)
				}
				if d.ID != greedy {
					notGreedy++
				}
			}
			if row := rows[c]; row.Accept != (row.Sample == d.ID) {
				t.Errorf("trial %d, row %d: accept %v, the target drew %d for draft %d", trial, c, row.Accept, row.Sample, d.ID)
			}
			if !rows[c].Accept {
				break // the rows after a rejection verify drafts past the target's token
			}
		}
	}
	if notGreedy == 0 {
		t.Error("every coupled draft was the drafter's greedy token")
	}
	t.Logf("coupled drafts other than the greedy token: %d", notGreedy)
}
