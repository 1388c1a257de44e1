package sampling_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

// alpha is the p-value below which a goodness-of-fit check rejects: the
// right rule fails one check in 10⁴ (and the seeds are fixed, so a run
// that passes passes always).
const alpha = 1e-4

// dist is sampling.Dist for rows the test built itself.
func dist(t *testing.T, logits []float32, p sampling.Params) []float64 {
	t.Helper()
	d, err := sampling.Dist(logits, p)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// uniforms returns n uniforms in [0, 1).
func uniforms(r *rand.Rand, n int) []float32 {
	u := make([]float32, n)
	for i := range u {
		u[i] = r.Float32()
	}
	return u
}

// nodeCase is one node of drafts: the target's p, the drafter's q, and m
// children drawn from q without replacement.
type nodeCase struct {
	name string
	p, q []float64
	m    int
}

// nodeCases are the nodes the rule is held to: chains and wider nodes,
// at temperature 0.7 and with top_p 0.9 (zeros in p and q where their
// nuclei differ), a poor drafter, a perfect one, and a greedy one (q a
// point mass, the rule Choose runs).
func nodeCases(t *testing.T) []nodeCase {
	r := rand.New(rand.NewPCG(11, 12))
	const n = 10
	target := randLogits(r, n, 1.5)
	near := slices.Clone(target) // a good drafter: the target's logits, perturbed
	for i := range near {
		near[i] += float32(r.NormFloat64() * 0.6)
	}
	far := randLogits(r, n, 2.5) // a poor one: logits of its own
	t1 := sampling.Params{Temperature: 1}
	t07 := sampling.Params{Temperature: 0.7}
	nucleus := sampling.Params{Temperature: 1, TopP: 0.9}
	p1, p07, pn := dist(t, target, t1), dist(t, target, t07), dist(t, target, nucleus)
	return []nodeCase{
		{"chain", p1, dist(t, near, t1), 1},
		{"2 children", p1, dist(t, near, t1), 2},
		{"4 children", p1, dist(t, near, t1), 4},
		{"T 0.7, 3 children", p07, dist(t, near, t07), 3},
		{"top_p 0.9, chain", pn, dist(t, near, nucleus), 1},
		{"top_p 0.9, 4 children", pn, dist(t, near, nucleus), 4},
		{"poor drafter, chain", p1, dist(t, far, t1), 1},
		{"poor drafter, 4 children", p1, dist(t, far, t1), 4},
		{"poor drafter, top_p 0.9, 3 children", pn, dist(t, far, nucleus), 3},
		{"perfect drafter, chain", p1, p1, 1},
		{"perfect drafter, 3 children", p07, p07, 3},
		{"greedy drafter", p07, dist(t, near, sampling.Params{}), 1},
	}
}

// fitNode runs trials of c, each drafting c.m children with DrawDistinct
// and holding them to ver's rule, and tests the tokens that come out
// against c.p. It returns the fit and how often the first child was
// accepted.
func fitNode(t *testing.T, ver *sampling.Verifier, c nodeCase, trials int, seed uint64) (samplingtest.Fit, int) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	counts := make([]int, len(c.p))
	first := 0
	for range trials {
		children, err := sampling.DrawDistinct(c.q, uniforms(r, c.m))
		if err != nil {
			t.Fatal(err)
		}
		i, token, err := ver.AcceptNode(c.p, c.q, children, uniforms(r, len(children)), r.Float32())
		if err != nil {
			t.Fatal(err)
		}
		if i >= 0 && token != children[i] {
			t.Fatalf("%s: accepted child %d (%d) but emitted %d", c.name, i, children[i], token)
		}
		if i == 0 {
			first++
		}
		counts[token]++
	}
	fit, err := samplingtest.GoodnessOfFit(counts, c.p)
	if err != nil {
		t.Fatal(err)
	}
	return fit, first
}

const nodeTrials = 40000

// TestAcceptNodeKeepsP: whatever the drafter and however many children it
// draws, the token a node emits is distributed as the target's p.
func TestAcceptNodeKeepsP(t *testing.T) {
	var ver sampling.Verifier
	for k, c := range nodeCases(t) {
		fit, first := fitNode(t, &ver, c, nodeTrials, uint64(100+k))
		t.Logf("%-36s χ² %6.2f, df %2d, p-value %.3g; first child accepted %.3f", c.name, fit.Stat, fit.DF, fit.PValue, float64(first)/nodeTrials)
		if fit.PValue < alpha {
			t.Errorf("%s: the tokens do not follow p: χ² %.2f on %d df, p-value %.3g", c.name, fit.Stat, fit.DF, fit.PValue)
		}
		// A drafter whose q is p exactly has every first child accepted
		// (u·q(x) < p(x) for every u < 1).
		if strings.HasPrefix(c.name, "perfect") && first != nodeTrials {
			t.Errorf("%s: the first child was accepted %d times in %d", c.name, first, nodeTrials)
		}
	}
}

// TestFaultsAreCaught: the goodness-of-fit check of TestAcceptNodeKeepsP
// rejects each deliberate mistake in the rule, on the nodes where it
// matters.
func TestFaultsAreCaught(t *testing.T) {
	cases := nodeCases(t)
	byName := func(name string) nodeCase {
		for _, c := range cases {
			if c.name == name {
				return c
			}
		}
		t.Fatalf("no case %q", name)
		return nodeCase{}
	}
	for _, f := range []struct {
		name  string
		fault sampling.Fault
		cases []string
	}{
		// Accepting with p(x) alone, as if q were a point mass, favours the
		// tokens the drafter samples often.
		{"accept by p(x) alone", sampling.FaultIgnoreQ, []string{"chain", "poor drafter, chain", "4 children", "top_p 0.9, chain"}},
		// Holding a later child to a q that still holds the rejected one
		// misjudges its ratio and the residual.
		{"keep rejected children in q", sampling.FaultKeepQ, []string{"4 children", "poor drafter, 4 children", "poor drafter, top_p 0.9, 3 children"}},
		// Drawing the last token from p itself counts again the mass the
		// children were already accepted with.
		{"bonus from the node's p", sampling.FaultBonusFromP, []string{"chain", "2 children", "poor drafter, chain", "top_p 0.9, 4 children"}},
	} {
		ver := sampling.Verifier{}
		ver.SetFault(f.fault)
		for k, name := range f.cases {
			fit, _ := fitNode(t, &ver, byName(name), nodeTrials, uint64(200+k))
			t.Logf("%s, %s: χ² %.1f, df %d, p-value %.3g", f.name, name, fit.Stat, fit.DF, fit.PValue)
			if fit.PValue >= alpha {
				t.Errorf("%s passed the check on %q: p-value %.3g", f.name, name, fit.PValue)
			}
		}
	}
}

// TestAcceptTreeKeepsJoint: a two-level tree emits its first two tokens
// with the target's joint p1(a)·p2(b | a), where the second level's rows
// depend on the first token. When the root rejects every child, the second
// token comes of the next round, a chain node at the first.
func TestAcceptTreeKeepsJoint(t *testing.T) {
	const n, trials = 6, 40000
	for k, params := range []sampling.Params{{Temperature: 1}, {Temperature: 0.7, TopP: 0.9}} {
		r := rand.New(rand.NewPCG(21, uint64(k)))
		target, draft := randLogits(r, n, 1.2), randLogits(r, n, 1.2)
		p1, q1 := dist(t, target, params), dist(t, draft, params)
		p2, q2 := make([][]float64, n), make([][]float64, n)
		for a := range n { // distinct rows after each first token
			p2[a], q2[a] = dist(t, randLogits(r, n, 1.5), params), dist(t, randLogits(r, n, 1.5), params)
		}
		p3 := dist(t, randLogits(r, n, 1), params) // the leaves' bonus; not counted
		var ver sampling.Verifier
		counts := make([]int, n*n)
		for range trials {
			nodes := []sampling.Node{{P: p1, Q: q1, V: r.Float32()}}
			first, err := sampling.DrawDistinct(q1, uniforms(r, 3))
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range first {
				nodes[0].Children = append(nodes[0].Children, len(nodes))
				nodes = append(nodes, sampling.Node{Token: a, P: p2[a], Q: q2[a], V: r.Float32()})
			}
			nodes[0].U = uniforms(r, len(first))
			for c := 1; c <= len(first); c++ {
				a := nodes[c].Token
				second, err := sampling.DrawDistinct(q2[a], uniforms(r, 2))
				if err != nil {
					t.Fatal(err)
				}
				for _, b := range second {
					nodes[c].Children = append(nodes[c].Children, len(nodes))
					nodes = append(nodes, sampling.Node{Token: b, P: p3, V: r.Float32()})
				}
				nodes[c].U = uniforms(r, len(second))
			}
			path, bonus, err := ver.AcceptTree(nodes)
			if err != nil {
				t.Fatal(err)
			}
			var tokens []int
			for _, c := range path {
				tokens = append(tokens, nodes[c].Token)
			}
			tokens = append(tokens, bonus)
			if len(tokens) == 1 { // the next round: a chain node after the bonus
				a := tokens[0]
				x, err := sampling.DrawDistinct(q2[a], uniforms(r, 1))
				if err != nil {
					t.Fatal(err)
				}
				_, b, err := ver.AcceptNode(p2[a], q2[a], x, uniforms(r, 1), r.Float32())
				if err != nil {
					t.Fatal(err)
				}
				tokens = append(tokens, b)
			}
			counts[tokens[0]*n+tokens[1]]++
		}
		want := make([]float64, n*n)
		for a := range n {
			for b := range n {
				want[a*n+b] = p1[a] * p2[a][b]
			}
		}
		fit, err := samplingtest.GoodnessOfFit(counts, want)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v: χ² %.2f, df %d, p-value %.3g", params, fit.Stat, fit.DF, fit.PValue)
		if fit.PValue < alpha {
			t.Errorf("%+v: the first two tokens do not follow p1·p2: χ² %.2f on %d df, p-value %.3g", params, fit.Stat, fit.DF, fit.PValue)
		}
	}
}

// TestAcceptNodeWithPointMassIsChoose: a drafter whose q is a point mass
// on X (a greedy drafter) turns the rule into Choose's: accept X when
// U < p(X), else draw from p without X at V.
func TestAcceptNodeWithPointMassIsChoose(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, params := range []sampling.Params{{Temperature: 1}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1.5, TopP: 0.5}} {
		for range 20 {
			l := randLogits(r, 30, 2)
			p := dist(t, l, params)
			for range 100 {
				x := r.IntN(len(l))
				q := make([]float64, len(l))
				q[x] = 1
				d := sampling.Draw{X: x, U: r.Float32(), V: r.Float32()}
				row, err := sampling.Choose(l, params, d)
				if err != nil {
					t.Fatal(err)
				}
				i, token, err := sampling.AcceptNode(p, q, []int{x}, []float32{d.U}, d.V)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]int{true: x, false: row.Sample}[row.Accept]; (i == 0) != row.Accept || token != want {
					t.Fatalf("%+v, %+v: AcceptNode gives child %d, token %d; Choose accept %v, sample %d", params, d, i, token, row.Accept, row.Sample)
				}
			}
		}
	}
}

// TestDist: Dist is samplingtest.Probs (the distribution Choose draws
// from), nucleus ties included, and its support is the tokens Choose
// draws.
func TestDist(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	params := []sampling.Params{{Temperature: 1}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1.5, TopP: 0.5}, {Temperature: 0.3, TopP: 0.99}, {Temperature: 2, TopP: 0.2}}
	for trial := range 200 {
		n := []int{1, 2, 7, 50, 1000}[trial%5]
		l := randLogits(r, n, 2)
		if trial%2 == 1 { // coarse logits: ties, at the nucleus's edge among them
			for i := range l {
				l[i] = float32(math.Round(float64(l[i])))
			}
		}
		if trial%7 == 3 && n > 1 {
			l[r.IntN(n)] = float32(math.Inf(-1))
		}
		p := params[trial%len(params)]
		got := dist(t, l, p)
		want, err := samplingtest.Probs(l, p)
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for i := range got {
			sum += got[i]
			if (got[i] > 0) != (want[i] > 0) || math.Abs(got[i]-want[i]) > 1e-5*want[i]+1e-300 {
				t.Fatalf("row %d, %+v: Dist(%d) = %v, Probs %v", trial, p, i, got[i], want[i])
			}
		}
		if math.Abs(sum-1) > 1e-12 {
			t.Errorf("row %d: Dist sums to %v", trial, sum)
		}
		for range 20 {
			row, err := sampling.Choose(l, p, sampling.Draw{X: sampling.NoProposal, V: r.Float32()})
			if err != nil {
				t.Fatal(err)
			}
			if got[row.Sample] == 0 {
				t.Fatalf("row %d, %+v: Choose drew %d, which Dist gives 0", trial, p, row.Sample)
			}
		}
	}
}

func TestDistEdges(t *testing.T) {
	inf := float32(math.Inf(1))
	// Greedy: a one-hot at the argmax, the lowest index on ties.
	if got := dist(t, []float32{1, 5, 2, 5}, sampling.Params{}); !slices.Equal(got, []float64{0, 1, 0, 0}) {
		t.Errorf("greedy Dist = %v", got)
	}
	// −Inf logits have probability 0.
	if got := dist(t, []float32{-inf, 0, 0, -inf}, sampling.Params{Temperature: 1}); !slices.Equal(got, []float64{0, 0.5, 0.5, 0}) {
		t.Errorf("Dist with −Inf logits = %v", got)
	}
	// The nucleus's edge keeps its ties (TestNucleus's row).
	got := dist(t, []float32{0, 3, 1, 3, 2, -5}, sampling.Params{Temperature: 1, TopP: 0.6})
	if got[1] != 0.5 || got[3] != 0.5 {
		t.Errorf("the two tied tokens of the nucleus: %v", got)
	}
	for _, c := range []struct {
		logits []float32
		p      sampling.Params
		want   string
	}{
		{nil, sampling.Params{Temperature: 1}, "empty"},
		{[]float32{0, float32(math.NaN())}, sampling.Params{Temperature: 1}, "NaN"},
		{[]float32{0, float32(math.NaN())}, sampling.Params{}, "NaN"},
		{[]float32{0, inf}, sampling.Params{Temperature: 1}, "+Inf"},
		{[]float32{-inf, -inf}, sampling.Params{Temperature: 1}, "−Inf"},
		{[]float32{0, 1}, sampling.Params{Temperature: 1, TopP: 2}, "top_p"},
		{[]float32{0, 1}, sampling.Params{Temperature: float32(math.NaN())}, "temperature"},
	} {
		_, err := sampling.Dist(c.logits, c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Dist(%v, %+v): %v, want an error about %s", c.logits, c.p, err, c.want)
		}
		if c.want == "NaN" && !errors.Is(err, sampling.ErrNaN) {
			t.Errorf("Dist(%v): %v is not ErrNaN", c.logits, err)
		}
	}
}

// TestDrawDistinct: draws never repeat, never take a token of weight 0,
// stop when the weight runs out, and follow q without replacement: the
// first x with q(x), the ordered pair (x, y) with q(x)·q(y)/(1 − q(x)).
func TestDrawDistinct(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	q := dist(t, randLogits(r, 8, 1.5), sampling.Params{Temperature: 1})
	q[2], q[5] = 0, 0
	orig := slices.Clone(q)
	const trials = 40000
	firsts, pairs := make([]int, len(q)), make([]int, len(q)*len(q))
	for range trials {
		got, err := sampling.DrawDistinct(q, uniforms(r, 9))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 6 { // the tokens of positive weight, then no more
			t.Fatalf("drew %v from 6 tokens of positive weight", got)
		}
		seen := map[int]bool{}
		for _, x := range got {
			if seen[x] || q[x] == 0 {
				t.Fatalf("drew %v: a repeat or a token of weight 0", got)
			}
			seen[x] = true
		}
		firsts[got[0]]++
		pairs[got[0]*len(q)+got[1]]++
	}
	if !slices.Equal(q, orig) {
		t.Error("DrawDistinct modified q")
	}
	pairQ := make([]float64, len(pairs))
	for a := range q {
		for b := range q {
			if a != b {
				pairQ[a*len(q)+b] = q[a] * q[b] / (1 - q[a])
			}
		}
	}
	for _, c := range []struct {
		name   string
		counts []int
		want   []float64
	}{{"first draw", firsts, q}, {"first two draws", pairs, pairQ}} {
		fit, err := samplingtest.GoodnessOfFit(c.counts, c.want)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: χ² %.2f, df %d, p-value %.3g", c.name, fit.Stat, fit.DF, fit.PValue)
		if fit.PValue < alpha {
			t.Errorf("%s: χ² %.2f on %d df, p-value %.3g", c.name, fit.Stat, fit.DF, fit.PValue)
		}
	}
	for _, c := range []struct {
		q []float64
		u []float32
	}{
		{nil, []float32{0.5}},
		{[]float64{0, 0}, []float32{0.5}},
		{[]float64{1, math.NaN()}, []float32{0.5}},
		{[]float64{1, -0.5}, []float32{0.5}},
		{[]float64{1, math.Inf(1)}, []float32{0.5}},
		{[]float64{1, 1}, []float32{1}},
		{[]float64{1, 1}, []float32{-0.1}},
	} {
		if got, err := sampling.DrawDistinct(c.q, c.u); err == nil {
			t.Errorf("DrawDistinct(%v, %v) = %v, want an error", c.q, c.u, got)
		}
	}
}

func TestAcceptNodeErrors(t *testing.T) {
	p := []float64{0.1, 0.2, 0.3, 0.4}
	q := []float64{0.4, 0, 0.3, 0.3}
	nan := math.NaN()
	for _, c := range []struct {
		name     string
		p, q     []float64
		children []int
		u        []float32
		v        float32
		want     string
	}{
		{"child out of range", p, q, []int{4}, []float32{0.5}, 0.5, "outside the row"},
		{"negative child", p, q, []int{-1}, []float32{0.5}, 0.5, "outside the row"},
		{"repeated child", p, q, []int{0, 2, 0}, []float32{0.5, 0.5, 0.5}, 0.5, "without replacement"},
		{"a proposal q could not draw", p, q, []int{1}, []float32{0.5}, 0.5, "q = 0"},
		{"NaN in p", []float64{0.1, nan, 0.3, 0.4}, q, []int{0}, []float32{0.5}, 0.5, "p: weight 1 is NaN"},
		{"NaN in q", p, []float64{0.4, nan, 0.3, 0.3}, []int{0}, []float32{0.5}, 0.5, "q: weight 1 is NaN"},
		{"negative p", []float64{0.1, -0.2, 0.3, 0.4}, q, []int{0}, []float32{0.5}, 0.5, "p: weight 1"},
		{"+Inf q", p, []float64{math.Inf(1), 0, 0, 0}, []int{0}, []float32{0.5}, 0.5, "q: weight 0"},
		{"p all zero", []float64{0, 0, 0, 0}, q, nil, nil, 0.5, "no weight"},
		{"empty p", nil, nil, nil, nil, 0.5, "empty"},
		{"rows of different lengths", p, q[:3], []int{0}, []float32{0.5}, 0.5, "q has 3 tokens"},
		{"uniforms short", p, q, []int{0, 2}, []float32{0.5}, 0.5, "1 uniforms for 2 children"},
		{"u = 1", p, q, []int{0}, []float32{1}, 0.5, "uniform 0"},
		{"NaN u", p, q, []int{0}, []float32{float32(nan)}, 0.5, "uniform 0"},
		{"v = 1", p, q, []int{0}, []float32{0.5}, 1, "v:"},
	} {
		i, token, err := sampling.AcceptNode(c.p, c.q, c.children, c.u, c.v)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "sampling: ") {
			t.Errorf("%s: (%d, %d, %v), want an error about %q", c.name, i, token, err, c.want)
		}
	}
	// No children: the token is p's draw, and q is not read.
	if i, token, err := sampling.AcceptNode(p, nil, nil, nil, 0.35); err != nil || i != -1 || token != 2 {
		t.Errorf("no children: (%d, %d, %v), want (-1, 2)", i, token, err)
	}
}

// TestAcceptNodeDetails: inputs are left as they were, weights need not
// be normalized, a residual that rounding leaves empty accepts the child,
// and a warm Verifier allocates nothing.
func TestAcceptNodeDetails(t *testing.T) {
	p := []float64{1, 2, 3, 4} // weights: p = (0.1, 0.2, 0.3, 0.4)
	q := []float64{4, 0, 3, 3}
	children, u := []int{0, 2, 3}, []float32{0.9, 0.9, 0.9}
	pc, qc, cc, uc := slices.Clone(p), slices.Clone(q), slices.Clone(children), slices.Clone(u)
	// Child 0: 0.9·0.4 ≥ 0.1, rejected; p ← (0, 2/3, 0, 1/3), q ← (0, 0, ½, ½).
	// Child 2: 0.9·½ ≥ 0, rejected; p ← (0, 1, 0, 0), q ← (0, 0, 0, 1).
	// Child 3: 0.9·1 ≥ 0, rejected; p stays (0, 1, 0, 0), and the draw takes 1.
	i, token, err := sampling.AcceptNode(p, q, children, u, 0.99)
	if err != nil || i != -1 || token != 1 {
		t.Errorf("(%d, %d, %v), want (-1, 1)", i, token, err)
	}
	if !slices.Equal(p, pc) || !slices.Equal(q, qc) || !slices.Equal(children, cc) || !slices.Equal(u, uc) {
		t.Error("AcceptNode modified its inputs")
	}
	// Child 0 accepted with 0.2·0.4 < 0.1.
	if i, token, _ := sampling.AcceptNode(p, q, children, []float32{0.2, 0.9, 0.9}, 0.5); i != 0 || token != 0 {
		t.Errorf("(%d, %d), want child 0 accepted", i, token)
	}
	// q exceeds p at token 0 by 2·10⁻¹⁹, below the rounding of the sums:
	// u close to 1 rejects it, and p − q has no positive mass left.
	pr := []float64{1e-12, 1 - 1e-12}
	qr := []float64{1e-12 * (1 + 2e-7), 1 - 1e-12}
	if i, token, err := sampling.AcceptNode(pr, qr, []int{0}, []float32{math.Nextafter32(1, 0)}, 0.5); err != nil || i != 0 || token != 0 {
		t.Errorf("an empty residual: (%d, %d, %v), want child 0 accepted", i, token, err)
	}
	var ver sampling.Verifier
	r := rand.New(rand.NewPCG(1, 1))
	big := dist(t, randLogits(r, 1000, 2), sampling.Params{Temperature: 1})
	bq := dist(t, randLogits(r, 1000, 2), sampling.Params{Temperature: 1})
	kids, err := sampling.DrawDistinct(bq, uniforms(r, 4))
	if err != nil {
		t.Fatal(err)
	}
	us := uniforms(r, 4)
	if allocs := testing.AllocsPerRun(20, func() { ver.AcceptNode(big, bq, kids, us, 0.5) }); allocs != 0 {
		t.Errorf("a warm Verifier allocates %v times a node", allocs)
	}
}

func TestAcceptTreeErrors(t *testing.T) {
	p := []float64{0.5, 0.5}
	var ver sampling.Verifier
	for _, c := range []struct {
		name  string
		nodes []sampling.Node
		want  string
	}{
		{"no root", nil, "no root"},
		{"a child before its parent", []sampling.Node{
			{P: p, Q: p, Children: []int{1}, U: []float32{0.9}},
			{Token: 1, P: p, Q: p, Children: []int{1}, U: []float32{0}},
		}, "node 1: child 1"},
		{"a child outside the tree", []sampling.Node{{P: p, Q: p, Children: []int{2}, U: []float32{0}}, {P: p}}, "node 0: child 2"},
		{"a token q could not draw", []sampling.Node{
			{P: p, Q: p, Children: []int{1}, U: []float32{0}},
			{Token: 0, P: p, Q: []float64{0, 1}, Children: []int{2}, U: []float32{0}},
			{Token: 0, P: p},
		}, "node 1: child 0: token 0 has q = 0"},
		{"a node without P", []sampling.Node{{Children: nil}}, "node 0: p: an empty row"},
	} {
		path, bonus, err := ver.AcceptTree(c.nodes)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: (%v, %d, %v), want an error about %q", c.name, path, bonus, err, c.want)
		}
	}
	// A chain root → 1 → 2 whose q is p accepts both drafts and draws the
	// bonus from the leaf's p.
	leaf := []float64{0, 0, 1}
	three := []float64{0.2, 0.3, 0.5}
	path, bonus, err := ver.AcceptTree([]sampling.Node{
		{P: three, Q: three, Children: []int{1}, U: []float32{0.99}},
		{Token: 1, P: three, Q: three, Children: []int{2}, U: []float32{0.99}},
		{Token: 0, P: leaf, V: 0.3},
	})
	if err != nil || !slices.Equal(path, []int{1, 2}) || bonus != 2 {
		t.Errorf("a perfect chain: (%v, %d, %v), want ([1 2], 2)", path, bonus, err)
	}
}

// Example of a drafter and a target at one node of a chain.
func ExampleAcceptNode() {
	params := sampling.Params{Temperature: 0.8, TopP: 0.95}
	target, _ := sampling.Dist([]float32{2, 1, 0.5, -1}, params)
	drafter, _ := sampling.Dist([]float32{1.5, 1.5, 0, -1}, params)
	children, _ := sampling.DrawDistinct(drafter, []float32{0.7, 0.2})
	i, token, _ := sampling.AcceptNode(target, drafter, children, []float32{0.4, 0.4}, 0.6)
	fmt.Println(children, i, token)
	// Output: [1 0] 0 1
}
