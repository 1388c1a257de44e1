package bench

import (
	"fmt"
	"time"

	"webdraft/gpu"
	"webdraft/qwen3"
)

// Floor is StepFloor's measurement.
type Floor struct {
	Step   time.Duration // the GPU's time for the skeleton step
	Record time.Duration // the host's time to record it (Step is the GPU's only when it is longer)
	Passes int
}

// StepFloor times the skeleton of a batch-1 decode step at a context of
// context tokens (kvElemBytes a cache element): each of a decoder layer's
// five dependent phases — the normalized q|k|v projection, attention, o_proj,
// the normalized gate|up, down_proj, each needing all of the one before —
// reduced to one pass that reads the phase's bytes once (StreamRead:
// the projection's int4 words and scales, or the layer's KV cache), then the
// head's and a 16-byte pass for the argmax's merge; every pass dependent on
// the one before, over bytes of its own (a step's worth, more than the GPU's
// caches hold), in one batch: what a step of dispatches costs before any
// arithmetic. A phase larger than one binding takes several passes, as
// the engine splits such a matrix into row blocks.
func StepFloor(d *gpu.Device, c *qwen3.Config, context, kvElemBytes, reps int) (Floor, error) {
	l := d.Limits()
	passes := floorPasses(c, context, kvElemBytes, min(l.MaxStorageBufferBindingSize, l.MaxBufferSize))
	var bufs []*gpu.Buffer
	defer func() {
		for _, b := range bufs {
			b.Release()
		}
	}()
	nsums := 0
	for i, n := range passes {
		b, err := d.NewBuffer(fmt.Sprintf("floor_%d", i), n)
		if err != nil {
			return Floor{}, err
		}
		bufs = append(bufs, b)
		nsums = max(nsums, StreamReadSums(n))
	}
	sums, err := d.NewBuffer("floor_sums", uint64(nsums)*4)
	if err != nil {
		return Floor{}, err
	}
	defer sums.Release()
	record := func(b *gpu.Batch) error {
		for i, n := range passes {
			if err := StreamRead(b, sums, bufs[i], n); err != nil {
				return err
			}
		}
		return nil
	}
	f := Floor{Passes: len(passes)}
	if f.Step, err = run(d, sums, reps, record); err != nil {
		return Floor{}, err
	}
	start := time.Now()
	for range reps {
		b, err := d.NewBatch("floor record")
		if err != nil {
			return Floor{}, err
		}
		err = record(b)
		b.Discard()
		if err != nil {
			return Floor{}, err
		}
	}
	f.Record = time.Since(start) / time.Duration(reps)
	return f, nil
}

// floorPasses returns the bytes of StepFloor's passes: a layer's five
// phases for each layer, the head, the argmax's merge — each rounded up to
// 16 bytes and split into passes of at most limit bytes (a whole number of
// 32 KB blocks).
func floorPasses(c *qwen3.Config, context, kvElemBytes int, limit uint64) []uint64 {
	kv := uint64(context) * uint64(2*c.KVDim()*kvElemBytes)
	layer := []uint64{
		int4Bytes(c.QDim()+2*c.KVDim(), c.HiddenSize),
		kv,
		int4Bytes(c.HiddenSize, c.QDim()),
		int4Bytes(2*c.IntermediateSize, c.HiddenSize),
		int4Bytes(c.HiddenSize, c.IntermediateSize),
	}
	var phases []uint64
	for range c.NumHiddenLayers {
		phases = append(phases, layer...)
	}
	phases = append(phases, int4Bytes(c.VocabSize, c.HiddenSize), 16)
	most := max(16, limit&^(32<<10-1))
	var passes []uint64
	for _, n := range phases {
		for n = max(16, (n+15)&^15); n > most; n -= most {
			passes = append(passes, most)
		}
		passes = append(passes, n)
	}
	return passes
}
