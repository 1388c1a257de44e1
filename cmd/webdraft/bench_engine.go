package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"webdraft/bench"
	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/webgpu"
	"webdraft/gpu"
	"webdraft/internal/svgplot"
	"webdraft/internal/synth"
	"webdraft/qwen3"
)

func benchEngine(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench engine", "[--shape qwen3-1.7b | --model DIR] [--backend webgpu|cpu|reference] [--context 1024] [--batches 1,32] [--prefill 512] [--rows 1,5,7,9,17] [--baseline reference|none] [--head | --head-model DIR] [--spec-ks 4,6] [--svg FILE]")
	shape := fs.String("shape", "qwen3-1.7b", "published shape, with random int4 weights: "+strings.Join(shapeNames(), ", "))
	modelDir := fs.String("model", "", "measure this model folder (or embedded:target, embedded:drafter) instead of random weights")
	context := fs.Int("context", 1024, "context length of each sequence before the timed decode steps")
	batchesFlag := fs.String("batches", "1,32", "decode batch sizes, comma-separated")
	steps := fs.Int("steps", 32, "timed decode steps per batch size")
	prefill := fs.Int("prefill", 512, "prompt length of the prefill measurement")
	copyMB := fs.Int("copy-mb", 1024, "buffer size of the copy-bandwidth measurement (capped by the device)")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the measurements to this file")
	gpuProfile := fs.Bool("profile", false, "also time one decode step per batch size, each verification of --rows, the prefill and, with --head or --head-model, the head's 16 chained draft tokens kernel by kernel on the GPU (timestamp queries)")
	svg := fs.String("svg", "", "also plot milliseconds per decode step against batch size, as SVG, to this file")
	backendFlag := fs.String("backend", "webgpu", "webgpu, or an engine on the CPU: cpu (the fast CPU engine) or reference (the plain-Go oracle)")
	rowsFlag := fs.String("rows", "1,5,7,9,17", "the verification passes to time, in rows (a verification of k drafted tokens reads k+1)")
	baseline := fs.String("baseline", "reference", "with --backend cpu: the engine measured beside it in the same run, for the ratios: reference, or none")
	head := fs.Bool("head", false, "with --backend webgpu: also time an EAGLE-3 head for the model (random int4: one layer of its shape, a draft vocabulary of at most 32,768 tokens) drafting 16 tokens chained, against the model's chained step")
	headModel := fs.String("head-model", "", "as --head, timing this EAGLE-3 head (a head's folder, or embedded:eagle3) drafting for the model in place of a random one")
	specKs := fs.String("spec-ks", "", "with --head or --head-model: also time greedy speculative steps of k drafts each (comma-separated k), 16 chained on the device in one call as the server runs them, against the model's chained step (with --profile, kernel by kernel too)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	batches, err := parseIDs(*batchesFlag)
	if err != nil || len(batches) == 0 {
		return usagef("--batches %q: want comma-separated sizes", *batchesFlag)
	}
	maxBatch := 0
	for _, b := range batches {
		if b < 1 {
			return usagef("--batches: %d is not a batch size", b)
		}
		maxBatch = max(maxBatch, b)
	}
	if *context < 1 || *steps < 1 || *prefill < 1 {
		return usagef("--context, --steps and --prefill must be positive")
	}
	backend, err := parseBackend(*backendFlag)
	if err != nil || backend == "auto" {
		return usagef("--backend %q: want webgpu, cpu or reference", *backendFlag)
	}
	rows, err := parseIDs(*rowsFlag)
	if err != nil || len(rows) == 0 || slices.Min(rows) < 1 {
		return usagef("--rows %q: want comma-separated row counts, each at least 1", *rowsFlag)
	}
	if *baseline != "reference" && *baseline != "none" {
		return usagef("--baseline %q: want reference or none", *baseline)
	}
	if *headModel != "" {
		*head = true
	}
	if *head && backend != "webgpu" {
		return usagef("--head times the head on WebGPU: --backend webgpu, not %s", backend)
	}
	var ks []int
	if *specKs != "" {
		if !*head {
			return usagef("--spec-ks times steps drafted by an EAGLE-3 head: add --head or --head-model")
		}
		if ks, err = parseIDs(*specKs); err != nil || len(ks) == 0 || slices.Min(ks) < 1 || slices.Max(ks) > maxSpecK {
			return usagef("--spec-ks %q: want comma-separated draft lengths from 1 to %d", *specKs, maxSpecK)
		}
	}

	var cfg qwen3.Config
	var w *qwen3.Weights
	label := *shape + " (random int4)"
	if *modelDir != "" {
		m, _, err := loadModel(*modelDir)
		if err != nil {
			return err
		}
		defer m.Close()
		cfg, w, label = m.Config, m.Weights, *modelDir+" ("+string(m.Quant)+")"
	} else {
		var ok bool
		if cfg, ok = synth.Shapes[*shape]; !ok {
			return usagef("--shape %q: want one of %s", *shape, strings.Join(shapeNames(), ", "))
		}
		w = synth.Int4Weights(cfg, 1, 0.02)
	}
	var hc eagle3.Config
	var hw *eagle3.Weights // nil: random weights
	headLabel := "random int4"
	switch {
	case *headModel != "":
		m, err := loadHead(*headModel)
		if err != nil {
			return fmt.Errorf("--head-model %s: %w", *headModel, err)
		}
		defer m.Close()
		if err := m.Config.Check(cfg); err != nil {
			return usagef("--head-model %s does not fit the model %s: %v", *headModel, label, err)
		}
		hc, hw, headLabel = m.Config, m.Weights, *headModel
	case *head:
		if hc, err = benchHeadConfig(cfg); err != nil {
			return usagef("--head: %v", err)
		}
	}
	if need := *context + max(*steps, slices.Max(rows), specChain*(slices.Max(append(ks, 0))+1)) + 4; need > cfg.MaxPositionEmbeddings || *prefill > cfg.MaxPositionEmbeddings {
		return usagef("--context %d / --prefill %d exceed the model's %d positions", *context, *prefill, cfg.MaxPositionEmbeddings)
	}
	kvPositions := maxBatch*(*context+max(*steps, slices.Max(rows))+8) + 2**prefill
	kvBytes := int64(kvPositions+(maxBatch+8)*16) * int64(2*cfg.NumHiddenLayers*cfg.KVDim()*4)
	if backend != "webgpu" {
		return benchCPU(ctx, e, cpuBench{
			cfg: cfg, w: w, label: label, backend: backend, baseline: *baseline == "reference" && backend == "cpu",
			kvBytes: kvBytes, batches: batches, rows: rows, context: *context, steps: *steps, prefill: *prefill,
		}, args)
	}
	eng, err := webgpu.Open(cfg, w, webgpu.Options{KVBytes: kvBytes, MaxSequences: maxBatch + 8, MaxRows: max(*prefill, maxBatch, slices.Max(rows))})
	if err != nil {
		return fmt.Errorf("webgpu: %w", err)
	}
	defer eng.Close()
	dev := eng.Device()
	e.log.Info("measuring", "adapter", dev.Info().String(), "model", label)

	if err := bench.WarmUp(dev, time.Second); err != nil {
		return err
	}
	bw, copyBytes, err := bench.CopyBandwidth(dev, uint64(*copyMB)<<20, 20)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	fmt.Fprintf(e.stdout, "adapter: %s\nmodel: %s\n\n", dev.Info(), label)
	row("figure", "measured", "limit", "ratio")
	row(fmt.Sprintf("copy, %d MiB buffers (read+write)", copyBytes>>20), gbps(bw), "", "")

	fma, err := bench.FMARate(dev, 5)
	if err != nil {
		return fmt.Errorf("fma: %w", err)
	}
	row("f32 multiply-add rate (registers only)", fmt.Sprintf("%.1f TFLOP/s", fma/1e12), "", "")
	imad, err := bench.IMADRate(dev, 5)
	if err != nil {
		return fmt.Errorf("imad: %w", err)
	}
	row("32-bit integer multiply-add rate (registers only)", fmt.Sprintf("%.1f Tops/s", imad/1e12), "", "")

	overhead, err := bench.DispatchOverhead(dev, 256)
	if err != nil {
		return fmt.Errorf("dispatch overhead: %w", err)
	}
	row("dependent dispatch of a 16-byte copy (256 in one pass)", fmt.Sprintf("%.1f µs", float64(overhead.Nanoseconds())/1e3), "", "")

	mvs, err := bench.MatVecs(dev, &cfg, 10)
	if err != nil {
		return fmt.Errorf("matvec: %w", err)
	}
	for _, m := range mvs {
		row(fmt.Sprintf("int4 matvec %s %d×%d, streamed (dependent)", m.Name, m.N, m.K),
			fmt.Sprintf("%.1f µs (%.1f µs), %.0f GB/s", us(m.Streamed), us(m.Dependent), m.GBps()), gbps(bw), pct(m.GBps()*1e9/bw))
		row("  a copy of as many bytes, streamed", fmt.Sprintf("%.1f µs, %.0f GB/s", us(m.Copy), m.CopyGBps()),
			"", "matvec "+pct(m.GBps()/m.CopyGBps())+" of it")
	}
	plot := svgplot.Bars{
		Title:    fmt.Sprintf("decode step time against batch size: %s, context %d", label, *context),
		Subtitle: dev.Info().String(),
		XLabel:   "sequences decoded together (batch)", YLabel: "ms per decode step",
	}
	var chainedOne, singleOne time.Duration // the batch-1 steps, for the floor's and the verifications' rows
	for _, b := range batches {
		step, err := bench.Decode(ctx, eng, b, *context, *steps)
		if err != nil {
			return fmt.Errorf("decode batch %d: %w", b, err)
		}
		// The floor: every weight and every sequence's KV cache read once.
		kv := uint64(b) * uint64(*context) * uint64(engine.KVBytesPerToken(&cfg, eng.KVElemBytes()))
		floor := time.Duration(float64(bench.WeightBytes(&cfg)+kv) / bw * 1e9)
		row(fmt.Sprintf("decode step, batch %d, context %d", b, *context),
			fmt.Sprintf("%.3f ms, %.0f tok/s", ms64(step), float64(b)/step.Seconds()),
			fmt.Sprintf("%.3f ms (weights + KV at copy bw)", ms64(floor)), pct(floor.Seconds()/step.Seconds()))
		chained, err := bench.Drafts(ctx, eng, b, *context, *steps, 16)
		if err != nil {
			return fmt.Errorf("chained decode batch %d: %w", b, err)
		}
		row(fmt.Sprintf("  chained 16 a draft (StepN), batch %d", b),
			fmt.Sprintf("%.3f ms, %.0f tok/s", ms64(chained), float64(b)/chained.Seconds()),
			fmt.Sprintf("%.3f ms", ms64(floor)), pct(floor.Seconds()/chained.Seconds()))
		if b == 1 {
			chainedOne, singleOne = chained, step
		}
		plot.Labels = append(plot.Labels, strconv.Itoa(b))
		plot.Values = append(plot.Values, ms64(step))
		plot.Notes = append(plot.Notes, fmt.Sprintf("%.0f tok/s", float64(b)/step.Seconds()))
	}
	// Verifications of one sequence: what a target pays to check k drafted
	// tokens, against the single step it would take without them.
	if singleOne == 0 {
		if singleOne, err = bench.Decode(ctx, eng, 1, *context, *steps); err != nil {
			return fmt.Errorf("decode batch 1: %w", err)
		}
	}
	for _, n := range rows {
		v, err := bench.Verify(ctx, eng, n, *context, *steps)
		if err != nil {
			return fmt.Errorf("verify %d rows: %w", n, err)
		}
		row(fmt.Sprintf("verification, %d rows read out (k = %d), context %d", n, n-1, *context),
			fmt.Sprintf("%.3f ms", ms64(v)), fmt.Sprintf("%.3f ms (a single batch-1 step)", ms64(singleOne)),
			strconv.FormatFloat(v.Seconds()/singleOne.Seconds(), 'f', 2, 64)+"× it")
	}
	var headProfile func(*env) error // the head's kernels, with --profile
	if *head {
		hr, err := headDrafts(ctx, cfg, w, hc, hw, *context, *steps, ks, *gpuProfile)
		if err != nil {
			return fmt.Errorf("EAGLE-3 head: %w", err)
		}
		headProfile = hr.profile
		limit, ratio := "", ""
		of := func(d time.Duration) string { return "" }
		if chainedOne > 0 {
			limit = fmt.Sprintf("%.3f ms (a chained batch-1 step)", ms64(chainedOne))
			of = func(d time.Duration) string {
				return strconv.FormatFloat(d.Seconds()/chainedOne.Seconds(), 'f', 3, 64) + "× it"
			}
			ratio = of(hr.draft)
		}
		row(fmt.Sprintf("EAGLE-3 head (%s, draft vocabulary %d), chained 16 a draft, batch 1", headLabel, hc.DraftVocabSize),
			fmt.Sprintf("%.3f ms, %.0f tok/s", ms64(hr.draft), 1/hr.draft.Seconds()), limit, ratio)
		for i, k := range ks {
			row(fmt.Sprintf("  speculative step: k = %d drafts and %d rows verified, %d chained, batch 1", k, k+1, specChain),
				fmt.Sprintf("%.3f ms", ms64(hr.spec[i])), limit, of(hr.spec[i]))
		}
	}
	// The floor of a batch-1 step made of dispatches: its dependent phases
	// reduced to passes that read their bytes once.
	floor, err := bench.StepFloor(dev, &cfg, *context, eng.KVElemBytes(), 10)
	if err != nil {
		return fmt.Errorf("step floor: %w", err)
	}
	ratio := ""
	if chainedOne > 0 {
		ratio = "chained batch 1 " + strconv.FormatFloat(chainedOne.Seconds()/floor.Step.Seconds(), 'f', 2, 64) + "× it"
	}
	row(fmt.Sprintf("batch-1 step floor: %d dependent passes, each reading a phase's bytes once", floor.Passes),
		fmt.Sprintf("%.3f ms (host records it in %.3f)", ms64(floor.Step), ms64(floor.Record)), "", ratio)
	if *svg != "" {
		if err := os.WriteFile(*svg, plot.SVG(), 0o644); err != nil {
			return err
		}
	}
	pre, err := bench.Prefill(ctx, eng, *prefill, 3)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	flops := 2 * float64(bench.Params(&cfg)) * float64(*prefill)
	limit, ratio := fmt.Sprintf("%.1f TFLOP/s (f32 multiply-add rate)", fma/1e12), pct(flops/pre.Seconds()/fma)
	if flops/pre.Seconds() > fma {
		// A real kernel outran the yardstick: it measured something else
		// than the arithmetic rate on this device (see BENCHMARKS.md).
		limit, ratio = "none: the multiply-add yardstick measured less", ""
	}
	row(fmt.Sprintf("prefill %d tokens", *prefill),
		fmt.Sprintf("%.1f ms, %.0f tok/s, %.2f TFLOP/s", ms64(pre), float64(*prefill)/pre.Seconds(), flops/pre.Seconds()/1e12),
		limit, ratio)
	if err := tw.Flush(); err != nil {
		return err
	}
	if *gpuProfile {
		if err := profileKernels(ctx, e, eng, batches, rows, *context, *prefill); err != nil {
			return err
		}
		if headProfile != nil {
			if err := headProfile(e); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(e.stdout, "\nreproduce: webdraft bench engine %s\n", strings.Join(args, " "))
	return nil
}

// startCPUProfile writes a Go CPU profile to file (none when file is "")
// until stop is called.
func startCPUProfile(file string) (stop func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// profileKernels prints the GPU time per kernel of one decode step for each
// batch size, of a verification of each row count, then of the prefill
// (each dispatch in a pass of its own between timestamps).
func profileKernels(ctx context.Context, e *env, eng *webgpu.Engine, batches, rows []int, context, prefill int) error {
	period, err := bench.TickPeriod(eng.Device())
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	for _, b := range batches {
		kernels, err := bench.ProfileDecode(ctx, eng, b, context, period)
		if err != nil {
			return fmt.Errorf("profile batch %d: %w", b, err)
		}
		if err := printProfile(e, fmt.Sprintf("one decode step, batch %d, context %d", b, context), kernels, period); err != nil {
			return err
		}
	}
	for _, n := range rows {
		kernels, err := bench.ProfileVerify(ctx, eng, n, context, period)
		if err != nil {
			return fmt.Errorf("profile a verification of %d rows: %w", n, err)
		}
		if err := printProfile(e, fmt.Sprintf("a verification of %d rows, context %d", n, context), kernels, period); err != nil {
			return err
		}
	}
	kernels, err := bench.ProfilePrefill(ctx, eng, prefill, period)
	if err != nil {
		return fmt.Errorf("profile prefill: %w", err)
	}
	return printProfile(e, fmt.Sprintf("the prefill of %d tokens", prefill), kernels, period)
}

func printProfile(e *env, what string, kernels []bench.Kernel, period float64) error {
	var total time.Duration
	for _, k := range kernels {
		total += k.Time
	}
	fmt.Fprintf(e.stdout, "\nGPU time of %s: %.3f ms in kernels (timestamps, %.3g ns a tick)\n", what, ms64(total), period*1e9)
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kernel\tdispatches\tGPU time\tper dispatch\tshare")
	for _, k := range kernels {
		fmt.Fprintf(tw, "%s\t%d\t%.3f ms\t%.1f µs\t%s\n", k.Name, k.Dispatches, ms64(k.Time),
			float64(k.Time.Nanoseconds())/1e3/float64(k.Dispatches), pct(k.Time.Seconds()/total.Seconds()))
	}
	return tw.Flush()
}

func gbps(bytesPerSecond float64) string {
	return strconv.FormatFloat(bytesPerSecond/1e9, 'f', 0, 64) + " GB/s"
}
func pct(r float64) string         { return strconv.FormatFloat(100*r, 'f', 0, 64) + " %" }
func ms64(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
func us(d time.Duration) float64   { return float64(d.Nanoseconds()) / 1e3 }

// benchHeadConfig is the EAGLE-3 head `bench engine --head` times for the
// model cfg: one layer of its shape reading the engines' default layers,
// or, in a model too shallow for those, its first, middle and last.
func benchHeadConfig(cfg qwen3.Config) (eagle3.Config, error) {
	hc := synth.Eagle3Config(cfg, synth.Eagle3Options{})
	if hc.Check(cfg) != nil && cfg.NumHiddenLayers >= 3 {
		L := cfg.NumHiddenLayers
		hc.AuxLayers = []int{0, L / 2, L - 1}
	}
	return hc, hc.Check(cfg)
}

// headResult is what headDrafts measured: the time a draft token, each
// speculative step's (by --spec-ks), and the kernels' profile to print
// (nil without --profile).
type headResult struct {
	draft   time.Duration
	spec    []time.Duration
	profile func(*env) error
}

// specChain is the speculative steps `bench engine --spec-ks` chains in
// one call, and maxSpecK its longest draft.
const (
	specChain = 16
	maxSpecK  = 16
)

// headDrafts times the EAGLE-3 head of config hc and weights hw (nil:
// random int4) drafting for the model cfg, w (bench.HeadDrafts), and the
// speculative steps of ks drafts it chains with the model
// (bench.SpecSteps): the target engine keeps the features of the layers
// the head reads, on a device of its own.
func headDrafts(ctx context.Context, cfg qwen3.Config, w *qwen3.Weights, hc eagle3.Config, hw *eagle3.Weights, context, steps int, ks []int, profiled bool) (headResult, error) {
	var res headResult
	room := steps // the positions past the context a measurement reaches
	if len(ks) > 0 {
		room = max(room, specChain*(slices.Max(ks)+1))
	}
	kvBytes := int64(context+room+64) * int64(2*cfg.NumHiddenLayers*cfg.KVDim()*4)
	g, err := webgpu.OpenGroup(gpu.Options{})
	if err != nil {
		return res, err
	}
	target, err := g.New(cfg, w, webgpu.Options{KVBytes: kvBytes, MaxSequences: 2, MaxRows: context, FeatureLayers: hc.Aux(cfg.NumHiddenLayers)})
	if err != nil {
		g.Close()
		return res, err
	}
	defer target.Close()
	if hw == nil {
		hw = synth.Eagle3Int4Weights(hc, 2, 0.02)
	}
	head, err := webgpu.NewHead(target, hc, hw, webgpu.HeadOptions{MaxRows: context})
	g.Close() // the device closes with the last engine
	if err != nil {
		return res, err
	}
	defer head.Close()
	const draft = 16
	if res.draft, err = bench.HeadDrafts(ctx, target, head, context, steps, draft); err != nil {
		return res, err
	}
	for _, k := range ks {
		d, err := bench.SpecSteps(ctx, target, head, context, k, specChain, 5)
		if err != nil {
			return res, err
		}
		res.spec = append(res.spec, d)
	}
	if !profiled {
		return res, nil
	}
	// The profiles are taken now, while the engines are open, and printed
	// with the model's.
	period, err := bench.TickPeriod(target.Device())
	if err != nil {
		return res, fmt.Errorf("profile: %w", err)
	}
	kernels, err := bench.ProfileHeadDraft(ctx, target, head, context, draft, period)
	if err != nil {
		return res, fmt.Errorf("profile: %w", err)
	}
	specKernels := make([][]bench.Kernel, len(ks))
	for i, k := range ks {
		if specKernels[i], err = bench.ProfileSpecSteps(ctx, target, head, context, k, specChain, period); err != nil {
			return res, fmt.Errorf("profile: %w", err)
		}
	}
	res.profile = func(e *env) error {
		if err := printProfile(e, fmt.Sprintf("%d draft tokens of the EAGLE-3 head chained, context %d", draft, context), kernels, period); err != nil {
			return err
		}
		for i, k := range ks {
			if err := printProfile(e, fmt.Sprintf("%d speculative steps of k = %d chained, context %d", specChain, k, context), specKernels[i], period); err != nil {
				return err
			}
		}
		return nil
	}
	return res, nil
}
