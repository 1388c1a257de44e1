package kernels

import (
	"flag"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"webdraft/gpu"
	"webdraft/tensor"
	"webdraft/treemask"
)

var seed = flag.Uint64("seed", 0, "random seed for the kernel tests (0: from the clock)")

// newRand returns a fresh generator and logs its seed, so that a failure
// can be replayed with -seed.
func newRand(t *testing.T) *rand.Rand {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed %d)", s, s)
	return rand.New(rand.NewPCG(s, 0x5eed))
}

// randVec returns n normal values times scale.
func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// randMatrix returns a random (n, k) matrix in format f, and the same
// matrix as the reference engine reads it.
func randMatrix(t *testing.T, r *rand.Rand, f Format, n, k, g int) tensor.Matrix {
	t.Helper()
	w := randVec(r, n*k, 0.05)
	switch f {
	case Int4:
		m, err := tensor.QuantizeInt4(w, n, k, g)
		if err != nil {
			t.Fatal(err)
		}
		return m
	case F16:
		m := &tensor.F16{Rows: n, Cols: k, Data: make([]uint16, len(w))}
		for i, v := range w {
			m.Data[i] = tensor.F32ToF16(v)
		}
		return m
	}
	return &tensor.F32{Rows: n, Cols: k, Data: w}
}

func upload(t *testing.T, d *gpu.Device, name string, v []float32) *gpu.Buffer {
	t.Helper()
	b, err := d.UploadF32(name, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Release)
	return b
}

func uploadU32(t *testing.T, d *gpu.Device, name string, v []uint32) *gpu.Buffer {
	t.Helper()
	b, err := d.UploadU32(name, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Release)
	return b
}

// poisoned returns a buffer of n words filled with NaN, so that an output
// a kernel fails to write shows up.
func poisoned(t *testing.T, d *gpu.Device, name string, n int) *gpu.Buffer {
	t.Helper()
	b, err := d.NewBuffer(name, uint64(n)*4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Release)
	if err := b.Fill(gpu.NaN32); err != nil {
		t.Fatal(err)
	}
	return b
}

// poisonScratch fills the device's scratch buffer (at least n f32 values)
// with NaN, so that a kernel reading scratch it did not write fails.
func poisonScratch(t *testing.T, d *gpu.Device, n int) {
	t.Helper()
	b, err := d.Scratch(uint64(n) * 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Fill(gpu.NaN32); err != nil {
		t.Fatal(err)
	}
}

// poisonCountedScratch fills the scratch space of the device's counted
// scratch buffer, grown for counters and n f32 values, with NaN, and
// returns the bytes its counters take.
func poisonCountedScratch(t *testing.T, d *gpu.Device, counters, n int) uint64 {
	t.Helper()
	b, off, err := d.CountedScratch(counters, uint64(n)*4)
	if err != nil {
		t.Fatal(err)
	}
	nan := make([]uint32, (b.Size()-off)/4)
	for i := range nan {
		nan[i] = gpu.NaN32
	}
	if err := b.WriteU32(off, nan); err != nil {
		t.Fatal(err)
	}
	return off
}

// checkCountsZero checks that the counted scratch buffer's counters (its
// first bytes) are all back at zero, as the next dispatch needs them.
func checkCountsZero(t *testing.T, d *gpu.Device, bytes uint64) {
	t.Helper()
	b, off, err := d.CountedScratch(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if off != bytes {
		t.Fatalf("the counters moved: %d bytes, then %d", bytes, off)
	}
	all, err := b.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range all[:bytes/4] {
		if c != 0 {
			t.Fatalf("counter %d = %d after the dispatch, want 0", i, c)
		}
	}
}

// run records ops into one batch and submits it.
func run(t *testing.T, d *gpu.Device, label string, record func(b *gpu.Batch) error) {
	t.Helper()
	b, err := d.NewBatch(label)
	if err != nil {
		t.Fatal(err)
	}
	if err := record(b); err != nil {
		b.Discard()
		t.Fatal(err)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
}

func readF32(t *testing.T, b *gpu.Buffer, n int) []float32 {
	t.Helper()
	v, err := b.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	return v[:n]
}

// relErr is max|got − want| / max|want| (docs/reference.md, "Tolerances"); a NaN or Inf in
// got (an unwritten, poisoned output) makes it +Inf.
func relErr(got, want []float32) float64 {
	var diff, ref float64
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1)
		}
		diff = max(diff, math.Abs(g-float64(w)))
		ref = max(ref, math.Abs(float64(w)))
	}
	if ref == 0 {
		return diff
	}
	return diff / ref
}

// Tolerances of docs/reference.md, "Tolerances".
const (
	tolF32 = 1e-5 // f32 math
	tolF16 = 2e-3 // f16 storage or math
)

func checkClose(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	e := relErr(got, want)
	t.Logf("%s: relative error %.3g", what, e)
	if e > tol {
		i := worst(got, want)
		t.Errorf("%s: relative error %.3g > %g (worst at %d: got %v, want %v)", what, e, tol, i, got[i], want[i])
	}
}

// worst returns the index of the largest difference (or the first NaN).
func worst(got, want []float32) int {
	best, bi := -1.0, 0
	for i := range want {
		d := math.Abs(float64(got[i] - want[i]))
		if math.IsNaN(d) {
			return i
		}
		if d > best {
			best, bi = d, i
		}
	}
	return bi
}

// kernelPlanned stands, in tests, for the kernel the device's plan picks.
const kernelPlanned matMulKernel = -1

// choiceFor returns how kernel k (kernelPlanned: the plan's pick) runs T
// rows of w on d; false when k does not take them.
func choiceFor(d *gpu.Device, k matMulKernel, w *Matrix, T int) (matMulChoice, bool) {
	p, l := planFor(d), d.Limits()
	if k == kernelPlanned {
		return p.pick(w, T, l), true
	}
	return p.choose(k, w, T, l)
}

// uploadRows uploads a rows buffer (PutRow): row i of the sequence whose
// table row is seq[i], at cache slot slot[i], placed as place[i].
func uploadRows(t *testing.T, d *gpu.Device, seq, slot []uint32, place []treemask.Row) *gpu.Buffer {
	t.Helper()
	words := make([]uint32, len(seq)*RowWords)
	for i := range seq {
		PutRow(words[i*RowWords:], int(seq[i]), int(slot[i]), place[i])
	}
	return uploadU32(t, d, "rows", words)
}

// lineRows are the placements of line tokens at slots.
func lineRows(slots []uint32) []treemask.Row {
	rows := make([]treemask.Row, len(slots))
	for i, s := range slots {
		rows[i] = treemask.LineRow(int(s))
	}
	return rows
}
