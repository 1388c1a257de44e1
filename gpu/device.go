package gpu

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/cogentcore/webgpu/wgpu"
)

// maxBufferCap caps the maxBufferSize requested from the adapter. Some
// drivers report u64-max (the H200 does), which wgpu reads as "undefined" and
// replaces by the 256 MiB default; asking for a concrete value avoids that.
const maxBufferCap = 1 << 31

// ErrNoAdapter is returned by Open when no WebGPU adapter exists: natively,
// no Vulkan, Metal or D3D12 driver (on Debian, `apt-get install
// mesa-vulkan-drivers` brings the lavapipe CPU driver); in a browser, no
// navigator.gpu or no adapter behind it.
var ErrNoAdapter = errors.New("gpu: no WebGPU adapter found")

// ErrNoHardwareAdapter is returned by Open with Options.HardwareOnly when
// the only adapters are software renderers; it wraps ErrNoAdapter.
var ErrNoHardwareAdapter = fmt.Errorf("%w besides software renderers", ErrNoAdapter)

// Options choose how Open configures the device.
type Options struct {
	// NoF16 leaves the shader-f16 feature off even where the adapter has it,
	// to exercise the path every kernel must support without it.
	NoF16 bool
	// HardwareOnly skips software renderers (AdapterInfo.Software): Open
	// then returns an error wrapping ErrNoAdapter, naming them, when they
	// are all there is.
	HardwareOnly bool
	// MaxStorageBufferBindingSize > 0 asks for storage bindings of at most
	// this many bytes, below the adapter's: a test's way to make a model's
	// large tensors split across bindings as on an adapter that offers
	// small ones.
	MaxStorageBufferBindingSize uint64
}

// AdapterInfo describes the adapter Open chose.
type AdapterInfo struct {
	Name     string   // e.g. "NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)"
	Type     string   // discrete-gpu, integrated-gpu, cpu, … ("" in the browser)
	Backend  string   // vulkan, metal, d3d12, … ("webgpu" in the browser)
	Features []string // every feature the adapter offers
}

// Software reports whether the adapter is a renderer running on the CPU —
// Mesa's lavapipe (llvmpipe), Chromium's SwiftShader — rather than a GPU.
// Natively wgpu reports such adapters as of type cpu; the browser gives no
// type, so the name decides there.
func (a AdapterInfo) Software() bool {
	c := a.Class()
	return a.Type == "cpu" || c == ClassLavapipe || c == ClassSwiftShader
}

// Class is a kind of adapter the layers above tune for (package kernels
// keeps a table of thresholds per class).
type Class int

const (
	ClassGPU         Class = iota // a GPU other than the ones below
	ClassH200                     // NVIDIA's H200, where webdraft's kernels were measured
	ClassLavapipe                 // Mesa's lavapipe (llvmpipe): Vulkan on the CPU
	ClassSwiftShader              // Chromium's SwiftShader: WebGPU on the CPU
	ClassBrowserGPU               // a GPU behind a browser's WebGPU, where each dispatch costs the host more than natively
	NumClasses
)

func (c Class) String() string {
	switch c {
	case ClassGPU:
		return "gpu"
	case ClassH200:
		return "h200"
	case ClassLavapipe:
		return "lavapipe"
	case ClassSwiftShader:
		return "swiftshader"
	case ClassBrowserGPU:
		return "browser-gpu"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Class returns the adapter's class, from its name and, for a GPU behind
// a browser's WebGPU, its backend.
func (a AdapterInfo) Class() Class {
	name := strings.ToLower(a.Name)
	switch {
	case strings.Contains(name, "swiftshader"):
		return ClassSwiftShader
	case strings.Contains(name, "llvmpipe") || strings.Contains(name, "lavapipe"):
		return ClassLavapipe
	case a.Backend == "webgpu":
		return ClassBrowserGPU
	case strings.Contains(name, "h200"):
		return ClassH200
	}
	return ClassGPU
}

func (a AdapterInfo) String() string {
	if a.Type == "" {
		return fmt.Sprintf("%s (%s)", a.Name, a.Backend)
	}
	return fmt.Sprintf("%s (%s, %s)", a.Name, a.Backend, a.Type)
}

// Limits are the device limits webdraft depends on, as granted by the
// device. Open requests each of them explicitly at the adapter's value
// (maxBufferSize capped, see maxBufferCap).
type Limits struct {
	MaxBufferSize                     uint64
	MaxStorageBufferBindingSize       uint64
	MaxUniformBufferBindingSize       uint64
	MaxStorageBuffersPerShaderStage   uint32
	MaxComputeWorkgroupStorageSize    uint32
	MaxComputeInvocationsPerWorkgroup uint32
	MaxComputeWorkgroupSizeX          uint32
	MaxComputeWorkgroupsPerDimension  uint32
	MinStorageBufferOffsetAlignment   uint32
	MinUniformBufferOffsetAlignment   uint32
}

// request returns the limits to ask a device for, given the adapter's
// and the options.
func (a Limits) request(opts Options) Limits {
	r := a
	r.MaxBufferSize = min(a.MaxBufferSize, maxBufferCap)
	r.MaxStorageBufferBindingSize = min(a.MaxStorageBufferBindingSize, r.MaxBufferSize)
	if opts.MaxStorageBufferBindingSize > 0 {
		r.MaxStorageBufferBindingSize = min(r.MaxStorageBufferBindingSize, opts.MaxStorageBufferBindingSize)
	}
	r.MaxUniformBufferBindingSize = min(a.MaxUniformBufferBindingSize, paramsChunkSize)
	return r
}

// check reports whether the granted limits are enough to run webdraft's
// kernels at all (WebGPU's defaults are; a broken driver may not be).
func (l Limits) check() error {
	switch {
	case l.MaxStorageBuffersPerShaderStage < 8:
		return fmt.Errorf("device allows %d storage buffers per stage, need 8", l.MaxStorageBuffersPerShaderStage)
	case l.MaxComputeInvocationsPerWorkgroup < 256 || l.MaxComputeWorkgroupSizeX < 256:
		return fmt.Errorf("device allows %d invocations per workgroup, need 256", l.MaxComputeInvocationsPerWorkgroup)
	case l.MaxComputeWorkgroupStorageSize < 16<<10:
		return fmt.Errorf("device allows %d bytes of workgroup storage, need 16 KiB", l.MaxComputeWorkgroupStorageSize)
	case l.MaxUniformBufferBindingSize < 4<<10:
		return fmt.Errorf("device allows %d-byte uniform bindings, need 4 KiB", l.MaxUniformBufferBindingSize)
	case l.MinStorageBufferOffsetAlignment == 0 || l.MinUniformBufferOffsetAlignment == 0:
		return errors.New("device reports a zero buffer offset alignment")
	case l.MinUniformBufferOffsetAlignment > uint32(len(paramsPad)):
		// WebGPU caps it at 256; so does Vulkan.
		return fmt.Errorf("device aligns uniform offsets to %d bytes, more than %d", l.MinUniformBufferOffsetAlignment, len(paramsPad))
	}
	return nil
}

// Device is an open WebGPU device with its queue, its pipeline cache and
// its error scopes. See the package comment on concurrency.
type Device struct {
	dev    *wgpu.Device
	queue  *wgpu.Queue
	info   AdapterInfo
	class  Class
	limits Limits
	f16    bool
	scopes errorScopes // backend-specific: catch-all error scopes and the lost state

	modules   map[string]*wgpu.ShaderModule // by module name + constants
	sources   map[string]string             // module name → the source it was first given
	pipelines map[string]*Pipeline          // by module name + entry + constants
	// pipelinesByKey holds the same pipelines for the per-dispatch lookup.
	pipelinesByKey map[pipelineKey]*Pipeline
	ahead          *aheadBuild    // non-nil within BuildAhead's record
	chunks         []*paramsChunk // free uniform chunks for Batch params
	binds          *bindCache     // bind groups reused across batches
	objs           objects        // what batches' recorders name (JavaScript: record_js.go)
	writes         writeScratch   // what queue writes copy through (JavaScript: write_js.go)
	timestamps     bool           // timestamp queries enabled (natively, where offered)
	deviceBarrier  bool           // see DeviceScopeBarrier
	scratch        *Buffer        // see Scratch
	counted        *Buffer        // see CountedScratch
	counters       uint64         // counted's counter words
	retired        []*Buffer      // grown-out scratch buffers, kept until Close
	readback       *wgpu.Buffer   // MapRead staging for Read, grown on demand
	readbackSize   uint64
	closed         bool
	lost           atomic.Pointer[string] // why Lose was called; nil while the device works
	bufferBytes    atomic.Int64           // see BufferBytes
}

// Info describes the adapter in use.
func (d *Device) Info() AdapterInfo { return d.info }

// Class is the adapter's class (AdapterInfo.Class), worked out once.
func (d *Device) Class() Class { return d.class }

// Limits returns the granted limits.
func (d *Device) Limits() Limits { return d.limits }

// F16 reports whether the shader-f16 feature is enabled on the device.
func (d *Device) F16() bool { return d.f16 }

// DeviceScopeBarrier reports whether WGSL's storageBarrier orders storage
// memory across the whole device on this build, not only within a
// workgroup: then a workgroup that counts its arrival with an atomic after
// a storageBarrier, and finds it was the last, sees (after another
// storageBarrier) what every other workgroup of the dispatch wrote before
// arriving, and can finish their work in the same dispatch. Natively naga
// compiles storageBarrier to OpControlBarrier with Device memory scope and
// acquire-release semantics on Vulkan (CUDA's __threadfence with
// __syncthreads). The WGSL specification promises only workgroup scope, so
// on other backends and in the browser this is false and such kernels take
// one more dispatch.
func (d *Device) DeviceScopeBarrier() bool { return d.deviceBarrier }

// Close releases the device and everything cached on it. Buffers made on it
// must not be used afterwards.
func (d *Device) Close() {
	if d.closed {
		return
	}
	d.releaseScratch()
	d.dropReadback()
	d.closed = true
	d.binds.open = 0 // batches left unsubmitted die with the device
	d.binds.clear()
	for _, p := range d.pipelines {
		p.release()
	}
	for _, m := range d.modules {
		m.Release()
	}
	for _, c := range d.chunks {
		c.buf.Destroy()
		c.buf.Release()
	}
	d.pipelines, d.pipelinesByKey, d.modules, d.chunks = nil, nil, nil, nil
	d.scopes.close()
	d.queue.Release()
	d.dev.Release()
}

// ErrLost is the error of every call on a device after Lose.
var ErrLost = errors.New("device lost")

// Lose loses the device as a GPU fault would — a reset, a driver crash, a
// browser taking the GPU back — for fault drills: every later submission
// and read fails with ErrLost (and why). In the browser the device is
// destroyed, lost for real; natively it is marked lost (the bundled
// wgpu-native cannot destroy a device). Close still releases it. Safe to
// call from any goroutine.
func (d *Device) Lose(why string) {
	if d.lost.CompareAndSwap(nil, &why) {
		d.destroy()
	}
}

// checkSubmit is check after a submission: where checksEachSubmit is
// false, only the device's state, the scopes left for the next check.
func (d *Device) checkSubmit(op string) error {
	if checksEachSubmit {
		return d.check(op)
	}
	if d.closed {
		return fmt.Errorf("gpu: %s: device is closed", op)
	}
	if why := d.lost.Load(); why != nil {
		return fmt.Errorf("gpu: %s: %w: %s", op, ErrLost, *why)
	}
	if err := d.scopes.lostErr(); err != nil {
		return fmt.Errorf("gpu: %s: %w", op, err)
	}
	return nil
}

// check pops the device's catch-all error scopes, pushes them again, and
// returns what they caught (or that the device is lost), naming op.
func (d *Device) check(op string) error {
	if err := d.checkState(op); err != nil {
		return err
	}
	if err := d.scopes.check(); err != nil {
		return fmt.Errorf("gpu: %s: %w", op, err)
	}
	return nil
}

// checkState reports a closed or lost device, naming op.
func (d *Device) checkState(op string) error {
	if d.closed {
		return fmt.Errorf("gpu: %s: device is closed", op)
	}
	if why := d.lost.Load(); why != nil {
		return fmt.Errorf("gpu: %s: %w: %s", op, ErrLost, *why)
	}
	return nil
}

// newDevice wraps a device fresh from the adapter and opens its error scopes.
func newDevice(dev *wgpu.Device, info AdapterInfo, limits Limits, f16 bool, scopes errorScopes) (*Device, error) {
	d := &Device{
		dev: dev, queue: dev.GetQueue(), info: info, class: info.Class(), limits: limits, f16: f16, scopes: scopes,
		modules: map[string]*wgpu.ShaderModule{}, sources: map[string]string{}, pipelines: map[string]*Pipeline{}, pipelinesByKey: map[pipelineKey]*Pipeline{},
		binds: newBindCache(),
	}
	d.binds.onRelease = func(g *wgpu.BindGroup) { d.objs.forget(g) }
	if err := limits.check(); err != nil {
		d.Close()
		return nil, fmt.Errorf("gpu: %s: %w", info, err)
	}
	return d, nil
}
