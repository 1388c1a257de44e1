package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/reference"
	"webdraft/tensor"
)

// matMulShape is one random case: T activation rows, W (N, K), group G.
type matMulShape struct{ T, N, K, G int }

// randMatMulShapes returns the extremes of T with an odd N, inputs longer
// than what the matrix-vector kernel stages at once (several chunks, the
// last one short), and n random shapes. Outputs number at least 16: the contract's error measure is
// relative to max|ref|, which a single output can make tiny by cancellation
// (and so fail on rounding alone).
const fixedMatMulShapes = 4

func randMatMulShapes(r *rand.Rand, n int) []matMulShape {
	shapes := []matMulShape{{1, 17, 32, 32}, {64, 67, 96, 32}, {1, 33, 4160, 32}, {3, 29, 1088, 64}}[:fixedMatMulShapes]
	for range n {
		g := []int{32, 32, 64, 128}[r.IntN(4)]
		shapes = append(shapes, matMulShape{
			T: []int{1, 1, 2, 3, 5, 8, 13, 64, 1 + r.IntN(64)}[r.IntN(9)],
			N: 16 + r.IntN(300),
			K: g * (1 + r.IntN(512/g)),
			G: g,
		})
	}
	return shapes
}

func TestMatMul(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16, F32} {
		for i, s := range randMatMulShapes(r, 10) {
			// The input as it is, computed from gate | up, or normalized:
			// every one for the fixed shapes, one at random for the others.
			ins := []string{"x", "swiglu", "norm"}
			if i >= fixedMatMulShapes {
				ins = []string{ins[r.IntN(3)]}
			}
			for _, in := range ins {
				for _, accumulate := range []bool{false, true} {
					if accumulate && in == "norm" {
						continue
					}
					name := fmt.Sprintf("%v/T%d_N%d_K%d_G%d/acc=%v/%s", f, s.T, s.N, s.K, s.G, accumulate, in)
					t.Run(name, func(t *testing.T) { testMatMul(t, d, r, f, s, accumulate, in, kernelPlanned, 0) })
				}
			}
		}
	}
}

// TestMatMulTallHead: more output rows than a grid dimension holds (a
// vocabulary-sized head) at T = 1 and T = 2.
func TestMatMulTallHead(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, T := range []int{1, 2} {
		s := matMulShape{T: T, N: 70001, K: 32, G: 32}
		t.Run(fmt.Sprint("T", T), func(t *testing.T) { testMatMul(t, d, r, Int4, s, false, "x", kernelPlanned, 0) })
	}
}

func TestMatVecBatchChunk(t *testing.T) {
	for _, c := range []struct{ tt, limit, want uint32 }{
		{1, 16 << 10, 2048}, {2, 16 << 10, 1024}, {4, 16 << 10, 512}, {4, 8 << 10, 512},
	} {
		if got := (matVecBatchLayout{lanes: 16, rows: 16}).chunk(c.tt, c.limit); got != c.want {
			t.Errorf("chunk(%d, %d) = %d, want %d", c.tt, c.limit, got, c.want)
		}
	}
}

func TestPlanMatVec(t *testing.T) {
	for _, c := range []struct {
		l       matVecLayout
		T, K    int
		limit   uint32
		ok      bool
		kc, shm uint32
	}{
		{matVecLayout{lanes: 16, rt: 4, wg: 256}, 1, 2048, 48 << 10, true, 2048, 1296},             // one chunk, partials and sums of squares the larger
		{matVecLayout{lanes: 16, rt: 4, wg: 64}, 4, 2048, 48 << 10, true, 2048, 2048},              // four rows staged
		{matVecLayout{lanes: 16, rt: 4, wg: 64}, 3, 6144, 48 << 10, true, 2048, 2048},              // registers: three chunks
		{matVecLayout{lanes: 64, rt: 4, wg: 128}, 1, 6144, 48 << 10, true, 6144, 1536},             // one chunk of 64 lanes
		{matVecLayout{lanes: 16, rt: 4, wg: 64}, 4, 2048, 16 << 10, true, 1024, 1024},              // memory: two chunks
		{matVecLayout{lanes: 16, rt: 2, wg: 64}, 1, 100, 48 << 10, true, 512, 196},                 // a short row: one vec4 a lane
		{matVecLayout{lanes: 16, rt: 4, wg: 256}, 4, 2048, 16 << 10, false, 0, 0},                  // partials alone exceed 16 KiB
		{matVecLayout{lanes: 16, rt: 32, wg: 256}, 1, 2048, 48 << 10, false, 0, 0},                 // more rows a thread than lanes
		{matVecLayout{lanes: 16, rt: 2, wg: 128, maxKC: 2048}, 1, 4096, 48 << 10, true, 2048, 512}, // capped: two chunks
		{matVecLayout{lanes: 32, rt: 2, wg: 128, maxKC: 100}, 1, 4096, 48 << 10, true, 1024, 392},  // a cap below one vec4 a lane: one
	} {
		p, ok := planMatVec(c.l, c.T, c.K, c.limit)
		if ok != c.ok || ok && (p.kc != c.kc || p.shm != c.shm) {
			t.Errorf("planMatVec(%v, T %d, K %d, %d B) = %+v, %v; want kc %d shm %d, %v", c.l, c.T, c.K, c.limit, p, ok, c.kc, c.shm, c.ok)
		}
	}
	// One row of the tall matrices (gate|up, the head) in 8 KiB a
	// workgroup: on the H200 six share an SM, and gate|up's 768 workgroups
	// run in one wave (at 10 KiB, five an SM, two waves: 5 % of a batch-1
	// step; BENCHMARKS.md).
	for _, n := range []int{12288, 151936} {
		l := pickMatVecLayout(n, 2048, 1)
		if p, ok := planMatVec(l, 1, 2048, 48<<10); !ok || 16*p.shm > 8<<10 {
			t.Errorf("%d×2048 at one row: %v takes %d bytes of workgroup memory, want at most 8 KiB", n, l, 16*p.shm)
		}
	}
	for _, c := range []struct {
		n, k, T int
		want    matVecLayout
	}{
		{2048, 2048, 1, matVecLayout{lanes: 64, rt: 4, wg: 128}},   // o_proj
		{4096, 2048, 2, matVecLayout{lanes: 64, rt: 4, wg: 128}},   // q|k|v
		{4096, 2048, 4, matVecLayout{lanes: 32, rt: 4, wg: 128}},   // q|k|v
		{12288, 2048, 1, matVecLayout{lanes: 16, rt: 2, wg: 128}},  // gate|up
		{151936, 2048, 4, matVecLayout{lanes: 16, rt: 8, wg: 128}}, // the head
		{2048, 6144, 1, matVecLayout{lanes: 32, rt: 4, wg: 128}},   // down_proj
		{2048, 6144, 3, matVecLayout{lanes: 16, rt: 1, wg: 256}},   // down_proj
	} {
		if got := pickMatVecLayout(c.n, c.k, c.T); got != c.want {
			t.Errorf("pickMatVecLayout(%d, %d, %d) = %v, want %v", c.n, c.k, c.T, got, c.want)
		}
	}
}

// TestMatMulUnsplit: matrices with enough column tiles that gemm_int4.wgsl
// runs unsplit, writing (and normalizing, and accumulating) out itself.
func TestMatMulUnsplit(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, k := range []matMulKernel{kernelGEMM4, kernelGEMM2x8, kernelSkinny} {
		w := &Matrix{Format: Int4, N: 1, K: 128, G: 32}
		c, _ := measuredH200.choose(k, w, 40, gpu.Limits{MaxComputeWorkgroupsPerDimension: 65535, MaxComputeWorkgroupStorageSize: 48 << 10})
		n := c.skinny.rows() * c.groups
		if k.isGEMM() {
			n = k.gemmTile().bn() * c.groups
		}
		s := matMulShape{T: 40, N: n + 17, K: 128, G: 32}
		for _, in := range []string{"x", "swiglu", "norm"} {
			t.Run(fmt.Sprintf("%v/%s", k, in), func(t *testing.T) {
				if !k.fits(&Matrix{Format: Int4, N: s.N, K: s.K, G: s.G}, s.T, d.Limits()) {
					t.Skipf("this device does not take %v", k)
				}
				testMatMul(t, d, r, Int4, s, in != "norm", in, k, 0)
			})
		}
	}
}

// TestMatMulEachKernel runs every int4 kernel on row counts pickMatMul
// gives to another one, so each is exact at every T it takes, not only
// at the ones it is picked for.
func TestMatMulEachKernel(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, c := range []struct {
		kernel matMulKernel
		Ts     []int
	}{
		{kernelRowTile, []int{1, 2, 11}},
		{kernelMatVec, []int{1, 2, 3, 4}},
		{kernelMatVecBatch, []int{1, 2, 3, 4}},
		{kernelGEMM2, []int{1, 3, 8, 40}},
		{kernelGEMM4, []int{2, 9, 31, 65}},
		{kernelGEMM2x8, []int{1, 5, 32, 33}},
		{kernelSkinny, []int{1, 5, 17, 33, 130}}, // 130: a prompt chunk, five row tiles
	} {
		for _, T := range c.Ts {
			step := 32 // K's step: a GEMM's stage, at least
			if c.kernel.isGEMM() {
				step = max(step, c.kernel.gemmTile().bk())
			}
			s := matMulShape{T: T, N: 16 + r.IntN(150), K: step * (1 + r.IntN(40*32/step)), G: 32}
			in := []string{"x", "swiglu", "norm"}[r.IntN(3)]
			name := fmt.Sprintf("%v/T%d_N%d_K%d/%s", c.kernel, T, s.N, s.K, in)
			t.Run(name, func(t *testing.T) {
				if !c.kernel.fits(&Matrix{Format: Int4, N: s.N, K: s.K, G: s.G}, T, d.Limits()) {
					t.Skipf("this device does not take %v", c.kernel)
				}
				testMatMul(t, d, r, Int4, s, in != "norm", in, c.kernel, 0)
			})
		}
	}
}

// TestSkinnyLayouts runs skinny_int4.wgsl at layouts pickSkinnyLayout
// does not choose (the benchmark's), each exact, split along K or not
// (split, with the sums scaled a group at a time: GS).
func TestSkinnyLayouts(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, l := range []skinnyLayout{{4, 1, 64}, {4, 2, 256}, {8, 2, 256}, {8, 4, 64}, {12, 2, 192}, {16, 1, 128}, {20, 2, 160}, {24, 2, 240}, {32, 4, 64}, {32, 2, 128}, {64, 2, 128}, {64, 1, 64},
		{1, 2, 64}, {3, 4, 96}, {5, 2, 160}, {6, 2, 192}, {9, 4, 72}, {17, 2, 255}} { // rows that are no multiple of 4
		for _, groups := range []int{1, 64} {
			T := 1 + r.IntN(2*l.tt)
			s := matMulShape{T: T, N: 16 + r.IntN(300), K: 32 * (1 + r.IntN(40)), G: 32}
			in := []string{"x", "swiglu", "norm"}[r.IntN(3)]
			t.Run(fmt.Sprintf("%v/groups%d/T%d_N%d_K%d/%s", l, groups, T, s.N, s.K, in), func(t *testing.T) {
				if l.chunk(d.Limits().MaxComputeWorkgroupStorageSize) == 0 {
					t.Skipf("this device does not take %v", l)
				}
				testMatMulHow(t, d, r, Int4, s, in != "norm", in, &matMulChoice{kernel: kernelSkinny, skinny: l, groupScale: groups == 64, groups: groups}, 0)
			})
		}
	}
}

// TestMatVecBatchLayouts runs matvec_batch_int4.wgsl at the layouts the
// benchmark tries, each exact, on rows of up to 5,120 inputs (several
// staged chunks, so that prefetching crosses chunks), over up to
// matVecBatchMaxT activation rows (past four, in blocks of four).
func TestMatVecBatchLayouts(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for i, l := range append(benchMatVecBatchLayouts, benchMatVecBatchLayouts...) {
		T := 1 + r.IntN(matVecBatchMaxT)
		if i%3 == 2 {
			T = matVecMaxT + 1 + r.IntN(matVecBatchMaxT-matVecMaxT) // row blocks
		}
		s := matMulShape{T: T, N: 16 + r.IntN(150), K: 32 * (1 + r.IntN(160)), G: 32}
		if !l.fits(&Matrix{Format: Int4, N: s.N, K: s.K, G: s.G}, T, d.Limits()) {
			s.T = 1 + r.IntN(2) // a layout whose staged rows outgrow this device's workgroup memory: one or two rows
		}
		in := []string{"x", "swiglu", "norm", "merge"}[r.IntN(4)]
		if in == "merge" { // o_proj of one attention row: heads of 64 or 128
			s.K = 64 * (1 + r.IntN(80))
		}
		// Every other layout split along K: a target of 64 workgroups
		// splits these rows 2 to 64 ways (slices of 32·lanes inputs, the
		// last one shorter where they do not divide K).
		c := matMulChoice{kernel: kernelMatVecBatch, matVecBatch: l, groups: []int{0, 64}[i%2]}
		t.Run(fmt.Sprintf("%v/T%d_N%d_K%d/%s", c, s.T, s.N, s.K, in), func(t *testing.T) {
			if !l.fits(&Matrix{Format: Int4, N: s.N, K: s.K, G: s.G}, s.T, d.Limits()) {
				t.Skipf("this device does not take %v at %d rows", l, s.T)
			}
			testMatMulHow(t, d, r, Int4, s, in != "norm", in, &c, 0)
		})
	}
}

func TestPickMatMul(t *testing.T) {
	small := gpu.Limits{MaxComputeWorkgroupsPerDimension: 65535, MaxComputeWorkgroupStorageSize: 16 << 10}
	large := small
	large.MaxComputeWorkgroupStorageSize = 48 << 10
	int4 := &Matrix{Format: Int4, N: 4096, K: 2048, G: 32}
	short := &Matrix{Format: Int4, N: 4096, K: 1024, G: 32}
	for _, c := range []struct {
		w      *Matrix
		T      int
		limits gpu.Limits
		want   matMulKernel
	}{
		{short, 1, large, kernelMatVec}, {short, 2, large, kernelMatVecBatch}, // one row of fewer than 2,048 inputs: matvec_int4.wgsl
		{int4, 1, large, kernelMatVecBatch}, {int4, 2, large, kernelMatVecBatch}, {int4, 4, large, kernelMatVecBatch},
		{&Matrix{Format: Int4, N: 2048, K: 6144, G: 32}, 1, large, kernelMatVecBatch}, // down_proj, one row of 2,048 inputs or more
		{&Matrix{Format: Int4, N: 2048, K: 6144, G: 32}, 2, large, kernelMatVecBatch},
		{&Matrix{Format: Int4, N: 4096, K: 12288, G: 32}, 2, large, kernelMatVecBatch}, // Qwen3-8B's down_proj: two rows,
		{&Matrix{Format: Int4, N: 4096, K: 12288, G: 32}, 3, large, kernelSkinny},      // three or four on skinny_int4.wgsl
		{&Matrix{Format: Int4, N: 4096, K: 12288, G: 32}, 4, large, kernelSkinny},
		{&Matrix{Format: Int4, N: 6144, K: 4096, G: 32}, 4, large, kernelMatVecBatch}, // its q|k|v: too small
		{&Matrix{Format: Int4, N: 2048, K: 6144, G: 32}, 32, large, kernelSkinny},
		{&Matrix{Format: Int4, N: 2048, K: 6144, G: 32}, 41, large, kernelGEMM4},
		{int4, 5, large, kernelSkinny}, {int4, 16, large, kernelSkinny},
		{int4, 17, large, kernelSkinny}, {int4, 40, large, kernelSkinny}, {int4, 40, small, kernelSkinny},
		{int4, 40, large, kernelSkinny}, {int4, 41, large, kernelGEMM4}, {int4, 127, large, kernelGEMM4},
		{int4, 128, large, kernelSkinny}, {int4, 1024, large, kernelSkinny}, {int4, 1024, small, kernelSkinny}, // prompt chunks
		{int4, 64, small, kernelGEMM2x8},                                      // 4 × 4 outputs a thread need more than 16 KiB
		{&Matrix{Format: Int4, N: 64, K: 48, G: 16}, 1, large, kernelRowTile}, // 32 codes span two groups
		{&Matrix{Format: Int4, N: 64, K: 96, G: 32}, 64, large, kernelGEMM4},
		{&Matrix{Format: F16, N: 64, K: 64}, 1, large, kernelRowTile},
		{&Matrix{Format: F32, N: 64, K: 64}, 64, large, kernelRowTile},
	} {
		if got := measuredH200.pick(c.w, c.T, c.limits).kernel; got != c.want {
			t.Errorf("%v (%d×%d, G %d), T = %d, %d B workgroup memory: %v, want %v",
				c.w.Format, c.w.N, c.w.K, c.w.G, c.T, c.limits.MaxComputeWorkgroupStorageSize, got, c.want)
		}
	}
}

// TestMatMulRowBlocks forces a tiny binding limit so that W is split into
// several row blocks writing column slices of one output.
func TestMatMulRowBlocks(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16, F32} {
		s := matMulShape{T: 3, N: 1000, K: 64, G: 32}
		t.Run(f.String()+"/swiglu", func(t *testing.T) { testMatMul(t, d, r, f, s, true, "swiglu", kernelPlanned, 32<<10) })
		t.Run(f.String()+"/norm", func(t *testing.T) { testMatMul(t, d, r, f, s, false, "norm", kernelPlanned, 32<<10) })
	}
}

// testMatMul checks MatMul (MatMulSwiGLU when in is "swiglu", MatMulNorm
// when "norm") against the reference on fresh random inputs, with the
// given kernel (kernelPlanned: the one the device's plan picks); maxBinding
// 0 means the device's own limit.
func testMatMul(t *testing.T, d *gpu.Device, r *rand.Rand, f Format, s matMulShape, accumulate bool, in string, kernel matMulKernel, maxBinding uint64) {
	m := randMatrix(t, r, f, s.N, s.K, s.G)
	choice, ok := choiceFor(d, kernel, &Matrix{Format: Int4, N: s.N, K: s.K, G: s.G}, s.T)
	if f != Int4 {
		choice, ok = matMulChoice{kernel: kernelRowTile}, true
	}
	if !ok {
		t.Fatalf("%v does not take %d rows of %d×%d", kernel, s.T, s.N, s.K)
	}
	testMatMulOf(t, d, r, m, s, accumulate, in, &choice, maxBinding)
}

// testMatMulHow is testMatMul with the kernel, its layout and its split-K
// target forced by choice.
func testMatMulHow(t *testing.T, d *gpu.Device, r *rand.Rand, f Format, s matMulShape, accumulate bool, in string, choice *matMulChoice, maxBinding uint64) {
	testMatMulOf(t, d, r, randMatrix(t, r, f, s.N, s.K, s.G), s, accumulate, in, choice, maxBinding)
}

func testMatMulOf(t *testing.T, d *gpu.Device, r *rand.Rand, m tensor.Matrix, s matMulShape, accumulate bool, in string, choice *matMulChoice, maxBinding uint64) {
	var how matMulInput
	x := randVec(r, s.T*s.K, 1)
	input := x
	how.accumulate = accumulate
	switch in {
	case "swiglu": // x = silu(gate) · up, from random gate | up rows
		input, how.swiglu = randVec(r, s.T*2*s.K, 2), true
		for row := range s.T {
			for k := range s.K {
				x[row*s.K+k] = reference.SiLU(input[row*2*s.K+k]) * input[row*2*s.K+s.K+k]
			}
		}
	case "norm": // x = rmsnorm(input) · g
		input = randVec(r, s.T*s.K, 3)
		g := randVec(r, s.K, 1)
		how.norm, how.eps = upload(t, d, "norm", g), 1e-6
		for row := range s.T {
			reference.RMSNorm(x[row*s.K:(row+1)*s.K], input[row*s.K:(row+1)*s.K], g, how.eps)
		}
	case "merge": // x = attention splits merged (s.K a multiple of 64)
		var part []float32
		part, how.merge = randDecodeSplits(r, x, s.T, s.K)
		input, how.merge.part = part, upload(t, d, "splits", part).All()
	}
	want := make([]float32, s.T*s.N)
	reference.MatMul(want, x, m, s.T)

	w, err := UploadMatrix(d, "w", m)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	xb := upload(t, d, "x", input)
	var out *gpu.Buffer
	if accumulate {
		residual := randVec(r, s.T*s.N, 1)
		out = upload(t, d, "out", residual)
		reference.Add(want, residual)
	} else {
		out = poisoned(t, d, "out", s.T*s.N)
	}
	if maxBinding == 0 {
		maxBinding = d.Limits().MaxStorageBufferBindingSize
	}
	poisonScratch(t, d, s.T*(s.N+1)*(s.K/8)) // more than any split-K's partial sums
	run(t, d, "matmul", func(b *gpu.Batch) error {
		_, err := matMulSplitK(b, out, xb, w, s.T, how, *choice, maxBinding, false)
		return err
	})
	checkClose(t, "out", readF32(t, out, s.T*s.N), want, tolF32)
}

func TestMatMulRejectsBadShapes(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	w, err := UploadMatrix(d, "w", randMatrix(t, r, Int4, 8, 64, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	small := poisoned(t, d, "small", 10)
	x := poisoned(t, d, "x", 2*64)
	for name, call := range map[string]func(b *gpu.Batch) error{
		"T=0":       func(b *gpu.Batch) error { return MatMul(b, small, x, w, 0, false) },
		"short out": func(b *gpu.Batch) error { return MatMul(b, small, x, w, 2, false) },
		"short x":   func(b *gpu.Batch) error { return MatMul(b, x, small, w, 2, false) },
	} {
		b, err := d.NewBatch(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := call(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
		b.Discard()
	}
}

// TestPlanSkinnyLayout: the H200's plan takes 5–20 rows that are no
// multiple of 4 in tiles of exactly those rows, each a layout the kernel
// takes; SwiftShader's keeps the padded tiles.
func TestPlanSkinnyLayout(t *testing.T) {
	for T := 1; T <= 24; T++ {
		l := measuredH200.skinnyLayout(4096, T)
		exact := T >= 5 && T <= 20 && T%4 != 0
		if !l.valid() || exact != (l.tt == T && l.tt%4 != 0) {
			t.Errorf("H200, %d rows: %v (valid %v), want a tile of exactly %d rows: %v", T, l, l.valid(), T, exact)
		}
		if s := measuredSwiftShader.skinnyLayout(4096, T); s != pickSkinnyLayout(4096, T) || s.tt%4 != 0 {
			t.Errorf("SwiftShader, %d rows: %v, want pickSkinnyLayout's %v", T, s, pickSkinnyLayout(4096, T))
		}
	}
	for _, c := range []struct {
		T    int
		want skinnyLayout
	}{{5, skinnyLayout{5, 2, 125}}, {9, skinnyLayout{9, 2, 144}}, {17, skinnyLayout{17, 2, 238}}} {
		if got := measuredH200.skinnyLayout(151936, c.T); got != c.want {
			t.Errorf("H200, the head at %d rows: %v, want %v", c.T, got, c.want)
		}
	}
}

// TestPlanMatVecBatch checks which one-to-four-row matmuls the H200's plan
// gives matvec_batch_int4.wgsl, at which layout, and that a plan not
// choosing by shape keeps the default layout.
func TestPlanMatVecBatch(t *testing.T) {
	lim := gpu.Limits{MaxComputeWorkgroupsPerDimension: 65535, MaxComputeWorkgroupStorageSize: 48 << 10}
	small := lim
	small.MaxComputeWorkgroupStorageSize = 16 << 10
	for _, c := range []struct {
		N, K, T int
		lim     gpu.Limits
		kernel  matMulKernel
		layout  matVecBatchLayout
	}{
		{4096, 4096, 1, lim, kernelMatVecBatch, matVecBatchNarrowOne}, // Qwen3-8B's o_proj
		{4096, 12288, 2, lim, kernelMatVecBatch, matVecBatchNarrow},   // its down_proj, two rows
		{6144, 4096, 1, lim, kernelMatVecBatch, matVecBatchWide},      // its q|k|v
		{24576, 4096, 2, lim, kernelMatVecBatch, matVecBatchWide},     // its gate|up
		{2048, 2048, 4, lim, kernelMatVecBatch, matVecBatchWide},      // Qwen3-1.7B's o_proj, four rows
		{151936, 2048, 1, lim, kernelMatVecBatch, matVecBatchHead},    // its head: many rows of 2,048 inputs
		{151936, 4096, 1, lim, kernelMatVecBatch, matVecBatchHead},    // Qwen3-8B's head
		{151936, 2048, 2, lim, kernelMatVecBatch, matVecBatchWide},    // two rows of a head
		{151936, 1024, 1, lim, kernelMatVecBatch, matVecBatchWide},    // Qwen3-0.6B's head: 1,024 inputs
		{12288, 2048, 1, lim, kernelMatVecBatch, matVecBatchWide},     // its gate|up
		{2048, 2048, 1, lim, kernelMatVecBatch, matVecBatchNarrowOne}, // its o_proj, one row
		{4096, 2048, 1, lim, kernelMatVecBatch, matVecBatchNarrowOne}, // its q|k|v (where not fused)
		{2048, 2048, 2, lim, kernelMatVecBatch, matVecBatchNarrow},    // its o_proj, two rows
		{1024, 3072, 1, lim, kernelMatVecBatch, matVecBatchNarrowOne}, // Qwen3-0.6B's down_proj
		{4096, 1024, 1, lim, kernelMatVec, matVecBatchLayout{}},       // Qwen3-0.6B's q|k|v: few rows of 1,024 inputs
		{151936, 256, 1, lim, kernelMatVec, matVecBatchLayout{}},      // the shipped target's head: short rows
		{2048, 6144, 4, small, kernelMatVecBatch, matVecBatchDefault}, // the wide layout's 4 rows do not fit 16 KiB
	} {
		w := &Matrix{Format: Int4, N: c.N, K: c.K, G: 32}
		got := measuredH200.pick(w, c.T, c.lim)
		if got.kernel != c.kernel || got.matVecBatch != c.layout {
			t.Errorf("H200, %d × %d at %d rows: %v (%v), want %v (%v)", c.N, c.K, c.T, got.kernel, got.matVecBatch, c.kernel, c.layout)
		}
	}
	if got := measuredSwiftShader.pick(&Matrix{Format: Int4, N: 4096, K: 4096, G: 32}, 2, lim); got.kernel != kernelMatVecBatch || got.matVecBatch != matVecBatchDefault {
		t.Errorf("SwiftShader, 4096 × 4096 at 2 rows: %v (%v), want the default matvec_batch_int4.wgsl layout", got.kernel, got.matVecBatch)
	}
}

// randDecodeSplits fills x (T rows of K) with the merge of random
// attention_decode.wgsl partials over heads of 64 or 128 (K a multiple of
// 64) and 1 to 40 splits (several of matvec_batch_int4.wgsl's MERGE
// blocks), some of them hidden (m = −inf, l = 0, o = 0; at least one a head
// seen), and returns the partials, (T, heads, splits, D + 4), with the
// decodeSplits that describe them (part unset).
func randDecodeSplits(r *rand.Rand, x []float32, T, K int) ([]float32, *decodeSplits) {
	D := 64
	if K%128 == 0 && r.IntN(2) == 0 {
		D = 128
	}
	heads, splits := K/D, 1+r.IntN(40)
	part := make([]float32, T*heads*splits*(D+4))
	for th := range T * heads {
		seen := r.IntN(splits)
		M := math.Inf(-1)
		for s := range splits {
			at := (th*splits + s) * (D + 4)
			if s != seen && r.IntN(4) == 0 {
				part[at+D] = float32(math.Inf(-1)) // hidden: o and l stay 0
				continue
			}
			l := 1 + 63*r.Float32()
			part[at+D], part[at+D+1] = float32(3*r.NormFloat64()), l
			for i := range D {
				part[at+i] = l * float32(r.NormFloat64())
			}
			M = max(M, float64(part[at+D]))
		}
		var den float64
		num := make([]float64, D)
		for s := range splits {
			at := (th*splits + s) * (D + 4)
			w := math.Exp(float64(part[at+D]) - M)
			den += w * float64(part[at+D+1])
			for i := range D {
				num[i] += w * float64(part[at+i])
			}
		}
		for i := range D {
			x[th*D+i] = float32(num[i] / den)
		}
	}
	return part, &decodeSplits{T: T, heads: heads, splits: splits, D: D}
}
