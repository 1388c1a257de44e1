package webgpu

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/treemask"
)

// treeHarness runs an engine on the tied golden model beside the reference
// model, which judges its rows: the greedy token equal (or a near tie) and
// the log-probability close, as package enginetest holds them.
type treeHarness struct {
	t   *testing.T
	e   *Engine
	ref *reference.Model
	rng *rand.Rand
}

func newTreeHarness(t *testing.T, opts Options) *treeHarness {
	m := load(t, "tied", checkpoint.Int4)
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	if opts.KVBytes == 0 {
		opts.KVBytes, opts.MaxSequences = 16<<20, 8
	}
	return &treeHarness{t: t, e: newEngine(t, m, opts), ref: ref, rng: rand.New(rand.NewPCG(3, 5))}
}

func (h *treeHarness) tokens(n int) []int { return randomTokens(h.rng, n, h.e.cfg.VocabSize) }

// seq returns a new sequence that has been fed context.
func (h *treeHarness) seq(prompt []int) engine.Sequence {
	h.t.Helper()
	s, err := h.e.NewSequence()
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(s.Release)
	if err := h.e.Step(context.Background(), []*engine.Entry{{Seq: s, Tokens: prompt}}); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// check holds a greedy token and its log-probability to the reference's
// row after line.
func (h *treeHarness) check(what string, id int, logprob float32, line []int) {
	h.t.Helper()
	logits, err := h.ref.Forward(h.ref.NewSequence(), line)
	if err != nil {
		h.t.Fatal(err)
	}
	want, err := sampling.Choose(logits, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
	if err != nil {
		h.t.Fatal(err)
	}
	var scale float64
	for _, l := range logits {
		scale = math.Max(scale, math.Abs(float64(l)))
	}
	tie := id >= 0 && id < len(logits) && math.Abs(float64(logits[id]-logits[want.Argmax])) <= 1e-3*scale
	if id != want.Argmax && !tie || math.Abs(float64(logprob-want.ArgmaxLogprob)) > 2e-3*max(1, math.Abs(float64(want.LogSumExp))) {
		h.t.Errorf("%s: token %d (log p %v), the line's %d (%v)", what, id, logprob, want.Argmax, want.ArgmaxLogprob)
	}
}

// tree verifies a random tree of n nodes on s (fed prompt) and returns
// its tokens and parents (slots).
func (h *treeHarness) tree(s engine.Sequence, n int) ([]int, []int) {
	h.t.Helper()
	base := s.Len()
	parents := make([]int, n)
	for i := range parents {
		parents[i] = base - 1 + h.rng.IntN(i+1)
	}
	fed := h.tokens(n)
	if err := h.e.Verify(context.Background(), []*engine.VerifyEntry{{Seq: s, Tokens: fed, Parents: parents, Out: 1}}); err != nil {
		h.t.Fatal(err)
	}
	return fed, parents
}

// deepest returns the root-first path (slots) of the tree's deepest node,
// and its tokens.
func deepest(fed, parents []int, base int) (path, tokens []int) {
	for i := range parents {
		var p []int
		for s := base + i; s >= base; s = parents[s-base] {
			p = append([]int{s}, p...)
		}
		if len(p) > len(path) {
			path = p
		}
	}
	for _, s := range path {
		tokens = append(tokens, fed[s-base])
	}
	return path, tokens
}

// TestTreeMovesAreLazy: KeepPath's moves wait for the engine's next pass,
// whichever sequences it runs — and the next step of the sequence equals
// the line's: after another sequence's pass, after a chain of steps, after
// a Truncate that drops part of the path before the moves are made, and
// after a Release of another sequence with moves pending.
func TestTreeMovesAreLazy(t *testing.T) {
	for _, kv := range []string{"f32", "f16"} {
		t.Run("kv_"+kv, func(t *testing.T) {
			h := newTreeHarness(t, Options{KVBytes: 16 << 20, MaxSequences: 8, KV: kv})
			ctx := context.Background()
			prompt := h.tokens(7)

			// Another sequence's pass makes the moves.
			a := h.seq(prompt)
			fed, parents := h.tree(a, 20)
			path, pathTokens := deepest(fed, parents, len(prompt))
			if err := a.KeepPath(path); err != nil {
				t.Fatal(err)
			}
			other := h.seq(h.tokens(3))
			if err := h.e.Step(ctx, []*engine.Entry{{Seq: other, Tokens: h.tokens(2)}}); err != nil {
				t.Fatal(err)
			}
			x := h.tokens(1)
			en := &engine.Entry{Seq: a, Tokens: x}
			if err := h.e.Step(ctx, []*engine.Entry{en}); err != nil {
				t.Fatal(err)
			}
			line := append(append(append([]int(nil), prompt...), pathTokens...), x...)
			h.check("after another sequence's pass", en.Next, en.Logprob, line)

			// A chain makes them, and its steps follow the line.
			b := h.seq(prompt)
			fed, parents = h.tree(b, 9)
			path, pathTokens = deepest(fed, parents, len(prompt))
			if err := b.KeepPath(path); err != nil {
				t.Fatal(err)
			}
			got, err := h.e.StepN(ctx, []*engine.Entry{{Seq: b, Tokens: x}}, 4)
			if err != nil {
				t.Fatal(err)
			}
			line = append(append(append([]int(nil), prompt...), pathTokens...), x...)
			for _, tok := range got[0] {
				h.check("a chained step after the kept path", tok.ID, tok.Logprob, line)
				line = append(line, tok.ID)
			}

			// A Truncate that drops all but the path's first node before the
			// moves are made; a Release with moves pending.
			c, gone := h.seq(prompt), h.seq(prompt)
			fed, parents = h.tree(c, 30)
			path, pathTokens = deepest(fed, parents, len(prompt))
			for len(path) < 2 { // a path of two at least, so that one is dropped
				c.Truncate(len(prompt))
				fed, parents = h.tree(c, 30)
				path, pathTokens = deepest(fed, parents, len(prompt))
			}
			if err := c.KeepPath(path); err != nil {
				t.Fatal(err)
			}
			c.Truncate(len(prompt) + 1)
			fed, parents = h.tree(gone, 12)
			gonePath, _ := deepest(fed, parents, len(prompt))
			if err := gone.KeepPath(gonePath); err != nil {
				t.Fatal(err)
			}
			gone.Release()
			en = &engine.Entry{Seq: c, Tokens: x}
			if err := h.e.Step(ctx, []*engine.Entry{en}); err != nil {
				t.Fatal(err)
			}
			line = append(append(append([]int(nil), prompt...), pathTokens[0]), x...)
			h.check("after a truncated kept path", en.Next, en.Logprob, line)
			if c.Len() != len(prompt)+2 {
				t.Errorf("Len %d, want %d", c.Len(), len(prompt)+2)
			}
		})
	}
}

// TestTreeSmallPasses: a tree verification larger than a pass runs in
// several, its nodes joining the tree pass by pass, with the rows of one
// pass; KeepPath after it equals the line.
func TestTreeSmallPasses(t *testing.T) {
	h := newTreeHarness(t, Options{KVBytes: 16 << 20, MaxSequences: 8, MaxRows: 5})
	ctx := context.Background()
	prompt := h.tokens(6)
	s := h.seq(prompt)
	base := len(prompt)
	const n = 13
	parents := make([]int, n)
	for i := range parents {
		parents[i] = base - 1 + h.rng.IntN(i+1)
	}
	fed := h.tokens(n)
	v := &engine.VerifyEntry{Seq: s, Tokens: fed, Parents: parents, Out: n}
	if err := h.e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
		t.Fatal(err)
	}
	for i, row := range v.Rows {
		var line []int
		for sl := base + i; sl >= base; sl = parents[sl-base] {
			line = append([]int{fed[sl-base]}, line...)
		}
		h.check("node", row.Argmax, row.ArgmaxLogprob, append(append([]int(nil), prompt...), line...))
	}
	path, pathTokens := deepest(fed, parents, base)
	if err := s.KeepPath(path); err != nil {
		t.Fatal(err)
	}
	x := h.tokens(1)
	en := &engine.Entry{Seq: s, Tokens: x}
	if err := h.e.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	h.check("after the kept path", en.Next, en.Logprob, append(append(append([]int(nil), prompt...), pathTokens...), x...))
}

// TestTreeRefusedBatch: a batch with one bad tree is refused whole — the
// good entries' sequences keep their length and hold no tree — and so are
// line tokens fed after a tree's nodes, and StepN of tree nodes; a
// KeepPath refused leaves the tree to a later one.
func TestTreeRefusedBatch(t *testing.T) {
	h := newTreeHarness(t, Options{})
	ctx := context.Background()
	prompt := h.tokens(5)
	good, bad := h.seq(prompt), h.seq(prompt)
	base := len(prompt)
	batch := []*engine.VerifyEntry{
		{Seq: good, Tokens: h.tokens(3), Parents: []int{base - 1, base, base}, Out: 3},
		{Seq: bad, Tokens: h.tokens(2), Parents: []int{base - 1, base + 1}, Out: 1},
	}
	if err := h.e.Verify(ctx, batch); err == nil {
		t.Fatal("a batch with a bad tree was accepted")
	}
	if good.Len() != base || bad.Len() != base {
		t.Fatalf("a refused batch changed the sequences: Len %d, %d", good.Len(), bad.Len())
	}
	// No tree was left behind: line tokens are taken, and follow the line.
	x := h.tokens(2)
	en := &engine.Entry{Seq: good, Tokens: x}
	if err := h.e.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	h.check("after the refused batch", en.Next, en.Logprob, append(append([]int(nil), prompt...), x...))

	// Line tokens after a tree's nodes, and tree nodes chained, are refused.
	fed, parents := h.tree(bad, 4)
	n := bad.Len()
	if err := h.e.Step(ctx, []*engine.Entry{{Seq: bad, Tokens: h.tokens(1)}}); err == nil || bad.Len() != n {
		t.Errorf("line tokens after the tree's nodes: err %v, Len %d (want %d)", err, bad.Len(), n)
	}
	if _, err := h.e.StepN(ctx, []*engine.Entry{{Seq: bad, Tokens: h.tokens(1), Parents: []int{base}}}, 3); err == nil || bad.Len() != n {
		t.Errorf("StepN of tree nodes: err %v, Len %d (want %d)", err, bad.Len(), n)
	}
	if err := bad.KeepPath([]int{base + 3, base}); !errors.Is(err, treemask.ErrPath) || bad.Len() != n {
		t.Errorf("a path not of the tree: err %v, Len %d (want %d)", err, bad.Len(), n)
	}
	path, pathTokens := deepest(fed, parents, base)
	if err := bad.KeepPath(path); err != nil {
		t.Fatal(err)
	}
	en = &engine.Entry{Seq: bad, Tokens: x}
	if err := h.e.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	h.check("after the kept path", en.Next, en.Logprob, append(append(append([]int(nil), prompt...), pathTokens...), x...))
}
