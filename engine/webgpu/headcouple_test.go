package webgpu

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/engine"
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
