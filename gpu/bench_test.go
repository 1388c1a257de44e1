//go:build !js

package gpu_test

import (
	"fmt"
	"reflect"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// BenchmarkRoundTrip times what every decode pass pays once besides its
// kernels: submitting a batch (here of one tiny dispatch) and reading 4
// bytes back, the wait included — with Read blocking in the driver
// ("wait") and polling without sleeping ("spin").
func BenchmarkRoundTrip(b *testing.B) {
	d := gputest.Device(b)
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		b.Fatal(err)
	}
	buf, err := d.UploadF32("y", make([]float32, 64))
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Release()
	for _, spin := range []bool{false, true} {
		name := map[bool]string{false: "wait", true: "spin"}[spin]
		for _, dispatches := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/dispatches=%d", name, dispatches), func(b *testing.B) {
				defer gpu.SetSpinPoll(gpu.SetSpinPoll(spin))
				for b.Loop() {
					bt, err := d.NewBatch("round trip")
					if err != nil {
						b.Fatal(err)
					}
					for range dispatches {
						if err := gpu.Dispatch(bt, p, affineParams(64, 1, 1), []gpu.Binding{buf.All()}, 1, 1, 1); err != nil {
							b.Fatal(err)
						}
					}
					if err := bt.Submit(); err != nil {
						b.Fatal(err)
					}
					if _, err := buf.Read(0, 4); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// chain6 is a benchmark kernel shaped like an engine's: five storage
// buffers read, one written, 16 bytes of params.
var chain6 = gpu.Kernel{
	Module: "chain6_test.wgsl",
	Entry:  "main",
	Source: `
struct Params { n: u32, a: f32, b: f32, c: u32 }
const VARIANT: u32 = 0u; // distinct values make distinct pipelines (BenchmarkDispatchCosts)
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x0: array<f32>;
@group(0) @binding(2) var<storage, read> x1: array<f32>;
@group(0) @binding(3) var<storage, read> x2: array<f32>;
@group(0) @binding(4) var<storage, read> x3: array<f32>;
@group(0) @binding(5) var<storage, read> x4: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
	let i = gid.x;
	if i < p.n { y[i] = x0[i] * p.a + x1[i] + x2[i] + x3[i] + x4[i] * p.b + f32(VARIANT); }
}`,
	Params:  reflect.TypeFor[chain6Args](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite},
}

type chain6Args struct {
	N    uint32
	A, B float32
	C    uint32
}

// BenchmarkHostCosts times what the host pays for the pieces of a step
// on this device, the GPU's own time kept out as far as it can be (the
// queue is drained untimed every 32 operations): a submission of an
// empty batch, a batch of 48 dispatches of a kernel bound like an
// engine's (each writing the buffer the next reads), and queued writes
// of 64 bytes before an empty submission.
func BenchmarkHostCosts(b *testing.B) {
	d := gputest.Device(b)
	p, err := d.Pipeline(chain6, nil)
	if err != nil {
		b.Fatal(err)
	}
	const n, nbuf = 1024, 8
	bufs := make([]*gpu.Buffer, nbuf)
	for i := range bufs {
		if bufs[i], err = d.UploadF32(fmt.Sprintf("x%d", i), make([]float32, n)); err != nil {
			b.Fatal(err)
		}
		defer bufs[i].Release()
	}
	drain := func(b *testing.B) {
		b.StopTimer()
		if _, err := bufs[0].Read(0, 4); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	run := func(b *testing.B, dispatches, writes int) {
		word := make([]byte, 64)
		ops := 0
		for b.Loop() {
			for w := range writes {
				if err := bufs[w%nbuf].Write(0, word); err != nil {
					b.Fatal(err)
				}
			}
			bt, err := d.NewBatch("host costs")
			if err != nil {
				b.Fatal(err)
			}
			for i := range dispatches {
				binds := make([]gpu.Binding, 6)
				for j := range binds {
					binds[j] = bufs[(i+j)%nbuf].All()
				}
				if err := gpu.Dispatch(bt, p, &chain6Args{N: n, A: 0.5, B: 0.25}, binds, n/64, 1, 1); err != nil {
					b.Fatal(err)
				}
			}
			if err := bt.Submit(); err != nil {
				b.Fatal(err)
			}
			if ops++; ops%32 == 0 {
				drain(b)
			}
		}
		if dispatches > 0 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*dispatches), "ns/dispatch")
		}
	}
	for _, c := range []struct{ dispatches, writes int }{{0, 0}, {8, 0}, {48, 0}, {96, 0}, {0, 1}, {0, 8}, {48, 8}} {
		b.Run(fmt.Sprintf("dispatches=%d/writes=%d", c.dispatches, c.writes), func(b *testing.B) { run(b, c.dispatches, c.writes) })
	}
}

// BenchmarkDispatchCosts times a dispatch's host cost, as BenchmarkHostCosts
// does at 48 a batch, by what an engine's dispatches differ in from that
// benchmark's: a pipeline change each dispatch (pipes: kernels in turn),
// and the buffers a step reads — a few, a step's worth of distinct ones
// (192), or as many ranges of one buffer — each dispatch writing one of
// eight others.
func BenchmarkDispatchCosts(b *testing.B) {
	d := gputest.Device(b)
	const n, perBatch = 1024, 48
	pipes := make([]*gpu.Pipeline, 6)
	for i := range pipes {
		var err error
		if pipes[i], err = d.Pipeline(chain6, gpu.Consts{"VARIANT": uint32(i)}); err != nil {
			b.Fatal(err)
		}
	}
	upload := func(name string, words int) *gpu.Buffer {
		buf, err := d.UploadF32(name, make([]float32, words))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(buf.Release)
		return buf
	}
	align := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	stride := (n*4 + align - 1) / align * align
	big := upload("big", 192*int(stride)/4)
	outs := make([]gpu.Binding, 8)
	for i := range outs {
		outs[i] = upload(fmt.Sprintf("y%d", i), n).All()
	}
	many, ranges := make([]gpu.Binding, 192), make([]gpu.Binding, 192)
	for i := range many {
		many[i] = upload(fmt.Sprintf("x%d", i), n).All()
		ranges[i] = big.Slice(uint64(i)*stride, n*4)
	}
	for _, np := range []int{1, 6} {
		for _, in := range []struct {
			name  string
			binds []gpu.Binding
		}{{"buffers=8", many[:8]}, {"buffers=192", many}, {"ranges=192", ranges}} {
			b.Run(fmt.Sprintf("pipes=%d/%s", np, in.name), func(b *testing.B) {
				ops, next := 0, 0
				binds := make([]gpu.Binding, 6)
				for b.Loop() {
					bt, err := d.NewBatch("dispatch costs")
					if err != nil {
						b.Fatal(err)
					}
					for i := range perBatch {
						for j := range 5 {
							binds[j] = in.binds[(next+j)%len(in.binds)]
						}
						binds[5] = outs[i%len(outs)]
						next += 5
						if err := gpu.Dispatch(bt, pipes[i%np], &chain6Args{N: n, A: 0.5, B: 0.25}, binds, n/64, 1, 1); err != nil {
							b.Fatal(err)
						}
					}
					if err := bt.Submit(); err != nil {
						b.Fatal(err)
					}
					if ops++; ops%32 == 0 {
						b.StopTimer()
						if _, err := big.Read(0, 4); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perBatch), "ns/dispatch")
			})
		}
	}
}
