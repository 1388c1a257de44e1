//go:build !js

package gpu

import (
	"encoding/binary"
	"fmt"

	"github.com/cogentcore/webgpu/wgpu"
)

// profiler brackets each dispatch of a batch with timestamps. Timestamps
// can be written only between compute passes here (the bundled wgpu-native
// has no timestamps inside passes), so a profiled batch records every
// dispatch in a pass of its own: for measuring, not for serving.
type profiler struct {
	set     *wgpu.QuerySet
	resolve *Buffer
	names   []string
	max     int
}

// Profile makes b time each of its next dispatches, up to max of them;
// Submit then resolves the timestamps and Results reads them.
func (b *Batch) Profile(max int) error {
	d := b.d
	if !d.timestamps {
		return errNoTimestamps(d)
	}
	if b.n > 0 || b.prof != nil {
		return fmt.Errorf("gpu: batch %q: Profile must come before the first dispatch", b.label)
	}
	if b.dry {
		return fmt.Errorf("gpu: batch %q: a dry batch runs nothing to time", b.label)
	}
	set, err := d.dev.CreateQuerySet(&wgpu.QuerySetDescriptor{Label: b.label, Type: wgpu.QueryTypeTimestamp, Count: uint32(2 * max)})
	if err != nil {
		return fmt.Errorf("gpu: batch %q: query set: %w", b.label, err)
	}
	raw, err := d.dev.CreateBuffer(&wgpu.BufferDescriptor{
		Label: b.label + ".timestamps", Size: uint64(16 * max), Usage: wgpu.BufferUsageQueryResolve | wgpu.BufferUsageCopySrc,
	})
	if err != nil {
		set.Release()
		return fmt.Errorf("gpu: batch %q: timestamp buffer: %w", b.label, err)
	}
	// The batch's compute pass is replaced by one pass per dispatch.
	endPass(b.pass)
	b.pass.Release()
	b.pass = nil
	b.prof = &profiler{set: set, resolve: &Buffer{d: d, buf: raw, size: uint64(16 * max), label: b.label + ".timestamps"}, max: max}
	return nil
}

// beginDispatch opens the dispatch's own pass after a timestamp.
func (b *Batch) beginDispatch(name string) error {
	p := b.prof
	if len(p.names) == p.max {
		return fmt.Errorf("more than the %d dispatches given to Profile", p.max)
	}
	if err := b.enc.WriteTimestamp(p.set, uint32(2*len(p.names))); err != nil {
		return err
	}
	p.names = append(p.names, name)
	b.pass = b.enc.BeginComputePass(nil)
	return nil
}

// endDispatch closes the dispatch's pass and writes the closing timestamp.
func (b *Batch) endDispatch() error {
	if err := endPass(b.pass); err != nil {
		return err
	}
	b.pass.Release()
	b.pass = nil
	return b.enc.WriteTimestamp(b.prof.set, uint32(2*len(b.prof.names)-1))
}

// resolveTimestamps copies the timestamps into the readable buffer (before
// the encoder finishes).
func (b *Batch) resolveTimestamps() error {
	if n := len(b.prof.names); n > 0 {
		return b.enc.ResolveQuerySet(b.prof.set, 0, uint32(2*n), b.prof.resolve.buf, 0)
	}
	return nil
}

// Results reads a submitted profiled batch's timestamps (waiting for it).
func (b *Batch) Results() (Profile, error) {
	out := Profile{Ticks: map[string]uint64{}, Count: map[string]int{}}
	p := b.prof
	if p == nil {
		return out, fmt.Errorf("gpu: batch %q was not profiled", b.label)
	}
	defer p.release()
	if len(p.names) == 0 {
		return out, nil
	}
	raw, err := p.resolve.Read(0, uint64(16*len(p.names)))
	if err != nil {
		return out, err
	}
	for i, name := range p.names {
		start := binary.LittleEndian.Uint64(raw[16*i:])
		end := binary.LittleEndian.Uint64(raw[16*i+8:])
		if end >= start {
			out.Ticks[name] += end - start
		}
		out.Count[name]++
	}
	return out, nil
}

func (p *profiler) release() {
	if p.set != nil {
		p.set.Release()
		p.resolve.Release()
		p.set = nil
	}
}
