package webgpu

import (
	"context"
	"fmt"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
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
// every row count into a dry batch — nothing runs — and asks for decode
// attention's pipelines for every row count and context length
// (kernels.KVCache.PrepareAttention), and the pipelines these ask for are
// built at once, on the host's cores (gpu.Device.BuildAhead).

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
	maxLen := min(e.cfg.MaxPositionEmbeddings, e.kv.Capacity())
	err := prepare(ctx, e.dev, e.kv, e.cfg.NumAttentionHeads, e.opts.MaxRows, maxLen, func(R int) []step {
		steps := e.kernels(pass{rows: R, lasts: min(R, e.act.maxLasts)})
		if R == 1 {
			// One decode row at the longest context: its attention block's
			// (kernels.AttentionBlockDecode), whose o_proj may merge
			// attention's splits as it reads them.
			steps = append(steps, e.kernels(pass{rows: 1, decode: 1, lasts: 1, maxLen: maxLen})...)
		}
		return steps
	})
	if err != nil {
		return fmt.Errorf("webgpu: prepare: %w", err)
	}
	return nil
}

// Prepare builds every pipeline a pass of the head may need, as
// Engine.Prepare does: its fc and layer at 1…R rows, its read-out at the
// rows a pass reads out, decode attention over its cache.
func (h *Head) Prepare(ctx context.Context) error {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	err := prepare(ctx, h.dev, h.kv, h.layer.NumAttentionHeads, h.act.R, min(h.engCfg.MaxPositionEmbeddings, h.kv.Capacity()), func(R int) []step {
		// fc over features already in place, the layer, and the first
		// rows read out where they are (x): what a pass of R rows records
		// that depends on R.
		ps := headPass{rows: R, nfc: R, featsIn: true, last: true, readX: true, noSave: true}
		return h.passSteps(&ps, min(R, h.act.S), 0)
	})
	if err != nil {
		return fmt.Errorf("webgpu head: prepare: %w", err)
	}
	return nil
}

// prepare records the steps of a pass of each of 1…rows rows (pass(R))
// into dry batches and asks for decode attention's pipelines over kv for
// those rows of heads query heads and contexts of up to maxLen positions,
// then builds every pipeline they asked for at once (gpu.Device.BuildAhead).
func prepare(ctx context.Context, d *gpu.Device, kv *kernels.KVCache, heads, rows, maxLen int, pass func(R int) []step) error {
	return d.BuildAhead(func() error {
		for R := 1; R <= rows; R++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := recordDry(d, pass(R)); err != nil {
				return fmt.Errorf("a pass of %d rows: %w", R, err)
			}
		}
		return kv.PrepareAttention(d, heads, rows, maxLen)
	})
}

// recordDry records steps into a dry batch: what recording makes
// (pipelines, bind groups, scratch space) stays; nothing runs.
func recordDry(d *gpu.Device, steps []step) error {
	b, err := d.NewDryBatch("prepare")
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
