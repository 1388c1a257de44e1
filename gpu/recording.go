package gpu

import (
	"errors"
	"fmt"

	"github.com/cogentcore/webgpu/wgpu"
)

// ErrStaleRecording is returned by Replay for a Recording that names a
// bind group the device has released since (one of its buffers was).
var ErrStaleRecording = errors.New("gpu: recording is stale: a buffer it binds was released")

// Recording is what one piece of recording code dispatched into a batch —
// each dispatch's pipeline, bind group, params and grid — captured so that
// later batches can record the same dispatches again without running that
// code (Batch.Replay): the planning, the bind-group lookups and the params'
// assembly are done once. It is what a CUDA graph is to a stream, for one
// batch at a time: a replayed dispatch costs the host its params' copy and
// its commands, so a step recorded each time the same — an engine's decode
// step at one batch shape — costs little more than WebGPU's own calls.
//
// A Recording holds its bind groups but not their buffers: it goes stale
// (Valid false) as soon as the device releases any bind group, which it
// does when a buffer is released; the caller records afresh then.
type Recording struct {
	d     *Device
	epoch uint64 // the device's binds.epoch while the recording was made
	stale bool   // a bind group was released while it was being made
	ops   []recordedDispatch
	words []uint32 // the dispatches' params, in order
}

type recordedDispatch struct {
	p     *Pipeline
	group *wgpu.BindGroup
	// entries are the group's bindings, the params' chunk first if it has
	// params: a replay whose params land in another chunk looks up the
	// group that binds that one.
	entries []wgpu.BindGroupEntry
	params  int // words of params, taken in turn from Recording.words
	x, y, z uint32
	slots   objectSlots // the recorder's lookups of p and group
}

// add appends one dispatch to the recording.
func (r *Recording) add(p *Pipeline, group *wgpu.BindGroup, entries []wgpu.BindGroupEntry, params []uint32, x, y, z uint32) {
	r.ops = append(r.ops, recordedDispatch{p: p, group: group, entries: append([]wgpu.BindGroupEntry(nil), entries...), params: len(params), x: x, y: y, z: z})
	r.words = append(r.words, params...)
}

// Len is the number of dispatches recorded.
func (r *Recording) Len() int { return len(r.ops) }

// Valid reports whether every object r names is still alive on its device,
// so that Replay can record it.
func (r *Recording) Valid() bool {
	return !r.stale && !r.d.closed && r.epoch == r.d.binds.epoch
}

// Capture runs record against b, recording its dispatches into b as usual,
// and returns them as a Recording. Captures do not nest.
func (b *Batch) Capture(record func(*Batch) error) (*Recording, error) {
	if b.capture != nil {
		return nil, fmt.Errorf("gpu: batch %q: capture within a capture", b.label)
	}
	r := &Recording{d: b.d, epoch: b.d.binds.epoch}
	b.capture = r
	err := record(b)
	b.capture = nil
	if err != nil {
		return nil, err
	}
	if b.err != nil {
		return nil, b.err
	}
	r.stale = r.epoch != b.d.binds.epoch
	return r, nil
}

// Replay records r's dispatches into b, in order, with their params as they
// were captured. A stale r records nothing and returns ErrStaleRecording,
// leaving b usable.
func (b *Batch) Replay(r *Recording) error {
	if b.err != nil {
		return b.err
	}
	if r.d != b.d {
		b.err = fmt.Errorf("gpu: batch %q: replaying another device's recording", b.label)
		return b.err
	}
	if !r.Valid() {
		return ErrStaleRecording
	}
	if b.ended {
		b.err = fmt.Errorf("gpu: batch %q: replay: batch already submitted", b.label)
		return b.err
	}
	d, words := b.d, r.words
	fail := func(op *recordedDispatch, err error) error {
		b.err = fmt.Errorf("gpu: batch %q: replay %s: %w", b.label, op.p.Name(), err)
		return b.err
	}
	for i := range r.ops {
		op := &r.ops[i]
		group, entries, slots, hasParams, off := op.group, op.entries, &op.slots, op.params > 0, uint64(0)
		if hasParams {
			chunk, at, err := b.params(words[:op.params])
			if err != nil {
				return fail(op, err)
			}
			off = at
			if chunk != op.entries[0].Buffer {
				entries = append(b.entries[:0], op.entries...)
				entries[0].Buffer = chunk
				b.entries = entries
				slots = nil
				if group, err = d.binds.get(d.dev, op.p.kernel.Module, op.p.bgl, entries); err != nil {
					return fail(op, err)
				}
			}
		}
		if err := b.emit(op.p, group, slots, hasParams, uint32(off), op.x, op.y, op.z); err != nil {
			return fail(op, err)
		}
		if c := b.capture; c != nil {
			c.add(op.p, group, entries, words[:op.params], op.x, op.y, op.z)
		}
		words = words[op.params:]
	}
	return nil
}
