package webgpu

import (
	"context"
	"slices"
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
// submit; the tiny model's GPU time is small beside it); "replay" and
// "replay+submit" record the pass as the engine does once its shape has
// been recorded, replaying the kernels' recordings (replay.go). Chained on
// the H200 the host records while the GPU runs, so this cost bounds a step
// from below whatever the kernels do; the metric is per dispatch.
func BenchmarkRecordDecodeStep(b *testing.B) {
	e, ps := decodeStep(b, 28, 1)
	steps := e.kernels(ps)
	// record records steps into a new batch.
	record := func(b *testing.B, steps []step) *gpu.Batch {
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
	// figure). Then one that captures them, kept for the replays.
	record(b, steps).Discard()
	captured, keep := e.passKernels(ps)
	record(b, captured).Discard()
	keep()
	key, _ := e.keyOf(ps)
	recs := e.recorded[key]
	if !recs.valid() {
		b.Fatal("the pass's recordings were not kept")
	}
	replays := e.replaySteps(ps, recs)
	for _, run := range []struct {
		name   string
		steps  []step
		submit bool
	}{{"record", steps, false}, {"replay", replays, false}, {"record+submit", steps, true}, {"replay+submit", replays, true}} {
		steps, submit := run.steps, run.submit
		b.Run(run.name, func(b *testing.B) {
			dispatches, n := 0, 0
			for b.Loop() {
				batch := record(b, steps)
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

// TestReplayedPasses: decode passes replay their kernels' recordings
// (replay.go) and give, bit for bit, what recording them afresh gives —
// one-token steps, chained steps, a batch of two — also after a released
// buffer made the recordings stale.
func TestReplayedPasses(t *testing.T) {
	cfg := synth.Shapes["tiny"]
	cfg.NumHiddenLayers = 3
	w := synth.Int4Weights(cfg, 7, 0.05)
	dev := gputest.Device(t)
	ctx := context.Background()
	var stale func(*testing.T, *Engine)
	type result struct {
		tokens   []engine.Token
		replayed int // passes whose recordings were replayed as they were
	}
	stale = staleRecordings(dev)
	run := func(t *testing.T, replay bool) result {
		e, err := New(dev, cfg, w, Options{KVBytes: 8 << 20, MaxSequences: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if !replay {
			e.recorded = nil
		}
		var res result
		// recordings is what the engine holds now, to count the passes that
		// kept them.
		recordings := func() map[*gpu.Recording]bool {
			m := map[*gpu.Recording]bool{}
			for _, rec := range e.recorded {
				for _, r := range rec {
					m[r] = true
				}
			}
			return m
		}
		var seqs []engine.Sequence
		for range 2 {
			s, err := e.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Release()
			seqs = append(seqs, s)
		}
		a := &engine.Entry{Seq: seqs[0], Tokens: []int{1, 2, 3, 4, 5}}
		b := &engine.Entry{Seq: seqs[1], Tokens: []int{9, 8}}
		for i := range 24 {
			before := recordings()
			batch := []*engine.Entry{a}
			if i >= 16 {
				batch = append(batch, b) // a batch of two: another shape
			}
			if i == 10 || i == 20 {
				stale(t, e)
			}
			if i%4 == 3 {
				tokens, err := e.StepN(ctx, batch, 5)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for _, ts := range tokens {
					res.tokens = append(res.tokens, ts...)
				}
			} else {
				if err := e.Step(ctx, batch); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for _, en := range batch {
					res.tokens = append(res.tokens, engine.Token{ID: en.Next, Logprob: en.Logprob})
				}
			}
			for _, en := range batch {
				en.Tokens = []int{en.Next}
			}
			after := recordings()
			for r := range before {
				if after[r] {
					res.replayed++
					break
				}
			}
		}
		return res
	}
	fresh, replayed := run(t, false), run(t, true)
	if fresh.replayed != 0 {
		t.Fatalf("an engine without recordings kept %d", fresh.replayed)
	}
	t.Logf("%d of 24 calls replayed recordings", replayed.replayed)
	if replayed.replayed < 12 {
		t.Errorf("%d of 24 calls replayed recordings, want most", replayed.replayed)
	}
	if !slices.EqualFunc(fresh.tokens, replayed.tokens, func(x, y engine.Token) bool { return x.ID == y.ID && x.Logprob == y.Logprob }) {
		t.Errorf("replayed passes gave\n%v\nrecorded afresh\n%v", replayed.tokens, fresh.tokens)
	}
}

// staleRecordings returns a function that releases a buffer a bind group
// binds, which makes every recording on dev stale.
func staleRecordings(dev *gpu.Device) func(*testing.T, *Engine) {
	return func(t *testing.T, e *Engine) {
		t.Helper()
		z, err := dev.NewBuffer("stale", 16)
		if err != nil {
			t.Fatal(err)
		}
		b, err := dev.NewBatch("stale")
		if err != nil {
			t.Fatal(err)
		}
		if err := kernels.Copy(b, z, e.act.next, 16); err != nil {
			t.Fatal(err)
		}
		if err := b.Submit(); err != nil {
			t.Fatal(err)
		}
		z.Release()
	}
}

// TestReplayGoneStale: a pass whose recordings go stale after it was
// planned (a buffer released by an earlier step of the same pass) records
// its kernels afresh, with the same result.
func TestReplayGoneStale(t *testing.T) {
	e, ps := decodeStep(t, 2, 3)
	dev := e.dev
	// The pass recorded afresh, then replayed with its recordings made
	// stale by its first step: each time the same greedy token.
	next := func(steps []step) uint32 {
		if err := e.submit(steps, submitEvery); err != nil {
			t.Fatal(err)
		}
		got, err := e.act.next.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	steps, keep := e.passKernels(ps)
	want := next(steps)
	keep()
	key, _ := e.keyOf(ps)
	rec := e.recorded[key]
	if !rec.valid() {
		t.Fatal("the pass's recordings were not kept")
	}
	staleNow := staleRecordings(dev)
	first := func(*gpu.Batch) error { staleNow(t, e); return nil }
	if got := next(append([]step{first}, e.replaySteps(ps, rec)...)); got != want {
		t.Errorf("recorded afresh within the pass: token %d, want %d", got, want)
	}
	if rec.valid() {
		t.Error("the recordings are still valid after a bound buffer's release")
	}
}

// decodeStep makes an engine of the tiny shape with layers layers (int4
// weights from seed), feeds a sequence a three-token prompt, reserves its
// next position and returns the engine and its next decode pass (one
// token), unsubmitted; the test's cleanup closes the engine.
func decodeStep(tb testing.TB, layers int, seed uint64) (*Engine, pass) {
	tb.Helper()
	cfg := synth.Shapes["tiny"]
	cfg.NumHiddenLayers = layers
	e, err := New(gputest.Device(tb), cfg, synth.Int4Weights(cfg, seed, 0.05), Options{KVBytes: 8 << 20, MaxSequences: 2})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := e.Close(); err != nil {
			tb.Error(err)
		}
	})
	seq, err := e.NewSequence()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(seq.Release)
	entry := &engine.Entry{Seq: seq, Tokens: []int{1, 2, 3}}
	if err := e.Step(context.Background(), []*engine.Entry{entry}); err != nil {
		tb.Fatal(err)
	}
	s := seq.(*kernels.KVSeq)
	if err := e.kv.Reserve([]*kernels.KVSeq{s}, []int{s.Len() + 1}); err != nil {
		tb.Fatal(err)
	}
	work := []pending{{entry: entry, seq: s, tokens: []int{entry.Next}, place: []treemask.Row{treemask.LineRow(s.Len())}}}
	return e, e.plan(work)
}
