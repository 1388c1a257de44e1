package webgpu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/gpu/gputest"
)

// TestPrepare: once a pass of each kind has run (as a warm-up's
// generations run them: the kernels whatever the rows) and the target's
// and the head's Prepare, their passes — prompts of 1–100 tokens (contexts past a split of decode attention),
// verifications of 1–20 rows read out, one to four sequences at once,
// chains, the head's steps and chains, greedy and listing top tokens —
// build no pipeline (on a device of the test's own, so that no other test
// built them).
func TestPrepare(t *testing.T) {
	ctx := context.Background()
	d := gputest.Fresh(t)
	c := enginetest.TinyHeadConfig()
	target, _, _ := tinyTarget(t, NewGroup(d), enginetest.HeadLayers, eagle3.DefaultAux(enginetest.HeadLayers))
	h, err := NewHead(target, c, enginetest.QuantizeHead(t, c, enginetest.RandomHead(c, 11, false)), HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, KV: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	r := rand.New(rand.NewPCG(7, 8))
	tokens := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = r.IntN(c.Layer().VocabSize)
		}
		return out
	}
	// round runs passes over n sequences: prompts of up to prompt tokens,
	// verifications of up to 20 rows in all.
	round := func(i, n, topN, prompt int, check func(string)) {
		var tEntries, hEntries []*engine.Entry
		for range n {
			ts, err := target.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			defer ts.Release()
			hs, err := h.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			defer hs.Release()
			tEntries = append(tEntries, &engine.Entry{Seq: ts, Tokens: tokens(1 + r.IntN(prompt)), TopN: topN})
			hEntries = append(hEntries, &engine.Entry{Seq: hs, Target: ts, TopN: topN})
		}
		what := fmt.Sprintf("round %d (%d sequences, top %d)", i, n, topN)
		if err := target.Step(ctx, tEntries); err != nil {
			t.Fatal(err)
		}
		check(what + ": the prompts")
		for i, en := range hEntries {
			en.Tokens = append(slices.Clone(tEntries[i].Tokens), tEntries[i].Next)
		}
		if err := h.Step(ctx, hEntries); err != nil {
			t.Fatal(err)
		}
		check(what + ": the head's first step")
		for _, en := range hEntries {
			en.Tokens = []int{en.Next}
		}
		if _, err := engine.StepN(ctx, h, hEntries, 3); err != nil {
			t.Fatal(err)
		}
		check(what + ": the head's chain")
		var verify []*engine.VerifyEntry
		for _, en := range tEntries {
			k := 1 + r.IntN(min(20/n, 4*prompt))
			verify = append(verify, &engine.VerifyEntry{Seq: en.Seq, Tokens: tokens(k), Out: k, TopN: topN})
		}
		if err := target.Verify(ctx, verify); err != nil {
			t.Fatal(err)
		}
		check(what + ": a verification")
		for _, en := range tEntries {
			en.Tokens = []int{en.Next}
		}
		if _, err := engine.StepN(ctx, target, tEntries, 4); err != nil {
			t.Fatal(err)
		}
		check(what + ": the target's chain")
	}
	// A pass of each kind, greedy and listing top tokens, before Prepare:
	// one-token prompts, verifications of 1–4 rows.
	for i, topN := range []int{0, 5} {
		round(-1-i, 1, topN, 1, func(string) {})
	}
	before, start := len(d.PipelineNames()), time.Now()
	for _, p := range []engine.Preparer{target, h} {
		if err := p.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	prepared := d.PipelineNames()
	t.Logf("Prepare built %d pipelines in %v", len(prepared)-before, time.Since(start))
	check := func(what string) {
		t.Helper()
		if built := gputest.BuiltSince(d, prepared); len(built) > 0 {
			t.Fatalf("%s built pipelines Prepare had not: %v", what, built)
		}
	}
	for i := range 8 {
		round(i, 1+i%4, 5*(i%2), 100, check)
	}
}
