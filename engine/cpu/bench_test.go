package cpu_test

import (
	"context"
	"fmt"
	"testing"

	"webdraft/bench"
	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/sampling"
	"webdraft/weights"
)

// embeddedTarget is the embedded target on the CPU engine, closed after b.
func embeddedTarget(b *testing.B) *cpu.Engine { return embeddedTargetWith(b, cpu.Options{}) }

// embeddedTargetWith is embeddedTarget with opts (its KV bytes set).
func embeddedTargetWith(b *testing.B, opts cpu.Options) *cpu.Engine {
	b.Helper()
	if !weights.Embedded() {
		b.Skip("no embedded weights")
	}
	m, err := checkpoint.LoadFS(weights.FS(), "target", checkpoint.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	opts.KVBytes = 64 << 20
	e, err := cpu.New(m.Config, m.Weights, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

// BenchmarkVerify is a verification pass of the embedded target at
// context 128, by rows read out (bench engine's figure, alone for
// profiling: go test -bench Verify -cpuprofile), its greedy read-out
// screened (the default) and exact (Options.NoScreen), alternated.
func BenchmarkVerify(b *testing.B) {
	engines := map[string]*cpu.Engine{"screened": embeddedTarget(b), "exact": embeddedTargetWith(b, cpu.Options{NoScreen: true})}
	for _, rows := range []int{1, 2, 3, 4, 7} {
		for _, mode := range []string{"screened", "exact"} {
			b.Run(fmt.Sprintf("rows%d/%s", rows, mode), func(b *testing.B) {
				d, err := bench.Verify(context.Background(), engines[mode], rows, 128, b.N)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(d.Microseconds())/1000, "ms/pass")
			})
		}
	}
}

// BenchmarkVerifyTop is a verification of the embedded target at context
// 40 reading out its rows' top 5, as the live page asks, beside the same
// pass reading out the argmax alone: what the top tokens cost a pass.
func BenchmarkVerifyTop(b *testing.B) {
	e := embeddedTarget(b)
	ctx := context.Background()
	for _, rows := range []int{1, 3} {
		for _, top := range []int{0, 5} {
			b.Run(fmt.Sprintf("rows%d/top%d", rows, top), func(b *testing.B) {
				seq, err := e.NewSequence()
				if err != nil {
					b.Fatal(err)
				}
				defer seq.Release()
				prefix := make([]int, 40)
				for i := range prefix {
					prefix[i] = 7 * i
				}
				if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: prefix, Out: 1}}); err != nil {
					b.Fatal(err)
				}
				tokens := make([]int, rows)
				for b.Loop() {
					if err := e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: tokens, Out: rows, TopN: top}}); err != nil {
						b.Fatal(err)
					}
					seq.Truncate(len(prefix))
				}
			})
		}
	}
}

// BenchmarkSampledRead is one pass of the embedded target at context 128
// reading out one row, greedy and sampled at temperature 0.7 (top_p 1
// and 0.9): a Step; a Verify's draw (the target alone, sampled), and a
// coupled one; a drafter's 4 proposals; a chain of 3 sampled drafts
// verified as a tree (its 4 rows), and as coupled rows — each pass's
// cost beside the greedy step's.
func BenchmarkSampledRead(b *testing.B) {
	e := embeddedTarget(b)
	ctx := context.Background()
	seq, err := e.NewSequence()
	if err != nil {
		b.Fatal(err)
	}
	defer seq.Release()
	prompt := make([]int, 128)
	for i := range prompt {
		prompt[i] = (i*7919 + 13) % 5000
	}
	if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: prompt}}); err != nil {
		b.Fatal(err)
	}
	// Drafts for the chain: the target's own proposals from the context.
	params := sampling.Params{Temperature: 0.7, TopP: 1}
	d := &engine.VerifyEntry{Seq: seq, Tokens: []int{42}, Out: 1, Sampling: params, Propose: [][]float32{{0.3}}}
	if err := e.Verify(ctx, []*engine.VerifyEntry{d}); err != nil {
		b.Fatal(err)
	}
	q := d.Rows[0].Q
	seq.Truncate(len(prompt))
	pass := func(b *testing.B, v *engine.VerifyEntry) {
		for b.Loop() {
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				b.Fatal(err)
			}
			seq.Truncate(len(prompt))
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/pass")
	}
	b.Run("greedy", func(b *testing.B) {
		for b.Loop() {
			if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: []int{42}}}); err != nil {
				b.Fatal(err)
			}
			seq.Truncate(len(prompt))
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/pass")
	})
	for _, topP := range []float32{1, 0.9} {
		p := sampling.Params{Temperature: 0.7, TopP: topP}
		b.Run(fmt.Sprintf("draw/top_p=%v", topP), func(b *testing.B) {
			pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42}, Out: 1, Sampling: p, Draws: []sampling.Draw{{X: sampling.NoProposal, U: 0.5, V: 0.5}}})
		})
		b.Run(fmt.Sprintf("draw_coupled/top_p=%v", topP), func(b *testing.B) {
			pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42}, Out: 1, Sampling: p, Draws: []sampling.Draw{{X: sampling.NoProposal, U: 0.5, V: 0.5, Coupled: true}}})
		})
		b.Run(fmt.Sprintf("propose4/top_p=%v", topP), func(b *testing.B) {
			pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42}, Out: 1, Sampling: p, Propose: [][]float32{{0.1, 0.4, 0.6, 0.9}}})
		})
	}
	b.Run("verify4_greedy", func(b *testing.B) {
		x := d.Rows[0].Drawn[0]
		pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42, x, x, x}, Out: 4})
	})
	b.Run("chain3/top_p=1", func(b *testing.B) {
		tree := &engine.SampledTree{Nodes: []engine.SampledNode{
			{Children: []int{1}, Q: q, U: []float32{0.5}, V: 0.5},
			{Children: []int{2}, Q: q, U: []float32{0.5}, V: 0.5},
			{Children: []int{3}, Q: q, U: []float32{0.5}, V: 0.5},
			{V: 0.5},
		}}
		x := d.Rows[0].Drawn[0]
		pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42, x, x, x}, Out: 4, Sampling: params, Tree: tree})
	})
	b.Run("chain3_coupled/top_p=1", func(b *testing.B) {
		x := d.Rows[0].Drawn[0]
		draws := make([]sampling.Draw, 4)
		for i := range draws {
			draws[i] = sampling.Draw{X: x, U: 0.1 + 0.2*float32(i), V: 0.5, Coupled: true}
		}
		draws[3].X = sampling.NoProposal
		pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42, x, x, x}, Out: 4, Sampling: params, Draws: draws})
	})
	b.Run("chain3_placed/top_p=1", func(b *testing.B) {
		tree := &engine.SampledTree{Nodes: []engine.SampledNode{
			{Children: []int{1}, Q: q, U: []float32{0.5}, V: 0.5},
			{Children: []int{2}, Q: q, U: []float32{0.5}, V: 0.5},
			{Children: []int{3}, Q: q, U: []float32{0.5}, V: 0.5},
			{V: 0.5},
		}}
		x, at := d.Rows[0].Drawn[0], len(prompt)
		pass(b, &engine.VerifyEntry{Seq: seq, Tokens: []int{42, x, x, x}, Parents: []int{-1, at, at + 1, at + 2}, Out: 4, Sampling: params, Tree: tree})
	})
}
