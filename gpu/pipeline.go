package gpu

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// Access says how a kernel uses one of its storage buffers.
type Access int

const (
	ReadOnly  Access = iota // var<storage, read>
	ReadWrite               // var<storage, read_write>
)

// Kernel is one WGSL compute entry point and the bind-group layout it
// expects in group 0: a uniform params struct at binding 0 (absent when
// Params is nil), then one storage buffer per element of Storage at
// bindings 1, 2, ….
type Kernel struct {
	Module string // the .wgsl file name: labels the module and keys the cache
	Source string // WGSL text
	Entry  string // entry point name
	// Params is the Go twin of the WGSL params struct: a struct of uint32
	// and float32 fields (or arrays of them) in the WGSL struct's order,
	// blank fields where WGSL pads, a multiple of 16 bytes in all — so
	// that its memory is the uniform's bytes. Dispatch takes a value of it.
	Params  reflect.Type
	Storage []Access
}

// paramsSize is the bytes of k's params (0: none).
func (k *Kernel) paramsSize() int {
	if k.Params == nil {
		return 0
	}
	return int(k.Params.Size())
}

// Consts specializes a kernel's tuning constants: name → value of a
// `const NAME: u32 = …;` declaration in the module (see Specialize).
type Consts map[string]uint32

// Pipeline is a compiled compute pipeline with its explicit layouts.
type Pipeline struct {
	kernel Kernel
	pipe   *wgpu.ComputePipeline // nil while queued
	bgl    *wgpu.BindGroupLayout
	layout *wgpu.PipelineLayout
	// queued is, while pipe is nil, what Device.BuildAhead queued it with:
	// the first batch that records it builds it if BuildAhead did not.
	queued *aheadModule
}

// Name is "module:entry", for error messages.
func (p *Pipeline) Name() string { return p.kernel.Module + ":" + p.kernel.Entry }

func (p *Pipeline) release() {
	if p.pipe != nil {
		p.pipe.Release()
	}
	p.layout.Release()
	p.bgl.Release()
}

// Pipeline returns the compute pipeline for k specialized by consts,
// compiling it on first use and caching it by module, entry and constants.
// A module name must always come with the same source. Within
// Device.BuildAhead's record a pipeline not built yet is queued instead.
func (d *Device) Pipeline(k Kernel, consts Consts) (*Pipeline, error) {
	if d.closed {
		return nil, fmt.Errorf("gpu: pipeline %s:%s: device is closed", k.Module, k.Entry)
	}
	// Every dispatch asks for its pipeline: a comparable key, no allocation.
	fast, ok := newPipelineKey(k, consts)
	if ok {
		if p, ok := d.pipelinesByKey[fast]; ok {
			return p, nil
		}
	}
	if src, ok := d.sources[k.Module]; ok && src != k.Source {
		return nil, fmt.Errorf("gpu: pipeline %s:%s: module name reused for a different source", k.Module, k.Entry)
	}
	d.sources[k.Module] = k.Source
	modKey := k.Module + constsKey(consts)
	key := modKey + ":" + k.Entry
	p, ok := d.pipelines[key]
	if !ok {
		if err := checkParams(k.Params); err != nil {
			return nil, fmt.Errorf("gpu: pipeline %s:%s: %w", k.Module, k.Entry, err)
		}
		if err := CheckParams(k); err != nil {
			return nil, fmt.Errorf("gpu: pipeline %s:%s: params: %w", k.Module, k.Entry, err)
		}
		var err error
		if d.ahead != nil {
			p, err = d.ahead.queue(d, k, consts, modKey)
		} else {
			p, err = d.newPipeline(k, consts, modKey)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: pipeline %s:%s%s: %w", k.Module, k.Entry, constsKey(consts), err)
		}
		d.pipelines[key] = p
	}
	if fast.n >= 0 {
		d.pipelinesByKey[fast] = p
	}
	return p, nil
}

// PipelineNames returns the names of the pipelines built on d so far —
// module, constants and entry, as the pipeline cache keys them —, sorted:
// what a warm-up (engine.Prepare) has built, and what a pass built after
// it.
func (d *Device) PipelineNames() []string {
	return slices.Sorted(maps.Keys(d.pipelines))
}

// PipelineMemo finds pipelines by a caller's comparable key — the
// constants its call site varies, with the kernel where several share the
// memo — before Device.Pipeline: a forward pass asks for hundreds, and
// building a Consts map for each lookup cost a tenth of the host's
// recording time. The zero value is ready; it belongs to one device.
type PipelineMemo[K comparable] struct{ m map[K]*Pipeline }

// Get returns the pipeline remembered for key, or d.Pipeline(k, consts())
// the first time.
func (p *PipelineMemo[K]) Get(d *Device, key K, k Kernel, consts func() Consts) (*Pipeline, error) {
	if pl, ok := p.m[key]; ok {
		return pl, nil
	}
	pl, err := d.Pipeline(k, consts())
	if err != nil {
		return nil, err
	}
	if p.m == nil {
		p.m = map[K]*Pipeline{}
	}
	p.m[key] = pl
	return pl, nil
}

// maxKeyConsts is how many constants a pipelineKey holds; a pipeline with
// more is found by its string key alone.
const maxKeyConsts = 8

// pipelineKey names a pipeline like its string key, as a comparable value:
// module, entry and the constants sorted by name — and where the source
// text lies, so that a module name given another source misses and is
// refused on the slow path.
type pipelineKey struct {
	module, entry string
	source        *byte
	n             int
	names         [maxKeyConsts]string
	values        [maxKeyConsts]uint32
}

func newPipelineKey(k Kernel, consts Consts) (pipelineKey, bool) {
	key := pipelineKey{module: k.Module, entry: k.Entry, source: unsafe.StringData(k.Source), n: -1}
	if len(consts) > maxKeyConsts {
		return key, false
	}
	key.n = 0
	for name, v := range consts { // insertion sort by name: a handful of entries
		i := key.n
		for i > 0 && key.names[i-1] > name {
			key.names[i], key.values[i] = key.names[i-1], key.values[i-1]
			i--
		}
		key.names[i], key.values[i] = name, v
		key.n++
	}
	return key, true
}

func (d *Device) newPipeline(k Kernel, consts Consts, modKey string) (*Pipeline, error) {
	p, err := d.newLayouts(k)
	if err != nil {
		return nil, err
	}
	if err := d.build(p, modKey, k.Module, func() (string, error) { return Specialize(k.Source, consts) }); err != nil {
		p.release()
		return nil, err
	}
	return p, nil
}

// build compiles p's pipeline from the device's module of modKey — made
// from src(), named name, where the device has none — and checks the
// device.
func (d *Device) build(p *Pipeline, modKey, name string, src func() (string, error)) error {
	mod, ok := d.modules[modKey]
	if !ok {
		code, err := src()
		if err != nil {
			return err
		}
		if mod, err = d.newModule(name, code); err != nil {
			return err
		}
		d.modules[modKey] = mod
	}
	pipe, err := d.compile(p, mod)
	if err == nil {
		err = d.check("creating pipeline")
	}
	if err != nil {
		if pipe != nil {
			pipe.Release()
		}
		return err
	}
	p.pipe = pipe
	return nil
}

// newModule compiles a module of WGSL source src, named name.
func (d *Device) newModule(name, src string) (*wgpu.ShaderModule, error) {
	return d.dev.CreateShaderModule(&wgpu.ShaderModuleDescriptor{
		Label:          name,
		WGSLDescriptor: &wgpu.ShaderModuleWGSLDescriptor{Code: src},
	})
}

// newLayouts returns a Pipeline of k with its bind-group and pipeline
// layouts and no compute pipeline yet.
func (d *Device) newLayouts(k Kernel) (*Pipeline, error) {
	var entries []wgpu.BindGroupLayoutEntry
	if size := k.paramsSize(); size > 0 {
		entries = append(entries, wgpu.BindGroupLayoutEntry{
			Binding: 0, Visibility: wgpu.ShaderStageCompute,
			// A dynamic offset: one bind group serves wherever the params sit.
			Buffer: wgpu.BufferBindingLayout{Type: wgpu.BufferBindingTypeUniform, HasDynamicOffset: true, MinBindingSize: uint64(size)},
		})
	}
	for i, a := range k.Storage {
		t := wgpu.BufferBindingTypeReadOnlyStorage
		if a == ReadWrite {
			t = wgpu.BufferBindingTypeStorage
		}
		entries = append(entries, wgpu.BindGroupLayoutEntry{
			Binding: uint32(i + 1), Visibility: wgpu.ShaderStageCompute,
			Buffer: wgpu.BufferBindingLayout{Type: t},
		})
	}
	bgl, err := d.dev.CreateBindGroupLayout(&wgpu.BindGroupLayoutDescriptor{Label: k.Module, Entries: entries})
	if err != nil {
		return nil, err
	}
	layout, err := d.dev.CreatePipelineLayout(&wgpu.PipelineLayoutDescriptor{Label: k.Module, BindGroupLayouts: []*wgpu.BindGroupLayout{bgl}})
	if err != nil {
		bgl.Release()
		return nil, err
	}
	return &Pipeline{kernel: k, bgl: bgl, layout: layout}, nil
}

// compile builds p's compute pipeline from mod: the driver's compilation,
// the slow part of a pipeline, which BuildAhead's workers run at once.
func (d *Device) compile(p *Pipeline, mod *wgpu.ShaderModule) (*wgpu.ComputePipeline, error) {
	d.beforeCompile()
	return d.dev.CreateComputePipeline(&wgpu.ComputePipelineDescriptor{
		Layout:  p.layout,
		Compute: wgpu.ProgrammableStageDescriptor{Module: mod, EntryPoint: p.kernel.Entry},
	})
}

// constsKey renders consts in a canonical order, e.g. "{TT=8,WG=64}".
func constsKey(consts Consts) string {
	if len(consts) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, name := range slices.Sorted(maps.Keys(consts)) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%d", name, consts[name])
	}
	b.WriteByte('}')
	return b.String()
}

var constDecl = regexp.MustCompile(`(?m)^const\s+([A-Za-z_][A-Za-z0-9_]*)\s*:\s*u32\s*=\s*[^;]+;`)

// Specialize returns src with the initializer of each top-level
// `const NAME: u32 = …;` declaration named in consts replaced by its value.
//
// It stands in for WGSL pipeline-overridable constants, which the WGSL
// compiler bundled with the native library does not parse: a tuning
// constant is declared once in the shader with its default, and a pipeline
// may replace that value — nothing else in the text changes. Naming a
// constant the module does not declare is an error.
func Specialize(src string, consts Consts) (string, error) {
	if len(consts) == 0 {
		return src, nil
	}
	seen := map[string]bool{}
	out := constDecl.ReplaceAllStringFunc(src, func(decl string) string {
		name := constDecl.FindStringSubmatch(decl)[1]
		v, ok := consts[name]
		if !ok {
			return decl
		}
		seen[name] = true
		return fmt.Sprintf("const %s: u32 = %du;", name, v)
	})
	for name := range consts {
		if !seen[name] {
			return "", fmt.Errorf("specializing: no `const %s: u32` declaration in the module", name)
		}
	}
	return out, nil
}
