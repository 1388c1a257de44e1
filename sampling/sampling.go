// Package sampling is how webdraft chooses a token from a row of logits:
// greedily (the argmax), or at a temperature from the nucleus of top_p —
// and the acceptance rule of speculative decoding for a drafter that
// proposes its greedy token. It is plain Go: the CPU engine's, and the
// oracle that sample.wgsl and topk.wgsl are tested against.
//
// The rule. A drafter that proposes its argmax x has a proposal
// distribution q that is a point mass on x, so speculative sampling (accept
// x with probability min(1, p(x)/q(x)), else draw from norm(max(0, p − q)))
// becomes: accept x with probability p(x); on rejection draw from p with x
// left out, renormalized. Either way the token that comes out is
// distributed as p, the target's own distribution. Coupled draws
// (coupled.go) share a row's randomness between drafter and target
// instead: both take Gumbel-max draws under one key.
package sampling

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Params say how a row's token is chosen.
type Params struct {
	// Temperature divides the logits before the softmax; 0 (or below) is
	// greedy: the argmax, no randomness.
	Temperature float32
	// TopP keeps the nucleus: the most likely tokens whose probability
	// reaches TopP, ties at its edge included (in (0, 1]; 0 or 1 keeps every
	// token).
	TopP float32
}

// Greedy reports whether p chooses the argmax.
func (p Params) Greedy() bool { return p.Temperature <= 0 }

// Validate reports parameters no engine takes.
func (p Params) Validate() error {
	switch {
	case math.IsNaN(float64(p.Temperature)) || math.IsInf(float64(p.Temperature), 0):
		return fmt.Errorf("temperature %v is not a number", p.Temperature)
	case math.IsNaN(float64(p.TopP)) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("top_p %v: want 0…1", p.TopP)
	}
	return nil
}

// keepsAll reports whether the nucleus is every token.
func (p Params) keepsAll() bool { return p.TopP <= 0 || p.TopP >= 1 }

// NoProposal is a Draw's X where the next position has no drafted token:
// the row's Sample is then drawn from p whole (the bonus token).
const NoProposal = -1

// Draw is the randomness for one row: X, the token a drafter proposed for
// the next position (NoProposal: none), and two uniforms in [0, 1): U
// decides the proposal's acceptance (U < p(X)), V the draw. A Coupled
// row's U and V are instead the key of its Gumbel noise (coupled.go): its
// Sample is the Gumbel-max draw from p, and X is accepted iff it is that
// token.
type Draw struct {
	X       int
	U, V    float32
	Coupled bool
}

// Row is what an engine reads out of one row of logits.
type Row struct {
	Argmax        int     // the largest logit's index, the lowest on ties
	LogSumExp     float32 // of the raw logits: log p(t) = logit[t] − LogSumExp
	ArgmaxLogprob float32 // log p(Argmax) at temperature 1, no nucleus
	// With sampling (Temperature > 0):
	Accept        bool    // the proposal X was accepted (false with no proposal)
	Sample        int     // a token drawn from p, X left out when there is a proposal (a coupled row's: its Gumbel-max draw, X when accepted)
	XLogprob      float32 // log p(X) at temperature 1 (0 with no proposal)
	SampleLogprob float32 // log p(Sample) at temperature 1
	// Threshold is the smallest scaled logit (logit / Temperature) the
	// nucleus keeps (−Inf when it keeps every token).
	Threshold float32
}

// ErrNaN reports a row of logits that holds a NaN.
var ErrNaN = errors.New("the logits hold NaN")

// Choose reads out one row: the argmax and its log-probability always,
// and with p.Temperature > 0 the rule's outcome for d. Logits are scaled
// in f32 as on the GPU; sums run in float64, in index order.
func Choose(logits []float32, p Params, d Draw) (Row, error) {
	if len(logits) == 0 {
		return Row{}, errors.New("sampling: an empty row")
	}
	if d.X != NoProposal && (d.X < 0 || d.X >= len(logits)) {
		return Row{}, fmt.Errorf("sampling: proposal %d outside the row of %d", d.X, len(logits))
	}
	r := Row{Threshold: float32(math.Inf(-1))}
	best := float32(math.Inf(-1))
	for i, l := range logits {
		if l != l {
			return Row{}, ErrNaN
		}
		if l > best || i == 0 {
			best, r.Argmax = l, i
		}
	}
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - best))
	}
	r.LogSumExp = best + float32(math.Log(sum))
	r.ArgmaxLogprob = best - r.LogSumExp
	if p.Greedy() {
		return r, nil
	}
	e, total := scaled(logits, best, p.Temperature)
	kept := total
	if !p.keepsAll() {
		r.Threshold, kept = nucleus(logits, e, total, p)
	}
	in := func(i int) bool { return logits[i]/p.Temperature >= r.Threshold }
	if d.Coupled {
		r.Sample = gumbelMax(logits, nil, p.Temperature, d, in)
		if d.X != NoProposal {
			r.XLogprob = logits[d.X] - r.LogSumExp
			r.Accept = r.Sample == d.X
		}
		r.SampleLogprob = logits[r.Sample] - r.LogSumExp
		return r, nil
	}
	weight := kept
	if d.X != NoProposal {
		r.XLogprob = logits[d.X] - r.LogSumExp
		if in(d.X) {
			r.Accept = float64(d.U) < e[d.X]/kept
			weight -= e[d.X]
		}
	}
	// Draw from the kept tokens, X left out, by the inverse CDF in index
	// order; rounding that carries the target past the end takes the last.
	r.Sample = -1
	target := float64(d.V) * weight
	var acc float64
	for i := range logits {
		if !in(i) || i == d.X {
			continue
		}
		acc += e[i]
		r.Sample = i
		if target < acc {
			break
		}
	}
	if r.Sample < 0 { // X was the only token kept: it is accepted surely
		r.Sample = d.X
	}
	r.SampleLogprob = logits[r.Sample] - r.LogSumExp
	return r, nil
}

// scaled returns exp((logit − max) / T) for each token and their sum.
func scaled(logits []float32, max, T float32) ([]float64, float64) {
	e := make([]float64, len(logits))
	return e, scaledInto(e, logits, max, T)
}

// scaledInto writes exp((logit − max) / T) for each token into e and
// returns their sum.
func scaledInto(e []float64, logits []float32, max, T float32) float64 {
	var total float64
	for i, l := range logits {
		e[i] = math.Exp(float64((l - max) / T))
		total += e[i]
	}
	return total
}

// nucleus returns the largest scaled-logit threshold whose tokens (those
// at or above it) hold at least TopP of the mass, and their mass. It
// searches the thresholds among the row's own values, as a bisection over
// the order of f32 bit patterns does on the GPU.
func nucleus(logits []float32, e []float64, total float64, p Params) (float32, float64) {
	s := make([]float32, len(logits))
	for i, l := range logits {
		s[i] = l / p.Temperature
	}
	order := make([]int, len(s))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return s[order[a]] > s[order[b]] })
	goal := float64(p.TopP) * total
	var mass float64
	for k := 0; k < len(order); {
		// Every token tied with order[k] comes in together.
		v := s[order[k]]
		for k < len(order) && s[order[k]] == v {
			mass += e[order[k]]
			k++
		}
		if mass >= goal {
			return v, massAtLeast(s, e, v)
		}
	}
	return s[order[len(order)-1]], total
}

// massAtLeast is Σ e over the tokens whose scaled logit is at least v, in
// index order (as the GPU sums it).
func massAtLeast(s []float32, e []float64, v float32) float64 {
	var m float64
	for i := range s {
		if s[i] >= v {
			m += e[i]
		}
	}
	return m
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	Token   int
	Logprob float32
}

// Top returns the n most likely tokens of a row (at temperature 1), most
// likely first, the lower index first on ties; lse is the row's
// LogSumExp.
func Top(logits []float32, n int, lse float32) []TokenLogprob {
	n = min(n, len(logits))
	order := make([]int, len(logits))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
	out := make([]TokenLogprob, n)
	for i := range out {
		out[i] = TokenLogprob{Token: order[i], Logprob: logits[order[i]] - lse}
	}
	return out
}
