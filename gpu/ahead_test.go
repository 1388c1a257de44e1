package gpu_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// TestBuildAhead queues pipelines of several module variants and entry
// points, records them into dry batches, and checks that BuildAhead builds
// them — each then runs, in a batch, as a pipeline built one at a time
// does — and that a dry batch runs nothing and cannot be submitted.
func TestBuildAhead(t *testing.T) {
	d := gputest.Fresh(t)
	const n = 300
	y := make([]float32, n)
	buf, err := d.UploadF32("y", y)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	twoEntries := affine
	twoEntries.Module = "affine_two_entries_test.wgsl"
	twoEntries.Source += `
@compute @workgroup_size(WG)
fn twice(@builtin(global_invocation_id) gid: vec3<u32>) {
	if gid.x < p.n { y[gid.x] = 2.0 * (y[gid.x] * p.mul + p.add); }
}`
	other := twoEntries
	other.Entry = "twice"
	wgs := []uint32{32, 64, 128, 256}
	before := d.PipelineNames()
	var queued []*gpu.Pipeline
	err = d.BuildAhead(func() error {
		b, err := d.NewDryBatch("dry")
		if err != nil {
			return err
		}
		defer b.Discard()
		for _, wg := range wgs {
			for _, k := range []gpu.Kernel{affine, twoEntries, other} {
				p, err := d.Pipeline(k, gpu.Consts{"WG": wg})
				if err != nil {
					return err
				}
				queued = append(queued, p)
				if err := gpu.Dispatch(b, p, affineParams(n, 2, 1), []gpu.Binding{buf.All()}, (n+wg-1)/wg, 1, 1); err != nil {
					return err
				}
			}
		}
		if b.Len() != len(queued) {
			return fmt.Errorf("dry batch Len = %d, want %d", b.Len(), len(queued))
		}
		if err := b.Submit(); err == nil || !strings.Contains(err.Error(), "dry") {
			return fmt.Errorf("submitting a dry batch: %v, want an error", err)
		}
		b2, err := d.NewDryBatch("dry read")
		if err != nil {
			return err
		}
		if _, err := b2.SubmitRead(buf.All()); err == nil || !strings.Contains(err.Error(), "dry") {
			return fmt.Errorf("submitting a dry batch with a read: %v, want an error", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	built := gputest.BuiltSince(d, before)
	if len(built) != len(queued) {
		t.Errorf("BuildAhead built %d pipelines, want %d: %v", len(built), len(queued), built)
	}
	if got, _ := buf.ReadF32(); slices.ContainsFunc(got, func(v float32) bool { return v != 0 }) {
		t.Fatal("a dry batch ran")
	}
	// Each pipeline, built ahead, runs as asked: y = 2·(2y + 1) for the
	// twice entries and 2y + 1 for the others, twelve times over.
	want := make([]float32, n)
	b, err := d.NewBatch("run")
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range queued {
		again, err := d.Pipeline([]gpu.Kernel{affine, twoEntries, other}[i%3], gpu.Consts{"WG": wgs[i/3]})
		if err != nil || again != p {
			t.Fatalf("pipeline %d asked for again: %p, %v; want the one built ahead, %p", i, again, err, p)
		}
		wg := wgs[i/3]
		if err := gpu.Dispatch(b, p, affineParams(n, 0.5, float32(i%4)), []gpu.Binding{buf.All()}, (n+wg-1)/wg, 1, 1); err != nil {
			t.Fatal(err)
		}
		for j := range want {
			want[j] = want[j]*0.5 + float32(i%4)
			if i%3 == 2 {
				want[j] *= 2
			}
		}
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	got, err := buf.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("after the pipelines built ahead ran: y[:4] = %v, want %v", got[:4], want[:4])
	}
	if len(gputest.BuiltSince(d, before)) != len(queued) {
		t.Error("running the pipelines built ahead built more")
	}
}

// TestBuildAheadFailures checks that a pipeline that fails to build ahead
// is reported by BuildAhead and again by the batch that records it, that
// the others build, and that pipelines left queued by a failed record are
// built by the first batch that records them.
func TestBuildAheadFailures(t *testing.T) {
	d := gputest.Fresh(t)
	broken := affine
	broken.Module = "broken_test.wgsl"
	broken.Source = strings.Replace(affine.Source, "y[gid.x] * p.mul", "y[gid.x] * p.nope", 1)
	buf, err := d.UploadF32("y", make([]float32, 64))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	var bad, good *gpu.Pipeline
	err = d.BuildAhead(func() error {
		if bad, err = d.Pipeline(broken, nil); err != nil {
			return fmt.Errorf("queueing: %w", err)
		}
		good, err = d.Pipeline(affine, gpu.Consts{"WG": 16})
		return err
	})
	// Natively the module's creation names it; in the browser the device's
	// check after the builds reports it, unnamed.
	if err == nil {
		t.Fatal("BuildAhead with a broken module reported no error")
	}
	run := func(p *gpu.Pipeline, wg uint32) error {
		b, err := d.NewBatch("run")
		if err != nil {
			return err
		}
		if err := gpu.Dispatch(b, p, affineParams(64, 1, 1), []gpu.Binding{buf.All()}, 64/wg, 1, 1); err != nil {
			b.Discard()
			return err
		}
		return b.Submit()
	}
	if err := run(good, 16); err != nil {
		t.Errorf("a pipeline built beside a broken one: %v", err)
	}
	if err := run(bad, 64); err == nil || !strings.Contains(err.Error(), "broken_test.wgsl") {
		t.Errorf("recording the broken pipeline: %v, want an error naming it", err)
	}

	stop := errors.New("stop")
	var left *gpu.Pipeline
	err = d.BuildAhead(func() error {
		if left, err = d.Pipeline(affine, gpu.Consts{"WG": 8}); err != nil {
			return err
		}
		return stop
	})
	if !errors.Is(err, stop) {
		t.Fatalf("BuildAhead whose record failed: %v, want its error", err)
	}
	if err := run(left, 8); err != nil {
		t.Errorf("a pipeline left queued: %v", err)
	}
	if got, _ := buf.ReadF32(); got[0] != 2 {
		t.Errorf("y[0] = %v after two runs adding 1, want 2", got[0])
	}
	if err := d.BuildAhead(func() error { return d.BuildAhead(func() error { return nil }) }); err == nil {
		t.Error("a nested BuildAhead was accepted")
	}
}
