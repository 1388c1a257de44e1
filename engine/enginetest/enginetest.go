// Package enginetest checks that an engine.Engine behaves as the interface
// promises, against the reference model: every engine (CPU, WebGPU) runs the
// same suite.
package enginetest

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

// Run checks e (over weights w of config c) against the reference model.
// Greedy tokens must be identical; the test models are chosen so that the
// reference's top-2 margins are wide enough for that.
func Run(t *testing.T, e engine.Engine, c qwen3.Config, w *qwen3.Weights) {
	ref, err := reference.New(c, w)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(c.VocabSize), 11))
	prompt := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = rng.IntN(c.VocabSize)
		}
		return p
	}
	refDraft := func(tokens []int, n int) []int {
		out, err := ref.Draft(ref.NewSequence(), tokens, n)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("draft matches reference", func(t *testing.T) {
		for _, n := range []int{1, 7, 40} {
			p := prompt(n)
			seq, err := e.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			got, err := engine.Draft(ctx, e, seq, p, 8)
			seq.Release()
			if err != nil {
				t.Fatal(err)
			}
			if want := refDraft(p, 8); !slices.Equal(engine.IDs(got), want) {
				t.Errorf("prompt of %d: draft %v, reference %v", n, engine.IDs(got), want)
			}
			for i, tok := range got {
				if !(tok.Logprob <= 0) || tok.Logprob < -50 {
					t.Errorf("prompt of %d: token %d's logprob %v", n, i, tok.Logprob)
				}
			}
		}
	})

	t.Run("batched equals one at a time", func(t *testing.T) {
		// Sequences of different lengths, one prefilling while others decode.
		prompts := [][]int{prompt(3), prompt(17), prompt(1), prompt(30)}
		var want [][]int
		for _, p := range prompts {
			want = append(want, refDraft(p, 6))
		}
		entries := newEntries(t, e, prompts)
		got := make([][]int, len(prompts))
		for step := 0; step < 6; step++ {
			if err := e.Step(ctx, entries); err != nil {
				t.Fatal(err)
			}
			for i, en := range entries {
				got[i] = append(got[i], en.Next)
				en.Tokens = []int{en.Next}
			}
		}
		for i := range prompts {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("sequence %d: batched %v, alone %v", i, got[i], want[i])
			}
		}
	})

	t.Run("truncate rolls back", func(t *testing.T) {
		p := prompt(12)
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		if _, err := engine.Draft(ctx, e, seq, p, 5); err != nil {
			t.Fatal(err)
		}
		if seq.Len() != len(p)+4 {
			t.Fatalf("Len = %d, want %d", seq.Len(), len(p)+4)
		}
		seq.Truncate(5)
		got, err := engine.Draft(ctx, e, seq, p[5:], 5)
		if err != nil {
			t.Fatal(err)
		}
		if want := refDraft(p, 5); !slices.Equal(engine.IDs(got), want) {
			t.Errorf("after rollback: %v, want %v", engine.IDs(got), want)
		}
	})

	t.Run("steps chained equal steps", func(t *testing.T) {
		// engine.StepN (the engine's own when it chains steps on the
		// device) over entries of different lengths, one prefilling.
		prompts := [][]int{prompt(5), prompt(1), prompt(23)}
		entries := newEntries(t, e, prompts)
		chained, err := engine.StepN(ctx, e, entries, 7)
		if err != nil {
			t.Fatal(err)
		}
		got := make([][]int, len(chained))
		for i, p := range prompts {
			got[i] = engine.IDs(chained[i])
			if want := refDraft(p, 7); !slices.Equal(got[i], want) {
				t.Errorf("entry %d: %v, reference %v", i, got[i], want)
			}
			if n := entries[i].Seq.Len(); n != len(p)+6 {
				t.Errorf("entry %d: Len = %d, want %d", i, n, len(p)+6)
			}
			if entries[i].Next != got[i][6] || entries[i].Logprob != chained[i][6].Logprob || !slices.Equal(entries[i].Tokens, p) {
				t.Errorf("entry %d: Next %d (want %d), Tokens changed", i, entries[i].Next, got[i][6])
			}
		}
		// The logprobs are the model's: the reference's log-softmax there.
		checkChained(t, ref, prompts[1], chained[1], 0)
		// And on from there, one entry rolled back.
		entries[0].Seq.Truncate(len(prompts[0]) + 2)
		entries[0].Tokens = got[0][2:3]
		entries[1].Tokens, entries[2].Tokens = []int{got[1][6]}, []int{got[2][6]}
		more, err := engine.StepN(ctx, e, entries, 3)
		if err != nil {
			t.Fatal(err)
		}
		if want := refDraft(prompts[0], 6)[3:6]; !slices.Equal(engine.IDs(more[0]), want) {
			t.Errorf("after rollback: %v, reference %v", engine.IDs(more[0]), want)
		}
		if want := refDraft(prompts[2], 10)[7:10]; !slices.Equal(engine.IDs(more[2]), want) {
			t.Errorf("continued: %v, reference %v", engine.IDs(more[2]), want)
		}
	})

	t.Run("steps with their most likely tokens", func(t *testing.T) {
		// A drafter's alternatives: entries asking for 0 and 3 of them,
		// through StepN (chained where the engine chains) and one Step.
		prompts := [][]int{prompt(9), prompt(4)}
		entries := newEntries(t, e, prompts)
		entries[1].TopN = 3
		chained, err := engine.StepN(ctx, e, entries, 4)
		if err != nil {
			t.Fatal(err)
		}
		checkChained(t, ref, prompts[1], chained[1], 3)
		for j, tok := range chained[0] {
			if tok.Top != nil {
				t.Errorf("entry 0 (TopN 0) token %d: %v", j, tok.Top)
			}
		}
		entries[1].Tokens = []int{chained[1][3].ID}
		if err := e.Step(ctx, entries[1:]); err != nil {
			t.Fatal(err)
		}
		if len(entries[1].Top) != 3 || entries[1].Top[0].Token != entries[1].Next {
			t.Errorf("Step's top %v for next %d", entries[1].Top, entries[1].Next)
		}
		if err := e.Step(ctx, []*engine.Entry{{Seq: entries[0].Seq, Tokens: []int{1}, TopN: engine.MaxTopN + 1}}); err == nil {
			t.Error("Step took TopN past MaxTopN")
		}
	})

	t.Run("chained steps past the context", func(t *testing.T) {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		p := prompt(c.MaxPositionEmbeddings - 3)
		_, err = engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: p}}, 6)
		if !errors.Is(err, engine.ErrContextFull) {
			t.Errorf("6 steps after %d of %d positions: %v", len(p), c.MaxPositionEmbeddings, err)
		}
		if n := seq.Len(); n > c.MaxPositionEmbeddings {
			t.Errorf("Len = %d past max_position_embeddings", n)
		}
	})

	t.Run("chained decode past the context", func(t *testing.T) {
		// Single tokens only (the engine may chain every step): nothing is
		// fed past max_position_embeddings.
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		p := prompt(c.MaxPositionEmbeddings - 3)
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: p}}); err != nil {
			t.Fatal(err)
		}
		_, err = engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: p[:1]}}, 6)
		if !errors.Is(err, engine.ErrContextFull) {
			t.Errorf("6 steps after %d of %d positions: %v", len(p), c.MaxPositionEmbeddings, err)
		}
		if n := seq.Len(); n > c.MaxPositionEmbeddings {
			t.Errorf("Len = %d past max_position_embeddings", n)
		}
	})

	t.Run("sampled steps chained", func(t *testing.T) {
		sc, ok := e.(engine.SampleChainer)
		if !ok {
			t.Skip("the engine does not chain sampled steps")
		}
		runSampleN(t, e, sc, ref, c.VocabSize)
	})

	t.Run("bad input", func(t *testing.T) {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		for _, tokens := range [][]int{{}, {-1}, {c.VocabSize}} {
			if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: tokens}}); err == nil {
				t.Errorf("Step accepted tokens %v", tokens)
			}
			if _, err := engine.StepN(ctx, e, []*engine.Entry{{Seq: seq, Tokens: tokens}}, 3); err == nil {
				t.Errorf("StepN accepted tokens %v", tokens)
			}
		}
		other, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer other.Release()
		twice := []*engine.Entry{{Seq: other, Tokens: []int{1}}, {Seq: other, Tokens: []int{2}}}
		if _, err := engine.StepN(ctx, e, twice, 3); err == nil {
			t.Error("StepN accepted one sequence twice in a batch")
		}
		if other.Len() != 0 {
			t.Errorf("a refused StepN changed the cache: Len = %d", other.Len())
		}
		long := make([]int, c.MaxPositionEmbeddings+1)
		err = e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: long}})
		if !errors.Is(err, engine.ErrContextFull) {
			t.Errorf("past max_position_embeddings: %v", err)
		}
		if seq.Len() != 0 {
			t.Errorf("a refused step changed the cache: Len = %d", seq.Len())
		}
	})
	t.Run("verify", func(t *testing.T) { runVerify(t, e, c, ref, prompt) })
	t.Run("trees", func(t *testing.T) { runTrees(t, e, c, ref, prompt) })
	t.Run("sampled drafts", func(t *testing.T) { runSampled(t, e, c, ref, prompt) })
}

// newEntries gives each prompt a fresh sequence of e, released when the
// test ends.
func newEntries(t *testing.T, e engine.Engine, prompts [][]int) []*engine.Entry {
	t.Helper()
	entries := make([]*engine.Entry, len(prompts))
	for i, p := range prompts {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(seq.Release)
		entries[i] = &engine.Entry{Seq: seq, Tokens: p}
	}
	return entries
}

// runSampleN holds a SampleChainer's chained sampled steps to the rule:
// over entries of different lengths (one prefilling, so that the chain
// starts after a pass read back) at different temperatures and nuclei,
// each drawn token is where its V falls in the reference's distribution
// after the prompt and the tokens before it (samplingtest.Check), with its
// log-probability and the top tokens asked for; the caches hold what was
// fed, and a chain goes on from them, one rolled back; bad batches are
// refused and change nothing.
func runSampleN(t *testing.T, e engine.Engine, sc engine.SampleChainer, ref *reference.Model, vocab int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(41, 43)) // its own: the other checks' prompts stay as they were
	prompt := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = rng.IntN(vocab)
		}
		return p
	}
	params := []sampling.Params{{Temperature: 0.9, TopP: 0.95}, {Temperature: 1.3, TopP: 1}, {Temperature: 0.5, TopP: 0.8}}
	prompts := [][]int{prompt(5), prompt(1), prompt(23)}
	draws := func(n int) []sampling.Draw {
		d := make([]sampling.Draw, n)
		for j := range d {
			d[j] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32()}
		}
		return d
	}
	batch := make([]*engine.VerifyEntry, len(prompts))
	for i, p := range prompts {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(seq.Release)
		batch[i] = &engine.VerifyEntry{Seq: seq, Tokens: p, Out: 1, Sampling: params[i], Draws: draws(7)}
	}
	batch[2].TopN = 3
	check := func(i int, context []int, d []sampling.Draw, got []engine.Token, topN int) {
		t.Helper()
		if len(got) != len(d) {
			t.Fatalf("entry %d: %d tokens for %d draws", i, len(got), len(d))
		}
		context = slices.Clone(context)
		for j, tok := range got {
			logits, err := ref.Forward(ref.NewSequence(), context)
			if err != nil {
				t.Fatal(err)
			}
			want, err := sampling.Choose(logits, params[i], d[j])
			if err != nil {
				t.Fatal(err)
			}
			row := want
			row.Sample = tok.ID
			if err := samplingtest.Check(logits, params[i], d[j], row); err != nil {
				t.Errorf("entry %d token %d: %v", i, j, err)
			}
			if tok.ID >= 0 && tok.ID < len(logits) && !logprobClose(tok.Logprob, logits[tok.ID]-want.LogSumExp, want.LogSumExp) {
				t.Errorf("entry %d token %d: logprob %v, reference %v", i, j, tok.Logprob, logits[tok.ID]-want.LogSumExp)
			}
			if top := sampling.Top(logits, topN, want.LogSumExp); topN > 0 && !topClose(tok.Top, top, logits, want.LogSumExp) || topN == 0 && tok.Top != nil {
				t.Errorf("entry %d token %d: top %v, reference %v", i, j, tok.Top, top)
			}
			context = append(context, tok.ID)
		}
	}
	got, err := sc.SampleN(ctx, batch, 7)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range prompts {
		check(i, p, batch[i].Draws, got[i], batch[i].TopN)
		if n := batch[i].Seq.Len(); n != len(p)+6 {
			t.Errorf("entry %d: Len = %d, want %d", i, n, len(p)+6)
		}
		if !slices.Equal(batch[i].Tokens, p) || batch[i].Rows != nil {
			t.Errorf("entry %d: the entry changed: tokens %v, rows %v", i, batch[i].Tokens, batch[i].Rows)
		}
	}
	// On from the caches, entry 0 rolled back to its third token: every
	// entry one token pending, so the whole call chains.
	texts := make([][]int, len(prompts))
	for i, p := range prompts {
		texts[i] = append(slices.Clone(p), engine.IDs(got[i])...)
	}
	batch[0].Seq.Truncate(len(prompts[0]) + 2)
	texts[0] = texts[0][:len(prompts[0])+3]
	for i := range batch {
		batch[i].Tokens, batch[i].Draws = texts[i][len(texts[i])-1:], draws(4)
	}
	more, err := sc.SampleN(ctx, batch, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i := range batch {
		check(i, texts[i], batch[i].Draws, more[i], batch[i].TopN)
	}
	// Bad batches: refused, nothing fed.
	lens := make([]int, len(batch))
	for i := range batch {
		lens[i] = batch[i].Seq.Len()
	}
	one := func(f func(v *engine.VerifyEntry)) []*engine.VerifyEntry {
		v := *batch[1]
		v.Tokens, v.Draws = []int{1}, draws(3)
		f(&v)
		return []*engine.VerifyEntry{batch[0], &v}
	}
	for name, bad := range map[string][]*engine.VerifyEntry{
		"a proposal":    one(func(v *engine.VerifyEntry) { v.Draws[1].X = 2 }),
		"too few draws": one(func(v *engine.VerifyEntry) { v.Draws = v.Draws[:2] }),
		"greedy":        one(func(v *engine.VerifyEntry) { v.Sampling = sampling.Params{} }),
		"two rows out":  one(func(v *engine.VerifyEntry) { v.Tokens, v.Out = []int{1, 2}, 2 }),
		"a bad uniform": one(func(v *engine.VerifyEntry) { v.Draws[2].V = 1 }),
	} {
		bad[0].Draws = draws(3)
		if _, err := sc.SampleN(ctx, bad, 3); err == nil {
			t.Errorf("%s: SampleN took it", name)
		}
	}
	for i := range batch {
		if n := batch[i].Seq.Len(); n != lens[i] {
			t.Errorf("entry %d: Len %d after bad batches, want %d", i, n, lens[i])
		}
	}
}

// checkChained holds an entry's chained greedy tokens to the reference
// after the prompt and each token before: their log-probabilities, and
// with topN their most likely tokens.
func checkChained(t *testing.T, ref *reference.Model, prompt []int, got []engine.Token, topN int) {
	t.Helper()
	seq := ref.NewSequence()
	feed := prompt
	for i, tok := range got {
		logits, err := ref.Forward(seq, feed)
		if err != nil {
			t.Fatal(err)
		}
		row, err := sampling.Choose(logits, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
		if err != nil {
			t.Fatal(err)
		}
		if !logprobClose(tok.Logprob, row.ArgmaxLogprob, row.LogSumExp) {
			t.Errorf("token %d: logprob %v, reference %v", i, tok.Logprob, row.ArgmaxLogprob)
		}
		if topN > 0 {
			if want := sampling.Top(logits, topN, row.LogSumExp); !topClose(tok.Top, want, logits, row.LogSumExp) {
				t.Errorf("token %d: top %v, reference %v", i, tok.Top, want)
			}
		}
		feed = []int{tok.ID}
	}
}

// sameArgmax reports whether two engines' greedy tokens agree on the
// reference's logits: equal, or a near tie (logits within 1e-3 × the
// largest |logit|, the tolerance of greedy tokens).
func sameArgmax(logits []float32, got, want int) bool {
	if got == want {
		return true
	}
	if got < 0 || got >= len(logits) {
		return false
	}
	var scale float64
	for _, l := range logits {
		scale = math.Max(scale, math.Abs(float64(l)))
	}
	return math.Abs(float64(logits[got]-logits[want])) <= 1e-3*scale
}

// logprobClose reports whether an engine's log-probability is within
// 2e-3 × max(1, |lse|) of the reference's, lse the row's log-sum-exp (of
// the scale of its largest logits): f32 sums over the vocabulary in
// another order, and the logits' own tolerance, which an f16 KV cache
// widens to f16 storage's.
func logprobClose(got, want, lse float32) bool {
	return math.Abs(float64(got-want)) <= 2e-3*max(1, math.Abs(float64(lse)))
}

// topClose reports whether an engine's most likely tokens are the
// reference's: log-probabilities close rank by rank, and each token the
// reference's at its rank or, at a near tie, a token whose reference
// log-probability is as close.
func topClose(got, want []sampling.TokenLogprob, logits []float32, lse float32) bool {
	if len(got) != len(want) {
		return false
	}
	for r := range want {
		if !logprobClose(got[r].Logprob, want[r].Logprob, lse) {
			return false
		}
		if g := got[r].Token; g != want[r].Token && (g < 0 || g >= len(logits) || !logprobClose(logits[g]-lse, want[r].Logprob, lse)) {
			return false
		}
	}
	return true
}

// runVerify checks Verify against the reference: the rows read out equal
// one-token steps at each position (argmax, log-probabilities, the most
// likely tokens), a batch equals its entries alone, a sampled row's
// acceptance and draw follow the logits, a rollback after a verification
// goes on right, and bad read-outs are refused before any work.
func runVerify(t *testing.T, e engine.Engine, c qwen3.Config, ref *reference.Model, prompt func(int) []int) {
	ctx := context.Background()
	// refRows returns the reference's logits at the last out positions of
	// context + tokens.
	refRows := func(context, tokens []int, out int) [][]float32 {
		seq := ref.NewSequence()
		if len(context) > 0 {
			if _, err := ref.Forward(seq, context); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := ref.ForwardRows([]reference.Input{{Seq: seq, Tokens: tokens}}, []int{out})
		if err != nil {
			t.Fatal(err)
		}
		return rows[0]
	}
	newSeq := func() engine.Sequence {
		s, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Release)
		return s
	}

	t.Run("rows equal steps", func(t *testing.T) {
		// A context, then k+1 tokens fed at once, as a verifier feeds its
		// last token and k drafted ones; every row read out, with the top 5.
		for _, k := range []int{1, 4, 16} {
			context, fed := prompt(9), prompt(k+1)
			seq := newSeq()
			if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
				t.Fatal(err)
			}
			v := &engine.VerifyEntry{Seq: seq, Tokens: fed, Out: k + 1, TopN: 5}
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
			if len(v.Rows) != k+1 || seq.Len() != len(context)+k+1 {
				t.Fatalf("k %d: %d rows, Len %d", k, len(v.Rows), seq.Len())
			}
			for j, logits := range refRows(context, fed, k+1) {
				want, err := sampling.Choose(logits, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
				if err != nil {
					t.Fatal(err)
				}
				got := v.Rows[j]
				if !sameArgmax(logits, got.Argmax, want.Argmax) || !logprobClose(got.ArgmaxLogprob, want.ArgmaxLogprob, want.LogSumExp) ||
					!logprobClose(got.LogSumExp, want.LogSumExp, want.LogSumExp) {
					t.Errorf("k %d row %d: %+v, reference %+v", k, j, got.Row, want)
				}
				top := sampling.Top(logits, 5, want.LogSumExp)
				if !topClose(got.Top, top, logits, want.LogSumExp) {
					t.Errorf("k %d row %d: top %v, reference %v", k, j, got.Top, top)
				}
			}
			// The same positions as one-token steps on a sequence of their own.
			alone := newSeq()
			feed := append(append([]int(nil), context...), fed[0])
			rows := refRows(context, fed, k+1)
			for j := range k + 1 {
				en := &engine.Entry{Seq: alone, Tokens: feed}
				if err := e.Step(ctx, []*engine.Entry{en}); err != nil {
					t.Fatal(err)
				}
				if !sameArgmax(rows[j], en.Next, v.Rows[j].Argmax) {
					t.Errorf("k %d row %d: verified %d, stepped %d", k, j, v.Rows[j].Argmax, en.Next)
				}
				if j < k {
					feed = fed[j+1 : j+2]
				}
			}
		}
	})

	t.Run("batched equals alone", func(t *testing.T) {
		contexts := [][]int{prompt(3), prompt(20), nil, prompt(7)}
		feeds := [][]int{prompt(5), prompt(1), prompt(12), prompt(9)}
		outs := []int{5, 1, 4, 9}
		var batch []*engine.VerifyEntry
		for i := range feeds {
			seq := newSeq()
			if len(contexts[i]) > 0 {
				if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: contexts[i]}}); err != nil {
					t.Fatal(err)
				}
			}
			batch = append(batch, &engine.VerifyEntry{Seq: seq, Tokens: feeds[i], Out: outs[i]})
		}
		if err := e.Verify(ctx, batch); err != nil {
			t.Fatal(err)
		}
		for i, v := range batch {
			for j, logits := range refRows(contexts[i], feeds[i], outs[i]) {
				want, _ := reference.Argmax(logits)
				if !sameArgmax(logits, v.Rows[j].Argmax, want) {
					t.Errorf("entry %d row %d: batched %d, reference alone %d", i, j, v.Rows[j].Argmax, want)
				}
			}
		}
	})

	t.Run("sampled rows follow the logits", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		context, fed := prompt(6), prompt(8)
		seq := newSeq()
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
			t.Fatal(err)
		}
		p := sampling.Params{Temperature: 1.3, TopP: 0.9}
		v := &engine.VerifyEntry{Seq: seq, Tokens: fed, Out: len(fed), Sampling: p}
		for j := range fed {
			x := sampling.NoProposal
			if j+1 < len(fed) {
				x = fed[j+1] // the fed token: as a drafter's proposal
			}
			v.Draws = append(v.Draws, sampling.Draw{X: x, U: rng.Float32(), V: rng.Float32()})
		}
		if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
			t.Fatal(err)
		}
		for j, logits := range refRows(context, fed, len(fed)) {
			if err := samplingtest.Check(logits, p, v.Draws[j], v.Rows[j].Row); err != nil {
				t.Errorf("row %d: %v", j, err)
			}
		}
	})

	t.Run("coupled rows follow the logits", func(t *testing.T) {
		// A chain of coupled rows (sampling.Draw.Coupled) whose drafts are
		// the coupled draws under the reference's own logits, each but the
		// last few (then random tokens): the first rows accept theirs, the
		// rest draw and reject; with and without a nucleus.
		rng := rand.New(rand.NewPCG(7, 8))
		for _, p := range []sampling.Params{{Temperature: 0.8, TopP: 1}, {Temperature: 1.2, TopP: 0.9}} {
			context := prompt(5)
			draws := make([]sampling.Draw, 7)
			for j := range draws {
				draws[j] = sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
			}
			fed := []int{prompt(1)[0]}
			for j := range len(draws) - 1 {
				x := prompt(1)[0]
				if j < 4 {
					logits := refRows(context, fed, 1)[0]
					var err error
					if x, err = sampling.CoupledChoice(logits, nil, p.Temperature, draws[j]); err != nil {
						t.Fatal(err)
					}
					if kept, _ := samplingtest.Probs(logits, p); kept[x] == 0 { // outside the nucleus: the target draws another
						x = slices.Index(logits, slices.Max(logits))
					}
				}
				draws[j].X = x
				fed = append(fed, x)
			}
			seq := newSeq()
			if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
				t.Fatal(err)
			}
			v := &engine.VerifyEntry{Seq: seq, Tokens: fed, Out: len(fed), Sampling: p, Draws: draws}
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
			accepted := 0
			for j, logits := range refRows(context, fed, len(fed)) {
				if err := samplingtest.Check(logits, p, draws[j], v.Rows[j].Row); err != nil {
					t.Errorf("%+v row %d: %v", p, j, err)
				}
				if v.Rows[j].Accept {
					accepted++
				}
			}
			if accepted < 2 {
				t.Errorf("%+v: %d of the reference's own coupled draws accepted", p, accepted)
			}
		}
	})

	t.Run("rollback after a verification", func(t *testing.T) {
		context, fed := prompt(10), prompt(6)
		seq := newSeq()
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: fed, Out: 6}}); err != nil {
			t.Fatal(err)
		}
		seq.Truncate(len(context) + 2) // two of the drafted tokens accepted
		next := prompt(3)
		v := &engine.VerifyEntry{Seq: seq, Tokens: next, Out: 3}
		if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
			t.Fatal(err)
		}
		kept := append(append([]int(nil), context...), fed[:2]...)
		for j, logits := range refRows(kept, next, 3) {
			if want, _ := reference.Argmax(logits); !sameArgmax(logits, v.Rows[j].Argmax, want) {
				t.Errorf("row %d: %d, reference %d", j, v.Rows[j].Argmax, want)
			}
		}
	})

	t.Run("bad read-outs", func(t *testing.T) {
		seq := newSeq()
		for _, v := range []*engine.VerifyEntry{
			{Seq: seq, Tokens: []int{1, 2}, Out: 0},
			{Seq: seq, Tokens: []int{1, 2}, Out: 3},
			{Seq: seq, Tokens: []int{1}, Out: 1, TopN: engine.MaxTopN + 1},
			{Seq: seq, Tokens: []int{1}, Out: 1, Sampling: sampling.Params{Temperature: 1}},
			{Seq: seq, Tokens: []int{1}, Out: 1, Sampling: sampling.Params{Temperature: 1}, Draws: []sampling.Draw{{X: c.VocabSize}}},
			{Seq: seq, Tokens: []int{1}, Out: 1, Sampling: sampling.Params{Temperature: 1}, Draws: []sampling.Draw{{X: 1, U: 1}}},
			{Seq: seq, Tokens: []int{c.VocabSize}, Out: 1},
		} {
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err == nil {
				t.Errorf("Verify accepted %+v", v)
			}
		}
		if seq.Len() != 0 {
			t.Errorf("a refused verification changed the cache: Len %d", seq.Len())
		}
	})
}
