package webgpu

import (
	"errors"

	"webdraft/gpu"
	"webdraft/kernels"
)

// A decode step records the same dispatches every time at one batch shape:
// each row's token, position and mask are inputs on the device (ids, rows),
// not params. So the kernels of a pass whose rows all go through decode
// attention are recorded once per shape (gpu.Batch.Capture) and replayed
// afterwards (gpu.Batch.Replay), which spares the host the planning, the
// bind-group lookups and the params' assembly of ~100–200 dispatches a
// step: in the browser, where the Go program runs as WebAssembly, about a
// third of a step's host time (BenchmarkRecordDecodeStep).

// passKey is what the kernels of a replayable pass depend on: two such
// passes with equal keys record the same dispatches with the same params.
type passKey struct {
	rows, lasts int
	attention   kernels.DecodeShape
	sample      bool
	topN        int
	chained     bool
	fromNext    bool
	coupled     bool
	keeps       bool // its features copied for a head (pass.keep: the same buffers every call)
}

// maxRecordedPasses bounds the recorded shapes an engine keeps (a server's
// batches come in a few dozen shapes); past it the engine starts over.
const maxRecordedPasses = 64

// recordedPass is the recordings of a pass's kernels, one per step of
// Engine.kernels.
type recordedPass []*gpu.Recording

// keyOf returns ps's key, and whether its kernels can be replayed: every row
// through decode attention, no sampled drafts (their kernels read the
// group's Q store, whose size is not in the key). An engine without a
// recorded map (tests) replays nothing.
func (e *Engine) keyOf(ps pass) (passKey, bool) {
	if e.recorded == nil || ps.rows == 0 || ps.decode != ps.rows || ps.propose || ps.trees > 0 {
		return passKey{}, false
	}
	return passKey{
		rows: ps.rows, lasts: ps.lasts, sample: ps.sample, topN: ps.topN, chained: ps.chained, fromNext: ps.fromNext, coupled: ps.coupled, keeps: ps.keep != nil,
		attention: e.kv.DecodeShapeOf(e.dev, ps.decode, e.cfg.NumAttentionHeads, ps.maxLen),
	}, true
}

// passKernels returns the steps that record ps's kernels — replays of
// their recordings where ps's shape was recorded before — and a function
// to call once the steps have been submitted, which keeps what they
// captured for the next pass of the shape.
func (e *Engine) passKernels(ps pass) (steps []step, keep func()) {
	key, ok := e.keyOf(ps)
	if !ok {
		return e.kernels(ps), func() {}
	}
	if rec, ok := e.recorded[key]; ok && rec.valid() {
		return e.replaySteps(ps, rec), func() {}
	}
	delete(e.recorded, key)
	steps = e.kernels(ps)
	rec := make(recordedPass, len(steps))
	for i, st := range steps {
		steps[i] = func(b *gpu.Batch) error {
			r, err := b.Capture(st)
			rec[i] = r
			return err
		}
	}
	return steps, func() {
		if !rec.valid() {
			return
		}
		if len(e.recorded) >= maxRecordedPasses {
			clear(e.recorded)
		}
		e.recorded[key] = rec
	}
}

// replaySteps are rec's recordings replayed, one a step. A recording gone
// stale since the pass began (a buffer released by the pass's earlier
// steps: the KV moves, say) is recorded afresh.
func (e *Engine) replaySteps(ps pass, rec recordedPass) []step {
	var fresh []step // e.kernels(ps), made on first need
	steps := make([]step, len(rec))
	for i, r := range rec {
		steps[i] = func(b *gpu.Batch) error {
			err := b.Replay(r)
			if !errors.Is(err, gpu.ErrStaleRecording) {
				return err
			}
			if fresh == nil {
				fresh = e.kernels(ps)
			}
			return fresh[i](b)
		}
	}
	return steps
}

// valid reports whether every recording of the pass was made and can still
// be replayed.
func (rec recordedPass) valid() bool {
	for _, r := range rec {
		if r == nil || !r.Valid() {
			return false
		}
	}
	return true
}
