package samplingtest_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"webdraft/sampling/samplingtest"
)

// TestChiSquareSurvival against the closed forms: erfc(√(x/2)) at one
// degree of freedom, e^(−x/2) Σ_{k<df/2} (x/2)ᵏ/k! at even ones.
func TestChiSquareSurvival(t *testing.T) {
	for _, x := range []float64{0.01, 0.5, 1, 3, 10, 15.1367, 40, 100, 700} {
		if got, want := samplingtest.ChiSquareSurvival(1, x), math.Erfc(math.Sqrt(x/2)); !near(got, want) {
			t.Errorf("Q(χ²₁ ≥ %v) = %v, want %v", x, got, want)
		}
		for df := 2; df <= 60; df += 2 {
			var s, term float64 = 0, 1
			for k := range df / 2 {
				if k > 0 {
					term *= x / 2 / float64(k)
				}
				s += term
			}
			if got, want := samplingtest.ChiSquareSurvival(df, x), math.Exp(-x/2)*s; !near(got, want) {
				t.Errorf("Q(χ²_%d ≥ %v) = %v, want %v", df, x, got, want)
			}
		}
	}
	if q := samplingtest.ChiSquareSurvival(2, 18.420680743952367); math.Abs(q-1e-4) > 1e-15 {
		t.Errorf("the 1e-4 critical value of χ²₂: %v", q)
	}
}

func near(got, want float64) bool {
	return math.Abs(got-want) <= 1e-12*want+1e-300
}

// TestGoodnessOfFit: the right distribution passes about as often as the
// p-values promise, a wrong one fails, a draw where the probability is 0
// fails outright, and rare bins are pooled.
func TestGoodnessOfFit(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	want := []float64{0.5, 0.2, 0.15, 0.1, 0.04, 0.009, 0.001, 0}
	draw := func(p []float64, n int) []int {
		counts := make([]int, len(p))
		for range n {
			u, t := r.Float64(), 0
			for acc := p[0]; u >= acc && t < len(p)-1; acc += p[t] {
				t++
			}
			counts[t]++
		}
		return counts
	}
	const runs = 400
	below := 0
	for range runs {
		fit, err := samplingtest.GoodnessOfFit(draw(want, 300), want)
		if err != nil {
			t.Fatal(err)
		}
		// 300 draws expect 0.3 and 2.7 of the two rarest bins: pooled with
		// the 0.04 bin's 12, they leave five pools, four degrees of freedom.
		if fit.DF != 4 {
			t.Fatalf("%d degrees of freedom, want 4", fit.DF)
		}
		if fit.PValue < 0.05 {
			below++
		}
	}
	// Binomial(400, 0.05): 20 ± 4.4; allow 4.5σ either way.
	t.Logf("below 0.05: %d of %d", below, runs)
	if below < 1 || below > 40 {
		t.Errorf("the right distribution fell below p 0.05 in %d runs of %d", below, runs)
	}
	wrong := []float64{0.45, 0.25, 0.15, 0.1, 0.04, 0.009, 0.001, 0}
	if fit, _ := samplingtest.GoodnessOfFit(draw(wrong, 20000), want); fit.PValue > 1e-4 {
		t.Errorf("a wrong distribution passed: %+v", fit)
	}
	counts := draw(want, 1000)
	counts[7]++
	if fit, err := samplingtest.GoodnessOfFit(counts, want); err != nil || fit.PValue != 0 {
		t.Errorf("a draw of probability 0: %+v, %v", fit, err)
	}
	for _, c := range []struct {
		counts []int
		want   []float64
	}{{[]int{1}, []float64{1, 0}}, {[]int{1, 1}, []float64{0.5, 0.5}}, {[]int{9, 0}, []float64{1, 0}}, {[]int{-1, 5}, []float64{0.5, 0.5}}} {
		if fit, err := samplingtest.GoodnessOfFit(c.counts, c.want); err == nil {
			t.Errorf("GoodnessOfFit(%v, %v) = %+v, want an error", c.counts, c.want, fit)
		}
	}
}
