package webgpu

import (
	"context"
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
)

// Building ahead (engine.Preparer). A pass's kernels are chosen by its
// rows — the plan gives each row count of a projection its kernel and
// layout, on a GPU 5–20 verified rows a tile of exactly their count — and
// decode attention's by its rows and its longest context. Which row counts
// a batch meets depends on when its generations join and end, so a
// warm-up's generations cannot be sure to meet them all, and a pipeline
// the driver first builds mid-generation stalls that step: on an H100 a
// batch-4 run whose timed pass met pipelines its untimed pass had not took
// 3.6 ms a step against 1.5 (BENCHMARKS.md). Prepare records a pass of
// every row count into a batch it discards — the pipelines stay built,
// nothing runs — and builds decode attention's for every row count and
// context length (kernels.KVCache.PrepareAttention).

var (
	_ engine.Preparer = (*Engine)(nil)
	_ engine.Preparer = (*Head)(nil)
)

// Prepare builds every pipeline a pass of e may need: the projections,
// the attention input and the read-out at 1…MaxRows rows (at most the
// read-out's rows read out), and decode attention at those rows over any
// context the model and the cache allow.
func (e *Engine) Prepare(ctx context.Context) error {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return err
	}
	for R := 1; R <= e.opts.MaxRows; R++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := recordOnly(e.dev, e.kernels(pass{rows: R, lasts: min(R, e.act.maxLasts)})); err != nil {
			return fmt.Errorf("webgpu: prepare: a pass of %d rows: %w", R, err)
		}
	}
	maxLen := min(e.cfg.MaxPositionEmbeddings, e.kv.Capacity())
	if err := e.kv.PrepareAttention(e.dev, e.cfg.NumAttentionHeads, e.opts.MaxRows, maxLen); err != nil {
		return fmt.Errorf("webgpu: prepare: %w", err)
	}
	return nil
}

// Prepare builds every pipeline a pass of the head may need, as
// Engine.Prepare does: its layer and fc at 1…R rows, its read-out at the
// rows a pass reads out, decode attention over its cache.
func (h *Head) Prepare(ctx context.Context) error {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	for R := 1; R <= h.act.R; R++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		// fc over features already in place, the layer, and the first
		// rows read out where they are (x): what a pass of R rows records
		// that depends on R.
		ps := headPass{rows: R, nfc: R, featsIn: true, last: true, readX: true, noSave: true}
		if err := recordOnly(h.dev, h.passSteps(&ps, min(R, h.act.S), 0)); err != nil {
			return fmt.Errorf("webgpu head: prepare: a pass of %d rows: %w", R, err)
		}
	}
	maxLen := min(h.engCfg.MaxPositionEmbeddings, h.kv.Capacity())
	if err := h.kv.PrepareAttention(h.dev, h.layer.NumAttentionHeads, h.act.R, maxLen); err != nil {
		return fmt.Errorf("webgpu head: prepare: %w", err)
	}
	return nil
}

// recordOnly records steps into a batch that it discards: what recording
// builds (pipelines, scratch space) stays; nothing runs.
func recordOnly(d *gpu.Device, steps []step) error {
	b, err := d.NewBatch("prepare")
	if err != nil {
		return err
	}
	defer b.Discard()
	for _, s := range steps {
		if err := s(b); err != nil {
			return err
		}
	}
	return nil
}
