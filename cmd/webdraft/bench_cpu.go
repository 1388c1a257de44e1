package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"webdraft/bench"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/engine/cpu/ops"
	"webdraft/qwen3"
)

// cpuBench is what `bench engine --backend cpu|reference` measures.
type cpuBench struct {
	cfg      qwen3.Config
	w        *qwen3.Weights
	label    string
	backend  backendChoice // cpu or reference
	baseline bool          // the reference engine beside the CPU engine
	kvBytes  int64
	batches  []int
	rows     []int
	context  int
	steps    int
	prefill  int
}

// benchCPU times an engine on the CPU: decode steps by batch, verification
// passes by rows (each also as a multiple of a one-token step), a prefill;
// with a baseline, the reference engine's step and verifications in the
// same run and the speed-up over them.
func benchCPU(ctx context.Context, e *env, b cpuBench, args []string) error {
	if need := b.context + max(b.steps, 1) + 4 + slices.Max(b.rows); need > b.cfg.MaxPositionEmbeddings {
		return usagef("--context %d with --rows up to %d exceeds the model's %d positions", b.context, slices.Max(b.rows), b.cfg.MaxPositionEmbeddings)
	}
	open := func(backend backendChoice) (engine.Engine, error) {
		if backend == "reference" {
			return engine.NewReference(b.cfg, b.w, b.kvBytes)
		}
		return cpu.New(b.cfg, b.w, cpu.Options{KVBytes: b.kvBytes})
	}
	eng, err := open(b.backend)
	if err != nil {
		return err
	}
	defer eng.Close()
	var ref engine.Engine
	if b.baseline {
		if ref, err = open("reference"); err != nil {
			return err
		}
		defer ref.Close()
	}
	e.log.Info("measuring", "engine", eng.Info().Adapter, "model", b.label)
	fmt.Fprintf(e.stdout, "engine: %s\nmodel: %s\n\n", eng.Info().Adapter, b.label)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	if ref != nil {
		row("figure", "measured", "reference engine", "speed-up")
	} else {
		row("figure", "measured")
	}
	peak := ops.FMARate(runtime.GOMAXPROCS(0), 500*time.Millisecond)
	row(fmt.Sprintf("f32 multiply-add peak, registers only, %d threads", runtime.GOMAXPROCS(0)), fmt.Sprintf("%.0f G/s", peak/1e9))
	// refSteps keeps the reference's share of the run short: it is ~50×
	// slower.
	refSteps := min(b.steps, 4)
	var step1 time.Duration
	// A collection before each figure: the reference engine's garbage
	// (a row of logits a position) would otherwise be collected during
	// the next figure.
	for _, batch := range b.batches {
		runtime.GC()
		d, err := bench.Decode(ctx, eng, batch, b.context, b.steps)
		if err != nil {
			return fmt.Errorf("decode batch %d: %w", batch, err)
		}
		if batch == 1 {
			step1 = d
		}
		cells := []string{fmt.Sprintf("decode step, batch %d, context %d", batch, b.context),
			fmt.Sprintf("%.2f ms, %.1f tok/s", ms64(d), float64(batch)/d.Seconds())}
		if ref != nil && batch == 1 {
			runtime.GC()
			r, err := bench.Decode(ctx, ref, batch, b.context, refSteps)
			if err != nil {
				return fmt.Errorf("reference decode: %w", err)
			}
			cells = append(cells, fmt.Sprintf("%.1f ms", ms64(r)), fmt.Sprintf("%.1f×", r.Seconds()/d.Seconds()))
		}
		row(cells...)
	}
	if step1 == 0 {
		if step1, err = bench.Decode(ctx, eng, 1, b.context, b.steps); err != nil {
			return fmt.Errorf("decode batch 1: %w", err)
		}
	}
	for _, n := range b.rows {
		runtime.GC()
		d, err := bench.Verify(ctx, eng, n, b.context, b.steps)
		if err != nil {
			return fmt.Errorf("verify %d rows: %w", n, err)
		}
		cells := []string{fmt.Sprintf("verification, %d rows read out (k = %d)", n, n-1),
			fmt.Sprintf("%.2f ms, %.2f× a step", ms64(d), d.Seconds()/step1.Seconds())}
		if ref != nil {
			runtime.GC()
			r, err := bench.Verify(ctx, ref, n, b.context, refSteps)
			if err != nil {
				return fmt.Errorf("reference verify: %w", err)
			}
			cells = append(cells, fmt.Sprintf("%.1f ms", ms64(r)), fmt.Sprintf("%.1f×", r.Seconds()/d.Seconds()))
		}
		row(cells...)
	}
	runtime.GC()
	pre, err := bench.Prefill(ctx, eng, b.prefill, 2)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	flops := 2 * float64(bench.Params(&b.cfg)) * float64(b.prefill)
	row(fmt.Sprintf("prefill %d tokens", b.prefill),
		fmt.Sprintf("%.1f ms, %.0f tok/s, %.1f GFLOP/s", ms64(pre), float64(b.prefill)/pre.Seconds(), flops/pre.Seconds()/1e9))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\nreproduce: webdraft bench engine %s\n", strings.Join(args, " "))
	return nil
}
