package sampling_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

// coupledDraw is a fresh coupled row's draw proposing x.
func coupledDraw(r *rand.Rand, x int) sampling.Draw {
	return sampling.Draw{X: x, U: r.Float32(), V: r.Float32(), Coupled: true}
}

// TestCoupledKeepsTheDistribution: over fresh keys, a coupled row's token
// follows p (a chi-square test at p ≈ 1e-4 over the kept tokens), whatever
// it proposes; the proposal is accepted exactly when it is that token.
func TestCoupledKeepsTheDistribution(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 40000
	for _, p := range []sampling.Params{{Temperature: 1, TopP: 1}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1.5, TopP: 0.5}} {
		l := randLogits(r, 12, 1.5)
		want, err := samplingtest.Probs(l, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range []int{sampling.NoProposal, 0, 5} {
			counts := make([]float64, len(l))
			for range n {
				row, err := sampling.Choose(l, p, coupledDraw(r, x))
				if err != nil {
					t.Fatal(err)
				}
				if row.Accept != (x != sampling.NoProposal && row.Sample == x) {
					t.Fatalf("%+v, X %d: accept %v with sample %d", p, x, row.Accept, row.Sample)
				}
				counts[row.Sample]++
			}
			chi2, dof := 0.0, -1
			for i, c := range counts {
				if want[i] == 0 {
					if c > 0 {
						t.Errorf("%+v, X %d: token %d outside the nucleus came out %v times", p, x, i, c)
					}
					continue
				}
				e := want[i] * n
				chi2 += (c - e) * (c - e) / e
				dof++
			}
			// The chi-square quantile at 1 − 1e-4 is below dof + 6·√(2·dof) + 10 for these dof.
			if limit := float64(dof) + 6*math.Sqrt(2*float64(dof)) + 10; chi2 > limit {
				t.Errorf("%+v, X %d: χ² %.1f over %d degrees of freedom (limit %.1f)", p, x, chi2, dof, limit)
			}
		}
	}
}

// TestCoupledAgreement: a drafter drawing from q by the same key agrees
// with the target's draw from p at least (1 − TV)/(1 + TV) of the time,
// the coupling's bound, and always where q = p; a greedy proposal agrees
// p(argmax q) of the time.
func TestCoupledAgreement(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	p := sampling.Params{Temperature: 0.8, TopP: 1}
	const n = 20000
	for trial := range 4 {
		lp := randLogits(r, 50, 2)
		lq := make([]float32, len(lp))
		for i := range lq {
			lq[i] = lp[i] + float32(r.NormFloat64()*0.7*float64(trial))
		}
		P, _ := samplingtest.Probs(lp, p)
		Q, _ := samplingtest.Probs(lq, p)
		tv := 0.0
		for i := range P {
			tv += math.Abs(P[i]-Q[i]) / 2
		}
		agree := 0
		for range n {
			d := coupledDraw(r, sampling.NoProposal)
			x, err := sampling.CoupledChoice(lq, nil, p.Temperature, d)
			if err != nil {
				t.Fatal(err)
			}
			d.X = x
			row, err := sampling.Choose(lp, p, d)
			if err != nil {
				t.Fatal(err)
			}
			if row.Accept {
				agree++
			}
		}
		rate := float64(agree) / n
		if trial == 0 && rate != 1 {
			t.Errorf("q = p: the drafter agreed %.4f of the time, want 1", rate)
		}
		if bound := (1 - tv) / (1 + tv); rate < bound-0.02 {
			t.Errorf("trial %d: agreement %.3f below the bound %.3f (TV %.3f)", trial, rate, bound, tv)
		}
		t.Logf("TV %.3f: coupled agreement %.3f, optimal %.3f", tv, rate, 1-tv)
	}
}

// TestCoupledChoiceMapped: a head's choice over part of the vocabulary is
// the choice over the whole vocabulary's row with the others at −∞, its
// noise keyed by the target's tokens.
func TestCoupledChoiceMapped(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const V = 300
	tokens := []int32{3, 40, 41, 77, 150, 151, 299, 12}
	for range 200 {
		part := randLogits(r, len(tokens), 2)
		whole := make([]float32, V)
		for i := range whole {
			whole[i] = float32(math.Inf(-1))
		}
		for i, tk := range tokens {
			whole[tk] = part[i]
		}
		d := coupledDraw(r, sampling.NoProposal)
		got, err := sampling.CoupledChoice(part, tokens, 0.9, d)
		if err != nil {
			t.Fatal(err)
		}
		want, err := sampling.CoupledChoice(whole, nil, 0.9, d)
		if err != nil {
			t.Fatal(err)
		}
		if int(tokens[got]) != want {
			t.Fatalf("mapped choice %d (token %d), whole row's %d", got, tokens[got], want)
		}
	}
	bad := []float32{1, float32(math.NaN())}
	if _, err := sampling.CoupledChoice(bad, nil, 1, sampling.Draw{}); err != sampling.ErrNaN {
		t.Errorf("NaN logits: %v", err)
	}
}

// TestGumbel: the noise is the standard Gumbel's — mean γ, variance π²/6 —
// over tokens and over keys, and a function of the key and the token only.
func TestGumbel(t *testing.T) {
	const n = 200000
	var s, s2 float64
	for i := range n {
		g := float64(sampling.Gumbel(0x1234567, 0x89abcdef, i))
		s, s2 = s+g, s2+g*g
	}
	mean, variance := s/n, s2/n-(s/n)*(s/n)
	if math.Abs(mean-0.5772) > 0.01 || math.Abs(variance-math.Pi*math.Pi/6) > 0.03 {
		t.Errorf("over tokens: mean %.4f, variance %.4f; want 0.5772, %.4f", mean, variance, math.Pi*math.Pi/6)
	}
	s, s2 = 0, 0
	for k := range uint32(n) {
		g := float64(sampling.Gumbel(k*2654435761, k, 42))
		s, s2 = s+g, s2+g*g
	}
	mean, variance = s/n, s2/n-(s/n)*(s/n)
	if math.Abs(mean-0.5772) > 0.01 || math.Abs(variance-math.Pi*math.Pi/6) > 0.03 {
		t.Errorf("over keys: mean %.4f, variance %.4f", mean, variance)
	}
	if sampling.Gumbel(1, 2, 3) != sampling.Gumbel(1, 2, 3) || sampling.Gumbel(1, 2, 3) == sampling.Gumbel(1, 2, 4) || sampling.Gumbel(1, 2, 3) == sampling.Gumbel(2, 1, 3) {
		t.Error("the noise is not a function of the key and the token")
	}
}

// TestGumbelTails: at the ends of the hash's range and at the GPU
// formula's seams (samplingtest.ExtremeHashes, reached through keys that
// give a token that hash) the noise is finite, at most MaxGumbel, and falls
// as the hash grows; the largest is MaxGumbel.
func TestGumbelTails(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	if g := float64(sampling.MaxGumbel); math.IsInf(g, 0) || math.IsNaN(g) || g < 22 || g > 23.5 {
		t.Fatalf("MaxGumbel %v", g)
	}
	last := float32(math.Inf(1))
	for _, h := range samplingtest.ExtremeHashes {
		tok := r.IntN(151936)
		d := samplingtest.DrawHashing(r, tok, h, sampling.NoProposal)
		if d.U < 0 || d.U >= 1 || d.V < 0 || d.V >= 1 {
			t.Fatalf("hash %#x: draw %+v outside [0, 1)", h, d)
		}
		k0, k1 := d.Key()
		g := sampling.Gumbel(k0, k1, tok)
		if math.IsInf(float64(g), 0) || math.IsNaN(float64(g)) || g > sampling.MaxGumbel || g > last {
			t.Errorf("hash %#x: noise %v (MaxGumbel %v, the hash before %v)", h, g, sampling.MaxGumbel, last)
		}
		if h == 0 && g != sampling.MaxGumbel {
			t.Errorf("hash 0: noise %v, want MaxGumbel %v", g, sampling.MaxGumbel)
		}
		last = g
	}
}
