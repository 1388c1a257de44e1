package gpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/cogentcore/webgpu/wgpu"
)

// BuildAhead runs record, which asks for pipelines (Device.Pipeline) and
// records passes into dry batches (NewDryBatch), then builds the pipelines
// it asked for that were not built yet, on up to GOMAXPROCS goroutines at
// once. A driver compiles a pipeline in its creation call — tens of ms for
// an engine's kernel on a GPU whose driver has not cached it —, so a
// warm-up building hundreds (an engine's Prepare) takes seconds one after
// another and a fraction of that at once.
//
// Within record a pipeline not built yet is queued unbuilt (a batch that
// runs and records it builds it there, as Device.Pipeline would have).
// BuildAhead returns once every queued pipeline is built or has failed,
// with an error joining the failures; where record fails, it returns that
// error and builds nothing. A pipeline left unbuilt is built by the first
// batch that records it.
//
// BuildAhead is the one exception to one goroutine a device (the package
// comment): while its workers build, the caller waits, and the workers'
// error scopes are pushed and popped concurrently, so a failure is
// reported but may be named after another pipeline of the same call
// (wgpu's own message names the module).
func (d *Device) BuildAhead(record func() error) error {
	if d.closed {
		return errors.New("gpu: building pipelines ahead: device is closed")
	}
	if d.ahead != nil {
		return errors.New("gpu: building pipelines ahead: already within BuildAhead")
	}
	d.ahead = &aheadBuild{byModule: map[string]*aheadModule{}}
	err := record()
	a := d.ahead
	d.ahead = nil
	if err != nil {
		return err
	}
	if err := a.build(d, runtime.GOMAXPROCS(0)); err != nil {
		return fmt.Errorf("gpu: building pipelines ahead: %w", err)
	}
	return nil
}

// aheadBuild is what BuildAhead has queued: the module variants whose
// pipelines record asked for, in the order first asked for.
type aheadBuild struct {
	modules  []*aheadModule
	byModule map[string]*aheadModule // by module name + constants
}

// aheadModule is one module variant and its queued pipelines (one per
// entry point asked for): a worker compiles the module, where the device
// has not already, then each pipeline.
type aheadModule struct {
	key   string             // module name + constants, as Device.modules keys it
	name  string             // module name
	src   string             // its source, specialized
	mod   *wgpu.ShaderModule // the device's, or compiled by the worker
	fresh bool               // mod was compiled by the worker
	pipes []*Pipeline
	built []*Pipeline // those the worker built
	err   error       // the first failure of the worker's build
}

// queue makes k's layouts now and queues its pipeline, returning it
// unbuilt.
func (a *aheadBuild) queue(d *Device, k Kernel, consts Consts, modKey string) (*Pipeline, error) {
	m, ok := a.byModule[modKey]
	if !ok {
		m = &aheadModule{key: modKey, name: k.Module, mod: d.modules[modKey]}
		if m.mod == nil {
			var err error
			if m.src, err = Specialize(k.Source, consts); err != nil {
				return nil, err
			}
		}
		a.byModule[modKey] = m
		a.modules = append(a.modules, m)
	}
	p, err := d.newLayouts(k)
	if err != nil {
		return nil, err
	}
	m.pipes = append(m.pipes, p)
	p.queued = m
	return p, nil
}

// build compiles every queued module and pipeline on up to workers
// goroutines.
func (a *aheadBuild) build(d *Device, workers int) error {
	for _, m := range a.modules {
		if m.mod == nil { // built since, by a batch within record
			m.mod = d.modules[m.key]
		}
	}
	next := make(chan *aheadModule)
	var wg sync.WaitGroup
	for range min(workers, len(a.modules)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range next {
				m.build(d)
			}
		}()
	}
	for _, m := range a.modules {
		next <- m
	}
	close(next)
	wg.Wait()

	var errs []error
	if err := d.check("building pipelines"); err != nil {
		// An error no creation call returned (the browser's are reported
		// here): which one raised it is unknown, so each pipeline built here
		// is built again, alone and checked, by the batch that first
		// records it.
		for _, m := range a.modules {
			m.unbuild()
		}
		errs = append(errs, err)
	}
	for _, m := range a.modules {
		if m.fresh {
			d.modules[m.key] = m.mod
		}
		for _, p := range m.built {
			p.queued = nil
		}
		if m.err != nil {
			errs = append(errs, m.err)
		}
	}
	return errors.Join(errs...)
}

// build compiles m's module, where the device had none, and its pipelines;
// on a worker goroutine.
func (m *aheadModule) build(d *Device) {
	if m.mod == nil {
		mod, err := d.newModule(m.name, m.src)
		if err != nil {
			m.err = fmt.Errorf("module %s: %w", m.key, err)
			return
		}
		m.mod, m.fresh = mod, true
	}
	for _, p := range m.pipes {
		if p.pipe != nil { // built by a batch within record
			continue
		}
		pipe, err := d.compile(p, m.mod)
		if err != nil {
			m.err = fmt.Errorf("pipeline %s:%s: %w", m.key, p.kernel.Entry, err)
			return
		}
		p.pipe = pipe
		m.built = append(m.built, p)
	}
}

// unbuild releases what m's worker built, leaving its pipelines queued.
func (m *aheadModule) unbuild() {
	for _, p := range m.built {
		p.pipe.Release()
		p.pipe = nil
	}
	m.built = nil
	if m.fresh {
		m.mod.Release()
		m.mod, m.fresh = nil, false
	}
}

// buildQueued builds p, which BuildAhead queued and left unbuilt, as
// Device.Pipeline builds a pipeline.
func (d *Device) buildQueued(p *Pipeline) error {
	m := p.queued
	if err := d.build(p, m.key, m.name, func() (string, error) { return m.src, nil }); err != nil {
		return fmt.Errorf("gpu: pipeline %s:%s: %w", m.key, p.kernel.Entry, err)
	}
	p.queued = nil
	return nil
}
