package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"webdraft/checkpoint"
	"webdraft/internal/memstat"
	"webdraft/internal/synth"
)

// benchmarks lists the `webdraft bench` subcommands.
var benchmarks = map[string]struct {
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}{
	"convert": {"convert a checkpoint (by default a random one of a published shape) and measure time and memory", benchConvert},
	"engine":  {"measure an engine: on WebGPU copy bandwidth, int4 matvec, decode steps, prefill; on the CPU (--backend cpu|reference) steps, verifications by rows, prefill", benchEngine},
	"spec":    {"measure speculative decoding: a drafter's mean acceptance length τ against a target", benchSpec},
}

func runBench(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(e.stderr, "usage: webdraft bench <benchmark> [flags]\n\nbenchmarks:")
		names := make([]string, 0, len(benchmarks))
		for n := range benchmarks {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(e.stderr, "  %-9s %s\n", n, benchmarks[n].summary)
		}
		if len(args) == 0 {
			return usagef("name a benchmark")
		}
		return nil
	}
	b, ok := benchmarks[args[0]]
	if !ok {
		return usagef("unknown benchmark %q", args[0])
	}
	return b.run(ctx, e, args[1:])
}

func benchConvert(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench convert", "[--shape qwen3-1.7b | --in HF_DIR] [--quant int4] [--scratch DIR]")
	shape := fs.String("shape", "qwen3-1.7b", "published shape of the random bf16 checkpoint to generate: "+strings.Join(shapeNames(), ", "))
	in := fs.String("in", "", "convert this HF checkpoint instead of a random one")
	quant := fs.String("quant", "int4", "int4, f16 or f32")
	scratch := fs.String("scratch", "", "folder for the generated checkpoint and the output (default: a temporary folder, removed after)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	q, err := checkpoint.ParseQuant(*quant)
	if err != nil {
		return usagef("--quant: %v", err)
	}
	cfg, ok := synth.Shapes[*shape]
	if *in == "" && !ok {
		return usagef("--shape %q: want one of %s", *shape, strings.Join(shapeNames(), ", "))
	}
	dir := *scratch
	if dir == "" {
		if dir, err = os.MkdirTemp("", "webdraft-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	src, label := *in, *in
	if src == "" {
		src, label = filepath.Join(dir, "hf"), *shape+" (random bf16)"
		start := time.Now()
		e.log.Info("writing a random checkpoint", "shape", *shape, "dir", src)
		if err := synth.Write(src, cfg, synth.Options{Seed: 1}); err != nil {
			return fmt.Errorf("generate %s: %w", *shape, err)
		}
		e.log.Info("written", "seconds", fmt.Sprintf("%.1f", time.Since(start).Seconds()))
	}
	out := filepath.Join(dir, "out-"+string(q))

	runtime.GC()
	debug.FreeOSMemory()
	base, err := memstat.Read()
	if err != nil {
		return err
	}
	sampler := memstat.Sample(10 * time.Millisecond)
	start := time.Now()
	stats, err := checkpoint.Convert(ctx, src, out, checkpoint.ConvertOptions{Quant: q})
	elapsed := time.Since(start)
	peak := sampler.Stop()
	if err != nil {
		return err
	}

	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "checkpoint\tquant\tsource\toutput\ttime\tread rate\tpeak anon RSS above start\tpeak file-backed RSS\tcores")
	fmt.Fprintf(tw, "%s\t%s\t%.2f GB\t%.2f GB\t%.1f s\t%.2f GB/s\t%.0f MB\t%.0f MB\t%d\n",
		label, q, gb(stats.SourceBytes), gb(stats.OutputBytes), elapsed.Seconds(),
		gb(stats.SourceBytes)/elapsed.Seconds(), mb(peak.Anon-base.Anon), mb(peak.File), runtime.GOMAXPROCS(0))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\nreproduce: webdraft bench convert %s\n", strings.Join(args, " "))
	return nil
}

func shapeNames() []string {
	var names []string
	for n := range synth.Shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func gb(b int64) float64 { return float64(b) / 1e9 }
func mb(b int64) float64 { return float64(b) / 1e6 }
