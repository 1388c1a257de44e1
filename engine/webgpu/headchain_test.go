package webgpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/engine/enginetest"
)

// headSteps is n Steps over batch, each after the first feeding every
// entry's Next, as engine.StepN's fallback runs them: each entry's n
// tokens.
func headSteps(t *testing.T, h *Head, batch []*engine.Entry, n int) [][]engine.Token {
	t.Helper()
	out := make([][]engine.Token, len(batch))
	tokens := make([][]int, len(batch))
	for i, en := range batch {
		tokens[i] = en.Tokens
	}
	for k := range n {
		if err := h.Step(context.Background(), batch); err != nil {
			t.Fatalf("step %d: %v", k+1, err)
		}
		for i, en := range batch {
			out[i] = append(out[i], engine.Token{ID: en.Next, Logprob: en.Logprob, Top: en.Top})
			en.Tokens = []int{en.Next}
		}
	}
	for i, en := range batch {
		en.Tokens = tokens[i]
	}
	return out
}

// sameTokens compares StepN's tokens with Steps'.
func sameTokens(t *testing.T, what string, got, want [][]engine.Token) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("%s, entry %d: %d tokens, want %d", what, i, len(got[i]), len(want[i]))
		}
		for j, w := range want[i] {
			g := got[i][j]
			same := g.ID == w.ID && math.Abs(float64(g.Logprob-w.Logprob)) <= headLogprobTol && len(g.Top) == len(w.Top)
			for k := range w.Top {
				same = same && g.Top[k].Token == w.Top[k].Token && math.Abs(float64(g.Top[k].Logprob-w.Top[k].Logprob)) <= headLogprobTol
			}
			if !same {
				t.Errorf("%s, entry %d, token %d: StepN %d (%g) %v, Steps %d (%g) %v", what, i, j, g.ID, g.Logprob, g.Top, w.ID, w.Logprob, w.Top)
			}
		}
	}
}

// chainCase is a head sequence drafted by StepN beside one drafted by
// Steps, over one target sequence.
type chainCase struct {
	tseq, chained, stepped engine.Sequence
}

// compare runs StepN over the chained sequences and n Steps over the
// stepped ones, each entry fed tokens[i] with topN[i], and checks their
// tokens, the entries (Next, Logprob, Top; Tokens left as they were), the
// sequences' lengths, the outputs kept, and a following Step's draft (the
// caches): chained is whether StepN's steps chain on the device. It
// returns each entry's Next after that Step.
func compareStepN(t *testing.T, h *Head, what string, cases []chainCase, tokens [][]int, topN []int, n int, chained bool) []int {
	t.Helper()
	var a, b []*engine.Entry
	for i, c := range cases {
		a = append(a, &engine.Entry{Seq: c.chained, Target: c.tseq, Tokens: slices.Clone(tokens[i]), TopN: topN[i]})
		b = append(b, &engine.Entry{Seq: c.stepped, Target: c.tseq, Tokens: slices.Clone(tokens[i]), TopN: topN[i]})
	}
	if n > 1 {
		h.g.mu.Lock()
		feeds, err := h.stepFeeds(a)
		h.g.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if got := h.chains(feeds); got != chained {
			t.Fatalf("%s: chains %v, want %v", what, got, chained)
		}
	}
	got, err := h.StepN(context.Background(), a, n)
	if err != nil {
		t.Fatalf("%s: StepN: %v", what, err)
	}
	want := headSteps(t, h, b, n)
	sameTokens(t, what, got, want)
	for i, c := range cases {
		if !slices.Equal(a[i].Tokens, tokens[i]) {
			t.Errorf("%s, entry %d: Tokens %v after StepN, want %v", what, i, a[i].Tokens, tokens[i])
		}
		last := got[i][n-1]
		if a[i].Next != last.ID || a[i].Logprob != last.Logprob || len(a[i].Top) != len(last.Top) {
			t.Errorf("%s, entry %d: Next %d (%g) %v, want the last token %d (%g) %v", what, i, a[i].Next, a[i].Logprob, a[i].Top, last.ID, last.Logprob, last.Top)
		}
		if c.chained.Len() != c.stepped.Len() {
			t.Errorf("%s, entry %d: %d tokens after StepN, %d after Steps", what, i, c.chained.Len(), c.stepped.Len())
		}
		ko, ks := h.keptOutput(t, c.chained), h.keptOutput(t, c.stepped)
		for k := range ks {
			if math.Abs(float64(ko[k]-ks[k])) > headTol {
				t.Errorf("%s, entry %d: kept output %d: %g after StepN, %g after Steps", what, i, k, ko[k], ks[k])
				break
			}
		}
	}
	// The caches: a Step after each drafts the same.
	for i := range a {
		a[i].Tokens, b[i].Tokens = []int{a[i].Next}, []int{b[i].Next}
	}
	sameTokens(t, what+", the Step after", headSteps(t, h, a, 1), headSteps(t, h, b, 1))
	next := make([]int, len(a))
	for i, en := range a {
		next[i] = en.Next
	}
	return next
}

// TestHeadStepN: StepN of 1, 2 and 5 tokens equals as many Steps —
// tokens, log-probabilities, top tokens, the entries, the sequences and
// what a Step after them drafts — for one entry, a batch of two (one with
// top tokens, one without), a first feed that already drafts past the
// target (its rows in stages), and an entry fed short of the target's line
// (its later rows over the target's features: step by step).
func TestHeadStepN(t *testing.T) {
	testHeadStepN(t, newHeadRig(t, true, HeadOptions{}))
}

// TestHeadStepNPasses: the same with passes of three rows, so that a
// first feed takes several passes.
func TestHeadStepNPasses(t *testing.T) {
	testHeadStepN(t, newHeadRig(t, true, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, MaxRows: 3, KV: "f32"}))
}

func testHeadStepN(t *testing.T, rig *headRig) {
	h, target := rig.head, rig.target
	prompts := [][]int{{3, 17, 5, 9, 30, 200}, {8, 1, 250, 4}}
	var cases []chainCase
	var texts [][]int
	for _, p := range prompts {
		tseq := enginetest.NewSequence(t, target)
		next := enginetest.TargetStep(t, target, tseq, p...)
		a := enginetest.NewSequence(t, h)
		b := enginetest.NewSequence(t, h)
		cases = append(cases, chainCase{tseq, a, b})
		texts = append(texts, append(slices.Clone(p), next))
	}
	t.Cleanup(func() {
		for _, c := range cases {
			c.tseq.Release()
			c.chained.Release()
			c.stepped.Release()
		}
	})
	one := cases[:1]
	// The prompt and the target's token, then chains of the drafts.
	next := compareStepN(t, h, "n = 1", one, texts[:1], []int{0}, 1, false)
	for _, n := range []int{2, 5} {
		next = compareStepN(t, h, fmt.Sprintf("n = %d", n), one, [][]int{{next[0]}}, []int{0}, n, true)
	}
	next = compareStepN(t, h, "n = 5, top 4", one, [][]int{{next[0]}}, []int{4}, 5, true)

	// A batch: the second entry's prompt (its first feed), the first's
	// draft; top tokens for one of them.
	next = compareStepN(t, h, "batch, a first feed", cases, [][]int{{next[0]}, texts[1]}, []int{3, 0}, 5, true)
	next = compareStepN(t, h, "batch", cases, next2(next), []int{0, 2}, 2, true)

	// A first feed that drafts past the target already: rows over the
	// head's output in stages.
	compareStepN(t, h, "a first feed past the target", cases, [][]int{{next[0], 60, 61}, {next[1], 7}}, []int{0, 0}, 5, true)

	// Short of the target's line: a fresh pair of sequences fed the first
	// three tokens of the prompt and target token (seven); their next rows
	// read the target's features, so the steps run one by one.
	a := enginetest.NewSequence(t, h)
	b := enginetest.NewSequence(t, h)
	defer a.Release()
	defer b.Release()
	short := []chainCase{{cases[0].tseq, a, b}}
	compareStepN(t, h, "short of the target's line", short, [][]int{texts[0][:3]}, []int{2}, 5, false)
}

// next2 makes each Next an entry's tokens.
func next2(next []int) [][]int {
	out := make([][]int, len(next))
	for i, n := range next {
		out[i] = []int{n}
	}
	return out
}

// TestHeadStepNRefusals: StepN refuses what Step refuses, n ≤ 0, and n
// tokens past the context, before anything runs: the sequences are as
// they were, and StepN works after.
func TestHeadStepNRefusals(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	tseq := enginetest.NewSequence(t, target)
	defer tseq.Release()
	next := enginetest.TargetStep(t, target, tseq, 1, 2, 3)
	s := enginetest.NewSequence(t, h)
	defer s.Release()
	en := &engine.Entry{Seq: s, Target: tseq, Tokens: []int{1, 2, 3, next}}
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	fresh := enginetest.NewSequence(t, h)
	defer fresh.Release()
	max := h.Config().MaxPositionEmbeddings
	for _, tc := range []struct {
		name  string
		batch []*engine.Entry
		n     int
		is    error
	}{
		{"n = 0", []*engine.Entry{{Seq: s, Target: tseq, Tokens: []int{en.Next}}}, 0, nil},
		{"no Target", []*engine.Entry{{Seq: s, Tokens: []int{en.Next}}}, 3, nil},
		{"tree nodes", []*engine.Entry{{Seq: s, Target: tseq, Tokens: []int{en.Next}, Parents: []int{-1}}}, 3, nil},
		{"token 0 alone", []*engine.Entry{{Seq: s, Target: tseq, Tokens: []int{en.Next}}, {Seq: fresh, Target: tseq, Tokens: []int{1}}}, 3, nil},
		{"a repeated sequence", []*engine.Entry{{Seq: s, Target: tseq, Tokens: []int{en.Next}}, {Seq: s, Target: tseq, Tokens: []int{en.Next}}}, 3, nil},
		{"a token outside the vocabulary", []*engine.Entry{{Seq: s, Target: tseq, Tokens: []int{256}}}, 3, nil},
		{"past the context", []*engine.Entry{{Seq: s, Target: tseq, Tokens: []int{en.Next}}}, max - s.Len() + 1, engine.ErrContextFull},
	} {
		l := s.Len()
		out, err := h.StepN(ctx, tc.batch, tc.n)
		if err == nil || out != nil {
			t.Errorf("%s: StepN: %v, %v; want a refusal", tc.name, out, err)
			continue
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
		}
		if s.Len() != l || fresh.Len() != 0 {
			t.Errorf("%s: the sequences hold %d and %d tokens, want %d and 0", tc.name, s.Len(), fresh.Len(), l)
		}
	}
	// To the context's last position but one (the Step after takes the
	// last): accepted.
	b := enginetest.NewSequence(t, h)
	defer b.Release()
	if err := h.Step(ctx, []*engine.Entry{{Seq: b, Target: tseq, Tokens: []int{1, 2, 3, next}}}); err != nil {
		t.Fatal(err)
	}
	n := max - s.Len() - 1
	compareStepN(t, h, "to the context's end", []chainCase{{tseq, s, b}}, [][]int{{en.Next}}, []int{0}, n, true)
}
