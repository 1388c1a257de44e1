package sampling_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

func randLogits(r *rand.Rand, n int, scale float64) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * scale)
	}
	return l
}

func TestGreedy(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	l := randLogits(r, 1000, 3)
	l[17], l[400] = 50, 50 // a tie: the lower index wins
	row, err := sampling.Choose(l, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, x := range l {
		sum += math.Exp(float64(x) - 50)
	}
	if row.Argmax != 17 || math.Abs(float64(row.LogSumExp)-(50+math.Log(sum))) > 1e-4 {
		t.Errorf("argmax %d, lse %v; want 17, %v", row.Argmax, row.LogSumExp, 50+math.Log(sum))
	}
	if row.Accept || row.Sample != 0 {
		t.Errorf("a greedy row drew: %+v", row)
	}
	l[3] = float32(math.NaN())
	if _, err := sampling.Choose(l, sampling.Params{}, sampling.Draw{X: sampling.NoProposal}); err != sampling.ErrNaN {
		t.Errorf("NaN logits: %v", err)
	}
}

// TestRuleKeepsTheDistribution: over every (U, V) on a fine grid, the
// token that comes out — X when accepted, else the draw without X — is
// distributed as p, whatever X is; without a proposal the draw alone is.
func TestRuleKeepsTheDistribution(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const grid = 400
	for _, p := range []sampling.Params{{Temperature: 1, TopP: 1}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1.5, TopP: 0.5}} {
		l := randLogits(r, 12, 1.5)
		for _, x := range []int{sampling.NoProposal, 0, 5, 11} {
			counts := make([]float64, len(l))
			for iu := range grid {
				for iv := range grid {
					d := sampling.Draw{X: x, U: (float32(iu) + 0.5) / grid, V: (float32(iv) + 0.5) / grid}
					row, err := sampling.Choose(l, p, d)
					if err != nil {
						t.Fatal(err)
					}
					out := row.Sample
					if row.Accept {
						out = x
					}
					counts[out]++
				}
			}
			want, err := samplingtest.Probs(l, p)
			if err != nil {
				t.Fatal(err)
			}
			for i := range counts {
				got := counts[i] / grid / grid
				if math.Abs(got-want[i]) > 4.0/grid {
					t.Errorf("%+v, X %d: token %d comes out %.4f of the time, want %.4f", p, x, i, got, want[i])
				}
			}
		}
	}
}

// TestNucleus: the kept tokens are the most likely ones, the fewest whose
// mass reaches top_p, ties at the edge all kept.
func TestNucleus(t *testing.T) {
	l := []float32{0, 3, 1, 3, 2, -5}
	p := sampling.Params{Temperature: 1, TopP: 0.6}
	row, err := sampling.Choose(l, p, sampling.Draw{X: sampling.NoProposal, V: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	// The two 3s hold exp(3)·2 / Σ ≈ 0.80 ≥ 0.6 of the mass: both kept, nothing else.
	if row.Threshold != 3 {
		t.Errorf("threshold %v, want 3", row.Threshold)
	}
	if row.Sample != 1 && row.Sample != 3 {
		t.Errorf("drew %d outside the nucleus", row.Sample)
	}
	p.TopP = 0.9 // the 2 too (0.80 + 0.11)
	if row, _ := sampling.Choose(l, p, sampling.Draw{X: sampling.NoProposal}); row.Threshold != 2 {
		t.Errorf("threshold %v, want 2", row.Threshold)
	}
	// A proposal outside the nucleus is never accepted.
	if row, _ := sampling.Choose(l, sampling.Params{Temperature: 1, TopP: 0.6}, sampling.Draw{X: 4, U: 0}); row.Accept {
		t.Error("a token outside the nucleus was accepted")
	}
	// The only kept token, proposed, is accepted whatever U is.
	if row, _ := sampling.Choose([]float32{9, 0, 0}, sampling.Params{Temperature: 0.1, TopP: 0.5}, sampling.Draw{X: 0, U: 0.9999}); !row.Accept || row.Sample != 0 {
		t.Errorf("the only kept token: %+v", row)
	}
}

func TestTop(t *testing.T) {
	l := []float32{1, 4, 4, -2, 3}
	got := sampling.Top(l, 3, 5)
	want := []sampling.TokenLogprob{{1, -1}, {2, -1}, {4, -2}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Top = %v, want %v", got, want)
		}
	}
	if len(sampling.Top(l, 10, 0)) != 5 {
		t.Error("Top of more than the row")
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []sampling.Params{{Temperature: float32(math.NaN())}, {TopP: 1.5}, {TopP: -1}} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	if (sampling.Params{Temperature: 0.7, TopP: 0.95}).Validate() != nil {
		t.Error("good params refused")
	}
}
