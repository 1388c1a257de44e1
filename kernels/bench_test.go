package kernels

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/tensor"
	"webdraft/treemask"
)

// BenchmarkMatMulInt4 measures the int4 matmul at Qwen3-1.7B's shapes
// (q/o_proj 2048→2048, gate/up 2048→6144, down 6144→2048, the tied head
// 2048→151936) for decode (T=1) and, but for the head, a prefill tile
// (T=64), reporting the effective bandwidth: the bytes of weights, scales,
// x and out per matmul over its time. Each matmul's time is the slope
// between batches of reps and 4·reps (benchMatMuls). On lavapipe (128 MiB bindings) the head runs as two
// row blocks.
func BenchmarkMatMulInt4(b *testing.B) {
	d := gputest.Device(b)
	const reps = 16
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range []struct {
		name string
		N, K int
		Ts   []int
	}{
		{"q_proj_2048x2048", 2048, 2048, []int{1, 64}},
		{"gate_proj_2048x6144", 6144, 2048, []int{1, 64}},
		{"down_proj_6144x2048", 2048, 6144, []int{1, 64}},
		{"lm_head_2048x151936", 151936, 2048, []int{1}}, // drafting needs the last row's logits only
	} {
		m, w := benchMatrix(b, d, r, s.name, s.N, s.K)
		if w == nil {
			continue
		}
		for _, T := range s.Ts {
			b.Run(fmt.Sprintf("%s/T%d", s.name, T), func(b *testing.B) {
				x, err := d.UploadF32("x", make([]float32, T*s.K))
				if err != nil {
					b.Fatal(err)
				}
				defer x.Release()
				out, err := d.NewBuffer("out", uint64(T*s.N)*4)
				if err != nil {
					b.Fatal(err)
				}
				defer out.Release()
				bytes := float64(len(m.QWeight)*4 + len(m.Scales)*2 + 4*T*(s.K+s.N))
				sec := benchMatMuls(b, d, out, reps, func(bt *gpu.Batch) error { return MatMul(bt, out, x, w, T, false) })
				b.ReportMetric(bytes/sec/1e9, "GB/s")
				b.ReportMetric(sec*1e6, "µs/matmul")
			})
		}
		w.Release()
	}
}

// BenchmarkMatMulKernels times every int4 matmul kernel that takes the
// shape, with the input the engine gives it, at Qwen3-1.7B's four projections (q|k|v stacked, o, gate|up
// stacked, down) for 1 to 1,024 activation rows: the measurements behind
// the plan's thresholds, redone in one run (on the GPU machine: build
// with `go test -c ./kernels`, run `kernels.test -test.run '^$' -test.bench
// MatMulKernels`). Each reports µs a matmul (dependent ones in one batch,
// as in a forward pass: see benchMatMuls), TFLOP/s and GB/s of weights.
func BenchmarkMatMulKernels(b *testing.B) {
	d := gputest.Device(b)
	const reps = 16
	r := rand.New(rand.NewPCG(3, 4))
	// Each projection takes its input as the engine gives it: q|k|v and
	// gate|up normalize it (RMSNorm fused), down_proj computes SwiGLU from
	// gate|up, o_proj and down_proj add into the residual.
	// A CPU adapter (lavapipe) would take hours over every row count: it
	// gets two, and no head.
	sh := benchModel(b)
	ts, headTs, downPlainTs := benchTs, []int{1, 2, 4, 8, 16, 32}, []int{1, 4, 32}
	if d.Info().Software() {
		ts, headTs, downPlainTs = []int{1, 16}, nil, nil
	}
	if *benchRows != "" {
		ts, headTs, downPlainTs = benchRowList(b), benchRowList(b), nil
	}
	H, I, qDim, kvDim := sh.hidden, sh.intermediate, sh.heads*sh.headDim, sh.kvHeads*sh.headDim
	shapes := []struct {
		name   string
		N, K   int
		Ts     []int
		in     matMulInput
		xWidth int // x's columns per K
	}{
		{"qkv", qDim + 2*kvDim, H, ts, matMulInput{norm: &gpu.Buffer{}}, 1},
		{"o", H, qDim, ts, matMulInput{accumulate: true}, 1},
		{"gate_up", 2 * I, H, ts, matMulInput{norm: &gpu.Buffer{}}, 1},
		{"down", H, I, ts, matMulInput{swiglu: true, accumulate: true}, 2},
		// down_proj of an input already through SwiGLU: what computing it
		// once, before the matmul, would leave.
		{"down_plain", H, I, downPlainTs, matMulInput{accumulate: true}, 1},
		{"head", sh.vocab, H, headTs, matMulInput{}, 1},
	}
	if sh.headRows > 0 { // the drafter's head over its most used tokens
		shapes = append(shapes, shapes[len(shapes)-1])
		shapes[len(shapes)-1].name, shapes[len(shapes)-1].N = "head_part", sh.headRows
	}
	for _, s := range shapes {
		if len(s.Ts) == 0 {
			continue
		}
		s.name = fmt.Sprintf("%s_%dx%d", s.name, s.K, s.N)
		m, w := benchMatrix(b, d, r, s.name, s.N, s.K)
		if w == nil {
			continue
		}
		// With -cold, further copies of the matrix, so that the dependent
		// matmuls cycle through more bytes than the GPU's last-level cache
		// holds and each reads its weights from memory, as a forward pass
		// does; without, every matmul reads the same, cached, copy.
		ws := []*Matrix{w}
		for *coldWeights && len(ws)*len(m.QWeight)*4 < coldBytes && len(ws) < 4*16 {
			c, err := UploadMatrix(d, s.name, m)
			if err != nil {
				b.Fatal(err)
			}
			ws = append(ws, c)
		}
		norm, err := d.UploadF32("norm", ones(s.K))
		if err != nil {
			b.Fatal(err)
		}
		in := s.in
		if in.norm != nil {
			in.norm, in.eps = norm, 1e-6
		}
		for _, T := range s.Ts {
			x, err := d.UploadF32("x", ones(T*s.K*s.xWidth))
			if err != nil {
				b.Fatal(err)
			}
			out, err := d.NewBuffer("out", uint64(T*s.N)*4)
			if err != nil {
				b.Fatal(err)
			}
			// Every kernel at its layout for the shape, then the layouts and
			// split-K targets the plan's were chosen among.
			// Each kernel's own is named by the kernel (matvec, skinny, …),
			// the others by their layout and split-K target.
			plan, limits := planFor(d), d.Limits()
			type variant struct {
				name string
				c    matMulChoice
			}
			var choices []variant
			add := func(k matMulKernel, edit func(c *matMulChoice)) {
				if c, ok := plan.choose(k, w, T, limits); ok {
					name := k.String()
					if edit != nil {
						edit(&c)
						name = c.String()
					}
					choices = append(choices, variant{name, c})
				}
			}
			for _, k := range []matMulKernel{kernelMatVec, kernelMatVecBatch, kernelRowTile, kernelGEMM2, kernelGEMM2x8, kernelGEMM4, kernelSkinny} {
				add(k, nil)
			}
			skinnyLayouts := benchSkinnyLayouts
			if T >= 256 {
				skinnyLayouts = benchSkinnyPrefillLayouts
			}
			if T >= 2 && T <= 64 || T >= 256 {
				for _, l := range skinnyLayouts {
					if (T >= 256 || l.tt <= 2*T && 4*l.tt >= T) && l.chunk(limits.MaxComputeWorkgroupStorageSize) > 0 {
						add(kernelSkinny, func(c *matMulChoice) { c.skinny, c.groupScale = l, false })
					}
				}
				// The plan's layout with its sums scaled the other way (GS).
				add(kernelSkinny, func(c *matMulChoice) { c.groupScale = !c.groupScale })
			}
			groups := []int{128, 512, 1024}
			if d.Info().Software() { // a CPU's few threads: no split, or a few
				groups = []int{1, 8, 32}
			}
			if T >= 2 && T <= 64 {
				for _, g := range groups {
					add(kernelSkinny, func(c *matMulChoice) { c.groups = g })
				}
			}
			if d.Info().Software() {
				groups = append(groups, 128)
			} else {
				groups = []int{128, 256, 1024}
			}
			if T >= 16 && T <= 64 {
				for _, g := range groups {
					for _, k := range []matMulKernel{kernelGEMM2x8, kernelGEMM4} {
						add(k, func(c *matMulChoice) { c.groups = g })
					}
				}
			}
			if T <= matVecMaxT {
				for _, l := range benchMatVecBatchLayouts {
					if l.fits(w, T, limits) {
						add(kernelMatVecBatch, func(c *matMulChoice) { c.matVecBatch = l })
					}
				}
				// Split along K where its workgroups are fewer than a target.
				for _, g := range []int{512, 768, 1024, 2048} {
					for _, l := range []matVecBatchLayout{matVecBatchDefault, matVecBatchNarrow, matVecBatchWide} {
						if l.fits(w, T, limits) {
							add(kernelMatVecBatch, func(c *matMulChoice) { c.matVecBatch, c.groups = l, g })
						}
					}
				}
				for _, l := range benchMatVecLayouts {
					// Each layout staging the whole row where it fits, and
					// in chunks of at most 1,024 and 2,048 columns.
					for _, kc := range []int{0, 1024, 2048} {
						l.maxKC = kc
						if kc > 0 && kc >= s.K {
							continue
						}
						if p, ok := matVecAt(l, w, T, limits); ok {
							add(kernelMatVec, func(c *matMulChoice) { c.matVec = p })
						}
					}
				}
			}
			for _, v := range choices {
				b.Run(fmt.Sprintf("%s/T%d/%s", s.name, T, v.name), func(b *testing.B) {
					i := 0
					sec := benchMatMuls(b, d, out, reps, func(bt *gpu.Batch) error {
						i++
						_, err := matMulSplitK(bt, out, x, ws[i%len(ws)], T, in, v.c, limits.MaxStorageBufferBindingSize, false)
						return err
					})
					b.ReportMetric(sec*1e6, "µs/matmul")
					b.ReportMetric(2*float64(T*s.N*s.K)/sec/1e12, "TFLOP/s")
					b.ReportMetric(float64(len(m.QWeight)*4+len(m.Scales)*2)/sec/1e9, "GB/s")
				})
			}
			x.Release()
			out.Release()
		}
		for _, w := range ws {
			w.Release()
		}
		norm.Release()
	}
}

// coldWeights makes BenchmarkMatMulKernels read each matmul's weights from
// memory rather than the last-level cache (go test -bench MatMulKernels
// -cold): coldBytes of copies, twice the H200's 60 MB L2.
var coldWeights = flag.Bool("cold", false, "BenchmarkMatMulKernels: cycle through copies of each matrix, more bytes than the GPU's last-level cache holds")

const coldBytes = 128 << 20

// ones returns n ones: inputs whose SwiGLU and norm stay finite.
func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// benchMatrix uploads a random int4 N × K matrix, or returns a nil Matrix
// (logged) when the adapter's buffers cannot hold it.
func benchMatrix(b *testing.B, d *gpu.Device, r *rand.Rand, name string, n, k int) (*tensor.Int4, *Matrix) {
	m := randInt4(r, n, k, tensor.DefaultGroupSize)
	if size := uint64(len(m.QWeight)) * 4; size > d.Limits().MaxBufferSize {
		b.Logf("%s: skipped: %d-byte weights exceed this adapter's maxBufferSize %d", name, size, d.Limits().MaxBufferSize)
		return m, nil
	}
	w, err := UploadMatrix(d, name, m)
	if err != nil {
		b.Fatal(err)
	}
	return m, w
}

// benchModel is the model whose shapes the benchmarks take: -benchshape
// names a published Qwen3 size (qwen3-0.6b, qwen3-1.7b, the default,
// qwen3-4b, qwen3-8b: internal/synth's shapes) or embedded (the shipped
// pair, weights/target and weights/drafter: what the page runs in the
// browser).
func benchModel(b *testing.B) benchShape {
	if s, ok := benchShapes[*benchShapeName]; ok {
		return s
	}
	if c, ok := synth.Shapes[*benchShapeName]; ok && c.HeadDim == 128 {
		return benchShape{hidden: c.HiddenSize, intermediate: c.IntermediateSize, heads: c.NumAttentionHeads,
			kvHeads: c.NumKeyValueHeads, headDim: c.HeadDim, vocab: c.VocabSize, context: 1024}
	}
	b.Fatalf("-benchshape %q: want qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b or embedded", *benchShapeName)
	return benchShape{}
}

// benchShape is a Qwen3 model's shapes, as the benchmarks need them.
type benchShape struct {
	hidden, intermediate, heads, kvHeads, headDim, vocab int
	headRows                                             int // > 0: a head over this many of the vocabulary's tokens too
	context                                              int // decode attention's position
}

// benchShapes are the shapes that are not a published size's.
var benchShapes = map[string]benchShape{
	// The page's contexts are a prompt and a few dozen tokens.
	"embedded": {hidden: 256, intermediate: 1024, heads: 4, kvHeads: 2, headDim: 64, vocab: 151936, headRows: 32768, context: 256},
}

var (
	benchShapeName = flag.String("benchshape", "qwen3-1.7b", "the benchmarks' model shapes: qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b or embedded (the shipped pair)")
	benchRows      = flag.String("benchts", "", "the activation rows the benchmarks time, comma-separated (default: each benchmark's own)")
)

// benchRowList is -benchts's rows.
func benchRowList(b *testing.B) []int {
	var ts []int
	for f := range strings.SplitSeq(*benchRows, ",") {
		T, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || T < 1 {
			b.Fatalf("-benchts %q: want positive row counts, comma-separated", *benchRows)
		}
		ts = append(ts, T)
	}
	return ts
}

// benchTs are the activation rows BenchmarkMatMulKernels times the layers'
// projections at.
var benchTs = []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}

// benchSkinnyLayouts are the skinny_int4.wgsl layouts
// BenchmarkMatMulKernels tries besides pickSkinnyLayout's, each at the
// rows T of a quarter to twice its tile.
var benchSkinnyLayouts = []skinnyLayout{
	{4, 2, 64}, {4, 2, 128}, {4, 2, 256}, {8, 2, 128}, {8, 2, 256}, {8, 4, 64}, {16, 2, 64}, {16, 2, 128}, {16, 4, 64},
	{32, 1, 128}, {32, 2, 64}, {32, 2, 128}, {32, 4, 64}, {32, 2, 256},
	// Row counts between the powers of two: a verification's k + 1 rows.
	{12, 2, 96}, {12, 2, 192}, {20, 2, 160}, {20, 2, 240}, {24, 2, 192}, {24, 2, 240},
	// Tiles of exactly those rows.
	{8, 2, 64}, {3, 2, 96}, {3, 4, 96}, {3, 2, 192}, {5, 2, 80}, {5, 2, 160}, {5, 4, 80}, {5, 4, 160}, {5, 2, 240},
	{9, 2, 72}, {9, 2, 144}, {9, 4, 72}, {9, 2, 252}, {17, 2, 136}, {17, 2, 255}, {17, 4, 68}, {17, 4, 136}, {17, 1, 255},
}

// benchSkinnyPrefillLayouts are the skinny_int4.wgsl layouts
// BenchmarkMatMulKernels tries for prompt chunks (256 rows and more)
// besides pickSkinnyLayout's: more weight rows a thread, or 64 activation
// rows a workgroup, each weight dequantized for more multiply-adds.
var benchSkinnyPrefillLayouts = []skinnyLayout{
	{32, 2, 64}, {32, 2, 128}, {32, 2, 256}, {32, 4, 64}, {32, 4, 128},
	{64, 1, 64}, {64, 1, 128}, {64, 2, 64}, {64, 2, 128}, {64, 2, 256},
}

// benchMatVecBatchLayouts are the matvec_batch_int4.wgsl layouts
// BenchmarkMatMulKernels tries (and TestMatVecBatchLayouts checks): one
// weight row a thread at 16 lanes × 16 rows (the default), fewer rows a
// workgroup, 8, 32 and 64 lanes a row, 1,024 and 4,096 staged values (the
// chunk, over the activation rows); two and four weight rows a thread
// (the H200's plan takes two: matVecBatchNarrow, matVecBatchWide).
var benchMatVecBatchLayouts = []matVecBatchLayout{
	{lanes: 16, rows: 16}, {lanes: 16, rows: 8}, {lanes: 32, rows: 8}, {lanes: 8, rows: 32},
	{lanes: 16, rows: 16, staged: 1024}, {lanes: 16, rows: 16, staged: 4096},
	{lanes: 16, rows: 32, rt: 2}, {lanes: 16, rows: 16, rt: 2}, {lanes: 16, rows: 64, rt: 4}, {lanes: 16, rows: 32, rt: 4},
	{lanes: 32, rows: 16, rt: 2}, {lanes: 8, rows: 64, rt: 2}, {lanes: 64, rows: 2}, {lanes: 64, rows: 4}, {lanes: 64, rows: 8, rt: 2}, {lanes: 64, rows: 16, rt: 4},
}

// benchMatVecLayouts are the matrix-vector layouts BenchmarkMatMulKernels
// tries besides pickMatVecLayout's.
var benchMatVecLayouts = []matVecLayout{
	{lanes: 16, rt: 1, wg: 256}, {lanes: 16, rt: 2, wg: 128}, {lanes: 16, rt: 4, wg: 64},
	{lanes: 16, rt: 4, wg: 128}, {lanes: 16, rt: 4, wg: 256}, {lanes: 16, rt: 8, wg: 128},
	{lanes: 32, rt: 4, wg: 128}, {lanes: 32, rt: 2, wg: 64}, {lanes: 64, rt: 4, wg: 128}, {lanes: 64, rt: 2, wg: 64},
}

// benchMatMuls runs the benchmark's loop over pairs of batches, one of reps
// dependent matmuls (record records one) and one of 4·reps, each submitted
// and waited for by reading out, after a batch that compiles the pipelines
// and warms up. It returns the seconds one more matmul adds to a batch —
// the slope between the two, what a matmul costs inside a forward pass —
// free of the fixed cost of submitting and waiting for a batch (on the
// H200 a few milliseconds, more than 16 small matmuls take).
//
// The batch is recorded before it is submitted, so the slope holds the
// host's recording as well as the GPU's work; the host's part, the same
// slope of the recording alone, is reported as "µs-host" (a forward pass
// records while the GPU runs the passes before, so there only the larger
// of the two counts).
func benchMatMuls(b *testing.B, d *gpu.Device, out *gpu.Buffer, reps int, record func(*gpu.Batch) error) float64 {
	if d.Info().Software() { // up to seconds a dispatch on SwiftShader: one, or many minutes a benchmark
		reps = 1
	}
	batch := func(n int) (total, host time.Duration) {
		start := time.Now()
		bt, err := d.NewBatch("bench")
		if err != nil {
			b.Fatal(err)
		}
		for range n {
			if err := record(bt); err != nil {
				b.Fatal(err)
			}
		}
		host = time.Since(start)
		if err := bt.Submit(); err != nil {
			b.Fatal(err)
		}
		if _, err := out.Read(0, 4); err != nil { // waits for the batch
			b.Fatal(err)
		}
		return time.Since(start), host
	}
	batch(4 * reps)
	var short, long, hostShort, hostLong time.Duration
	for b.Loop() {
		t, h := batch(reps)
		short, hostShort = short+t, hostShort+h
		t, h = batch(4 * reps)
		long, hostLong = long+t, hostLong+h
	}
	items := float64(b.N * 3 * reps)
	b.ReportMetric(max(0, (hostLong-hostShort).Seconds())/items*1e6, "µs-host")
	return max(0, (long-short).Seconds()) / items
}

// randInt4 returns an int4 matrix of random codes and scales (quantizing a
// random f32 matrix of the head's size would take seconds).
func randInt4(r *rand.Rand, n, k, g int) *tensor.Int4 {
	m := &tensor.Int4{Rows: n, Cols: k, GroupSize: g, QWeight: make([]uint32, n*k/8), Scales: make([]uint16, n*k/g)}
	for i := range m.QWeight {
		m.QWeight[i] = r.Uint32()
	}
	for i := range m.Scales {
		m.Scales[i] = tensor.F32ToF16(0.01 * float32(1+r.IntN(8)))
	}
	return m
}

// BenchmarkAttentionDecode times decode attention (split and merge) at
// Qwen3-1.7B's heads (16 query heads on 8 kv heads of 128, an f16 cache)
// for 1, 4 and 32 rows, each its own sequence at position 1,023, at the
// plan's tuning and others decodeTuning allows: µs a call (dependent
// calls in one batch, as in a forward pass: see benchMatMuls) and GB/s of
// keys and values read.
func BenchmarkAttentionDecode(b *testing.B) {
	d := gputest.Device(b)
	sh := benchModel(b)
	const blockSize, reps = 16, 16
	kvHeads, group, D, context := sh.kvHeads, sh.heads/sh.kvHeads, sh.headDim, sh.context
	heads := kvHeads * group
	// The plan's tuning with the changes below (zero fields keep it).
	Ts, changes := []int{1, 4, 32}, []decodeTuning{
		{}, {mergeDispatch: true}, {mergeMinRows: 1}, {vb: 1}, {vb: 4}, {vb: 16}, {workgroups: 2048}, {workgroups: 256, maxChunk: 512},
		// splits shorter than 64 positions: more workgroups for few kv heads
		{minChunk: 32}, {minChunk: 16}, {minChunk: 32, mergeMinRows: 1}, {minChunk: 16, mergeMinRows: 1},
		{minChunk: 16, workgroups: 4096, mergeMinRows: 1}, {wg: 128, minChunk: 32, mergeMinRows: 1},
		{wg: 128}, {wg: 128, vb: 4}, {wg: 128, vb: 16}, {wg: 128, workgroups: 256, maxChunk: 512},
		{wg: 256, vb: 4}, {wg: 256, vb: 8}, {wg: 256, vb: 16}, {wg: 256, workgroups: 256, maxChunk: 512, vb: 16},
		// one split of the whole context, which needs no merge
		{wg: 128, workgroups: 1, maxChunk: 1024, vb: 16}, {wg: 256, workgroups: 1, maxChunk: 1024, vb: 16},
		{wg: 256, workgroups: 1, maxChunk: 1024, vb: 8}, {wg: 512, workgroups: 1, maxChunk: 1024, vb: 8}, {wg: 1024, workgroups: 1, maxChunk: 1024, vb: 4},
		// a few long splits of a large workgroup, merged apart or by the last
		{wg: 256, workgroups: 32, maxChunk: 256, vb: 8}, {wg: 256, workgroups: 32, maxChunk: 256, vb: 8, mergeMinRows: 1},
		{wg: 512, workgroups: 16, maxChunk: 512, vb: 8}, {wg: 512, workgroups: 16, maxChunk: 512, vb: 8, mergeMinRows: 1},
	}
	if d.Info().Software() {
		// A CPU's few threads: few splits, or one (no merge).
		changes = []decodeTuning{
			{}, {mergeDispatch: true},
			{wg: 64, workgroups: 1, maxChunk: 1024, vb: 8}, {wg: 64, workgroups: 1, maxChunk: 1024, vb: 4}, {wg: 64, workgroups: 1, maxChunk: 1024, vb: 16},
			{wg: 128, workgroups: 1, maxChunk: 1024, vb: 8}, {wg: 128, workgroups: 1, maxChunk: 1024, vb: 16}, {wg: 256, workgroups: 1, maxChunk: 1024, vb: 16},
			{wg: 64, workgroups: 4, maxChunk: 1024, vb: 8}, {wg: 64, workgroups: 16, maxChunk: 1024, vb: 8}, {wg: 64, workgroups: 64, maxChunk: 1024, vb: 8},
			{wg: 64, workgroups: 16, maxChunk: 256, vb: 8}, {wg: 128, workgroups: 16, maxChunk: 256, vb: 8},
			{wg: 64, workgroups: 16, maxChunk: 256, vb: 8, mergeDispatch: true},
		}
	}
	tunings := make([]decodeTuning, len(changes))
	for i, ch := range changes {
		t := planFor(d).decode
		for _, f := range []struct {
			dst *int
			v   int
		}{{&t.wg, ch.wg}, {&t.workgroups, ch.workgroups}, {&t.maxChunk, ch.maxChunk}, {&t.minChunk, ch.minChunk}, {&t.vb, ch.vb}, {&t.mergeMinRows, ch.mergeMinRows}} {
			if f.v != 0 {
				*f.dst = f.v
			}
		}
		t.mergeDispatch = ch.mergeDispatch
		tunings[i] = t
	}
	if *benchRows != "" {
		Ts = benchRowList(b)
	} else if d.Info().Software() && *benchShapeName != "embedded" { // lavapipe would take many minutes over them all
		Ts, tunings = []int{1}, tunings[:2]
	}
	for _, T := range Ts {
		c, rb := benchDecodeCache(b, d, T, kvHeads, D, blockSize, context)
		q, err := d.UploadF32("q", ones(T*heads*D))
		if err != nil {
			b.Fatal(err)
		}
		out, err := d.NewBuffer("out", uint64(T*heads*D)*4)
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range tunings {
			name := fmt.Sprintf("T%d/wg=%d/workgroups=%d/max=%d/min=%d/vb=%d/mergerows=%d", T, t.wg, t.workgroups, t.maxChunk, t.leastChunk(), t.vb, t.mergeMinRows)
			if t.mergeDispatch { // else merged by the last split where the device allows
				name += "/merge=dispatch"
			}
			b.Run(name, func(b *testing.B) {
				sec := benchMatMuls(b, d, out, reps, func(bt *gpu.Batch) error {
					return attentionDecode(bt, out, q, c, 0, rb, T, heads, context, t, nil)
				})
				b.ReportMetric(sec*1e6, "µs/call")
				b.ReportMetric(float64(2*T*context*kvHeads*D*c.ElemBytes())/sec/1e9, "GB/s")
				b.ReportMetric(float64(c.decodeSplits(T, heads, context, t)), "splits")
			})
		}
		for _, buf := range []*gpu.Buffer{rb, q, out} {
			buf.Release()
		}
		c.Release()
	}
}

// BenchmarkAttentionPrefill times prefill attention at Qwen3-1.7B's heads
// (an f16 cache): T rows of one sequence after P cached positions — a
// prompt chunk (line rows), verifications of 16 to 64 tokens after a
// 1,024-position line, and one of a 64-node token tree there (which reads
// the keys the line of 64 does) — µs a call, as benchMatMuls.
func BenchmarkAttentionPrefill(b *testing.B) {
	d := gputest.Device(b)
	sh := benchModel(b)
	const blockSize, reps = 16, 8
	kvHeads, heads, D := sh.kvHeads, sh.heads, sh.headDim
	type prefillCase struct {
		name string
		P, T int
		tree bool
	}
	cases := []prefillCase{{"prompt", 0, 512, false}, {"prompt", 1024, 512, false}, {"line", 1024, 16, false}, {"line", 1024, 32, false},
		{"line", 1024, 64, false}, {"tree", 1024, 64, true}}
	if d.Info().Software() {
		cases = []prefillCase{{"line", 256, 64, false}, {"tree", 256, 64, true}}
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, cs := range cases {
		b.Run(fmt.Sprintf("%s/P%d/T%d", cs.name, cs.P, cs.T), func(b *testing.B) {
			n := cs.P + cs.T
			c, err := NewKVCache(d, KVShape{Layers: 1, KVHeads: kvHeads, D: D, BlockSize: blockSize, Blocks: (n + blockSize - 1) / blockSize, Seqs: 1, MaxBlocks: (n + blockSize - 1) / blockSize, F16: true})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Release()
			s, err := c.NewSeq()
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Reserve([]*KVSeq{s}, []int{n}); err != nil {
				b.Fatal(err)
			}
			if err := c.SyncTables([]*KVSeq{s}); err != nil {
				b.Fatal(err)
			}
			place := treemask.LineRows(cs.P, cs.T)
			if cs.tree { // each node the child of a random earlier one, or a root
				parents := make([]int, cs.T)
				for i := range parents {
					parents[i] = cs.P - 1 + r.IntN(i+1)
				}
				var tr treemask.Tree
				if place, err = tr.Plan(cs.P, parents); err != nil {
					b.Fatal(err)
				}
			}
			rows := make([]uint32, cs.T*RowWords)
			for i, row := range place {
				PutRow(rows[i*RowWords:], s.Slot(), cs.P+i, row)
			}
			rb, err := d.UploadU32("rows", rows)
			if err != nil {
				b.Fatal(err)
			}
			defer rb.Release()
			q, err := d.UploadF32("q", ones(cs.T*heads*D))
			if err != nil {
				b.Fatal(err)
			}
			defer q.Release()
			out, err := d.NewBuffer("out", uint64(cs.T*heads*D)*4)
			if err != nil {
				b.Fatal(err)
			}
			defer out.Release()
			sec := benchMatMuls(b, d, out, reps, func(bt *gpu.Batch) error {
				return AttentionPrefill(bt, out, q, c, 0, s.Slot(), rb, 0, cs.T, heads)
			})
			b.ReportMetric(sec*1e6, "µs/call")
		})
	}
}

// BenchmarkDecodeLayer times a decoder layer's dispatches as a decode step
// records them — q|k|v with the input norm, q/k norms, RoPE and KV
// append, decode attention, o_proj into the residual, gate|up with the
// post-attention norm, down_proj of SwiGLU into the residual — at
// Qwen3-1.7B's shapes, for 1 to 64 rows (each its own sequence at
// position 1,023 of an f16 cache), with layers' weights cycled through
// copies that outgrow the L2 as a forward pass's do. Beside the whole
// layer ("layer") it times the four projections alone ("matmuls"), the
// attention half alone ("attention": q/k norms, RoPE, KV append,
// attention), and each projection alone and in the pairs that follow each
// other (decodeLayerParts): a layer slower than its parts added up is time
// the parts' own benchmarks, each kernel chained with itself, do not see.
// µs a layer, as benchMatMuls. A CPU adapter (lavapipe) gets a small
// model's shapes.
func BenchmarkDecodeLayer(b *testing.B) {
	d := gputest.Device(b)
	const reps = 8
	sh := benchModel(b)
	H, I, kvHeads, group, D, context, copies := sh.hidden, sh.intermediate, sh.kvHeads, sh.heads/sh.kvHeads, sh.headDim, sh.context, 8
	Ts := []int{1, 8, 16, 32, 64}
	if d.Info().Software() {
		copies, Ts = 2, []int{8}
		if *benchShapeName != "embedded" { // a small model's shapes
			H, I, kvHeads, D = 256, 512, 2, 64
		}
	}
	if *benchRows != "" {
		Ts = benchRowList(b)
	}
	heads := kvHeads * group
	qDim, kvDim := heads*D, kvHeads*D
	r := rand.New(rand.NewPCG(5, 6))
	type layerWeights struct{ qkv, o, gateUp, down *Matrix }
	layers := make([]layerWeights, copies)
	upload := func(name string, n, k int) *Matrix {
		_, w := benchMatrix(b, d, r, name, n, k)
		if w == nil {
			b.Skipf("%s does not fit this adapter's buffers", name)
		}
		b.Cleanup(w.Release)
		return w
	}
	for i := range layers {
		layers[i] = layerWeights{
			qkv: upload("qkv", qDim+2*kvDim, H), o: upload("o", H, qDim),
			gateUp: upload("gate_up", 2*I, H), down: upload("down", H, I),
		}
	}
	buffer := func(name string, v []float32) *gpu.Buffer {
		buf, err := d.UploadF32(name, v)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(buf.Release)
		return buf
	}
	norm := buffer("norm", ones(H))
	qkNormRope, err := UploadQKNormRope(d, "qk_norm_rope", ones(D), ones(D), (&qwen3.Config{HeadDim: D, RopeTheta: 1e6}).RopeInvFreq(), ones(H))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(qkNormRope.Release)
	for _, T := range Ts {
		c, rb := benchDecodeCache(b, d, T, kvHeads, D, 16, context)
		x := buffer("x", ones(T*H))
		qkv, q, attn := buffer("qkv", make([]float32, T*(qDim+2*kvDim))), buffer("q", make([]float32, T*qDim)), buffer("attn", make([]float32, T*qDim))
		gateUp := buffer("gate_up", make([]float32, T*2*I))
		const eps = 1e-6
		attention := func(bt *gpu.Batch) error {
			if err := qkvRopeKVRows(bt, q, qkv, qkNormRope, c, 0, rb, T, heads, eps); err != nil {
				return err
			}
			return AttentionDecode(bt, attn, q, c, 0, rb, T, heads, context)
		}
		// Each projection from its input to its output, as the layer has them.
		// (wg: skinny_int4.wgsl at pickSkinnyLayout's layout but wg threads,
		// where it is the plan's kernel.)
		limit := d.Limits().MaxStorageBufferBindingSize
		project := func(bt *gpu.Batch, proj int, w layerWeights, in, out *gpu.Buffer, wg int) error {
			m := w.o // projO, projONorm
			switch proj {
			case projQKV:
				m = w.qkv
			case projGateUp:
				m = w.gateUp
			case projDown:
				m = w.down
			}
			how := matMulInput{accumulate: proj == projO || proj == projDown, swiglu: proj == projDown}
			if proj == projQKV || proj == projGateUp || proj == projONorm {
				how.norm, how.eps = norm, eps
			}
			c := planFor(d).pick(m, T, d.Limits())
			if wg > 0 && c.kernel == kernelSkinny {
				c.skinny.wg = wg
			}
			_, err := matMulSplitK(bt, out, in, m, T, how, c, limit, false)
			return err
		}
		ins := map[int]*gpu.Buffer{projQKV: x, projO: attn, projGateUp: x, projDown: gateUp, projONorm: x}
		outs := map[int]*gpu.Buffer{projQKV: qkv, projO: x, projGateUp: gateUp, projDown: x, projONorm: q}
		// raw parts pass each projection's output on as the next one's
		// input, through two buffers wide enough for any of them.
		pingPong := [2]*gpu.Buffer{buffer("ping", ones(T*max(2*I, qDim+2*kvDim))), buffer("pong", ones(T*max(2*I, qDim+2*kvDim)))}
		i, j := 0, 0
		for _, part := range decodeLayerParts {
			b.Run(fmt.Sprintf("T%d/%s", T, part.name), func(b *testing.B) {
				sec := benchMatMuls(b, d, x, reps, func(bt *gpu.Batch) error {
					i++
					w := layers[i%len(layers)]
					for _, proj := range part.projs {
						if proj == projQKV && part.attention { // as the engine records it
							if err := QKVProjRopeKV(bt, q, qkv, x, norm, w.qkv, qkNormRope, c, 0, rb, T, heads, eps); err != nil {
								return err
							}
							if err := AttentionDecode(bt, attn, q, c, 0, rb, T, heads, context); err != nil {
								return err
							}
							continue
						}
						in, out := ins[proj], outs[proj]
						if part.raw {
							in, out = pingPong[j%2], pingPong[(j+1)%2]
							j++
						}
						if err := project(bt, proj, w, in, out, part.wg); err != nil {
							return err
						}
					}
					if len(part.projs) == 0 && part.attention {
						return attention(bt)
					}
					return nil
				})
				b.ReportMetric(sec*1e6, "µs/layer")
			})
		}
		// The attention input alone: in two dispatches (the plan's matmul,
		// then qkv_rope_kv.wgsl), and in one (qkv_fused_int4.wgsl) at the
		// shape's default layout and at others, each where the device
		// takes it.
		variants := map[string]qkvFusedLayout{}
		for _, l := range []qkvFusedLayout{{}, {lanes: 4, rt: 2}, {lanes: 8, rt: 2}, {lanes: 8, rt: 4}, {lanes: 16, rt: 2}, {lanes: 16, rt: 4}} {
			if resolved, ok := l.of(D, H, d.Limits()); ok && fusesQKV(d, layers[0].qkv, D, T, l) {
				variants["fused=true/"+resolved.String()] = l
			}
		}
		names := append([]string{"fused=false"}, slices.Sorted(maps.Keys(variants))...)
		for _, name := range names {
			layout, fused := variants[name]
			b.Run(fmt.Sprintf("T%d/qkv-rope-kv/%s", T, name), func(b *testing.B) {
				sec := benchMatMuls(b, d, x, reps, func(bt *gpu.Batch) error {
					i++
					w := layers[i%len(layers)].qkv
					choice := planFor(d).pick(w, T, d.Limits())
					choice.fusedQKV, choice.qkvFused = fused, layout
					_, err := qkvProjRopeKV(bt, q, qkv, x, w, qkNormRope, c, 0, rb, T, heads, matMulInput{norm: norm, eps: eps}, choice, limit)
					return err
				})
				b.ReportMetric(sec*1e6, "µs/layer")
			})
		}
		rb.Release()
		c.Release()
	}
}

// The decoder layer's projections.
const (
	projQKV = iota
	projO
	projGateUp
	projDown
	projONorm // o_proj's matrix as q|k|v takes its input: normalized, not added
)

// decodeLayerPart is a subset of a decoder layer's dispatches.
type decodeLayerPart struct {
	name      string
	projs     []int // recorded in this order
	attention bool  // the attention half, after q|k|v (alone without it)
	raw       bool  // each projection reads the previous one's output
	wg        int   // > 0: skinny projections at this many threads a workgroup
}

// decodeLayerParts are the subsets BenchmarkDecodeLayer times: the whole
// layer, its projections, its attention half; each projection alone and
// in the pairs that follow each other in the layer, so that a layer
// slower than its parts can be bisected to the pair that costs more
// together than apart; each projection alone again, reading the output
// the one before wrote ("raw"), as three of the layer's four do; and the
// projections in an order where only one reads what the one before wrote;
// o_proj's matrix taking q|k|v's input (normalized, not added), so that
// q|k|v and o share a pipeline, or o runs through two in turn; and the
// projections with one skinny workgroup size for all.
var decodeLayerParts = []decodeLayerPart{
	{name: "layer", projs: []int{projQKV, projO, projGateUp, projDown}, attention: true},
	{name: "matmuls", projs: []int{projQKV, projO, projGateUp, projDown}},
	{name: "attention", attention: true},
	{name: "qkv", projs: []int{projQKV}}, {name: "o", projs: []int{projO}},
	{name: "gate_up", projs: []int{projGateUp}}, {name: "down", projs: []int{projDown}},
	{name: "qkv+o", projs: []int{projQKV, projO}}, {name: "o+gate_up", projs: []int{projO, projGateUp}},
	{name: "gate_up+down", projs: []int{projGateUp, projDown}}, {name: "down+qkv", projs: []int{projDown, projQKV}},
	{name: "qkv-raw", projs: []int{projQKV}, raw: true}, {name: "o-raw", projs: []int{projO}, raw: true},
	{name: "gate_up-raw", projs: []int{projGateUp}, raw: true}, {name: "down-raw", projs: []int{projDown}, raw: true},
	{name: "matmuls-reordered", projs: []int{projQKV, projGateUp, projO, projDown}},
	// Two matrices through one pipeline, and one matrix through two.
	{name: "o-norm", projs: []int{projONorm}}, {name: "qkv+o-norm", projs: []int{projQKV, projONorm}},
	{name: "o+o-norm", projs: []int{projO, projONorm}},
	// Every skinny projection at one workgroup size.
	{name: "matmuls-wg128", projs: []int{projQKV, projO, projGateUp, projDown}, wg: 128},
	{name: "matmuls-wg256", projs: []int{projQKV, projO, projGateUp, projDown}, wg: 256},
	{name: "layer-wg256", projs: []int{projQKV, projO, projGateUp, projDown}, attention: true, wg: 256},
}

// benchDecodeCache makes a one-layer f16 KV cache of T sequence slots, each
// with the blocks for context positions (its own, in order), and the rows
// buffer of T decode rows, row t a line token at position context − 1 of
// slot t. The caller releases both.
func benchDecodeCache(b *testing.B, d *gpu.Device, T, kvHeads, D, blockSize, context int) (*KVCache, *gpu.Buffer) {
	perSeq := (context + blockSize - 1) / blockSize
	c, err := NewKVCache(d, KVShape{Layers: 1, KVHeads: kvHeads, D: D, BlockSize: blockSize, Blocks: T * perSeq, Seqs: T, MaxBlocks: perSeq, F16: true})
	if err != nil {
		b.Fatal(err)
	}
	rows := make([]uint32, T*RowWords)
	seqs := make([]*KVSeq, T)
	for i := range T {
		if seqs[i], err = c.NewSeq(); err != nil {
			b.Fatal(err)
		}
		if err := c.Reserve(seqs[i:i+1], []int{context}); err != nil {
			b.Fatal(err)
		}
		PutRow(rows[i*RowWords:], seqs[i].Slot(), context-1, treemask.LineRow(context-1))
	}
	if err := c.SyncTables(seqs); err != nil {
		b.Fatal(err)
	}
	rb, err := d.UploadU32("rows", rows)
	if err != nil {
		b.Fatal(err)
	}
	return c, rb
}
