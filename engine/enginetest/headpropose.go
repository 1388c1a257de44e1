package enginetest

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/reference"
	"webdraft/sampling"
)

// HeadProposals checks a head that samples its drafts (engine.
// SamplesDrafts): a Verify entry with Sampling and Propose, beside a
// greedy entry in the same call, draws at each row with uniforms the
// tokens sampling.DrawDistinct draws from sampling.Dist of the
// reference head's logits there (scattered over the target's
// vocabulary), their log q and q itself within the engines' f32 of the
// reference's; a row without uniforms draws nothing, and so does the
// greedy entry, whose row is the greedy read-out; each sampled row's
// argmax and top tokens are the greedy read-out's too. Temperatures
// below and above 1 (up to 2, where the draws seldom fall on the argmax),
// with and without a nucleus. h reads target's
// features; ref is the target's reference model and head the head's.
func HeadProposals(t *testing.T, h, target engine.Engine, ref *reference.Model, head *reference.Head) {
	t.Helper()
	if !engine.SampledPair(h, target) {
		t.Fatalf("the head and its target are no sampled pair (engine.SampledPair)")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 17))
	tseq, err := target.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer tseq.Release()
	prompt := []int{3, 17, 5, 9, 30, 200}
	next := TargetStep(t, target, tseq, prompt...)
	text := append(slices.Clone(prompt), next)
	rows := HeadRows(t, ref, head, text, prompt)
	uniforms := func(n int) []float32 {
		u := make([]float32, n)
		for i := range u {
			u[i] = rng.Float32()
		}
		return u
	}
	V := h.Config().VocabSize
	params := []sampling.Params{{Temperature: 0.8}, {Temperature: 1.3, TopP: 0.7}, {Temperature: 1.6}, {Temperature: 2}}
	for _, p := range params {
		a := NewSequence(t, h)
		b := NewSequence(t, h)
		us := [][]float32{uniforms(3), nil, uniforms(1)}
		sampled := &engine.VerifyEntry{Seq: a, Target: tseq, Tokens: text, Out: 3, Sampling: p, Propose: us, TopN: 2}
		greedy := &engine.VerifyEntry{Seq: b, Target: tseq, Tokens: text[:4], Out: 1, TopN: 2}
		if err := h.Verify(ctx, []*engine.VerifyEntry{greedy, sampled}); err != nil {
			t.Fatal(err)
		}
		if r := greedy.Rows[0]; r.Drawn != nil || r.Q != nil {
			t.Errorf("%+v: the greedy entry's row drew %v", p, r.Drawn)
		}
		CheckHeadRead(t, "the greedy entry beside proposals", head, rows[2], greedy.Rows[0].Argmax, greedy.Rows[0].ArgmaxLogprob, greedy.Rows[0].Top, 2, 1e-3)
		for j, r := range sampled.Rows {
			want := rows[len(rows)-3+j]
			CheckHeadRead(t, "a proposing row's read-out", head, want, r.Argmax, r.ArgmaxLogprob, r.Top, 2, 1e-3)
			if len(us[j]) == 0 {
				if r.Drawn != nil || r.Q != nil {
					t.Errorf("%+v row %d: no uniforms, drew %v", p, j, r.Drawn)
				}
				continue
			}
			full := make([]float32, V)
			for i := range full {
				full[i] = float32(math.Inf(-1))
			}
			for d, l := range want.Logits {
				full[head.TargetToken(d)] = l
			}
			q, err := sampling.Dist(full, p)
			if err != nil {
				t.Fatal(err)
			}
			drew, err := sampling.DrawDistinct(q, us[j])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.Drawn, drew) || len(r.DrawnLogprob) != len(r.Drawn) {
				t.Errorf("%+v row %d: drew %v, the reference's distribution %v", p, j, r.Drawn, drew)
				continue
			}
			for k, x := range r.Drawn {
				if got := math.Exp(float64(r.DrawnLogprob[k])); !qClose(got, q[x]) {
					t.Errorf("%+v row %d: token %d has q %v, the reference %v", p, j, x, got, q[x])
				}
			}
			got, err := hostDist(r.Q, V)
			if err != nil || got == nil {
				t.Fatalf("%+v row %d: q kept: %v", p, j, err)
			}
			for x := range q {
				if !qClose(got[x], q[x]) {
					t.Errorf("%+v row %d: Q(%d) = %v, the reference %v", p, j, x, got[x], q[x])
					break
				}
			}
		}
		a.Release()
		b.Release()
	}
}
