// Package samplingtest holds an engine's or a kernel's sampled rows to
// package sampling's rule, with room for f32 sums taken in another order.
package samplingtest

import (
	"fmt"
	"math"

	"webdraft/sampling"
)

// Slack is how close (as a probability) a uniform may come to a boundary
// of the rule before Check lets either side of it pass.
const Slack = 1e-3

// Check holds got, a row read out of logits with p and d, to the rule
// computed in float64: the argmax, the acceptance U < p(X) (where U is not
// within Slack of p(X)), and a draw where V falls in the cumulative
// distribution of the nucleus without X (within Slack of the mass); a
// coupled row's draw to a kept token whose scaled logit and noise are
// within NoiseSlack of the largest, accepted iff it is X.
func Check(logits []float32, p sampling.Params, d sampling.Draw, got sampling.Row) error {
	ref, err := sampling.Choose(logits, p, d)
	if err != nil {
		return err
	}
	if got.Argmax != ref.Argmax {
		return fmt.Errorf("argmax %d, want %d", got.Argmax, ref.Argmax)
	}
	if p.Greedy() {
		return nil
	}
	probs := probsAt(logits, p, ref.Threshold)
	if d.Coupled {
		return checkCoupled(logits, p, d, got, ref, probs)
	}
	if d.X != sampling.NoProposal {
		if px := probs[d.X]; math.Abs(float64(d.U)-px) > Slack && got.Accept != (float64(d.U) < px) {
			return fmt.Errorf("accept %v for U %v, p(X) %v", got.Accept, d.U, px)
		}
		if got.Sample == d.X {
			if probs[d.X] < 1-Slack {
				return fmt.Errorf("drew the proposal %d (p %v)", d.X, probs[d.X])
			}
			return nil
		}
	}
	var below, mass float64
	for i, q := range probs {
		if i == d.X {
			continue
		}
		if i < got.Sample {
			below += q
		}
		mass += q
	}
	if got.Sample < 0 || got.Sample >= len(probs) || probs[got.Sample] == 0 {
		return fmt.Errorf("drew %d, outside the nucleus", got.Sample)
	}
	if at := float64(d.V) * mass; at < below-Slack*mass || at > below+probs[got.Sample]+Slack*mass {
		return fmt.Errorf("drew %d for V %v; it covers [%v, %v) of %v", got.Sample, d.V, below, below+probs[got.Sample], mass)
	}
	return nil
}

// Probs is the distribution p samples logits from (the nucleus at the
// temperature), in float64.
func Probs(logits []float32, p sampling.Params) ([]float64, error) {
	row, err := sampling.Choose(logits, p, sampling.Draw{X: sampling.NoProposal})
	if err != nil {
		return nil, err
	}
	return probsAt(logits, p, row.Threshold), nil
}

// NucleusEdge reports whether got may stand for want, the nucleus
// threshold p takes over logits by the rule: want itself, or — the f32
// sums' order telling the goal from a neighbouring token's edge — a
// threshold whose tokens hold the nucleus's mass, within 1e-5, and whose
// tokens above it do not.
func NucleusEdge(logits []float32, p sampling.Params, got, want float32) bool {
	if got == want {
		return true
	}
	if p.TopP <= 0 || p.TopP >= 1 {
		return false
	}
	probs, err := Probs(logits, sampling.Params{Temperature: p.Temperature, TopP: 1})
	if err != nil {
		return false
	}
	var at, above float64
	for i, q := range probs {
		switch s := logits[i] / p.Temperature; {
		case s > got:
			above += q
			at += q
		case s == got:
			at += q
		}
	}
	return at >= float64(p.TopP)-1e-5 && above < float64(p.TopP)+1e-5
}

// probsAt is the softmax at p's temperature over the tokens whose scaled
// logit is at least threshold.
func probsAt(logits []float32, p sampling.Params, threshold float32) []float64 {
	probs := make([]float64, len(logits))
	top := math.Inf(-1)
	for _, l := range logits {
		top = math.Max(top, float64(l))
	}
	var kept float64
	for i, l := range logits {
		if l/p.Temperature >= threshold {
			probs[i] = math.Exp((float64(l) - top) / float64(p.Temperature))
			kept += probs[i]
		}
	}
	for i := range probs {
		probs[i] /= kept
	}
	return probs
}

// NoiseSlack is how far below the largest scaled logit plus noise a
// coupled row's draw may lie: f32 division and logarithms rounded
// differently on a GPU.
const NoiseSlack = 1e-4

// checkCoupled is Check for a coupled row.
func checkCoupled(logits []float32, p sampling.Params, d sampling.Draw, got, ref sampling.Row, probs []float64) error {
	y := got.Sample
	if y < 0 || y >= len(probs) || probs[y] == 0 {
		return fmt.Errorf("coupled draw %d, outside the nucleus", y)
	}
	k0, k1 := d.Key()
	noisy := func(i int) float64 { return float64(logits[i]/p.Temperature) + float64(sampling.Gumbel(k0, k1, i)) }
	if best := noisy(ref.Sample); noisy(y) < best-NoiseSlack*math.Max(1, math.Abs(best)) {
		return fmt.Errorf("coupled draw %d (%v), want %d (%v)", y, noisy(y), ref.Sample, best)
	}
	if got.Accept != (d.X != sampling.NoProposal && y == d.X) {
		return fmt.Errorf("coupled: accept %v with draw %d and proposal %d", got.Accept, y, d.X)
	}
	return nil
}
