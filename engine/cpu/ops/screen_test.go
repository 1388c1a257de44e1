package ops

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestScreen holds the screening kernel to its definition (quantize8Go's
// input, each weight's code and scale, summed in float64) over poisoned
// outputs and a split of the rows as workers take them, and its results
// to within ScreenBound of the exact kernel's, on rows with an outlier
// column, as a model's last hidden state has.
func TestScreen(t *testing.T) {
	if !hasScreen {
		t.Skip("no screening kernel on this machine (AVX-512 VNNI, GOEXPERIMENT=simd)")
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
	for _, format := range []string{"int4g32", "int4g64", "int4g128"} {
		for _, shape := range [][2]int{{16, 32}, {37, 64}, {300, 256}, {129, 384}} {
			rows, cols := shape[0], shape[1]
			var g int
			if fmt.Sscanf(format, "int4g%d", &g); cols%g != 0 {
				continue
			}
			l := NewLinear(randMatrix(t, rng, format, rows, cols))
			if !l.EnableScreen() || !l.Screens() {
				t.Fatalf("%s: EnableScreen refused a fixed-point matrix", format)
			}
			checkScreenMax(t, l)
			for _, T := range []int{1, 3, 8, 9} {
				t.Run(fmt.Sprintf("%s/%dx%d/T%d", format, rows, cols, T), func(t *testing.T) {
					x := randRow(rng, T*cols)
					for r := range T {
						x[r*cols+rng.IntN(cols)] *= 40 // an outlier column
					}
					in := NewInput(l)
					in.Resize(T, cols)
					for r := range T {
						in.Set(r, x[r*cols:(r+1)*cols])
					}
					exact := make([]float32, T*rows)
					l.MulRows(exact, rows, in, 0, rows, false, make([]float32, l.ScratchLen()))
					got := make([]float32, T*rows+16)
					for i := range got {
						got[i] = float32(math.NaN())
					}
					lo, hi := rng.IntN(rows), rows // a worker's share, then the rest
					l.Screen(got, rows, in, lo, hi)
					l.Screen(got, rows, in, 0, lo)
					for i := T * rows; i < len(got); i++ {
						if !math.IsNaN(float64(got[i])) {
							t.Fatalf("wrote %v past the output at %d", got[i], i)
						}
					}
					want := screenGo(l, in)
					for tt := range T {
						bound := l.ScreenBound(in, tt)
						var worst float64
						for r := range rows {
							i := tt*rows + r
							if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5*math.Max(1, math.Abs(want[i])) || math.IsNaN(float64(got[i])) {
								t.Fatalf("input %d row %d: %v, its definition %v", tt, r, got[i], want[i])
							}
							d := math.Abs(float64(got[i] - exact[i]))
							worst = math.Max(worst, d)
							if d > bound {
								t.Fatalf("input %d row %d: %v, exact %v: |Δ| %.4g past the bound %.4g", tt, r, got[i], exact[i], d, bound)
							}
						}
						if bound <= 0 || worst > 0 && bound > 200*worst {
							t.Errorf("input %d: bound %.4g against a largest |Δ| of %.4g", tt, bound, worst)
						}
					}
				})
			}
		}
	}
}

// checkScreenMax holds A_b to the matrix's own weights.
func checkScreenMax(t *testing.T, l *Linear) {
	t.Helper()
	nb := l.Cols / Block
	want := make([]float64, nb)
	row := make([]float32, l.Cols)
	for r := range l.Rows {
		l.Row(r, row)
		for b := range nb {
			var s float64
			for _, w := range row[b*Block : (b+1)*Block] {
				s += math.Abs(float64(w))
			}
			want[b] = math.Max(want[b], s)
		}
	}
	for b := range nb {
		if math.Abs(l.screenMax[b]-want[b]) > 1e-9*want[b] {
			t.Fatalf("A_%d = %v, the weights' %v", b, l.screenMax[b], want[b])
		}
	}
}

// screenGo is the screening product by its definition, in float64: per
// block, the weight's value times the input's s·(v − lo).
func screenGo(l *Linear, in *Input) []float64 {
	nb, n := l.Cols/Block, fixedStride(l.Cols)
	out := make([]float64, in.T*l.Rows)
	w := make([]float32, l.Cols)
	for r := range l.Rows {
		l.Row(r, w)
		for t := range in.T {
			x := in.fixed[t*n : (t+1)*n]
			var sum float64
			for b := range nb {
				s := float64(math.Float32frombits(binary.LittleEndian.Uint32(x[96*nb+12*b:])))
				for j := range Block {
					v := fixedValue(x, b, j) - int32(int8(x[96*b+64+j]))
					sum += float64(w[b*Block+j]) * s * float64(v)
				}
			}
			out[t*l.Rows+r] = sum
		}
	}
	return out
}

// TestScreenNaN: a row holding a NaN gets no finite bound.
func TestScreenNaN(t *testing.T) {
	if !hasScreen {
		t.Skip("no screening kernel on this machine")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	l := NewLinear(randMatrix(t, rng, "int4g32", 32, 64))
	l.EnableScreen()
	in := NewInput(l)
	in.Resize(2, 64)
	x := randRow(rng, 64)
	in.Set(0, x)
	x[5] = float32(math.Inf(1))
	in.Set(1, x)
	if b := l.ScreenBound(in, 0); math.IsInf(b, 0) || b <= 0 {
		t.Errorf("a finite row's bound %v", b)
	}
	if b := l.ScreenBound(in, 1); !math.IsInf(b, 1) {
		t.Errorf("a row with an infinity: bound %v, want +Inf", b)
	}
}

// BenchmarkScreen is the screening kernel against MulRows on the
// embedded target's head shape, one worker, by input rows.
func BenchmarkScreen(b *testing.B) {
	if !hasScreen {
		b.Skip("no screening kernel on this machine")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rows, cols := 151936, 256
	l := NewLinear(randMatrix(b, rng, "int4g32", rows, cols))
	l.EnableScreen()
	for _, T := range []int{1, 3, 4, 7} {
		in := NewInput(l)
		in.Resize(T, cols)
		x := randRow(rng, T*cols)
		for r := range T {
			in.Set(r, x[r*cols:(r+1)*cols])
		}
		out := make([]float32, T*rows)
		scratch := make([]float32, l.ScratchLen())
		b.Run(fmt.Sprintf("T%d/exact", T), func(b *testing.B) {
			for b.Loop() {
				l.MulRows(out, rows, in, 0, rows, false, scratch)
			}
		})
		b.Run(fmt.Sprintf("T%d/screen", T), func(b *testing.B) {
			for b.Loop() {
				l.Screen(out, rows, in, 0, rows)
			}
		})
	}
}
