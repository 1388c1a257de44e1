package ops

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/tensor"
)

// randMatrix is a random (rows, cols) matrix in the named format.
func randMatrix(t testing.TB, rng *rand.Rand, format string, rows, cols int) tensor.Matrix {
	t.Helper()
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64()) * 0.5
	}
	var group int
	switch format {
	case "f32":
		return &tensor.F32{Rows: rows, Cols: cols, Data: w}
	case "f16":
		h := make([]uint16, len(w))
		for i, v := range w {
			h[i] = tensor.F32ToF16(v)
		}
		return &tensor.F16{Rows: rows, Cols: cols, Data: h}
	default:
		if _, err := fmt.Sscanf(format, "int4g%d", &group); err != nil {
			t.Fatalf("format %q", format)
		}
	}
	m, err := tensor.QuantizeInt4(w, rows, cols, group)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randRow(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// closeTo holds got to want within tol × max|want| (f32 sums in another
// order).
func closeTo(got, want []float32, tol float64) error {
	var scale float64
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*scale) {
			return fmt.Errorf("at %d: %v, want %v (|Δ| %.3g, max|want| %.3g)", i, got[i], want[i], d, scale)
		}
	}
	return nil
}

// closeToTerms holds got to want within tol × (max|want| + terms[i]),
// terms[i] the sum of |w|·|x| behind output i: f32 sums in another order
// err by that much at most.
func closeToTerms(got, want, terms []float32, tol float64) error {
	var scale float64
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*(scale+float64(terms[i]))) {
			return fmt.Errorf("at %d: %v, want %v (|Δ| %.3g, max|want| %.3g, Σ|w·x| %.3g)", i, got[i], want[i], d, scale, terms[i])
		}
	}
	return nil
}

// TestMulRows holds MulRows to reference.MatMul on random matrices of
// every format and input row counts around the kernels' blocking, over a
// poisoned output, for a split of the rows as workers take them, and in
// add mode.
func TestMulRows(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		if fixed && !hasFixed {
			continue
		}
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			defer SetFixed(SetFixed(fixed))
			testMulRows(t)
		})
	}
}

func testMulRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for _, format := range []string{"int4g32", "int4g64", "int4g128", "int4g8", "int4g16", "f16", "f32"} {
		for _, shape := range [][2]int{{1, 32}, {37, 64}, {129, 256}, {8, 128}, {5, 48}, {48, 96}} {
			rows, cols := shape[0], shape[1]
			var g int
			if fmt.Sscanf(format, "int4g%d", &g); g > 0 && cols%g != 0 {
				continue
			}
			if format == "f32" || format == "f16" {
				cols += rng.IntN(3) // dense rows need not be whole blocks
			}
			m := randMatrix(t, rng, format, rows, cols)
			l := NewLinear(m)
			// |W|, for the scale of each output's terms: a sum that
			// cancels to near zero is held to the size of what it added.
			abs := &tensor.F32{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
			for r := range rows {
				m.Row(r, abs.Data[r*cols:(r+1)*cols])
			}
			for i, v := range abs.Data {
				abs.Data[i] = float32(math.Abs(float64(v)))
			}
			for _, T := range []int{1, 2, 3, 4, 5, 7, 8, 9, 17} {
				t.Run(fmt.Sprintf("%s/%dx%d/T%d", format, rows, cols, T), func(t *testing.T) {
					x := randRow(rng, T*cols)
					want := make([]float32, T*rows)
					reference.MatMul(want, x, m, T)
					xAbs := make([]float32, len(x))
					for i, v := range x {
						xAbs[i] = float32(math.Abs(float64(v)))
					}
					terms := make([]float32, T*rows)
					reference.MatMul(terms, xAbs, abs, T)
					in := NewInput(l)
					in.Resize(T, cols)
					for r := range T {
						in.Set(r, x[r*cols:(r+1)*cols])
					}
					if l.Fixed() {
						// The kernel's sums are exact to its fixed-point
						// input: held to the reference on that input
						// (TestQuantize bounds its distance from x).
						x = dequantize(in)
						reference.MatMul(want, x, m, T)
					}
					// Poisoned, with a guard past the end that no kernel may touch.
					const guard = 64
					buf := make([]float32, T*rows+guard)
					for i := range buf {
						buf[i] = float32(math.NaN())
					}
					got := buf[:T*rows]
					defer func() {
						for i, v := range buf[T*rows:] {
							if v == v {
								t.Fatalf("a write past the output, %d after its end", i)
							}
						}
					}()
					scratch := make([]float32, l.ScratchLen())
					mid := rng.IntN(rows + 1)
					l.MulRows(got, rows, in, 0, mid, false, scratch)
					l.MulRows(got, rows, in, mid, rows, false, scratch)
					if err := closeToTerms(got, want, terms, 1e-5); err != nil {
						t.Fatal(err)
					}
					l.MulRows(got, rows, in, 0, rows, true, scratch)
					for i := range want {
						want[i] *= 2
						terms[i] *= 2
					}
					if err := closeToTerms(got, want, terms, 1e-5); err != nil {
						t.Fatalf("add: %v", err)
					}
				})
			}
			got, want := make([]float32, cols), make([]float32, cols)
			for r := range rows {
				l.Row(r, got)
				m.Row(r, want)
				if !slices.Equal(got, want) {
					t.Fatalf("%s %dx%d: Row(%d) differs from the matrix's", format, rows, cols, r)
				}
			}
			if format == "int4g32" && !l.InPlace() {
				t.Errorf("an int4 matrix of 32-column groups is not read in place")
			}
			if strings.HasPrefix(format, "int4") && g%Block == 0 && l.Fixed() != useFixed {
				t.Errorf("%s: fixed-point kernel %v, want %v", format, l.Fixed(), useFixed)
			}
		}
	}
}

func TestPermute(t *testing.T) {
	for _, n := range []int{0, 5, 32, 70, 96} {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i)
		}
		dst := make([]float32, n)
		Permute(dst, src)
		for c := range n {
			if dst[Permuted(c, n)] != src[c] {
				t.Fatalf("n %d: column %d at %d holds %v", n, c, Permuted(c, n), dst[Permuted(c, n)])
			}
		}
	}
}

// TestVectorOps holds Dot, Axpy, ExpSum, ExpSumFrom and Max to plain
// loops on random lengths, −Inf and NaN included.
func TestVectorOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	for _, n := range []int{1, 3, 15, 16, 17, 31, 33, 64, 100, 1000} {
		a, b := randRow(rng, n), randRow(rng, n)
		var dot float64
		for i := range a {
			dot += float64(a[i]) * float64(b[i])
		}
		if got := Dot(a, b); math.Abs(float64(got)-dot) > 1e-5*float64(n) {
			t.Errorf("n %d: Dot %v, want %v", n, got, dot)
		}
		y := append([]float32(nil), b...)
		Axpy(y, 0.5, a)
		for i := range y {
			if want := b[i] + 0.5*a[i]; math.Abs(float64(y[i]-want)) > 1e-6 {
				t.Fatalf("n %d: Axpy[%d] %v, want %v", n, i, y[i], want)
			}
		}
		x := randRow(rng, n)
		for i := range x {
			x[i] *= 30
		}
		if n > 2 {
			x[rng.IntN(n)] = float32(math.Inf(-1))
		}
		best, at, nan := Max(x)
		wantBest, wantAt, _ := maxGo(x)
		if best != wantBest || at != wantAt || nan {
			t.Errorf("n %d: Max %v at %d (nan %v), want %v at %d", n, best, at, nan, wantBest, wantAt)
		}
		var sum float64
		for _, v := range x {
			sum += math.Exp(float64(v - best))
		}
		if got := ExpSumFrom(x, best); math.Abs(float64(got)-sum) > 1e-6*sum {
			t.Errorf("n %d: ExpSumFrom %v, want %v", n, got, sum)
		}
		e := append([]float32(nil), x...)
		if got := ExpSum(e, best); math.Abs(float64(got)-sum) > 1e-6*sum {
			t.Errorf("n %d: ExpSum %v, want %v", n, got, sum)
		}
		for i, v := range x {
			want := math.Exp(float64(v - best))
			if math.Abs(float64(e[i])-want) > 3e-7*want+minNormal {
				t.Fatalf("n %d: exp(%v) = %v, want %v", n, v-best, e[i], want)
			}
		}
		x[n-1] = float32(math.NaN())
		if _, _, nan := Max(x); !nan {
			t.Errorf("n %d: Max missed a NaN", n)
		}
	}
}

// minNormal is f32's smallest normal number: below it exp may give 0.
const minNormal = 0x1p-126

// TestExpRange holds the vector exp to math.Exp over its whole range and
// past it, as ExpSum and as ExpScaled (at temperature 1 and 0.7) use it.
func TestExpRange(t *testing.T) {
	var x []float32
	for v := -100.0; v <= 0; v += 0.013 {
		x = append(x, float32(v))
	}
	x = append(x, float32(math.Inf(-1)))
	e := append([]float32(nil), x...)
	ExpSum(e, 0)
	for i, v := range x {
		want := math.Exp(float64(v))
		if math.Abs(float64(e[i])-want) > 3e-7*want+minNormal {
			t.Fatalf("exp(%v) = %v, want %v", v, e[i], want)
		}
	}
	for _, temp := range []float32{1, 0.7} {
		ExpScaled(e, x, 0, temp)
		for i, v := range x {
			want := math.Exp(float64(v / temp))
			if math.Abs(float64(e[i])-want) > 3e-7*want+minNormal {
				t.Fatalf("exp(%v / %v) = %v, want %v", v, temp, e[i], want)
			}
		}
	}
}

// BenchmarkMulRows is one worker's matrix product at the embedded
// target's shapes (hidden 256, MLP 1024, the 151,936-row tied head), for
// the input rows of a step (1) and of a 7-row verification.
func BenchmarkMulRows(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range []struct {
		name       string
		rows, cols int
	}{{"qkv_256x256", 512, 256}, {"gate_up_2048x256", 2048, 256}, {"down_256x1024", 256, 1024}, {"head_151936x256", 151936, 256}} {
		m := randMatrix(b, rng, "int4g32", s.rows, s.cols)
		l := NewLinear(m)
		for _, T := range []int{1, 4, 7} {
			b.Run(fmt.Sprintf("%s/T%d", s.name, T), func(b *testing.B) {
				x := randRow(rng, T*s.cols)
				in := NewInput(l)
				in.Resize(T, s.cols)
				for r := range T {
					in.Set(r, x[r*s.cols:(r+1)*s.cols])
				}
				out := make([]float32, T*s.rows)
				scratch := make([]float32, l.ScratchLen())
				b.SetBytes(int64(s.rows * s.cols / 2))
				for b.Loop() {
					l.MulRows(out, s.rows, in, 0, s.rows, false, scratch)
				}
			})
		}
	}
}

// TestRowOps holds RMSNorm, Rope and SiLUMul to the reference's.
func TestRowOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, n := range []int{8, 33, 64, 256} {
		x, w := randRow(rng, n), randRow(rng, n)
		want := make([]float32, n)
		reference.RMSNorm(want, x, w, 1e-6)
		got := append([]float32(nil), x...)
		RMSNorm(got, got, w, 1e-6)
		if err := closeTo(got, want, 1e-6); err != nil {
			t.Errorf("RMSNorm n %d: %v", n, err)
		}
		g, u := randRow(rng, n), randRow(rng, n)
		for i := range g {
			g[i] *= 10
		}
		for i := range want {
			want[i] = reference.SiLU(g[i]) * u[i]
		}
		SiLUMul(g, u)
		if err := closeTo(g, want, 1e-6); err != nil {
			t.Errorf("SiLUMul n %d: %v", n, err)
		}
		if n%2 == 0 {
			inv := make([]float32, n/2)
			for i := range inv {
				inv[i] = float32(math.Pow(10000, -2*float64(i)/float64(n)))
			}
			pos := rng.IntN(5000)
			h := randRow(rng, n)
			want := append([]float32(nil), h...)
			reference.Rope(want, pos, inv)
			cos, sin := make([]float32, n/2), make([]float32, n/2)
			RopeAngles(cos, sin, pos, inv)
			Rope(h, cos, sin)
			if err := closeTo(h, want, 0); err != nil {
				t.Errorf("Rope n %d: %v", n, err)
			}
		}
	}
}

func TestFMARate(t *testing.T) {
	if r := FMARate(1, 10*time.Millisecond); !(r > 0) {
		t.Errorf("FMARate %v", r)
	}
}

// TestAttend holds Attend to reference.Attention's arithmetic for one
// head: heads of 64 and 128 (the vector path) and 32, over key counts
// around its blocking of four, keys strided as in a cache of several
// heads; causal, and with a random tree mask over the last slots.
func TestAttend(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	for _, D := range []int{32, 64, 128} {
		for _, n := range []int{1, 3, 4, 5, 17, 200} {
			for _, tree := range []bool{false, true} {
				testAttend(t, rng, D, n, tree)
			}
		}
	}
}

func testAttend(t *testing.T, rng *rand.Rand, D, n int, tree bool) {
	mask := Mask{Base: n}
	if tree {
		// Slots from Base on are tree nodes; the row sees a random
		// subset of them and always its own slot, n-1.
		mask.Base = max(n-64, 0) + rng.IntN(min(n, 64))
		mask.Bits = rng.Uint64() | 1<<uint(n-1-mask.Base)
	}
	stride := 3 * D // three kv heads; this one is the second
	keys, values := randRow(rng, n*stride), randRow(rng, n*stride)
	q := randRow(rng, D)
	scale := float32(1 / math.Sqrt(float64(D)))
	// The reference: one query at position n-1 over the n keys of
	// its head, as reference.Attention computes it.
	want := make([]float32, D)
	scores := make([]float64, n)
	best := math.Inf(-1)
	for j := range n {
		if j >= mask.Base && mask.Bits>>uint(j-mask.Base)&1 == 0 {
			scores[j] = math.Inf(-1)
			continue
		}
		var d float64
		for i := range D {
			d += float64(q[i]) * float64(keys[j*stride+D+i])
		}
		scores[j] = d * float64(scale)
		best = math.Max(best, scores[j])
	}
	var sum float64
	for j := range scores {
		scores[j] = math.Exp(scores[j] - best)
		sum += scores[j]
	}
	for i := range D {
		var o float64
		for j := range n {
			o += scores[j] / sum * float64(values[j*stride+D+i])
		}
		want[i] = float32(o)
	}
	got := make([]float32, D)
	for i := range got {
		got[i] = float32(math.NaN())
	}
	Attend(got, q, keys[D:], values[D:], stride, n, scale, make([]float32, n), mask)
	if err := closeTo(got, want, 1e-5); err != nil {
		t.Errorf("D %d, %d keys, mask %+v: %v", D, n, mask, err)
	}
}

// dequantize is in's rows as the fixed-point kernel sees them: s·v.
func dequantize(in *Input) []float32 {
	nb, stride := in.Cols/Block, fixedStride(in.Cols)
	x := make([]float32, in.T*in.Cols)
	for t := range in.T {
		row := in.fixed[t*stride : (t+1)*stride]
		for b := range nb {
			s := math.Float32frombits(binary.LittleEndian.Uint32(row[96*nb+12*b:]))
			for i := range Block {
				x[t*in.Cols+b*Block+i] = s * float32(fixedValue(row, b, i))
			}
		}
	}
	return x
}

// fixedValue is the value v of block b's column i in a fixed-point row.
func fixedValue(row []byte, b, i int) int32 {
	return 65536*int32(int8(row[96*b+i])) + 256*int32(int8(row[96*b+32+i])) + int32(int8(row[96*b+64+i]))
}

// TestQuantize holds the fixed-point input to its definition: the
// vector quantizer equal to quantizeGo byte for byte, every value within
// a step of its source (half, and f32 rounding of x/s), the corrections −8·Σv and
// −8·Σ(v − lo), zero blocks exact,
// and a NaN or an infinity making its block's scale NaN.
func TestQuantize(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	for _, cols := range []int{32, 64, 256, 1024} {
		row := randRow(rng, cols)
		for i := range row {
			row[i] *= float32(math.Exp(4 * rng.NormFloat64())) // magnitudes far apart
		}
		clear(row[:Block]) // a zero block
		got, want := make([]byte, fixedStride(cols)), make([]byte, fixedStride(cols))
		quantize(got, row)
		quantizeGo(want, row)
		if !bytes.Equal(got, want) {
			t.Fatalf("cols %d: quantize differs from quantizeGo", cols)
		}
		in := &Input{T: 1, Cols: cols, fixed: got}
		x := dequantize(in)
		nb := cols / Block
		for b := range nb {
			var m float64
			var sv, slo int32
			for i := range Block {
				m = math.Max(m, math.Abs(float64(row[b*Block+i])))
				sv += fixedValue(got, b, i)
				slo += int32(int8(got[96*b+64+i]))
			}
			if corr := int32(binary.LittleEndian.Uint32(got[96*nb+12*b+4:])); corr != -8*sv {
				t.Fatalf("cols %d block %d: correction %d, want %d", cols, b, corr, -8*sv)
			}
			if corr := int32(binary.LittleEndian.Uint32(got[96*nb+12*b+8:])); corr != -8*(sv-slo) {
				t.Fatalf("cols %d block %d: screening correction %d, want %d", cols, b, corr, -8*(sv-slo))
			}
			for i := range Block {
				c := b*Block + i
				if d := math.Abs(float64(x[c] - row[c])); d > m/fixedMax {
					t.Fatalf("cols %d: column %d: %v for %v (|Δ| %.3g, block max %.3g)", cols, c, x[c], row[c], d, m)
				}
			}
		}
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			if nb < 2 {
				break
			}
			row[Block+3] = bad
			quantize(got, row)
			if x := dequantize(in); !math.IsNaN(float64(x[Block])) || math.IsNaN(float64(x[0])) {
				t.Fatalf("cols %d: %v in block 1 gives %v there and %v in block 0", cols, bad, x[Block], x[0])
			}
			row[Block+3] = 1
		}
	}
}

// TestFirstAtLeast holds FirstAtLeast to a plain loop on fresh random rows
// of lengths around its 64- and 16-value steps: thresholds at a value
// (the first of a tie), between values, above them all (none), NaNs
// (never at least anything) before the first hit, and from every offset
// of a row.
func TestFirstAtLeast(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 9))
	for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 65, 130, 1000 + rng.IntN(1000)} {
		x := randRow(rng, n)
		for i := range x {
			x[i] = float32(math.Round(float64(x[i])*4)) / 2 // ties
		}
		if n > 3 {
			x[rng.IntN(n/2)] = float32(math.NaN())
		}
		for _, v := range []float32{float32(math.Inf(-1)), -0.25, 0.3, 1, 2.75, float32(math.Inf(1))} {
			if n > 0 && rng.IntN(2) == 0 {
				v = x[rng.IntN(n)]
			}
			for _, from := range []int{0, min(n, 1), n / 3, n} {
				want := len(x[from:])
				for i, l := range x[from:] {
					if l >= v {
						want = i
						break
					}
				}
				if got := FirstAtLeast(x[from:], v); got != want {
					t.Errorf("n %d: FirstAtLeast(x[%d:], %v) = %d, want %d", n, from, v, got, want)
				}
			}
		}
	}
}

// TestSampleOps holds the sampled read-out's kernels (ExpScaled, AtLeast,
// KeepAtLeast, Between, Residual, Scale, SumMin, RangeInt32) to plain loops on fresh
// random rows of random lengths, −Inf logits, ties at the threshold and
// zero weights included.
func TestSampleOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	for _, n := range []int{1, 5, 15, 16, 17, 40, 100, 512, 513 + rng.IntN(2000)} {
		// f32 sums in 16 lanes: n/16 roundings a lane.
		near := func(got float32, want, scale float64) bool {
			return math.Abs(float64(got)-want) <= 1e-7*float64(1+n/16)*scale+minNormal
		}
		x := randRow(rng, n)
		for i := range x {
			x[i] = float32(math.Round(float64(x[i])*8)) / 2 // ties
		}
		if n > 2 {
			x[rng.IntN(n)] = float32(math.Inf(-1))
		}
		m := slices.Max(x)
		temp := []float32{0.3, 1, 1.7}[rng.IntN(3)]
		e := make([]float32, n)
		sum, top := ExpScaled(e, x, m, temp)
		var want, mass float64
		for i, l := range x {
			w := math.Exp(float64((l - m) / temp))
			if math.Abs(float64(e[i])-w) > 3e-7*w+minNormal {
				t.Fatalf("n %d: ExpScaled[%d] = exp(%v) %v, want %v", n, i, (l-m)/temp, e[i], w)
			}
			want += w
		}
		if !near(sum, want, want) || top != m {
			t.Errorf("n %d: ExpScaled sum %v top %v, want %v %v", n, sum, top, want, m)
		}
		v := x[rng.IntN(n)]
		count := 0
		for i, l := range x {
			if l >= v {
				mass += float64(e[i])
				count++
			}
		}
		if got, k := AtLeast(e, x, v); !near(got, mass, want) || k != count {
			t.Errorf("n %d: AtLeast(%v) %v of %d, want %v of %d", n, v, got, k, mass, count)
		}
		lo, hi := min(v, x[0]), max(v, x[0])
		dx, de := make([]float32, n+16), make([]float32, n+16)
		var wx, we []float32
		for i, l := range x {
			if l >= lo && l < hi {
				wx, we = append(wx, l), append(we, e[i])
			}
		}
		if k := Between(dx, de, x, e, lo, hi); !slices.Equal(dx[:k], wx) || !slices.Equal(de[:k], we) {
			t.Errorf("n %d: Between [%v, %v) %v, want %v", n, lo, hi, dx[:k], wx)
		}
		ix, ie := slices.Clone(x), slices.Clone(e) // in place
		if k := Between(ix, ie, ix, ie, lo, hi); !slices.Equal(ix[:k], wx) || !slices.Equal(ie[:k], we) {
			t.Errorf("n %d: Between in place [%v, %v) %v, want %v", n, lo, hi, ix[:k], wx)
		}
		kept := slices.Clone(e)
		if got := KeepAtLeast(kept, x, v); !near(got, mass, want) {
			t.Errorf("n %d: KeepAtLeast(%v) %v, want %v", n, v, got, mass)
		}
		for i, l := range x {
			if w := e[i]; l < v && kept[i] != 0 || l >= v && kept[i] != w {
				t.Fatalf("n %d: KeepAtLeast(%v) left %v at logit %v, weight %v", n, v, kept[i], l, w)
			}
		}
		q := randRow(rng, n)
		for i := range q {
			q[i] = float32(math.Abs(float64(q[i])))
		}
		a, b := float32(1/want), float32(0.3)
		r := make([]float32, n)
		var rs float64
		for i := range r {
			w := math.Max(0, float64(e[i]*a)-float64(q[i]*b))
			rs += w
			r[i] = float32(w)
		}
		got := make([]float32, n)
		if s := Residual(got, e, a, q, b); !near(s, rs, rs+1) {
			t.Errorf("n %d: Residual sum %v, want %v", n, s, rs)
		}
		if err := closeTo(got, r, 1e-6); err != nil {
			t.Errorf("n %d: Residual: %v", n, err)
		}
		var qs float64
		lowest := float32(math.Inf(1))
		for i := range q {
			r[i] = q[i] * 3
			qs += float64(q[i])
			lowest = min(lowest, q[i])
		}
		if s := Scale(got, q, 3); !near(s, 3*qs, 3*qs) || !slices.Equal(got, r) {
			t.Errorf("n %d: Scale sum %v, want %v", n, s, 3*qs)
		}
		if s, l := SumMin(q); !near(s, qs, qs) || l != lowest {
			t.Errorf("n %d: SumMin %v %v, want %v %v", n, s, l, qs, lowest)
		}
		q[rng.IntN(n)] = float32(math.NaN())
		if s, _ := SumMin(q); s == s {
			t.Errorf("n %d: SumMin missed a NaN: %v", n, s)
		}
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = rng.Int32N(1<<20) - 1000
		}
		if lo, hi := RangeInt32(toks); lo != slices.Min(toks) || hi != slices.Max(toks) {
			t.Errorf("n %d: RangeInt32 [%d, %d], want [%d, %d]", n, lo, hi, slices.Min(toks), slices.Max(toks))
		}
	}
}

// TestHashBelow holds HashBelow to its definition over sampling.Mix32 (the
// hash sampling.Gumbel keys its noise by): over lengths around the vector
// width, tokens in order from a base and mapped, limits from 0 to past 1 (some at the
// hash's own value, the edge), it appends exactly the indices whose hash
// falls at or under the limit, in order, after what dst held.
func TestHashBelow(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	hash := func(tok, k0, k1 uint32) uint32 {
		return sampling.Mix32(sampling.Mix32(sampling.Mix32(tok^k0)+k1) ^ k0)
	}
	for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 1000, 151936} {
		for _, mapped := range []bool{false, true} {
			k0, k1 := rng.Uint32(), rng.Uint32()
			var tokens []int32
			if mapped {
				tokens = make([]int32, n)
				for i := range tokens {
					tokens[i] = int32(rng.IntN(1 << 20))
				}
			}
			base := 0
			if !mapped && n > 0 {
				base = rng.IntN(1000)
			}
			tok := func(i int) uint32 {
				if mapped {
					return uint32(tokens[i])
				}
				return uint32(base + i)
			}
			lim := make([]float32, n)
			for i := range lim {
				switch rng.IntN(4) {
				case 0:
					lim[i] = rng.Float32() * 1e-3
				case 1: // the hash's own value: at the edge, included
					lim[i] = float32(hash(tok(i), k0, k1)) * (1.0 / 4294967296)
				case 2:
					lim[i] = rng.Float32() * 1.5
				}
			}
			var want []int32
			for i := range lim {
				if float32(hash(tok(i), k0, k1))*(1.0/4294967296) <= lim[i] {
					want = append(want, int32(base+i))
				}
			}
			got := HashBelow([]int32{-7}, lim, tokens, base, k0, k1)
			if got[0] != -7 || !slices.Equal(got[1:], want) {
				t.Fatalf("n %d, mapped %v: %d indices (dst's first %d), want %d", n, mapped, len(got)-1, got[0], len(want))
			}
		}
	}
}
