//go:build !js

package gridsync_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// gridSync is a test kernel of synchronization across all the workgroups
// of one dispatch — the grid barrier a persistent kernel would put between
// a decoder layer's phases, where today each phase is a dispatch. It is
// outside WebGPU's guarantees: a workgroup spins until every other has
// arrived, so all of them must be resident at once (a few per SM on a
// GPU; on lavapipe, with two workgroups, the spin ended early and the
// count fell short, so the tests here skip CPU adapters).
//
// Phase ph of p.phases: thread 0 of workgroup g checks that its neighbour
// g+1 wrote phase ph−1's value (or already ph's), writes its own, and the
// workgroup arrives at the barrier: FENCE = 1 storageBarrier (device scope:
// MEMBAR.SC.GPU on NVIDIA), thread 0 adds one to the arrival counter and
// spins until it reaches count0 + (ph+1)·groups, storageBarrier again. The
// counter is never reset: the host passes what it held before the dispatch
// (count0), and the comparison is modulo 2³². FENCE = 0 takes
// workgroupBarriers instead (timing only: no order across workgroups).
//
// With LOADS > 0 each thread also reads LOADS vec4s of w a phase, slice
// (p.ph0 + ph) % p.slices (coalesced): with PREFETCH = 0 after the
// barrier, used at once; with PREFETCH = 1 the next phase's go out before
// the barrier, as a persistent kernel would load its next weights while
// it waits.
//
// Buffers: sync [0] the counter, [1] errors seen; data (groups) the
// phase values; w the loaded words; out (groups·WG) a sum of them.
// Dispatch: (groups, 1, 1).
// gridSyncParams is gridSync's params.
type gridSyncParams struct {
	Phases, Groups, Count0, Slices, Ph0 uint32
	_, _, _                             uint32
}

var gridSync = gpu.Kernel{
	Module: "grid_sync_test.wgsl",
	Entry:  "main",
	Source: `
const WG: u32 = 128u;
const FENCE: u32 = 1u;
const LOADS: u32 = 0u;
const PREFETCH: u32 = 0u;
const LMAX: u32 = 16u;
struct Params { phases: u32, groups: u32, count0: u32, slices: u32, ph0: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> sync: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> data: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

fn barrier() {
	if FENCE == 1u {
		storageBarrier();
	} else {
		workgroupBarrier();
	}
}

fn grid_sync(lid: u32, goal: u32) {
	barrier();
	if lid == 0u {
		atomicAdd(&sync[0], 1u);
		loop {
			if i32(atomicLoad(&sync[0]) - goal) >= 0 {
				break;
			}
		}
	}
	barrier();
}

fn load(ph: u32, g: u32, lid: u32, i: u32) -> vec4<u32> {
	return w[((((p.ph0 + ph) % p.slices) * p.groups + g) * LOADS + i) * WG + lid];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
	let g = wid.x;
	let next = (g + 1u) % p.groups;
	var acc = vec4<u32>();
	var pre: array<vec4<u32>, LMAX>;
	if PREFETCH == 1u {
		for (var i = 0u; i < LOADS; i++) {
			pre[i] = load(0u, g, lid, i);
		}
	}
	for (var ph = 0u; ph < p.phases; ph++) {
		if PREFETCH == 1u {
			for (var i = 0u; i < LOADS; i++) {
				acc += pre[i];
			}
			for (var i = 0u; i < LOADS; i++) {
				pre[i] = load(ph + 1u, g, lid, i);
			}
		} else {
			for (var i = 0u; i < LOADS; i++) {
				acc += load(ph, g, lid, i);
			}
		}
		if lid == 0u {
			let v = p.count0 + ph * p.groups + 1u;
			let seen = atomicLoad(&data[next]);
			if FENCE == 1u && ph > 0u && seen != v && seen != v - p.groups {
				atomicAdd(&sync[1], 1u);
			}
			atomicStore(&data[g], v);
		}
		grid_sync(lid, p.count0 + (ph + 1u) * p.groups);
	}
	out[g * WG + lid] = acc.x + acc.y + acc.z + acc.w;
}`,
	Params:  reflect.TypeFor[gridSyncParams](),
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadWrite},
}

// gridSyncRig holds gridSync's buffers and the counter's running value.
type gridSyncRig struct {
	d                  *gpu.Device
	sync, data, w, out *gpu.Buffer
	count, phase       uint32
}

func newGridSyncRig(tb testing.TB, d *gpu.Device, groups int, wBytes uint64) *gridSyncRig {
	tb.Helper()
	r := &gridSyncRig{d: d}
	var err error
	for _, b := range []struct {
		p    **gpu.Buffer
		name string
		size uint64
	}{{&r.sync, "sync", 256}, {&r.data, "data", uint64(4 * groups)}, {&r.w, "w", wBytes}, {&r.out, "out", uint64(4 * 1024 * groups)}} {
		if *b.p, err = d.NewBuffer(b.name, b.size); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		for _, b := range []*gpu.Buffer{r.sync, r.data, r.w, r.out} {
			b.Release()
		}
	})
	return r
}

// dispatch records one gridSync dispatch of phases phases over groups
// workgroups, each phase loading from slices slices of w.
func (r *gridSyncRig) dispatch(b *gpu.Batch, p *gpu.Pipeline, groups, phases, slices int) error {
	params := &gridSyncParams{Phases: uint32(phases), Groups: uint32(groups), Count0: r.count, Slices: uint32(max(slices, 1)), Ph0: r.phase}
	r.count += uint32(phases * groups)
	r.phase += uint32(phases)
	return gpu.Dispatch(b, p, params, []gpu.Binding{r.sync.All(), r.data.All(), r.w.All(), r.out.All()}, uint32(groups), 1, 1)
}

// gridSyncDevice returns the shared device if it is a GPU whose
// storageBarrier is device-wide, and skips the test otherwise.
func gridSyncDevice(tb testing.TB) *gpu.Device {
	d := gputest.Device(tb)
	if !d.DeviceScopeBarrier() || d.Info().Type == "cpu" {
		tb.Skipf("%s: no device-wide storageBarrier, or a CPU adapter that may not run the workgroups at once", d.Info())
	}
	return d
}

// TestGridSync runs the grid barrier over 132–528 workgroups, several
// dispatches in one pass, and checks that every workgroup saw its
// neighbour's write of the phase before and that the counter counted
// every arrival.
func TestGridSync(t *testing.T) {
	// Every adapter compiles it (naga validates the WGSL); GPUs run it.
	for _, c := range []gpu.Consts{nil, {"FENCE": 0, "LOADS": 16, "PREFETCH": 1}} {
		if _, err := gputest.Device(t).Pipeline(gridSync, c); err != nil {
			t.Fatal(err)
		}
	}
	d := gridSyncDevice(t)
	p, err := d.Pipeline(gridSync, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, groups := range []int{132, 264, 528} {
		r := newGridSyncRig(t, d, groups, 256)
		b, err := d.NewBatch("grid sync")
		if err != nil {
			t.Fatal(err)
		}
		const dispatches, phases = 8, 50
		for range dispatches {
			if err := r.dispatch(b, p, groups, phases, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Submit(); err != nil {
			t.Fatal(err)
		}
		s, err := r.sync.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		if s[0] != r.count || s[1] != 0 {
			t.Errorf("%d workgroups: counter %d (want %d), %d stale reads", groups, s[0], r.count, s[1])
		}
	}
}

// BenchmarkGridSync compares a grid barrier inside a dispatch with the
// boundary between two dependent dispatches (on the GPU machine: `go test
// -c ./lab/gridsync`, then `gridsync.test -test.run '^$' -test.bench GridSync`). Each
// reports µs a phase: the slope between batches of 16 and 64 phases, as
// dependent dispatches of one phase each ("dispatches") or as phases of
// dispatches of many ("barriers"), with and without loads.
func BenchmarkGridSync(b *testing.B) {
	d := gridSyncDevice(b)
	// 256 MB of loads, more than the L2 holds, within one binding.
	wBytes := min(uint64(256<<20), d.Limits().MaxStorageBufferBindingSize&^0xFFFF)
	for _, groups := range []int{132, 264, 528} {
		r := newGridSyncRig(b, d, groups, wBytes)
		for _, c := range []struct {
			name                   string
			fence, loads, prefetch uint32
		}{
			{"fence", 1, 0, 0},
			{"nofence", 0, 0, 0},
			{"fence/loads=4", 1, 4, 0},
			{"fence/loads=4/prefetch", 1, 4, 1},
			{"fence/loads=16", 1, 16, 0},
			{"fence/loads=16/prefetch", 1, 16, 1},
		} {
			p, err := d.Pipeline(gridSync, gpu.Consts{"FENCE": c.fence, "LOADS": c.loads, "PREFETCH": c.prefetch})
			if err != nil {
				b.Fatal(err)
			}
			slices := 1
			if c.loads > 0 {
				slices = int(wBytes / (uint64(groups) * uint64(c.loads) * 128 * 16))
			}
			for _, shape := range []string{"dispatches", "barriers"} {
				if shape == "dispatches" && c.prefetch == 1 {
					continue
				}
				b.Run(fmt.Sprintf("G=%d/%s/%s", groups, c.name, shape), func(b *testing.B) {
					run := func(phases int) time.Duration {
						start := time.Now()
						bt, err := d.NewBatch("grid sync")
						if err != nil {
							b.Fatal(err)
						}
						if shape == "dispatches" {
							for range phases {
								if err := r.dispatch(bt, p, groups, 1, slices); err != nil {
									b.Fatal(err)
								}
							}
						} else {
							for range 4 {
								if err := r.dispatch(bt, p, groups, phases/4, slices); err != nil {
									b.Fatal(err)
								}
							}
						}
						if err := bt.Submit(); err != nil {
							b.Fatal(err)
						}
						if _, err := r.sync.Read(0, 4); err != nil {
							b.Fatal(err)
						}
						return time.Since(start)
					}
					run(64)
					var short, long time.Duration
					for b.Loop() {
						short += run(64)
						long += run(256)
					}
					b.ReportMetric(max(0, (long-short).Seconds())/float64(b.N*192)*1e6, "µs/phase")
				})
			}
		}
		s, err := r.sync.ReadU32()
		if err != nil {
			b.Fatal(err)
		}
		if s[0] != r.count || s[1] != 0 {
			b.Errorf("%d workgroups: counter %d (want %d), %d stale reads", groups, s[0], r.count, s[1])
		}
	}
}

// residencyParams is residency's params.
type residencyParams struct{ Groups, Spins, _, _ uint32 }

// residency is a test kernel that finds how many workgroups of a size and
// workgroup memory run at once: each takes PAD vec4s of workgroup memory,
// counts its arrival and polls until p.groups have arrived, or gives up
// after p.spins polls and counts a timeout.
var residency = gpu.Kernel{
	Module: "residency_test.wgsl",
	Entry:  "main",
	Source: `
const WG: u32 = 128u;
const PAD: u32 = 16u;
struct Params { groups: u32, spins: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> sync: array<atomic<u32>>;
var<workgroup> pad: array<vec4<f32>, PAD>;
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
	for (var i = lid; i < PAD; i += WG) { pad[i] = vec4<f32>(f32(i)); }
	workgroupBarrier();
	if lid == 0u {
		atomicAdd(&sync[0], 1u);
		for (var n = 0u; atomicLoad(&sync[0]) < p.groups; n++) {
			if n == p.spins { atomicAdd(&sync[1], 1u); break; }
		}
		if pad[(wid.x * 7u) % PAD].x == 12345.0 { atomicAdd(&sync[2], 1u); }
	}
}`,
	Params:  reflect.TypeFor[residencyParams](),
	Storage: []gpu.Access{gpu.ReadWrite},
}

// TestResidentWorkgroups measures how many workgroups of 128 and 256
// threads run at once with 8–40 KB of workgroup memory each (-v prints the
// table): a kernel whose workgroups wait for each other needs them all
// resident, and the count is what a dispatch's occupancy is. On the H200
// (BENCHMARKS.md) NVIDIA's driver fits about 56 KB an SM: 8 KB → 6
// workgroups an SM, 12 KB → 4, 20–24 KB → 2, 28 KB or more → 1. (With 1
// KB the probe passed 4,096 workgroups, more than the SMs' thread slots
// hold, so it is not taken as a count there.)
func TestResidentWorkgroups(t *testing.T) {
	d := gridSyncDevice(t)
	sync, err := d.NewBuffer("sync", 16)
	if err != nil {
		t.Fatal(err)
	}
	defer sync.Release()
	together := func(p *gpu.Pipeline, g int) bool {
		if err := sync.Fill(0); err != nil {
			t.Fatal(err)
		}
		b, err := d.NewBatch("residency")
		if err != nil {
			t.Fatal(err)
		}
		if err := gpu.Dispatch(b, p, &residencyParams{Groups: uint32(g), Spins: 1 << 16}, []gpu.Binding{sync.All()}, uint32(g), 1, 1); err != nil {
			t.Fatal(err)
		}
		if err := b.Submit(); err != nil {
			t.Fatal(err)
		}
		s, err := sync.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		return s[1] == 0
	}
	for _, wg := range []uint32{128, 256} {
		for _, kb := range []uint32{8, 12, 16, 20, 24, 28, 40} {
			if 1024*kb > d.Limits().MaxComputeWorkgroupStorageSize {
				continue
			}
			p, err := d.Pipeline(residency, gpu.Consts{"WG": wg, "PAD": kb * 64})
			if err != nil {
				t.Fatal(err)
			}
			// Doubling, then bisecting between the last count that ran
			// at once and the first that did not.
			pass, fail := 0, 4097
			for g := 1; g < fail; g *= 2 {
				if !together(p, g) {
					fail = g
					break
				}
				pass = g
			}
			for fail-pass > 1 {
				if mid := (pass + fail) / 2; together(p, mid) {
					pass = mid
				} else {
					fail = mid
				}
			}
			if pass == 0 {
				t.Errorf("%d threads, %d KB: not even one workgroup ran", wg, kb)
			}
			t.Logf("%d threads, %2d KB of workgroup memory: %d workgroups at once", wg, kb, pass)
		}
	}
}
