package webgpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
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
// position, within the noise's slack), listing the head's most likely
// tokens where it is asked to, the verification accepts a draft iff the
// target's coupled draw is that token, and at temperature 1 the drafts are
// draws, not the greedy tokens.
func TestHeadCoupledDrafts(t *testing.T) {
	rig := newHeadRig(t, false, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(21, 22))
	const n = 4
	notGreedy := 0
	for trial := range 16 {
		prompt := []int{3 + trial, 17, 5, 9, 30 + trial, 200}
		g := newHeadTwins(t, h, target, prompt)
		release := func() {
			for _, s := range []engine.Sequence{g.tF, g.tS, g.hF, g.hS} {
				s.Release()
			}
		}
		T := []float32{1, 0.7}[trial%2]
		topN := 0
		if trial%4 >= 2 {
			topN = 3 // drafts that list their top tokens, as the live page's do
		}
		draws := make([]sampling.Draw, n+1)
		for k := range draws {
			draws[k] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
		}
		steps := []engine.ChainStep{{
			Draft:  &engine.Entry{Seq: g.hF, Target: g.tF, Tokens: slices.Clone(g.text[g.hF.Len():]), TopN: topN},
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
			if checkHeadCoupled(t, rig, fmt.Sprintf("trial %d, draft %d", trial, c), rows[len(g.text)-2+c].Logits, T, draws[c], d, topN) {
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

// checkHeadCoupled checks a head's token d, drafted under draw at
// temperature T where the plain-Go head's logits over its draft vocabulary
// are logits: the coupled draw within the noise's slack, listing topN
// most likely tokens, the most likely first. It reports whether d is not
// the head's greedy token.
func checkHeadCoupled(t *testing.T, rig *headRig, what string, logits []float32, T float32, draw sampling.Draw, d engine.Token, topN int) bool {
	t.Helper()
	k0, k1 := draw.Key()
	noisy := func(i int) float64 {
		return float64(logits[i]/T) + float64(sampling.Gumbel(k0, k1, int(rig.w.TargetIDs[i])))
	}
	want, err := sampling.CoupledChoice(logits, rig.w.TargetIDs, T, draw)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Index(rig.w.TargetIDs, int32(d.ID))
	if got < 0 {
		t.Fatalf("%s: token %d is not a draft token", what, d.ID)
	}
	if best := noisy(want); noisy(got) < best-samplingtest.NoiseSlack*max(1, math.Abs(best))-1e-3 {
		t.Errorf("%s: token %d (%v), the coupled draw is %d (%v)", what, d.ID, noisy(got), rig.w.TargetIDs[want], best)
	}
	greedy := slices.Index(logits, slices.Max(logits))
	if len(d.Top) != topN {
		t.Fatalf("%s: %d top tokens, want %d", what, len(d.Top), topN)
	}
	if topN > 0 {
		if top := slices.Index(rig.w.TargetIDs, int32(d.Top[0].Token)); top < 0 || top != greedy && logits[top] < logits[greedy]-1e-3 {
			t.Errorf("%s: top tokens %v, the most likely is %d", what, d.Top, rig.w.TargetIDs[greedy])
		}
	}
	return got != greedy
}

// TestEngineCoupledDrafts: a standalone drafter's fused steps draft as a
// head's do (TestHeadCoupledDrafts) — each draft the coupled draw of the
// drafter's own distribution (the plain-Go reference's logits of its int4
// weights) under the key of the row that verifies it, a row accepting a
// draft iff the target drew it, drafts other than the greedy tokens at
// temperature 1 — in one fused step (DraftVerify) and in a chain of them
// (DraftVerifyN, its last step's drafts checked), two generations a call,
// each on its own keys; where the drafts list their top tokens, the same
// coupled draws, each listing the drafter's most likely tokens.
func TestEngineCoupledDrafts(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{})
	dm := load(t, "untied", checkpoint.Int4)
	ref, err := reference.New(dm.Config, dm.Weights)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(23, 24))
	const n, B = 4, 2
	notGreedy := 0
	for trial := range 8 {
		chained, topN := trial%4 == 1, 0
		if trial%4 == 3 {
			topN = 2
		}
		T := []float32{1, 0.7}[trial%2]
		m := 1
		if chained {
			m = 2
		}
		steps := make([]engine.ChainStep, B)
		prompts, draws := make([][]int, B), make([][]sampling.Draw, B)
		for i := range B {
			prompts[i] = p.tokens(5 + trial + 3*i)
			draws[i] = make([]sampling.Draw, n+1)
			for k := range draws[i] {
				draws[i][k] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
			}
			pr := prompts[i]
			steps[i] = engine.ChainStep{
				Draft: &engine.Entry{Seq: p.seq(p.drafter, nil), Tokens: slices.Clone(pr), TopN: topN},
				Verify: &engine.VerifyEntry{Seq: p.seq(p.target, pr[:len(pr)-1]), Tokens: pr[len(pr)-1:], Out: n + 1,
					Sampling: sampling.Params{Temperature: T, TopP: 1}, Draws: draws[i][:n+1]},
				Take: n,
			}
		}
		texts, keys := make([][]int, B), make([][]sampling.Draw, B)
		drafts, rows := make([][]engine.Token, B), make([][]engine.VerifyRow, B)
		seeds := make([]sampling.Keys, B)
		if chained {
			for i := range steps {
				seeds[i] = sampling.NewKeys(rng.Uint64())
				steps[i].Keys = &seeds[i]
			}
			out, err := p.drafter.DraftVerifyN(ctx, p.target, steps, n, m)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != m {
				t.Fatalf("trial %d: %d chained steps, want %d", trial, len(out), m)
			}
			// The last step's drafts follow the text the first accepted.
			for i := range B {
				a := out[0].Accepted[i]
				texts[i] = append(append(slices.Clone(prompts[i]), engine.IDs(out[0].Drafts[i][:a])...), out[0].Rows[i][a].Sample)
				drafts[i], rows[i] = out[1].Drafts[i], out[1].Rows[i]
				for c := range n + 1 { // the second step's row c decides position len(texts[i]) + c
					keys[i] = append(keys[i], seeds[i].At(len(texts[i])+c))
				}
			}
		} else {
			out, err := engine.DraftVerify(ctx, p.drafter, p.target, steps, n)
			if err != nil {
				t.Fatal(err)
			}
			for i := range B {
				texts[i], drafts[i], rows[i], keys[i] = prompts[i], out[i], steps[i].Verify.Rows, draws[i][:n+1]
			}
		}
		for i := range B {
			for c, d := range drafts[i] {
				logits, err := ref.Forward(ref.NewSequence(), append(slices.Clone(texts[i]), engine.IDs(drafts[i][:c])...))
				if err != nil {
					t.Fatal(err)
				}
				greedy := slices.Index(logits, slices.Max(logits))
				if len(d.Top) != topN {
					t.Fatalf("trial %d, entry %d, draft %d: %d top tokens, want %d", trial, i, c, len(d.Top), topN)
				}
				if topN > 0 && d.Top[0].Token != greedy && logits[d.Top[0].Token] < logits[greedy]-1e-3 {
					t.Errorf("trial %d, entry %d, draft %d: top tokens %v, the most likely is %d", trial, i, c, d.Top, greedy)
				}
				k0, k1 := keys[i][c].Key()
				noisy := func(j int) float64 { return float64(logits[j]/T) + float64(sampling.Gumbel(k0, k1, j)) }
				want, err := sampling.CoupledChoice(logits, nil, T, keys[i][c])
				if err != nil {
					t.Fatal(err)
				}
				if best := noisy(want); noisy(d.ID) < best-samplingtest.NoiseSlack*max(1, math.Abs(best))-1e-3 {
					t.Errorf("trial %d, entry %d, draft %d: token %d (%v), the coupled draw is %d (%v)", trial, i, c, d.ID, noisy(d.ID), want, best)
				}
				if d.ID != greedy {
					notGreedy++
				}
				if row := rows[i][c]; row.Accept != (row.Sample == d.ID) {
					t.Errorf("trial %d, entry %d, row %d: accept %v, the target drew %d for draft %d", trial, i, c, row.Accept, row.Sample, d.ID)
				}
				if !rows[i][c].Accept {
					break // the rows after a rejection verify drafts past the target's token
				}
			}
		}
	}
	if notGreedy == 0 {
		t.Error("every coupled draft was the drafter's greedy token")
	}
	t.Logf("coupled drafts other than the greedy token: %d", notGreedy)
}

// TestHeadSampleN: outside fused steps a head drafts coupled draws through
// SampleN — each token the coupled draw of its own distribution (the
// plain-Go head's logits at its position) under its draw's key, within the
// noise's slack, listing its most likely tokens where asked, and at
// temperature 1 not only its greedy tokens — chained on the device, and a
// step a call where the entry is fed short of the target's line (its later
// rows then read the target's features); a draw that is not coupled is
// refused.
func TestHeadSampleN(t *testing.T) {
	rig := newHeadRig(t, false, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(25, 26))
	const n = 4
	notGreedy := 0
	for trial := range 8 {
		prompt := []int{3 + trial, 17, 5, 9, 30 + trial, 200, 11, 40 + trial}
		g := newHeadTwins(t, h, target, prompt)
		fed := g.text // the head's tokens: the whole text, or short of the target's line
		if trial%2 == 1 {
			fed = g.text[:len(g.text)-3]
		}
		T := []float32{1, 0.7}[trial/2%2]
		topN := 0
		if trial >= 4 {
			topN = 3
		}
		draws := make([]sampling.Draw, n)
		for k := range draws {
			draws[k] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
		}
		en := &engine.VerifyEntry{Seq: g.hF, Target: g.tF, Tokens: slices.Clone(fed), Out: 1, TopN: topN,
			Sampling: sampling.Params{Temperature: T, TopP: 1}, Draws: draws}
		out, err := h.SampleN(ctx, []*engine.VerifyEntry{en}, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || len(out[0]) != n {
			t.Fatalf("trial %d: %d entries' tokens, want 1 of %d", trial, len(out), n)
		}
		if got, want := g.hF.Len(), len(fed)+n-1; got > want {
			t.Errorf("trial %d: the head holds %d positions, want at most %d", trial, got, want)
		}
		text := append(slices.Clone(fed), engine.IDs(out[0][:n-1])...)
		rows := rig.oracle.rows(text, prompt)
		for c, d := range out[0] {
			// rows[i]: the head's row after token i + 1.
			if checkHeadCoupled(t, rig, fmt.Sprintf("trial %d, token %d", trial, c), rows[len(fed)-2+c].Logits, T, draws[c], d, topN) {
				notGreedy++
			}
		}
		for _, s := range []engine.Sequence{g.tF, g.tS, g.hF, g.hS} {
			s.Release()
		}
	}
	if notGreedy == 0 {
		t.Error("every coupled draw was the head's greedy token")
	}
	t.Logf("coupled draws other than the greedy token: %d", notGreedy)

	g := newHeadTwins(t, h, target, []int{5, 6, 7})
	plain := &engine.VerifyEntry{Seq: g.hF, Target: g.tF, Tokens: slices.Clone(g.text), Out: 1,
		Sampling: sampling.Params{Temperature: 1}, Draws: []sampling.Draw{{X: sampling.NoProposal, U: 0.5, V: 0.5}}}
	if _, err := h.SampleN(ctx, []*engine.VerifyEntry{plain}, 1); err == nil {
		t.Error("SampleN took a draw that is not coupled")
	}
	if g.hF.Len() != 0 {
		t.Errorf("a refused SampleN left %d positions in the head's sequence", g.hF.Len())
	}
}

// TestHeadVerifyCoupled: a Verify with coupled draws (a keyed token
// tree's levels, drafted a pass a level) reads each row's Sample out as
// the coupled draw of the head's own distribution under the row's key (the
// plain-Go head's logits), with its top tokens, beside a greedy entry of
// the same batch whose rows stay its greedy tokens; coupled draws in a
// batch that draws proposals are refused, nothing fed.
func TestHeadVerifyCoupled(t *testing.T) {
	rig := newHeadRig(t, false, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(27, 28))
	const out = 3
	notGreedy := 0
	for trial := range 4 {
		prompt := []int{3 + trial, 17, 5, 9, 30 + trial, 200, 11, 40 + trial}
		a, b := newHeadTwins(t, h, target, prompt), newHeadTwins(t, h, target, prompt[2:])
		T, topN := []float32{1, 0.7}[trial%2], 2*(trial/2)
		draws := make([]sampling.Draw, out)
		for k := range draws {
			draws[k] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
		}
		keyed := &engine.VerifyEntry{Seq: a.hF, Target: a.tF, Tokens: slices.Clone(a.text), Out: out, TopN: topN,
			Sampling: sampling.Params{Temperature: T, TopP: 1}, Draws: draws}
		greedy := &engine.VerifyEntry{Seq: b.hF, Target: b.tF, Tokens: slices.Clone(b.text), Out: 2}
		if err := h.Verify(ctx, []*engine.VerifyEntry{keyed, greedy}); err != nil {
			t.Fatal(err)
		}
		// rows[i]: the head's row after token i + 1.
		rows := rig.oracle.rows(a.text, prompt)
		for j, r := range keyed.Rows {
			d := engine.Token{ID: r.Sample, Logprob: r.SampleLogprob, Top: r.Top}
			if checkHeadCoupled(t, rig, fmt.Sprintf("trial %d, row %d", trial, j), rows[len(a.text)-out+j-1].Logits, T, draws[j], d, topN) {
				notGreedy++
			}
		}
		brows := rig.oracle.rows(b.text, prompt[2:])
		for j, r := range greedy.Rows {
			logits := brows[len(b.text)-greedy.Out+j-1].Logits
			got := slices.Index(rig.w.TargetIDs, int32(r.Argmax))
			if best := slices.Max(logits); got < 0 || logits[got] < best-1e-3 {
				t.Errorf("trial %d: the greedy entry's row %d reads %d, not the head's greedy token", trial, j, r.Argmax)
			}
		}
		for _, g := range []headTwins{a, b} {
			for _, s := range []engine.Sequence{g.tF, g.tS, g.hF, g.hS} {
				s.Release()
			}
		}
	}
	if notGreedy == 0 {
		t.Error("every coupled draw was the head's greedy token")
	}
	t.Logf("coupled draws other than the greedy token: %d", notGreedy)

	a, b := newHeadTwins(t, h, target, []int{5, 6, 7}), newHeadTwins(t, h, target, []int{8, 9, 10})
	coupled := &engine.VerifyEntry{Seq: a.hF, Target: a.tF, Tokens: slices.Clone(a.text), Out: 1,
		Sampling: sampling.Params{Temperature: 1}, Draws: []sampling.Draw{{X: sampling.NoProposal, U: 0.5, V: 0.5, Coupled: true}}}
	proposing := &engine.VerifyEntry{Seq: b.hF, Target: b.tF, Tokens: slices.Clone(b.text), Out: 1,
		Sampling: sampling.Params{Temperature: 1}, Propose: [][]float32{{0.5}}}
	if err := h.Verify(ctx, []*engine.VerifyEntry{coupled, proposing}); err == nil || !strings.Contains(err.Error(), "coupled draws in a batch that draws proposals") {
		t.Errorf("coupled draws beside proposals: %v", err)
	}
	if a.hF.Len() != 0 || b.hF.Len() != 0 {
		t.Errorf("a refused Verify left %d and %d positions in the head's sequences", a.hF.Len(), b.hF.Len())
	}
}
