package specdec

import (
	"context"
	"encoding/xml"
	"path/filepath"
	"reflect"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
)

func cpuEngine(t *testing.T, name string, q checkpoint.Quant) engine.Engine {
	t.Helper()
	m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", name), checkpoint.LoadOptions{Quant: q})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.NewReference(m.Config, m.Weights, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var prompts = [][]int{{1, 2, 3}, {500, 7, 7, 9, 1000, 3}, {42}}

// TestPerfectDrafter: a drafter that is the target accepts every draft
// token, so each step gains k+1 tokens (fewer at the end).
func TestPerfectDrafter(t *testing.T) {
	target := cpuEngine(t, "untied", checkpoint.F32)
	const k, n = 4, 23
	r, err := Run(context.Background(), target, target, prompts, Options{K: k, NewTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	stepsPer := (n + k) / (k + 1) // ceil(n / (k+1))
	if r.Steps != len(prompts)*stepsPer || r.Gained != len(prompts)*n {
		t.Errorf("steps %d gained %d, want %d and %d", r.Steps, r.Gained, len(prompts)*stepsPer, len(prompts)*n)
	}
	if want := float64(n) / float64(stepsPer); r.Tau() != want {
		t.Errorf("τ = %g, want %g", r.Tau(), want)
	}
	for i := range k {
		if r.AcceptRate(i) != 1 {
			t.Errorf("position %d accepted at rate %g", i, r.AcceptRate(i))
		}
	}
	// The target's continuations come back, one per prompt in order.
	if len(r.Continuations) != len(prompts) {
		t.Fatalf("%d continuations for %d prompts", len(r.Continuations), len(prompts))
	}
	for i, c := range r.Continuations {
		if len(c) != n {
			t.Errorf("continuation %d: %d tokens, want %d", i, len(c), n)
		}
	}
}

// TestAccounting: with an unrelated drafter, the counts stay consistent:
// every continuation token is gained once, the histogram sums to the steps,
// and positions are reached only after all earlier ones were accepted.
func TestAccounting(t *testing.T) {
	target, drafter := cpuEngine(t, "untied", checkpoint.F32), cpuEngine(t, "untied", checkpoint.Int4)
	const k, n = 6, 40
	r, err := Run(context.Background(), target, drafter, prompts, Options{K: k, NewTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	if r.Gained != len(prompts)*n {
		t.Errorf("gained %d, want %d", r.Gained, len(prompts)*n)
	}
	sum := 0
	for a, c := range r.Hist {
		sum += c
		if a > 0 && c > 0 && r.Accepted[a-1] < c {
			t.Errorf("%d steps accepted %d tokens but position %d was accepted %d times", c, a, a-1, r.Accepted[a-1])
		}
	}
	if sum != r.Steps || r.Tau() < 1 || r.Tau() > k+1 {
		t.Errorf("histogram sums to %d of %d steps; τ = %g", sum, r.Steps, r.Tau())
	}
	for i := 1; i < k; i++ {
		if r.Reached[i] > r.Accepted[i-1] {
			t.Errorf("position %d reached %d times, position %d accepted only %d", i, r.Reached[i], i-1, r.Accepted[i-1])
		}
	}
	t.Logf("int4 drafter of the same random model: τ = %.2f over %d steps", r.Tau(), r.Steps)
	// The plot is well-formed SVG.
	if err := xml.Unmarshal(r.HistogramSVG("test <pair>"), new(struct{})); err != nil {
		t.Errorf("SVG: %v", err)
	}
}

func TestRejects(t *testing.T) {
	e := cpuEngine(t, "tied", checkpoint.Int4)
	for _, c := range []struct {
		prompts [][]int
		o       Options
	}{
		{prompts, Options{K: 0, NewTokens: 4}},
		{[][]int{{}}, Options{K: 2, NewTokens: 4}},
		{[][]int{{1024}}, Options{K: 2, NewTokens: 4}},
		{[][]int{make([]int, 500)}, Options{K: 16, NewTokens: 4}},
	} {
		if _, err := Run(context.Background(), e, e, c.prompts, c.o); err == nil {
			t.Errorf("accepted %v with %+v", c.prompts, c.o)
		}
	}
}

// TestBatchedEqualsAlone: prompts measured side by side give exactly the
// counts they give one at a time.
func TestBatchedEqualsAlone(t *testing.T) {
	target, drafter := cpuEngine(t, "untied", checkpoint.F32), cpuEngine(t, "untied", checkpoint.Int4)
	many := append(append([][]int{}, prompts...), []int{9, 8, 7, 6, 5}, []int{3, 3}, []int{77, 1})
	var results []*Result
	for _, b := range []int{1, 2, len(many)} {
		r, err := Run(context.Background(), target, drafter, many, Options{K: 5, NewTokens: 30, Batch: b})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	for i, r := range results[1:] {
		if !reflect.DeepEqual(r, results[0]) {
			t.Errorf("batched run %d: %+v, one at a time: %+v", i+1, r, results[0])
		}
	}
}
