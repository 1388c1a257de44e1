package webgpu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"webdraft/checkpoint"
	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
	"webdraft/reference"
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
	tokens := func(n int) []int { return randomTokens(r, n, c.Layer().VocabSize) }
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

// TestPrepareMergedOProj: a model whose one-row o_proj merges attention's
// splits as it reads them (2,048 inputs: 16 heads of 128, where the plan
// has o_proj merge) — after a warm-up draft of one split, Prepare builds
// that pipeline too, so a generation whose context outgrows one split
// builds none, and drafts the reference's greedy tokens.
func TestPrepareMergedOProj(t *testing.T) {
	ctx := context.Background()
	cfg := synth.Shapes["tiny"]
	cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim, cfg.MaxPositionEmbeddings = 16, 2, 128, 512
	dir := filepath.Join(t.TempDir(), "synth")
	if err := synth.Write(dir, cfg, synth.Options{Seed: 13, Std: 0.1}); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{Quant: checkpoint.Int4})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d := gputest.Fresh(t)
	e, err := New(d, m.Config, m.Weights, Options{KVBytes: 16 << 20, MaxSequences: 2, KV: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	// A warm-up: the same draft after a short prompt (one split), then
	// Prepare.
	warm, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Draft(ctx, e, warm, []int{1, 2, 3}, 8); err != nil {
		t.Fatal(err)
	}
	warm.Release()
	if err := e.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	prepared := d.PipelineNames()
	if !slices.ContainsFunc(prepared, func(name string) bool {
		return strings.HasPrefix(name, "matvec_batch_int4.wgsl{") && strings.Contains(name, "MERGE=1")
	}) {
		t.Fatal("Prepare built no o_proj that merges attention's splits")
	}
	r := rand.New(rand.NewPCG(13, 14))
	prompt := randomTokens(r, 300+r.IntN(100), cfg.VocabSize) // past the one split of a short context
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	got, err := engine.Draft(ctx, e, seq, prompt, 8)
	if err != nil {
		t.Fatal(err)
	}
	if built := gputest.BuiltSince(d, prepared); len(built) > 0 {
		t.Fatalf("a draft after a prompt of %d tokens built pipelines Prepare had not: %v", len(prompt), built)
	}
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ref.Draft(ref.NewSequence(), prompt, 8)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range got {
		if tok.ID != want[i] {
			t.Fatalf("draft token %d is %d, the reference's %d (drafts %v, want %v)", i, tok.ID, want[i], got, want)
		}
	}
}
