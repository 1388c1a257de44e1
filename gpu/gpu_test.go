package gpu_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// affine is a test kernel: y[i] = y[i] * p.mul + p.add for i < p.n, with a
// params struct padded to 256 bytes so that a few hundred dispatches span
// several uniform chunks.
var affine = gpu.Kernel{
	Module: "affine_test.wgsl",
	Entry:  "main",
	Source: `
const WG: u32 = 64u;
struct Params { n: u32, mul: f32, add: f32, _pad: u32, fill: array<vec4<u32>, 15> }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
	if gid.x < p.n { y[gid.x] = y[gid.x] * p.mul + p.add; }
}`,
	Params:  reflect.TypeFor[affineArgs](),
	Storage: []gpu.Access{gpu.ReadWrite},
}

// affineArgs is affine's params: 256 bytes, more than most kernels' 16 or 32.
type affineArgs struct {
	N        uint32
	Mul, Add float32
	_        uint32
	Fill     [60]uint32
}

func affineParams(n int, mul, add float32) *affineArgs {
	return &affineArgs{N: uint32(n), Mul: mul, Add: add}
}

func TestOpen(t *testing.T) {
	d := gputest.Device(t)
	info, l := d.Info(), d.Limits()
	t.Logf("adapter %s; limits %+v; f16 %v", info, l, d.F16())
	if info.Name == "" || info.Backend == "" || strings.HasPrefix(info.Name, "0x") {
		t.Errorf("adapter info %+v lacks a name or backend", info)
	}
	if d.F16() && !slices.Contains(info.Features, "shader-f16") {
		t.Errorf("shader-f16 enabled but not among the adapter's features %v", info.Features)
	}
	if l.MaxBufferSize == 0 || l.MaxBufferSize > 1<<31 || l.MaxStorageBufferBindingSize > l.MaxBufferSize {
		t.Errorf("limits %+v: maxBufferSize not capped at 2 GiB or binding above it", l)
	}
}

// TestNoF16 opens a second device without shader-f16, the configuration
// of browsers that lack it, and runs a batch on it.
func TestNoF16(t *testing.T) {
	gputest.Device(t) // skips or fails without an adapter
	d, err := gpu.Open(gpu.Options{NoF16: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.F16() {
		t.Error("shader-f16 enabled despite NoF16")
	}
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := d.UploadF32("y", []float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.NewBatch("no-f16")
	if err != nil {
		t.Fatal(err)
	}
	if err := gpu.Dispatch(b, p, affineParams(2, 3, 1), []gpu.Binding{buf.All()}, 1, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	if got, err := buf.ReadF32(); err != nil || got[0] != 4 || got[1] != 7 {
		t.Errorf("got %v, %v; want [4 7]", got, err)
	}
	buf.Release()
	if _, err := buf.ReadF32(); err == nil {
		t.Error("reading a released buffer succeeded")
	}
	d.Close()
	if _, err := d.NewBuffer("late", 4); err == nil {
		t.Error("a buffer on a closed device was made")
	}
}

// TestBatchRoundTrip chains 300 dependent dispatches in one pass, each with
// its own params, across several uniform chunks, and checks the result
// against the same recurrence on the host: rounded after the multiply and
// after the add, or once (WGSL lets a compiler contract a * b + c into a
// fused multiply-add, and Dawn's does on the H200).
func TestBatchRoundTrip(t *testing.T) {
	d := gputest.Device(t)
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n, steps = 1000, 300
	y := make([]float32, n)
	for i := range y {
		y[i] = float32(i%7) - 3
	}
	fused := slices.Clone(y)
	buf, err := d.UploadF32("y", y)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	b, err := d.NewBatch("affine")
	if err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		mul, add := float32(1+s%3)/2, float32(s%5)-2
		if err := gpu.Dispatch(b, p, affineParams(n, mul, add), []gpu.Binding{buf.All()}, (n+63)/64, 1, 1); err != nil {
			t.Fatal(err)
		}
		for i := range y {
			y[i] = float32(y[i]*mul) + add
			// exact in float64 (the product has at most 48 bits), so
			// rounded once
			fused[i] = float32(math.FMA(float64(fused[i]), float64(mul), float64(add)))
		}
	}
	if b.Len() != steps {
		t.Errorf("Len = %d, want %d", b.Len(), steps)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	got, err := buf.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	for i := range y {
		if got[i] != y[i] && got[i] != fused[i] {
			t.Fatalf("y[%d] = %v, want %v (%v with fused multiply-adds)", i, got[i], y[i], fused[i])
		}
	}
}

func TestFillAndPartialRead(t *testing.T) {
	d := gputest.Device(t)
	buf, err := d.NewBuffer("poison", 40)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	if err := buf.Fill(gpu.NaN32); err != nil {
		t.Fatal(err)
	}
	if err := buf.WriteU32(8, []uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	raw, err := buf.Read(4, 12)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]byte{0xad, 0x0b, 0xc0, 0x7f, 1, 0, 0, 0, 2, 0, 0, 0})
	if got := fmt.Sprint(raw); got != want {
		t.Errorf("read %s, want %s", got, want)
	}
}

// TestReadsShareStaging: reads of growing and shrinking sizes, from two
// buffers, through the device's one reused staging buffer — each sees its
// own bytes, none a previous read's.
func TestReadsShareStaging(t *testing.T) {
	d := gputest.Device(t)
	const n = 300000 // 1.2 MB: past the first staging buffer's 4 KiB
	a, b := make([]uint32, n), make([]uint32, n)
	for i := range a {
		a[i], b[i] = uint32(i), uint32(3*i+1)
	}
	bufA, err := d.UploadU32("a", a)
	if err != nil {
		t.Fatal(err)
	}
	defer bufA.Release()
	bufB, err := d.UploadU32("b", b)
	if err != nil {
		t.Fatal(err)
	}
	defer bufB.Release()
	for _, c := range []struct {
		buf    *gpu.Buffer
		want   []uint32
		at, of int // words
	}{{bufA, a, 5, 1}, {bufB, b, 0, n}, {bufA, a, 7, 3}, {bufB, b, n - 2, 2}, {bufA, a, 0, n}} {
		raw, err := c.buf.Read(uint64(4*c.at), uint64(4*c.of))
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.of {
			if got := uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24; got != c.want[c.at+i] {
				t.Fatalf("%d words at %d: word %d = %d, want %d", c.of, c.at, i, got, c.want[c.at+i])
			}
		}
	}
}

// TestReadRanges: ranges of several buffers read in one go, each its own
// bytes; a misaligned range or one past its buffer is refused.
func TestReadRanges(t *testing.T) {
	d := gputest.Device(t)
	a, b := make([]uint32, 1000), make([]uint32, 64)
	for i := range a {
		a[i] = uint32(7*i + 3)
	}
	for i := range b {
		b[i] = ^uint32(i)
	}
	bufA, err := d.UploadU32("a", a)
	if err != nil {
		t.Fatal(err)
	}
	defer bufA.Release()
	bufB, err := d.UploadU32("b", b)
	if err != nil {
		t.Fatal(err)
	}
	defer bufB.Release()
	ranges := []gpu.Binding{bufA.Slice(4*10, 4*990), bufB.Slice(4*3, 4*5), bufB.Slice(0, 0), bufA.Slice(0, 4)}
	want := [][]uint32{a[10:], b[3:8], nil, a[:1]}
	got, err := gpu.ReadRanges(ranges...)
	if err != nil {
		t.Fatal(err)
	}
	for i, raw := range got {
		if len(raw) != 4*len(want[i]) {
			t.Fatalf("range %d: %d bytes, want %d", i, len(raw), 4*len(want[i]))
		}
		for j, w := range want[i] {
			if v := uint32(raw[4*j]) | uint32(raw[4*j+1])<<8 | uint32(raw[4*j+2])<<16 | uint32(raw[4*j+3])<<24; v != w {
				t.Fatalf("range %d word %d = %d, want %d", i, j, v, w)
			}
		}
	}
	for _, bad := range []gpu.Binding{bufB.Slice(2, 4), bufB.Slice(0, 4*65)} {
		if _, err := gpu.ReadRanges(bufA.Slice(0, 4), bad); err == nil {
			t.Errorf("range %+v of a %d-byte buffer read", bad, bufB.Size())
		}
	}
}

// TestSubmitRead: a batch submitted with ranges to read sees them after
// its own dispatches (and those of batches before it), in one go; a bad
// range spoils nothing but the read, and a read of nothing still submits.
func TestSubmitRead(t *testing.T) {
	d := gputest.Device(t)
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	y := make([]float32, n)
	for i := range y {
		y[i] = float32(rand.IntN(17)) - 8
	}
	buf, err := d.UploadF32("y", y)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	other, err := d.UploadU32("other", []uint32{7, 8, 9, 10})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	record := func(mul, add float32) *gpu.Batch {
		t.Helper()
		b, err := d.NewBatch("affine")
		if err != nil {
			t.Fatal(err)
		}
		if err := gpu.Dispatch(b, p, affineParams(n, mul, add), []gpu.Binding{buf.All()}, (n+63)/64, 1, 1); err != nil {
			t.Fatal(err)
		}
		for i := range y {
			y[i] = y[i]*mul + add // exact: small integers and halves
		}
		return b
	}
	if err := record(2, 1).Submit(); err != nil {
		t.Fatal(err)
	}
	got, err := record(0.5, -3).SubmitRead(buf.Slice(4*10, 4*(n-10)), other.Slice(4, 8))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[0]) != 4*(n-10) || len(got[1]) != 8 {
		t.Fatalf("read %d ranges of %v bytes", len(got), [][]byte(got))
	}
	for i := 10; i < n; i++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(got[0][4*(i-10):])); v != y[i] {
			t.Fatalf("y[%d] = %v, want %v", i, v, y[i])
		}
	}
	if a, b := binary.LittleEndian.Uint32(got[1]), binary.LittleEndian.Uint32(got[1][4:]); a != 8 || b != 9 {
		t.Errorf("other[1:3] = %d, %d, want 8, 9", a, b)
	}
	if _, err := record(1, 1).SubmitRead(other.Slice(2, 4)); err == nil {
		t.Error("a misaligned range was read")
	}
	y0 := y[0] - 1 // the refused batch was discarded, not submitted
	if out, err := record(1, 0).SubmitRead(); err != nil || len(out) != 0 {
		t.Fatalf("an empty read: %v, %v", out, err)
	}
	v, err := buf.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != y0 {
		t.Errorf("y[0] = %v after a refused read and an empty one, want %v", v[0], y0)
	}
}

func TestSpecialize(t *testing.T) {
	src := "const WG: u32 = 64u;\nconst TT: u32 = 1u; // rows\nconst K = 3;\n"
	got, err := gpu.Specialize(src, gpu.Consts{"TT": 8})
	if err != nil {
		t.Fatal(err)
	}
	if want := "const WG: u32 = 64u;\nconst TT: u32 = 8u; // rows\nconst K = 3;\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := gpu.Specialize(src, gpu.Consts{"ROWS": 2}); err == nil {
		t.Error("an undeclared constant was accepted")
	}
}

// TestPipelineMemo: a key's constants are built once; keys apart give the
// pipelines their constants ask for; a failed build is not remembered.
func TestPipelineMemo(t *testing.T) {
	d := gputest.Device(t)
	var memo gpu.PipelineMemo[uint32]
	built := 0
	get := func(wg uint32) (*gpu.Pipeline, error) {
		return memo.Get(d, wg, affine, func() gpu.Consts { built++; return gpu.Consts{"WG": wg} })
	}
	a, err := get(64)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := get(64)
	c, _ := get(128)
	want, _ := d.Pipeline(affine, gpu.Consts{"WG": 128})
	if a != b || c != want || built != 2 {
		t.Errorf("memo: %p %p (want equal), %p (want %p), %d builds (want 2)", a, b, c, want, built)
	}
	if _, err := memo.Get(d, 7, affine, func() gpu.Consts { return gpu.Consts{"NOPE": 1} }); err == nil {
		t.Fatal("an unknown constant was accepted")
	}
	if _, err := memo.Get(d, 7, affine, func() gpu.Consts { return nil }); err != nil {
		t.Errorf("after a failed build: %v", err)
	}
}

func TestPipelineCache(t *testing.T) {
	d := gputest.Device(t)
	a, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := d.Pipeline(affine, nil)
	c, err := d.Pipeline(affine, gpu.Consts{"WG": 128})
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a == c {
		t.Errorf("cache: same key gave %p and %p; WG=128 gave %p", a, b, c)
	}
	other := affine
	other.Source += "\n"
	if _, err := d.Pipeline(other, nil); err == nil {
		t.Error("a second source under the same module name was accepted")
	}
}

// TestErrorsAreGoErrors provokes errors at each layer — WGSL, our own
// checks, the device's validation — and checks that each comes back as an
// error naming what failed, and that the device still works afterwards.
func TestErrorsAreGoErrors(t *testing.T) {
	d := gputest.Device(t)
	bad := affine
	bad.Module, bad.Source = "bad_test.wgsl", "fn main( {"
	if _, err := d.Pipeline(bad, nil); err == nil || !strings.Contains(err.Error(), "bad_test.wgsl") {
		t.Errorf("bad WGSL: err = %v", err)
	}
	if _, err := d.NewBuffer("huge", d.Limits().MaxBufferSize+4); err == nil {
		t.Error("a buffer over maxBufferSize was accepted")
	}

	p, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := d.NewBuffer("y", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	for name, record := range map[string]func(*gpu.Batch) error{
		"params of another type": func(b *gpu.Batch) error {
			return gpu.Dispatch(b, p, &lastSumsParams{}, []gpu.Binding{buf.All()}, 1, 1, 1)
		},
		"no params": func(b *gpu.Batch) error {
			return gpu.Dispatch[affineArgs](b, p, nil, []gpu.Binding{buf.All()}, 1, 1, 1)
		},
		"range past the end": func(b *gpu.Batch) error {
			return gpu.Dispatch(b, p, affineParams(1, 1, 1), []gpu.Binding{buf.Slice(0, 128)}, 1, 1, 1)
		},
		"too many workgroups": func(b *gpu.Batch) error {
			return gpu.Dispatch(b, p, affineParams(1, 1, 1), []gpu.Binding{buf.All()}, d.Limits().MaxComputeWorkgroupsPerDimension+1, 1, 1)
		},
	} {
		b, err := d.NewBatch(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := record(b); err == nil {
			t.Errorf("%s: Dispatch accepted it", name)
		}
		if err := b.Submit(); err == nil {
			t.Errorf("%s: Submit of a spoiled batch succeeded", name)
		}
	}

	// A mistake only the device sees: a destroyed buffer in a submission.
	// wgpu-native would abort the process on it without our error scopes.
	gone, err := d.NewBuffer("gone", 64)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.NewBatch("destroyed")
	if err != nil {
		t.Fatal(err)
	}
	if err := gpu.Dispatch(b, p, affineParams(16, 1, 1), []gpu.Binding{gone.All()}, 1, 1, 1); err != nil {
		t.Fatal(err)
	}
	gone.Destroy()
	gone.Release()
	err = b.Submit()
	if err == nil { // the browser reports a submission's errors at the next read
		_, err = buf.Read(0, 16)
	}
	if err == nil || !strings.Contains(err.Error(), "destroyed") {
		t.Errorf("submitting a destroyed buffer: err = %v", err)
	}
	if err := b.Submit(); err == nil {
		t.Error("a second Submit succeeded")
	}

	// The device still works.
	b, err = d.NewBatch("after")
	if err != nil {
		t.Fatal(err)
	}
	if err := gpu.Dispatch(b, p, affineParams(8, 2, 1), []gpu.Binding{buf.All()}, 1, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	got, err := buf.ReadF32()
	if err != nil || got[0] != 1 || got[7] != 1 || got[8] != 0 {
		t.Errorf("after the errors: %v, %v", got, err)
	}
}

// TestReopen: devices opened, used and closed one after another in one
// process (the server's tests do this) — the library's own CreateInstance
// left part of its descriptor uninitialized and aborted the second time.
func TestReopen(t *testing.T) {
	for i := range 4 {
		d, err := gpu.Open(gpu.Options{})
		if err != nil {
			t.Fatal(err)
		}
		buf, err := d.UploadF32("x", make([]float32, 1024+i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := buf.ReadF32(); err != nil {
			t.Fatal(err)
		}
		buf.Release()
		d.Close()
	}
}

// TestProfile: a profiled batch times each dispatch in its own pass and
// still computes what an ordinary batch does.
func TestProfile(t *testing.T) {
	d := gputest.Device(t)
	if !d.Timestamps() {
		t.Skipf("%s offers no timestamp queries", d.Info())
	}
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := d.UploadF32("y", make([]float32, 1024))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	b, err := d.NewBatch("profiled")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Profile(8); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := gpu.Dispatch(b, p, affineParams(1024, 1, 1), []gpu.Binding{buf.All()}, 16, 1, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	prof, err := b.Results()
	if err != nil {
		t.Fatal(err)
	}
	if got := prof.Count["affine_test.wgsl:main"]; got != 5 {
		t.Errorf("%d dispatches profiled, want 5 (%+v)", got, prof)
	}
	if prof.Total() == 0 {
		t.Error("no time measured")
	}
	y, err := buf.ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	if y[0] != 5 || y[1023] != 5 {
		t.Errorf("y = %v…%v, want 5 (five dispatches adding 1)", y[0], y[1023])
	}
}

// lastSums is a test kernel of the arrival counting DeviceScopeBarrier
// allows: workgroup (s, g) writes WG values of split s of group g into the
// scratch space, then counts its arrival in counter g; the last of the
// group's p.splits workgroups to arrive sums every split's values into
// out[g] and sets the counter back to zero.
var lastSums = gpu.Kernel{
	Module: "last_sums_test.wgsl",
	Entry:  "main",
	Source: `
const WG: u32 = 64u;
struct Params { splits: u32, part0: u32, round: u32, _pad: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
var<workgroup> is_last: bool;
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
	let s = wid.x;
	let g = wid.y;
	let first = p.part0 + g * p.splits * WG;
	atomicStore(&part[first + s * WG + lid], g * 7u + s * 3u + lid + p.round);
	storageBarrier();
	if lid == 0u {
		is_last = atomicAdd(&part[g], 1u) == p.splits - 1u;
	}
	if !workgroupUniformLoad(&is_last) {
		return;
	}
	storageBarrier();
	var sum = 0u;
	for (var i = lid; i < p.splits * WG; i += WG) {
		sum += atomicLoad(&part[first + i]);
	}
	out[g * WG + lid] = sum;
	if lid == 0u {
		atomicStore(&part[g], 0u);
	}
}`,
	Params:  reflect.TypeFor[lastSumsParams](),
	Storage: []gpu.Access{gpu.ReadWrite, gpu.ReadWrite},
}

// lastSumsParams is lastSums's params.
type lastSumsParams struct{ Splits, Part0, Round, _ uint32 }

// TestCountedScratch runs lastSums over many workgroups, several times in
// one pass, where the device's storageBarrier is device-wide, and checks
// the sums and that the counters are back at zero; and that growing the
// counters moves the scratch space to a fresh buffer.
func TestCountedScratch(t *testing.T) {
	d := gputest.Device(t)
	if !d.DeviceScopeBarrier() {
		t.Skipf("%s: storageBarrier is not device-wide here", d.Info())
	}
	const wg, splits, groups, rounds = 64, 37, 300, 16
	buf, off, err := d.CountedScratch(groups, splits*groups*wg*4)
	if err != nil {
		t.Fatal(err)
	}
	if off < groups*4 || off%256 != 0 {
		t.Fatalf("scratch space at byte %d, for %d counters", off, groups)
	}
	p, err := d.Pipeline(lastSums, nil)
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]*gpu.Buffer, rounds)
	b, err := d.NewBatch("last-sums")
	if err != nil {
		t.Fatal(err)
	}
	for r := range rounds {
		if outs[r], err = d.NewBuffer(fmt.Sprint("out", r), groups*wg*4); err != nil {
			t.Fatal(err)
		}
		defer outs[r].Release()
		if err := gpu.Dispatch(b, p, &lastSumsParams{splits, uint32(off / 4), uint32(r), 0}, []gpu.Binding{buf.All(), outs[r].All()}, splits, groups, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	for r := range rounds {
		got, err := outs[r].ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		for g := range groups {
			for lid := range wg {
				want := uint32(0)
				for i := lid; i < splits*wg; i += wg {
					s, l := i/wg, i%wg
					want += uint32(g*7 + s*3 + l + r)
				}
				if v := got[g*wg+lid]; v != want {
					t.Fatalf("round %d, group %d, thread %d: sum %d, want %d", r, g, lid, v, want)
				}
			}
		}
	}
	all, err := buf.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range all[:off/4] {
		if c != 0 {
			t.Fatalf("counter %d = %d after the dispatches", i, c)
		}
	}

	// More counters: a new buffer, its scratch space after them.
	buf2, off2, err := d.CountedScratch(int(off/4)+1, 16)
	if err != nil {
		t.Fatal(err)
	}
	if buf2 == buf || off2 <= off {
		t.Errorf("%d counters: same buffer or scratch at byte %d (was %d)", off/4+1, off2, off)
	}
	if _, _, err := d.CountedScratch(-1, 0); err == nil {
		t.Error("negative counters accepted")
	}
}

// TestBufferBytes: BufferBytes follows buffers made and released.
func TestBufferBytes(t *testing.T) {
	d := gputest.Fresh(t)
	before := d.BufferBytes()
	a, err := d.NewBuffer("a", 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.UploadF32("b", make([]float32, 300))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.BufferBytes() - before; got != 1000+1200 {
		t.Errorf("after two buffers: %d bytes more, want 2200", got)
	}
	if _, err := b.ReadF32(); err != nil { // grows the readback staging buffer (4096 bytes at least)
		t.Fatal(err)
	}
	withStaging := d.BufferBytes()
	a.Release()
	a.Release()
	b.Release()
	if got := withStaging - d.BufferBytes(); got != 2200 {
		t.Errorf("releasing both (a twice) freed %d bytes, want 2200", got)
	}
}

// TestRecordingReplay: a captured run of dispatches, replayed into later
// batches — alone, after other dispatches (its params then land in other
// uniform chunks than captured) and within a capture — computes what
// recording them afresh does; a recording whose buffer was released is
// refused and leaves the batch usable.
func TestRecordingReplay(t *testing.T) {
	d := gputest.Device(t)
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n, steps = 1000, 300 // 256-byte params: 300 span two chunks
	y := make([]float32, n)
	for i := range y {
		y[i] = float32(i%7) - 3
	}
	buf, err := d.UploadF32("y", y)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	muls, adds := make([]float32, steps), make([]float32, steps)
	for s := range steps {
		muls[s], adds[s] = []float32{0.5, 1, 2}[s%3], float32(s%5)-2
	}
	dispatches := func(from, to int) func(*gpu.Batch) error {
		return func(b *gpu.Batch) error {
			for s := from; s < to; s++ {
				if err := gpu.Dispatch(b, p, affineParams(n, muls[s], adds[s]), []gpu.Binding{buf.All()}, (n+63)/64, 1, 1); err != nil {
					return err
				}
			}
			return nil
		}
	}
	// want applies steps from … to-1 to y: a product by a power of two is
	// exact, so the GPU's result is the same with or without fused
	// multiply-adds.
	want := func(from, to int) {
		for s := from; s < to; s++ {
			for i := range y {
				y[i] = float32(y[i]*muls[s]) + adds[s]
			}
		}
	}
	b, err := d.NewBatch("capture")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.Capture(dispatches(0, steps))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Len() != steps || b.Len() != steps || !rec.Valid() {
		t.Fatalf("captured %d dispatches into a batch of %d (valid %v), want %d", rec.Len(), b.Len(), rec.Valid(), steps)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	want(0, steps)
	for _, run := range []struct {
		name   string
		before int  // dispatches recorded afresh before the replay
		nested bool // the replay within a capture, which is replayed too
	}{{name: "alone"}, {name: "after 100 dispatches", before: 100}, {name: "within a capture", before: 37, nested: true}} {
		b, err := d.NewBatch(run.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := dispatches(0, run.before)(b); err != nil {
			t.Fatal(err)
		}
		replay := func(b *gpu.Batch) error { return b.Replay(rec) }
		var outer *gpu.Recording
		if run.nested {
			if outer, err = b.Capture(replay); err == nil && outer.Len() != steps {
				t.Errorf("%s: the capture holds %d dispatches, want %d", run.name, outer.Len(), steps)
			}
		} else {
			err = replay(b)
		}
		if err != nil {
			t.Fatalf("%s: %v", run.name, err)
		}
		if b.Len() != run.before+steps {
			t.Errorf("%s: batch of %d dispatches, want %d", run.name, b.Len(), run.before+steps)
		}
		if err := b.Submit(); err != nil {
			t.Fatal(err)
		}
		want(0, run.before)
		want(0, steps)
		if outer != nil { // the capture of a replay replays as the original
			b, err := d.NewBatch("outer")
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Replay(outer); err != nil {
				t.Fatal(err)
			}
			if err := b.Submit(); err != nil {
				t.Fatal(err)
			}
			want(0, steps)
		}
		got, err := buf.ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		for i := range y {
			if got[i] != y[i] {
				t.Fatalf("%s: y[%d] = %v, want %v", run.name, i, got[i], y[i])
			}
		}
	}

	// A recording binding a released buffer is stale.
	z, err := d.UploadF32("z", make([]float32, 64))
	if err != nil {
		t.Fatal(err)
	}
	b, err = d.NewBatch("stale")
	if err != nil {
		t.Fatal(err)
	}
	zrec, err := b.Capture(func(b *gpu.Batch) error {
		return gpu.Dispatch(b, p, affineParams(64, 2, 1), []gpu.Binding{z.All()}, 1, 1, 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
	z.Release()
	if zrec.Valid() || rec.Valid() {
		t.Errorf("after a bound buffer's release: valid %v and %v, want both stale", zrec.Valid(), rec.Valid())
	}
	b, err = d.NewBatch("after stale")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Replay(zrec); !errors.Is(err, gpu.ErrStaleRecording) {
		t.Errorf("replaying a stale recording: %v, want ErrStaleRecording", err)
	}
	if _, err := b.Capture(func(b *gpu.Batch) error { return b.Replay(zrec) }); !errors.Is(err, gpu.ErrStaleRecording) {
		t.Errorf("capturing a stale replay: %v, want ErrStaleRecording", err)
	}
	if _, err := b.Capture(func(b *gpu.Batch) error {
		_, err := b.Capture(dispatches(0, 1))
		return err
	}); err == nil || !strings.Contains(err.Error(), "capture within a capture") {
		t.Errorf("a nested capture: %v, want an error", err)
	}
	if err := dispatches(0, 1)(b); err != nil { // the batch is still usable
		t.Fatal(err)
	}
	if err := b.Submit(); err != nil {
		t.Fatal(err)
	}
}
