package webgpu

import (
	"context"
	"testing"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
	"webdraft/kernels"
	"webdraft/treemask"
)

// BenchmarkRecordDecodeStep is the host's share of a decode step: recording
// one batch-1 forward pass of a 28-layer model (Qwen3-1.7B's layer count,
// tiny widths) into command buffers, without submitting them ("record"),
// and submitting them too ("record+submit": wgpu validates and tracks at
// submit; the tiny model's GPU time is small beside it). Chained on the
// H200 the host records while the GPU runs, so this cost bounds a step
// from below whatever the kernels do; the metric is per dispatch.
func BenchmarkRecordDecodeStep(b *testing.B) {
	cfg := synth.Shapes["tiny"]
	cfg.NumHiddenLayers = 28
	e, err := New(gputest.Device(b), cfg, synth.Int4Weights(cfg, 1, 0.02), Options{KVBytes: 8 << 20, MaxSequences: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	seq, err := e.NewSequence()
	if err != nil {
		b.Fatal(err)
	}
	defer seq.Release()
	entry := &engine.Entry{Seq: seq, Tokens: []int{1, 2, 3}}
	if err := e.Step(context.Background(), []*engine.Entry{entry}); err != nil {
		b.Fatal(err)
	}
	s := seq.(*kernels.KVSeq)
	if err := e.kv.Reserve([]*kernels.KVSeq{s}, []int{s.Len() + 1}); err != nil {
		b.Fatal(err)
	}
	work := []pending{{entry: entry, seq: s, tokens: []int{entry.Next}, place: []treemask.Row{treemask.LineRow(s.Len())}}}
	steps := e.kernels(e.plan(work))
	record := func(b *testing.B) *gpu.Batch {
		batch, err := e.newBatch()
		if err != nil {
			b.Fatal(err)
		}
		for _, st := range steps {
			if err := st(batch); err != nil {
				b.Fatal(err)
			}
		}
		return batch
	}
	// One recording first, untimed: it creates the step's pipelines (on
	// SwiftShader seconds of shader compiling, which would swamp the
	// figure).
	record(b).Discard()
	for _, submit := range []bool{false, true} {
		name := map[bool]string{false: "record", true: "record+submit"}[submit]
		b.Run(name, func(b *testing.B) {
			dispatches, n := 0, 0
			for b.Loop() {
				batch := record(b)
				dispatches = batch.Len()
				if !submit {
					batch.Discard()
					continue
				}
				if err := batch.Submit(); err != nil {
					b.Fatal(err)
				}
				if n++; n%16 == 0 { // let the GPU catch up now and then
					if _, err := e.act.next.Read(0, 4); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*dispatches), "ns/dispatch")
			b.ReportMetric(float64(dispatches), "dispatches")
		})
	}
}
