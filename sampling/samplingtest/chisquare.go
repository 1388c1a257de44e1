package samplingtest

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// MinExpected is the fewest draws GoodnessOfFit lets a bin expect: bins
// that expect fewer are pooled, so that the statistic follows its
// chi-square law.
const MinExpected = 5

// Fit is the outcome of Pearson's chi-square test of draws against a
// distribution.
type Fit struct {
	Stat   float64 // Σ (observed − expected)² / expected over the pooled bins
	DF     int     // degrees of freedom: the pooled bins less one
	PValue float64 // P(χ²(DF) ≥ Stat): how often the right distribution fits as badly
}

// GoodnessOfFit tests counts, the draws that fell in each bin, against
// want, each bin's probability (weights, normalized here). Bins that
// expect fewer than MinExpected draws are pooled, the least likely first,
// until each pool expects MinExpected (a last pool short of it joins the
// one before). A draw in a bin of probability 0 cannot come from want: its
// Fit has Stat +Inf and PValue 0.
func GoodnessOfFit(counts []int, want []float64) (Fit, error) {
	if len(counts) != len(want) {
		return Fit{}, fmt.Errorf("samplingtest: %d counts for %d probabilities", len(counts), len(want))
	}
	var n int
	var total float64
	for i := range counts {
		if counts[i] < 0 || !(want[i] >= 0) || math.IsInf(want[i], 1) {
			return Fit{}, fmt.Errorf("samplingtest: bin %d: count %d, probability %v", i, counts[i], want[i])
		}
		n += counts[i]
		total += want[i]
	}
	if n == 0 || total == 0 {
		return Fit{}, errors.New("samplingtest: no draws or no probability")
	}
	order := make([]int, 0, len(want))
	for i := range want {
		if want[i] > 0 {
			order = append(order, i)
		} else if counts[i] > 0 {
			return Fit{Stat: math.Inf(1), DF: len(want) - 1}, nil
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpFloat(want[a], want[b]) })
	type pool struct {
		observed int
		expected float64
	}
	var pools []pool
	var cur pool
	for _, i := range order {
		cur.observed += counts[i]
		cur.expected += float64(n) * want[i] / total
		if cur.expected >= MinExpected {
			pools, cur = append(pools, cur), pool{}
		}
	}
	if cur.expected > 0 {
		if len(pools) == 0 {
			return Fit{}, fmt.Errorf("samplingtest: %d draws are too few: no bin expects %d", n, MinExpected)
		}
		last := &pools[len(pools)-1]
		last.observed += cur.observed
		last.expected += cur.expected
	}
	if len(pools) < 2 {
		return Fit{}, errors.New("samplingtest: fewer than two bins to test")
	}
	var f Fit
	for _, b := range pools {
		d := float64(b.observed) - b.expected
		f.Stat += d * d / b.expected
	}
	f.DF = len(pools) - 1
	f.PValue = ChiSquareSurvival(f.DF, f.Stat)
	return f, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ChiSquareSurvival is P(χ²(df) ≥ x), the regularized upper incomplete
// gamma function Q(df/2, x/2): by its series below a+1 and its continued
// fraction (modified Lentz) above, each to double precision.
func ChiSquareSurvival(df int, x float64) float64 {
	if df <= 0 || math.IsNaN(x) {
		return math.NaN()
	}
	if x <= 0 {
		return 1
	}
	if math.IsInf(x, 1) {
		return 0
	}
	a, x := float64(df)/2, x/2
	lg, _ := math.Lgamma(a)
	front := math.Exp(a*math.Log(x) - x - lg) // xᵃ e⁻ˣ / Γ(a)
	if x < a+1 {
		// P(a, x) = front · Σₖ xᵏ / (a (a+1) … (a+k)).
		term := 1 / a
		s := term
		for k := 1; k < 1000; k++ {
			term *= x / (a + float64(k))
			s += term
			if term < s*1e-17 {
				break
			}
		}
		return max(0, 1-front*s)
	}
	// Q(a, x) = front / (x + 1 − a − 1·(1−a)/(x + 3 − a − 2·(2−a)/(x + 5 − a − …))).
	const tiny = 1e-300
	b := x + 1 - a
	c := 1 / tiny
	d := 1 / b
	h := d
	for k := 1; k < 1000; k++ {
		an := -float64(k) * (float64(k) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		delta := d * c
		h *= delta
		if math.Abs(delta-1) < 1e-16 {
			break
		}
	}
	return front * h
}
