package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/internal/parallel"
	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

// boundary is how close (as a uniform) a draw may come to a boundary of
// the rule before the tests let the sampler fall on either side of it:
// it sums in f32 blocks where package sampling sums in float64.
const boundary = 1e-5

// sampleCase is one row of TestSampler: its logits over the head's rows
// and over the vocabulary (−Inf where the head leaves a token out), and
// what the row is.
type sampleCase struct {
	head, full []float32
	kind       string
}

// TestSampler holds the sampled read-out to package sampling, the oracle,
// on fresh random rows: heads over the whole vocabulary and over a random
// part of it, vocabularies of 700 tokens to the embedded model's 151,936;
// rows of normal logits, peaked ones (a nucleus of a few tokens), flat
// ones (a nucleus of most of the row), and rows of ties — logits on a
// grid of 0.5, and neighbouring f32s that one scaled value takes — at the
// nucleus's edge; T ∈ {0.5, 1, 1.7} and top_p ∈ {1, 0.9, 0.3}. Each row
// is read out as Choose (the threshold, the acceptance of a proposal, the
// draw), as a drafter's proposals (Dist and DrawDistinct: tokens, log q
// and the distribution kept) and as a tree node's verification
// (AcceptNode, against q of a drafter near the row, far from it or the
// row itself, dense or compacted). A draw may fall on either side of a
// boundary its uniform lies within 1e-5 of.
func TestSampler(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	pool := parallel.NewPool(3)
	defer pool.Close()
	for _, V := range []int{700, 5000 + rng.IntN(3000), 151936} {
		for _, partial := range []bool{false, true} {
			t.Run(fmt.Sprintf("V%d_partial=%v", V, partial), func(t *testing.T) {
				var tokens []int32
				n := V
				if partial {
					n = V/4 + rng.IntN(V/2)
					for _, tok := range rng.Perm(V)[:n] {
						tokens = append(tokens, int32(tok))
					}
					slices.Sort(tokens)
				}
				sv := newSampler(pool, tokens, V, n)
				s := &sv
				trials := 8
				if V > 100000 {
					trials = 4 // each kind once
				}
				var exact, all int
				for trial := range trials {
					c := randCase(rng, []string{"normal", "peaked", "flat", "ties"}[trial%4], n, V, tokens)
					for _, T := range []float32{0.5, 1, 1.7} {
						for _, topP := range []float32{1, 0.9, 0.3} {
							if V > 100000 && rng.IntN(3) > 0 {
								continue // the oracle's sorts: a third of the grid a row
							}
							p := sampling.Params{Temperature: T, TopP: topP}
							if c.kind == "flat" && rng.IntN(2) == 0 {
								p.TopP = 0.95
							}
							name := fmt.Sprintf("%s %+v", c.kind, p)
							if testChoose(t, s, rng, c, p, name) {
								exact++
							}
							all++
							testPropose(t, s, rng, c, p, name)
							testAccept(t, s, rng, c, p, name)
						}
					}
				}
				// A threshold other than sampling's is a rounding at the
				// edge (nucleusEdge), rare.
				if exact < all*9/10 {
					t.Errorf("%d of %d thresholds sampling's own", exact, all)
				}
			})
		}
	}
}

// randCase makes a row of the given kind over n head rows (tokens, or
// every token of V).
func randCase(rng *rand.Rand, kind string, n, V int, tokens []int32) sampleCase {
	head := make([]float32, n)
	for j := range head {
		head[j] = float32(rng.NormFloat64()) * 3
	}
	switch kind {
	case "peaked":
		for range 1 + rng.IntN(5) {
			head[rng.IntN(n)] = 20 + float32(rng.IntN(3))
		}
	case "flat":
		for j := range head {
			head[j] /= 6
		}
	case "ties":
		for j := range head {
			head[j] = float32(math.Round(float64(head[j])*2)) / 2
		}
		// Neighbouring f32s near the top, which 1.7 scales to one value.
		for range 20 {
			j, k := rng.IntN(n), rng.IntN(n)
			head[j] = 6 + float32(rng.IntN(8))/4
			head[k] = math.Nextafter32(head[j], 100)
		}
	}
	full := head
	if tokens != nil {
		full = make([]float32, V)
		for i := range full {
			full[i] = float32(math.Inf(-1))
		}
		for j, tok := range tokens {
			full[tok] = head[j]
		}
	}
	return sampleCase{head: head, full: full, kind: kind}
}

// prepared is s's dist of c under p.
func prepared(s *sampler, c sampleCase, p sampling.Params) *dist {
	m, lse := maxLSE(c.head)
	return prepare(s, c, m, lse, p)
}

// prepare is s's dist of c under p, given its largest logit and
// log-sum-exp.
func prepare(s *sampler, c sampleCase, m, lse float32, p sampling.Params) *dist {
	s.reset()
	d := s.add(c.head, m, lse, p, 1)
	s.prepare(d)
	return d
}

// maxLSE is a row's largest logit and log-sum-exp.
func maxLSE(l []float32) (float32, float32) {
	m := slices.Max(l)
	var sum float64
	for _, x := range l {
		sum += math.Exp(float64(x - m))
	}
	return m, m + float32(math.Log(sum))
}

// testChoose checks one Choose read-out of c and reports whether its
// threshold is sampling's own.
func testChoose(t *testing.T, s *sampler, rng *rand.Rand, c sampleCase, p sampling.Params, name string) bool {
	t.Helper()
	d := prepared(s, c, p)
	dr := sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32()}
	switch rng.IntN(3) {
	case 0:
		dr.X = s.token(slices.Index(c.head, d.max)) // the usual: the drafter's argmax
	case 1:
		dr.X = rng.IntN(len(c.full)) // anywhere, outside a partial head too
	}
	want, err := sampling.Choose(c.full, p, dr)
	if err != nil {
		t.Fatal(err)
	}
	got := sampling.Row{Argmax: want.Argmax, LogSumExp: d.lse, ArgmaxLogprob: d.max - d.lse}
	s.choose(d, dr, &got)
	if !samplingtest.NucleusEdge(c.full, p, got.Threshold, want.Threshold) {
		t.Fatalf("%s: threshold %v, want %v", name, got.Threshold, want.Threshold)
	}
	if got.Threshold != want.Threshold {
		return false
	}
	if err := samplingtest.Check(c.full, p, dr, got); err != nil {
		t.Errorf("%s, draw %+v: %v", name, dr, err)
	}
	if dr.X != sampling.NoProposal && !closeLogprob(got.XLogprob, want.XLogprob) {
		t.Errorf("%s: log p(X) %v, want %v", name, got.XLogprob, want.XLogprob)
	}
	if want := c.full[got.Sample] - want.LogSumExp; !closeLogprob(got.SampleLogprob, want) {
		t.Errorf("%s: log p(sample) %v, want %v", name, got.SampleLogprob, want)
	}
	return true
}

// closeLogprob: log-probabilities of one logit, the log-sum-exps summed
// in another order.
func closeLogprob(got, want float32) bool {
	return got == want || math.Abs(float64(got-want)) <= 1e-4*max(1, math.Abs(float64(want)))
}

// testPropose checks a drafter's proposals from c: the tokens
// DrawDistinct draws from Dist, their log q, and q kept.
func testPropose(t *testing.T, s *sampler, rng *rand.Rand, c sampleCase, p sampling.Params, name string) {
	t.Helper()
	d := prepared(s, c, p)
	want, _ := sampling.Choose(c.full, p, sampling.Draw{X: sampling.NoProposal})
	if d.theta != want.Threshold {
		return // an edge of the nucleus apart (testChoose's count)
	}
	us := make([]float32, []int{1, 3, 20}[rng.IntN(3)])
	for i := range us {
		us[i] = rng.Float32()
	}
	var r engine.VerifyRow
	s.propose(d, us, &r)
	q, err := sampling.Dist(c.full, p)
	if err != nil {
		t.Fatal(err)
	}
	got := r.Q.(*engine.HostDist).Dense(nil, len(c.full))
	for x := range q {
		if math.Abs(got[x]-q[x]) > 1e-9+1e-5*q[x] {
			t.Fatalf("%s: q(%d) = %v, want %v", name, x, got[x], q[x])
		}
	}
	if !drawnNear(r.Drawn, q, us) {
		want, _ := sampling.DrawDistinct(q, us)
		t.Errorf("%s, uniforms %v: drew %v, want %v", name, us, r.Drawn, want)
	}
	for k, x := range r.Drawn {
		if want := float32(math.Log(q[x])); !closeLogprob(r.DrawnLogprob[k], want) {
			t.Errorf("%s: log q(%d) = %v, want %v", name, x, r.DrawnLogprob[k], want)
		}
	}
}

// drawnNear reports whether got is DrawDistinct(q, us), or is with a
// uniform moved by boundary.
func drawnNear(got []int, q []float64, us []float32) bool {
	if want, _ := sampling.DrawDistinct(q, us); slices.Equal(got, want) {
		return true
	}
	for k := range us {
		for _, delta := range []float32{-boundary, boundary} {
			if want, _ := sampling.DrawDistinct(q, nudged(us, k, delta)); slices.Equal(got, want) {
				return true
			}
		}
	}
	return false
}

// nudged returns u with u[k] moved by delta, kept in [0, 1).
func nudged(u []float32, k int, delta float32) []float32 {
	v := slices.Clone(u)
	v[k] = min(max(v[k]+delta, 0), math.Nextafter32(1, 0))
	return v
}

// testAccept checks a tree node's verification at c (the target's row)
// of children drawn from a drafter's q: near c (its logits perturbed),
// far from it, or c itself; q given dense or compacted.
func testAccept(t *testing.T, s *sampler, rng *rand.Rand, c sampleCase, p sampling.Params, name string) {
	t.Helper()
	d := prepared(s, c, p)
	if want, _ := sampling.Choose(c.full, p, sampling.Draw{X: sampling.NoProposal}); d.theta != want.Threshold {
		return
	}
	P, err := sampling.Dist(c.full, p)
	if err != nil {
		t.Fatal(err)
	}
	drafter := []string{"near", "far", "same"}[rng.IntN(3)]
	dl := slices.Clone(c.full)
	for i := range dl {
		switch drafter {
		case "near":
			dl[i] += float32(rng.NormFloat64()) * 0.3
		case "far":
			dl[i] = float32(rng.NormFloat64()) * 3
		}
	}
	dp := sampling.Params{Temperature: p.Temperature, TopP: []float32{1, 0.9}[rng.IntN(2)]}
	if drafter == "same" {
		dp = p
	}
	q, err := sampling.Dist(dl, dp)
	if err != nil {
		t.Fatal(err)
	}
	us := make([]float32, 1+rng.IntN(4))
	for i := range us {
		us[i] = rng.Float32()
	}
	kids, err := sampling.DrawDistinct(q, us)
	if err != nil {
		t.Fatal(err)
	}
	hd := &engine.HostDist{P: make([]float32, len(q))}
	for x, v := range q {
		hd.P[x] = float32(v)
	}
	if rng.IntN(2) == 0 {
		hd = compacted(hd)
	}
	q32 := hd.Dense(nil, len(q)) // the q the rule holds the children to
	node := engine.SampledNode{Q: hd, U: make([]float32, len(kids)), V: rng.Float32()}
	for i := range node.U {
		node.U[i] = rng.Float32()
	}
	at, j, err := s.acceptNode(d, node, kids)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	tok := -1
	if j >= 0 {
		tok = s.token(j)
	}
	near := func(u []float32, v float32) bool {
		wantAt, wantTok, err := sampling.AcceptNode(P, q32, kids, u, v)
		if err != nil {
			t.Fatal(err)
		}
		return at == wantAt && tok == wantTok
	}
	if near(node.U, node.V) || near(node.U, min(node.V+boundary, math.Nextafter32(1, 0))) || near(node.U, max(node.V-boundary, 0)) {
		return
	}
	for k := range node.U {
		for _, delta := range []float32{-boundary, boundary} {
			if near(nudged(node.U, k, delta), node.V) {
				return
			}
		}
	}
	wantAt, wantTok, _ := sampling.AcceptNode(P, q32, kids, node.U, node.V)
	t.Errorf("%s, drafter %s %+v, children %v, u %v, v %v: child %d, token %d; want %d, %d", name, drafter, dp, kids, node.U, node.V, at, tok, wantAt, wantTok)
}

// compacted is q as its tokens of non-zero probability.
func compacted(q *engine.HostDist) *engine.HostDist {
	c := &engine.HostDist{}
	for x, v := range q.P {
		if v > 0 {
			c.Tokens, c.P = append(c.Tokens, int32(x)), append(c.P, v)
		}
	}
	return c
}

// BenchmarkSampler is the sampled read-out of one row of the embedded
// target's vocabulary (151,936 logits, normal with a peak, as a model's),
// on the machine's workers: Choose's draw with every token kept and with
// a nucleus, a drafter's 4 proposals with q kept, and a node's
// verification of 4 children whose q is the row's own (p = q: the first
// accepted) and another's (rejections, residuals).
func BenchmarkSampler(b *testing.B) {
	const V = 151936
	rng := rand.New(rand.NewPCG(1, 2))
	pool := parallel.NewPool(0)
	defer pool.Close()
	sv := newSampler(pool, nil, V, V)
	s := &sv
	c := randCase(rng, "peaked", V, V, nil)
	other := randCase(rng, "normal", V, V, nil)
	m, lse := maxLSE(c.head)
	for _, topP := range []float32{1, 0.9} {
		p := sampling.Params{Temperature: 0.7, TopP: topP}
		b.Run(fmt.Sprintf("choose/top_p=%v", topP), func(b *testing.B) {
			for b.Loop() {
				d := prepare(s, c, m, lse, p)
				var r sampling.Row
				s.choose(d, sampling.Draw{X: 7, U: rng.Float32(), V: rng.Float32()}, &r)
			}
		})
		b.Run(fmt.Sprintf("propose4/top_p=%v", topP), func(b *testing.B) {
			us := []float32{0.1, 0.5, 0.7, 0.9}
			for b.Loop() {
				d := prepare(s, c, m, lse, p)
				var r engine.VerifyRow
				s.propose(d, us, &r)
			}
		})
		for _, drafter := range []sampleCase{c, other} {
			d := prepared(s, drafter, p)
			var r engine.VerifyRow
			s.propose(d, []float32{0.1, 0.5, 0.7, 0.9}, &r)
			node := engine.SampledNode{Q: r.Q, U: []float32{0.99, 0.99, 0.99, 0.99}, V: 0.5}
			b.Run(fmt.Sprintf("accept4_%s/top_p=%v", map[bool]string{true: "own", false: "other"}[drafter.kind == c.kind], topP), func(b *testing.B) {
				for b.Loop() {
					d := prepare(s, c, m, lse, p)
					if _, _, err := s.acceptNode(d, node, r.Drawn); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
