package bench

import (
	"context"
	"strings"
	"testing"

	"webdraft/engine/webgpu"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
)

// TestFloorPasses: StepFloor's passes cover a step's bytes — every matrix
// once and each layer's KV cache — five a layer, the head and the merge,
// none over the binding limit.
func TestFloorPasses(t *testing.T) {
	cfg := synth.Shapes["qwen3-1.7b"]
	const context, elem = 1024, 2
	kv := uint64(cfg.NumHiddenLayers) * uint64(context) * uint64(2*cfg.KVDim()*elem)
	for _, c := range []struct {
		limit  uint64
		passes int
	}{
		{1 << 40, 5*cfg.NumHiddenLayers + 2},
		{64 << 20, 5*cfg.NumHiddenLayers + 4}, // the 160 MB head in three
	} {
		passes := floorPasses(&cfg, context, elem, c.limit)
		var sum uint64
		for _, n := range passes {
			if n == 0 || n%16 != 0 || n > c.limit {
				t.Fatalf("limit %d: a pass of %d bytes", c.limit, n)
			}
			sum += n
		}
		if len(passes) != c.passes || sum != WeightBytes(&cfg)+kv+16 {
			t.Errorf("limit %d: %d passes of %d bytes, want %d of %d", c.limit, len(passes), sum, c.passes, WeightBytes(&cfg)+kv+16)
		}
	}
}

// TestMeasurements runs each measurement of `webdraft bench engine` once on
// a tiny random model: they complete and report plausible figures.
func TestMeasurements(t *testing.T) {
	d := gputest.Device(t)
	cfg := synth.Shapes["tiny"]
	e, err := webgpu.New(d, cfg, synth.Int4Weights(cfg, 1, 0.02), webgpu.Options{KVBytes: 8 << 20, MaxSequences: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	if bw, _, err := CopyBandwidth(d, 1<<20, 2); err != nil || bw <= 0 {
		t.Errorf("copy: %v, %v", bw, err)
	}
	if r, err := FMARate(d, 2); err != nil || r <= 0 {
		t.Errorf("fma: %v, %v", r, err)
	}
	if r, err := IMADRate(d, 2); err != nil || r <= 0 {
		t.Errorf("imad: %v, %v", r, err)
	}
	if f, err := StepFloor(d, &cfg, 10, 2, 2); err != nil || f.Step <= 0 || f.Record <= 0 || f.Passes != 5*cfg.NumHiddenLayers+2 {
		t.Errorf("step floor: %+v, %v", f, err)
	}
	if step, err := Decode(ctx, e, 3, 10, 2); err != nil || step <= 0 {
		t.Errorf("decode: %v, %v", step, err)
	}
	if step, err := Drafts(ctx, e, 2, 10, 8, 4); err != nil || step <= 0 {
		t.Errorf("chained decode: %v, %v", step, err)
	}
	if pre, err := Prefill(ctx, e, 12, 1); err != nil || pre <= 0 {
		t.Errorf("prefill: %v, %v", pre, err)
	}
	if !d.Timestamps() {
		t.Skip("no timestamp queries: profiling not checked")
	}
	period, err := TickPeriod(d)
	if err != nil || period <= 0 {
		t.Fatalf("tick period: %v, %v", period, err)
	}
	kernels, err := ProfileDecode(ctx, e, 2, 10, period)
	if err != nil || len(kernels) == 0 {
		t.Fatalf("profile: %v, %v", kernels, err)
	}
	// Whichever int4 matmul kernel the batch size picks, and attention.
	var matmul, attention bool
	for _, k := range kernels {
		module, _, _ := strings.Cut(k.Name, ":")
		switch {
		case strings.HasSuffix(module, "_int4.wgsl") && !strings.HasPrefix(module, "embed"):
			matmul = true
		case module == "attention_decode.wgsl":
			attention = true
		}
	}
	if !matmul || !attention {
		t.Errorf("profile lacks the matmul or attention kernels: %v", kernels)
	}
	// A verification reads every row out: the argmax over the vocabulary
	// once, its matmuls and attention as a step's.
	verify, err := ProfileVerify(ctx, e, 5, 10, period)
	if err != nil {
		t.Fatalf("profile a verification: %v", err)
	}
	counts := map[string]int{}
	for _, k := range verify {
		counts[k.Name] = k.Dispatches
	}
	if counts["argmax.wgsl:partial"] != 1 || counts["attention_decode.wgsl:main"] != cfg.NumHiddenLayers {
		t.Errorf("a verification's profile: %v, want one argmax and attention a layer", verify)
	}
	if _, err := ProfileVerify(ctx, e, 0, 10, period); err == nil {
		t.Error("a verification of 0 rows profiled, want an error")
	}
}
