package bench

import (
	"fmt"
	"math/rand/v2"
	"time"

	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
	"webdraft/tensor"
)

// run times reps batches of record, waiting for the GPU after the last
// (a one-word readback of sync), and returns the time per batch.
func run(d *gpu.Device, sync *gpu.Buffer, reps int, record func(*gpu.Batch) error) (time.Duration, error) {
	once := func(n int) (time.Duration, error) {
		start := time.Now()
		for range n {
			b, err := d.NewBatch("bench")
			if err != nil {
				return 0, err
			}
			if err := record(b); err != nil {
				b.Discard()
				return 0, err
			}
			if err := b.Submit(); err != nil {
				return 0, err
			}
		}
		if _, err := sync.Read(0, 4); err != nil {
			return 0, err
		}
		return time.Since(start) / time.Duration(n), nil
	}
	if _, err := once(2); err != nil { // warm up: pipelines, caches, clocks
		return 0, err
	}
	return once(reps)
}

// WarmUp keeps d's GPU busy with the arithmetic yardstick's kernel for at
// least dur, so that the yardsticks measured next find its clocks raised:
// an idle NVIDIA H200 measured first thing ran the copy at 1.2 TB/s and
// the multiply-adds at 8.8 TFLOP/s, against 3–4 TB/s and 51 TFLOP/s warm.
// Software adapters (lavapipe, SwiftShader) have no clocks to raise and
// are left alone.
func WarmUp(d *gpu.Device, dur time.Duration) error {
	if d.Info().Software() {
		return nil
	}
	groups := min(4096, int(d.Limits().MaxComputeWorkgroupsPerDimension))
	out, err := d.NewBuffer("warm_out", uint64(groups)*256*4)
	if err != nil {
		return err
	}
	defer out.Release()
	for start := time.Now(); time.Since(start) < dur; {
		if _, err := run(d, out, 1, func(b *gpu.Batch) error { return FMA(b, out, groups) }); err != nil {
			return fmt.Errorf("bench: warm-up: %w", err)
		}
	}
	return nil
}

// CopyBandwidth copies a buffer of the given size (capped by the device's
// binding limit) and returns bytes read plus written per second.
func CopyBandwidth(d *gpu.Device, bytes uint64, reps int) (float64, uint64, error) {
	bytes = min(bytes, d.Limits().MaxStorageBufferBindingSize) &^ 15
	src, err := d.NewBuffer("copy_src", bytes)
	if err != nil {
		return 0, 0, err
	}
	defer src.Release()
	dst, err := d.NewBuffer("copy_dst", bytes)
	if err != nil {
		return 0, 0, err
	}
	defer dst.Release()
	const perBatch = 4
	t, err := run(d, dst, reps, func(b *gpu.Batch) error {
		for range perBatch {
			if err := kernels.Copy(b, dst, src, bytes); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return float64(2*bytes*perBatch) / t.Seconds(), bytes, nil
}

// FMARate runs the arithmetic yardstick (FMA) and returns f32
// flops per second: the limit compute-bound work (a prefill's matmuls) is
// compared with. The grid grows fourfold from 16 workgroups until a
// dispatch takes a few milliseconds or reaches 4,096 workgroups, enough to
// fill a large GPU (a CPU implementation such as lavapipe stops far
// earlier). A single probe is not enough to size it: a handful of
// workgroups on a large GPU measures launch latency, not arithmetic.
func FMARate(d *gpu.Device, reps int) (float64, error) {
	return arithmeticRate(d, reps, FMA)
}

// IMADRate runs the integer yardstick (IMAD) as FMARate runs FMA and
// returns 32-bit integer operations per second (a multiply-add counted as
// two): the limit of integer dot products of unpacked int4 codes.
func IMADRate(d *gpu.Device, reps int) (float64, error) {
	return arithmeticRate(d, reps, IMAD)
}

// arithmeticRate is FMARate's measurement of record (FMA or IMAD).
func arithmeticRate(d *gpu.Device, reps int, record func(*gpu.Batch, *gpu.Buffer, int) error) (float64, error) {
	maxGroups := min(4096, int(d.Limits().MaxComputeWorkgroupsPerDimension))
	out, err := d.NewBuffer("arithmetic_out", uint64(maxGroups)*256*4)
	if err != nil {
		return 0, err
	}
	defer out.Release()
	timed := func(groups, reps int) (time.Duration, error) {
		return run(d, out, reps, func(b *gpu.Batch) error { return record(b, out, groups) })
	}
	groups := 16
	for groups < maxGroups {
		t, err := timed(groups, 1)
		if err != nil {
			return 0, err
		}
		if t > 2*time.Millisecond {
			break
		}
		groups = min(maxGroups, 4*groups)
	}
	t, err := timed(groups, reps)
	if err != nil {
		return 0, err
	}
	return float64(groups*256*FMAFlops) / t.Seconds(), nil
}

// MatVec is one int4 matrix × vector measurement.
type MatVec struct {
	Name  string
	N, K  int
	Bytes uint64 // weights and scales read
	// Dependent is the time of one matvec among dependent ones (each
	// writes what the next overwrites), as in a decode step: dispatch
	// latency included. Streamed is the time per matvec of independent
	// ones over distinct copies of the matrix (more bytes than the GPU's
	// caches hold, distinct outputs): the kernel's bandwidth.
	Dependent, Streamed time.Duration
	// Copy is the time per copy of the same number of bytes (half read,
	// half written), streamed the same way over distinct buffers: what
	// any one dispatch moving that much memory costs on this device —
	// for matrices of a few megabytes, launch and ramp-up more than
	// bandwidth.
	Copy time.Duration
}

// GBps is the effective bandwidth over the weights, streamed.
func (m MatVec) GBps() float64 { return float64(m.Bytes) / m.Streamed.Seconds() / 1e9 }

// CopyGBps is the bandwidth of the copies of the same size (bytes read
// plus written).
func (m MatVec) CopyGBps() float64 { return float64(m.Bytes) / m.Copy.Seconds() / 1e9 }

// streamBytes is how many bytes of matrix copies the streamed measurement
// reads a batch: more than a GPU's last-level cache (the H200's is 60 MB).
const streamBytes = 256 << 20

// MatVecs times out = x·Wᵀ at T = 1 for each of a layer's int4 matrices
// (random weights), and for the head: dependent and streamed (see MatVec).
func MatVecs(d *gpu.Device, c *qwen3.Config, reps int) ([]MatVec, error) {
	shapes := []MatVec{
		{Name: "q_proj", N: c.QDim(), K: c.HiddenSize},
		{Name: "k_proj / v_proj", N: c.KVDim(), K: c.HiddenSize},
		{Name: "o_proj", N: c.HiddenSize, K: c.QDim()},
		{Name: "gate+up", N: 2 * c.IntermediateSize, K: c.HiddenSize},
		{Name: "down_proj", N: c.HiddenSize, K: c.IntermediateSize},
		{Name: "lm_head", N: c.VocabSize, K: c.HiddenSize},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range shapes {
		if err := matVec(d, &shapes[i], rng, reps); err != nil {
			return nil, fmt.Errorf("%s: %w", shapes[i].Name, err)
		}
	}
	return shapes, nil
}

func matVec(d *gpu.Device, s *MatVec, rng *rand.Rand, reps int) error {
	m := &tensor.Int4{Rows: s.N, Cols: s.K, GroupSize: tensor.DefaultGroupSize,
		QWeight: make([]uint32, s.N*s.K/8), Scales: make([]uint16, s.N*s.K/tensor.DefaultGroupSize)}
	for j := range m.QWeight {
		m.QWeight[j] = rng.Uint32()
	}
	for j := range m.Scales {
		m.Scales[j] = tensor.F32ToF16(0.01)
	}
	s.Bytes = uint64(len(m.QWeight))*4 + uint64(len(m.Scales))*2
	copies := int(min(64, max(1, streamBytes/s.Bytes)))
	var ws []*kernels.Matrix
	var outs []*gpu.Buffer
	defer func() {
		for _, w := range ws {
			w.Release()
		}
		for _, o := range outs {
			o.Release()
		}
	}()
	for range copies {
		w, err := kernels.UploadMatrix(d, s.Name, m)
		if err != nil {
			return err
		}
		ws = append(ws, w)
		out, err := d.NewBuffer("out", uint64(s.N)*4)
		if err != nil {
			return err
		}
		outs = append(outs, out)
	}
	x, err := d.UploadF32("x", make([]float32, s.K))
	if err != nil {
		return err
	}
	defer x.Release()
	const perBatch = 16
	t, err := run(d, outs[0], reps, func(b *gpu.Batch) error {
		for range perBatch {
			if err := kernels.MatMul(b, outs[0], x, ws[0], 1, false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.Dependent = t / perBatch
	t, err = run(d, outs[0], reps, func(b *gpu.Batch) error {
		for i, w := range ws {
			if err := kernels.MatMul(b, outs[i], x, w, 1, false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.Streamed = t / time.Duration(copies)
	s.Copy, err = copiesStreamed(d, s.Bytes/2, copies, reps)
	return err
}

// copiesStreamed times n independent copies of bytes each (rounded down to
// 16), over distinct buffers, per copy.
func copiesStreamed(d *gpu.Device, bytes uint64, n, reps int) (time.Duration, error) {
	bytes &^= 15
	var bufs []*gpu.Buffer
	defer func() {
		for _, b := range bufs {
			b.Release()
		}
	}()
	for i := range 2 * n {
		b, err := d.NewBuffer(fmt.Sprintf("copy_%d", i), bytes)
		if err != nil {
			return 0, err
		}
		bufs = append(bufs, b)
	}
	t, err := run(d, bufs[1], reps, func(b *gpu.Batch) error {
		for i := range n {
			if err := kernels.Copy(b, bufs[2*i+1], bufs[2*i], bytes); err != nil {
				return err
			}
		}
		return nil
	})
	return t / time.Duration(n), err
}

// WeightBytes is what one decode step must read: every matrix's int4 words
// and scales (and the head once more when it is not tied).
func WeightBytes(c *qwen3.Config) uint64 {
	layer := int4Bytes(c.QDim(), c.HiddenSize) + 2*int4Bytes(c.KVDim(), c.HiddenSize) + int4Bytes(c.HiddenSize, c.QDim()) +
		3*int4Bytes(c.IntermediateSize, c.HiddenSize)
	return uint64(c.NumHiddenLayers)*layer + int4Bytes(c.VocabSize, c.HiddenSize)
}

// int4Bytes is an n×k int4 matrix's words and scales.
func int4Bytes(n, k int) uint64 {
	return uint64(n*k)/2 + uint64(n*k/tensor.DefaultGroupSize)*2
}

// Params counts the weights one token's forward pass multiplies by (the
// layers and the head), for FLOP rates: 2·Params per token.
func Params(c *qwen3.Config) int64 {
	layer := int64(c.QDim()+2*c.KVDim())*int64(c.HiddenSize) + int64(c.HiddenSize)*int64(c.QDim()) +
		3*int64(c.IntermediateSize)*int64(c.HiddenSize)
	return int64(c.NumHiddenLayers)*layer + int64(c.VocabSize)*int64(c.HiddenSize)
}

// DispatchOverhead times n dependent dispatches of a tiny kernel (a 16-byte
// copy back and forth) in one batch: the fixed cost of a dispatch, which
// every kernel pays on top of its work.
func DispatchOverhead(d *gpu.Device, n int) (time.Duration, error) {
	a, err := d.NewBuffer("tiny_a", 256)
	if err != nil {
		return 0, err
	}
	defer a.Release()
	b2, err := d.NewBuffer("tiny_b", 256)
	if err != nil {
		return 0, err
	}
	defer b2.Release()
	t, err := run(d, a, 5, func(b *gpu.Batch) error {
		for i := range n {
			src, dst := a, b2
			if i%2 == 1 {
				src, dst = b2, a
			}
			if err := kernels.Copy(b, dst, src, 16); err != nil {
				return err
			}
		}
		return nil
	})
	return t / time.Duration(n), err
}

// TickPeriod calibrates timestamp ticks: a large copy timed by the wall
// clock (back to back, so GPU-bound) and by timestamps gives the seconds per
// tick (WebGPU leaves the period to the implementation).
func TickPeriod(d *gpu.Device) (float64, error) {
	bytes := min(uint64(256<<20), d.Limits().MaxStorageBufferBindingSize) &^ 15
	src, err := d.NewBuffer("period_src", bytes)
	if err != nil {
		return 0, err
	}
	defer src.Release()
	dst, err := d.NewBuffer("period_dst", bytes)
	if err != nil {
		return 0, err
	}
	defer dst.Release()
	const copies = 8
	wall, err := run(d, dst, 4, func(b *gpu.Batch) error {
		for range copies {
			if err := kernels.Copy(b, dst, src, bytes); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	b, err := d.NewBatch("period")
	if err != nil {
		return 0, err
	}
	if err := b.Profile(copies); err != nil {
		b.Discard()
		return 0, err
	}
	for range copies {
		if err := kernels.Copy(b, dst, src, bytes); err != nil {
			b.Discard()
			return 0, err
		}
	}
	if err := b.Submit(); err != nil {
		return 0, err
	}
	p, err := b.Results()
	if err != nil {
		return 0, err
	}
	if p.Total() == 0 {
		return 0, fmt.Errorf("timestamps did not advance")
	}
	return wall.Seconds() / float64(p.Total()), nil
}
