package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// record runs one batch of record on d and waits for it.
func record(t *testing.T, d *gpu.Device, label string, rec func(b *gpu.Batch) error) {
	t.Helper()
	b, err := d.NewBatch(label)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec(b); err != nil {
		b.Discard()
		t.Fatal(err)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
}

// poisoned returns a buffer of n words, each a NaN.
func poisoned(t *testing.T, d *gpu.Device, name string, n int) *gpu.Buffer {
	t.Helper()
	buf, err := d.NewBuffer(name, uint64(n)*4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(buf.Release)
	if err := buf.Fill(gpu.NaN32); err != nil {
		t.Fatal(err)
	}
	return buf
}

func uploadU32(t *testing.T, d *gpu.Device, name string, v []uint32) *gpu.Buffer {
	t.Helper()
	buf, err := d.UploadU32(name, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(buf.Release)
	return buf
}

// TestStreamRead: each thread's sum of the words it read, every thread's
// written (sums poisoned first), for inputs of one partial vec4 block to
// several workgroups; bad sizes are refused.
func TestStreamRead(t *testing.T) {
	d := gputest.Device(t)
	r := rand.New(rand.NewPCG(uint64(t.Name()[0]), 7))
	const block = streamReadWG * streamReadV // vec4s a workgroup
	for _, words := range []int{1, 255, block, block + 1, 3*block + 77} {
		src := make([]uint32, 4*words)
		for i := range src {
			src[i] = r.Uint32()
		}
		bytes := uint64(len(src)) * 4
		n := StreamReadSums(bytes)
		if want := (words + block - 1) / block * streamReadWG; n != want {
			t.Fatalf("%d vec4s: %d sums, want %d", words, n, want)
		}
		want := make([]uint32, n)
		for i := range words {
			g, j := i/block, i%block
			for c := range 4 {
				want[g*streamReadWG+j%streamReadWG] += src[4*i+c]
			}
		}
		sb := uploadU32(t, d, "src", src)
		sums := poisoned(t, d, "sums", n)
		record(t, d, "stream_read", func(b *gpu.Batch) error { return StreamRead(b, sums, sb, bytes) })
		got, err := sums.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got[:n], want) {
			t.Fatalf("%d vec4s: sums differ", words)
		}
	}
	sb := uploadU32(t, d, "src", make([]uint32, 64))
	sums := poisoned(t, d, "sums", streamReadWG)
	record(t, d, "stream_read", func(b *gpu.Batch) error {
		for _, c := range []struct {
			name      string
			sums, src *gpu.Buffer
			bytes     uint64
		}{
			{"no bytes", sums, sb, 0},
			{"not a multiple of 16", sums, sb, 20},
			{"past the end", sums, sb, 272},
			{"nil source", sums, nil, 16},
			{"nil sums", nil, sb, 16},
		} {
			if err := StreamRead(b, c.sums, c.src, c.bytes); err == nil {
				t.Errorf("%s: accepted", c.name)
			}
		}
		return nil
	})
}

// TestFMA: the arithmetic yardstick computes what its header says (so its
// rounds cannot have been optimized away).
func TestFMA(t *testing.T) {
	d := gputest.Device(t)
	const groups = 2
	out := poisoned(t, d, "out", groups*fmaWG)
	record(t, d, "fma", func(b *gpu.Batch) error { return FMA(b, out, groups) })
	all, err := out.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	got := all[:groups*fmaWG]
	want := make([]float32, len(got))
	for i := range want {
		seed := float64(i&255) * 0.001
		var sum float64
		for acc := range 8 {
			for lane := range 4 {
				a := seed + 0.1*float64(lane) + float64(acc)
				for range fmaIters {
					a = a*float64(float32(0.999)) + float64(float32(0.001))
				}
				sum += a
			}
		}
		want[i] = float32(sum)
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*math.Abs(float64(want[i])) {
			t.Fatalf("thread %d: %g, want %g", i, got[i], want[i])
		}
	}
}

// TestIMAD: the integer yardstick computes what its header says, in
// wrapping u32 arithmetic.
func TestIMAD(t *testing.T) {
	d := gputest.Device(t)
	const groups = 2
	out := poisoned(t, d, "out", groups*fmaWG)
	record(t, d, "imad", func(b *gpu.Batch) error { return IMAD(b, out, groups) })
	all, err := out.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	m, c := uint32(fmaIters|1), math.Float32bits(0.001)
	for i, got := range all[:groups*fmaWG] {
		seed := uint32(i & 255)
		var sum uint32
		for acc := range uint32(8) {
			for lane := range uint32(4) {
				a := seed + lane + 10*acc
				for range fmaIters {
					a = a*m + c
				}
				sum += a
			}
		}
		if got != sum {
			t.Fatalf("thread %d: %d, want %d", i, got, sum)
		}
	}
}

// TestParamsMatchWGSL: each kernel's Go params struct has the fields of the
// WGSL struct it fills (gpu.CheckParams).
func TestParamsMatchWGSL(t *testing.T) {
	for _, k := range []gpu.Kernel{fmaKernel, imadKernel, streamReadKernel} {
		if err := gpu.CheckParams(k); err != nil {
			t.Error(err)
		}
	}
}
