package webgpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
	"webdraft/tensor"
)

// agreeablePair is a tiny target and an EAGLE-3 head over it that agree
// about half the time, so that chains of speculative steps accept drafts
// of every length: the target's final norm keeps one coordinate of its
// hidden state, so its greedy token is one of two (the tokens its lm_head
// scores highest and lowest by that coordinate), by the coordinate's
// sign; the head's lm_head scores the same two by a random direction of
// its own output, and every other draft token 0, so it drafts one of the
// two by that direction's sign — each side's choice its own, from what
// each reads at the position.
func agreeablePair(t *testing.T) (*Head, *Engine) {
	t.Helper()
	m := enginetest.TinyModel(t, enginetest.HeadLayers)
	norm := make([]float32, len(m.Weights.Norm))
	norm[0] = 1
	m.Weights.Norm = norm
	tlm := m.Weights.LMHead.(*tensor.F32)
	hi, lo := 0, 0
	for v := range tlm.Rows {
		if x := tlm.Data[v*tlm.Cols]; x > tlm.Data[hi*tlm.Cols] {
			hi = v
		} else if x < tlm.Data[lo*tlm.Cols] {
			lo = v
		}
	}
	target, err := NewGroup(gputest.Device(t)).New(m.Config, m.Weights, Options{KVBytes: 16 << 20, MaxSequences: 16, KV: "f32",
		FeatureLayers: eagle3.DefaultAux(enginetest.HeadLayers)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	c := enginetest.TinyHeadConfig()
	w := enginetest.RandomHead(c, 11, false)
	ids := []int32{int32(hi), int32(lo)}
	for _, id := range w.TargetIDs {
		if len(ids) < c.DraftVocabSize && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	w.TargetIDs = ids
	lm := w.LMHead.(*tensor.F32)
	u := slices.Clone(lm.Data[:lm.Cols])
	clear(lm.Data)
	for d, id := range ids {
		sign := float32(0)
		switch int(id) {
		case hi:
			sign = 1
		case lo:
			sign = -1
		}
		for k, x := range u {
			lm.Data[d*lm.Cols+k] = sign * x
		}
	}
	h, err := NewHead(target, c, w, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, KV: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, target
}

// specGen is one generation of TestHeadDraftVerifyN: its text, and its
// sequences for the chained calls (F) and for the step-by-step ones (S).
type specGen struct{ headTwins }

// TestHeadDraftVerifyN: a chain of m speculative steps in one call — each
// step after the first accepted and planned on the device — drafts,
// verifies and accepts what m DraftVerify calls do, each followed by
// greedy acceptance on the host: the same drafts and verified rows step
// by step, the same acceptance, and both caches then holding the same
// (the next call, chained or not, goes on from them alike). Over a pair
// that accepts drafts of every length (agreeablePair) and a random one
// (drafts seldom accepted, the target's rows its own), two generations a
// batch, n = 1, 3 and 5 drafts a step; and where the second generation's
// drafts and rows list their top tokens (3 and 2: the drafts then draft
// tokens mapped on the device, the rows read out by sample.wgsl).
func TestHeadDraftVerifyN(t *testing.T) {
	for _, pair := range []string{"agreeable", "random"} {
		t.Run(pair, func(t *testing.T) {
			var h *Head
			var target *Engine
			if pair == "agreeable" {
				h, target = agreeablePair(t)
			} else {
				rig := newHeadRig(t, true, HeadOptions{})
				h, target = rig.head, rig.target
			}
			for _, n := range []int{1, 3, 5} {
				t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) { testDraftVerifyN(t, h, target, n, 0, pair == "agreeable", nil) })
			}
			t.Run("n=3, top tokens", func(t *testing.T) { testDraftVerifyN(t, h, target, 3, 3, pair == "agreeable", nil) })
			t.Run("n=3, sampled", func(t *testing.T) { testDraftVerifyN(t, h, target, 3, 0, pair == "agreeable", sampledAt) })
			t.Run("n=4, sampled beside greedy, top tokens", func(t *testing.T) {
				testDraftVerifyN(t, h, target, 4, 2, pair == "agreeable", sampledBeside)
			})
		})
	}
}

// specDrafter is a drafter that chains speculative steps on its target's
// device: a Head, or an Engine.
type specDrafter interface {
	engine.Engine
	engine.SpecChainer
}

// The sampling of testDraftVerifyN's two generations: both sampled, in a
// nucleus and not, and the first sampled beside a greedy one; at
// temperatures low enough that the tiny target's flat rows pass the
// peaked head's coupled drafts of every length, and yet the noise decides
// near ties (TestHeadCoupledDrafts holds each draft to the coupled choice
// at higher ones).
var (
	sampledAt     = []sampling.Params{{Temperature: 0.05, TopP: 0.9}, {Temperature: 0.1, TopP: 1}}
	sampledBeside = []sampling.Params{{Temperature: 0.03, TopP: 0.95}, {}}
)

// testDraftVerifyN holds a chain of m steps to m DraftVerify calls
// (TestHeadDraftVerifyN), its two generations greedy or sampled under
// params, a sampled one's rows coupled under its own keys by the
// positions they decide (sampling.Keys), whichever step reaches them.
func testDraftVerifyN(t *testing.T, h specDrafter, target *Engine, n, topN int, agreeable bool, params []sampling.Params) {
	ctx := context.Background()
	const m = 4
	gens := []*specGen{
		{newHeadTwins(t, h, target, []int{3, 17, 5, 9, 30, 200})},
		{newHeadTwins(t, h, target, []int{8, 1, 250, 4})},
	}
	if params == nil {
		params = make([]sampling.Params, len(gens))
	}
	rng := rand.New(rand.NewPCG(uint64(n), uint64(topN)))
	keys := make([]sampling.Keys, len(gens)) // each round's
	// The head first drafts after the whole text fed at once.
	chainSteps := func(seq func(g *specGen) (tq, hq engine.Sequence), chain bool) []engine.ChainStep {
		var steps []engine.ChainStep
		for i, g := range gens {
			tq, hq := seq(g)
			dTop, vTop := 0, 0
			if (i == 1 || !params[i].Greedy()) && topN > 0 { // a sampled generation's drafts listing their top tokens too
				dTop, vTop = topN, topN-1
			}
			st := engine.ChainStep{
				Draft:  &engine.Entry{Seq: hq, Target: tq, Tokens: slices.Clone(g.text[hq.Len():]), TopN: dTop},
				Verify: &engine.VerifyEntry{Seq: tq, Tokens: slices.Clone(g.text[tq.Len():]), Out: n + 1, TopN: vTop, Sampling: params[i]},
				Take:   n,
			}
			if !params[i].Greedy() {
				for c := range n + 1 {
					st.Verify.Draws = append(st.Verify.Draws, keys[i].At(len(g.text)+c))
				}
				if chain {
					st.Keys = &keys[i]
				}
			}
			steps = append(steps, st)
		}
		return steps
	}
	accepted := map[int]int{}
	for round := range 3 {
		for i := range gens {
			keys[i] = sampling.NewKeys(rng.Uint64())
		}
		fused := chainSteps(func(g *specGen) (engine.Sequence, engine.Sequence) { return g.tF, g.hF }, true)
		got, err := h.DraftVerifyN(ctx, target, fused, n, m)
		if err != nil {
			t.Fatalf("round %d: DraftVerifyN: %v", round, err)
		}
		if len(got) != m {
			t.Fatalf("round %d: %d steps, want %d", round, len(got), m)
		}
		for i, s := range fused {
			if len(s.Verify.Tokens) != 1 || s.Verify.Rows != nil {
				t.Fatalf("round %d, generation %d: the Verify entry changed: %v, %d rows", round, i, s.Verify.Tokens, len(s.Verify.Rows))
			}
		}
		texts := make([][]int, len(gens))
		for i, g := range gens {
			texts[i] = slices.Clone(g.text)
		}
		for j, cs := range got {
			sep := chainSteps(func(g *specGen) (engine.Sequence, engine.Sequence) { return g.tS, g.hS }, false)
			want, err := engine.DraftVerify(ctx, h, target, sep, n)
			if err != nil {
				t.Fatalf("round %d, step %d: DraftVerify: %v", round, j, err)
			}
			what := fmt.Sprintf("round %d, step %d", round, j)
			sameTokens(t, what, cs.Drafts, want)
			for i, g := range gens {
				rows := sep[i].Verify.Rows
				for r, w := range rows {
					gr := cs.Rows[i][r]
					same := gr.Argmax == w.Argmax && math.Abs(float64(gr.ArgmaxLogprob-w.ArgmaxLogprob)) <= 1e-4 && math.Abs(float64(gr.LogSumExp-w.LogSumExp)) <= 1e-4 && len(gr.Top) == len(w.Top) &&
						gr.Accept == w.Accept && gr.Sample == w.Sample
					for q := range w.Top {
						same = same && gr.Top[q].Token == w.Top[q].Token && math.Abs(float64(gr.Top[q].Logprob-w.Top[q].Logprob)) <= 1e-4
					}
					if !same {
						t.Errorf("%s, generation %d, row %d: %+v %v, step by step %+v %v", what, i, r, gr.Row, gr.Top, w.Row, w.Top)
					}
				}
				greedy := params[i].Greedy()
				a := 0
				for a < n && (greedy && want[i][a].ID == rows[a].Argmax || !greedy && rows[a].Accept) {
					a++
				}
				if cs.Accepted[i] != a {
					t.Errorf("%s, generation %d: accepted %d, step by step %d", what, i, cs.Accepted[i], a)
				}
				accepted[a]++
				for _, d := range want[i][:a] {
					g.text = append(g.text, d.ID)
				}
				if greedy {
					g.text = append(g.text, rows[a].Argmax)
				} else {
					g.text = append(g.text, rows[a].Sample)
				}
				for _, s := range []engine.Sequence{g.tS, g.hS} {
					s.Truncate(min(s.Len(), len(g.text)-1))
				}
			}
			if t.Failed() {
				t.FailNow()
			}
		}
		// The chained sequences, cut back as after accepting the last step,
		// hold what the step-by-step ones do.
		for i, g := range gens {
			for _, s := range []engine.Sequence{g.tF, g.hF} {
				s.Truncate(min(s.Len(), len(g.text)-1))
			}
			if g.tF.Len() != g.tS.Len() || g.hF.Len() != g.hS.Len() {
				t.Fatalf("round %d, generation %d: the chain leaves the target %d tokens and the head %d; step by step %d and %d (text %d, from %d)",
					round, i, g.tF.Len(), g.hF.Len(), g.tS.Len(), g.hS.Len(), len(g.text), len(texts[i]))
			}
		}
	}
	t.Logf("drafts accepted (count: generations × steps): %v", accepted)
	if agreeable && len(accepted) < min(3, n+1) {
		t.Errorf("the agreeable pair accepted %v drafts: want several lengths", accepted)
	}
}

// TestDraftVerifyN: a standalone drafter's chains of speculative steps
// (Engine.DraftVerifyN) hold to m DraftVerify calls as a head's do
// (testDraftVerifyN): the golden model drafting in int4 for itself in f32,
// which agree most of the time, n = 1, 3 and 5, and with top tokens.
func TestDraftVerifyN(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{})
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) { testDraftVerifyN(t, p.drafter, p.target, n, 0, true, nil) })
	}
	t.Run("n=3, top tokens", func(t *testing.T) { testDraftVerifyN(t, p.drafter, p.target, 3, 3, true, nil) })
	t.Run("n=3, sampled", func(t *testing.T) { testDraftVerifyN(t, p.drafter, p.target, 3, 0, true, sampledAt) })
	t.Run("n=4, sampled beside greedy, top tokens", func(t *testing.T) {
		testDraftVerifyN(t, p.drafter, p.target, 4, 2, true, sampledBeside)
	})
}
