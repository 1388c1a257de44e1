package gpu

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// paramsChunkSize is the size of one uniform buffer holding the params of
// many dispatches (64 KiB: WebGPU's default maxUniformBufferBindingSize).
const paramsChunkSize = 64 << 10

// Binding is a byte range of a Buffer bound to one storage binding.
type Binding struct {
	Buf          *Buffer
	Offset, Size uint64
}

// All binds the whole buffer.
func (b *Buffer) All() Binding { return Binding{Buf: b, Size: b.size} }

// Slice binds size bytes at offset (a multiple of the device's
// minStorageBufferOffsetAlignment).
func (b *Buffer) Slice(offset, size uint64) Binding {
	return Binding{Buf: b, Offset: offset, Size: size}
}

// Batch records dispatches into one command encoder and one compute pass,
// and submits them at once: dispatches run in the order recorded, each
// seeing the writes of the ones before. The params of all dispatches are
// gathered on the host and written to uniform chunks with one queue write
// per chunk just before the submit.
//
// Keep a batch to about one forward pass: lavapipe has been seen to crash on
// a command buffer of ~560 dispatches with distinct bind groups (336 were
// fine). Len tells how many are recorded.
type Batch struct {
	d      *Device
	label  string
	enc    *wgpu.CommandEncoder
	pass   *wgpu.ComputePassEncoder
	chunks []*paramsChunk
	prof   *profiler // non-nil: each dispatch timed in a pass of its own (Profile)
	n      int
	err    error // the first recording error; Submit returns it
	ended  bool
	// Reused by every dispatch (wgpu-native copies what it keeps).
	entries []wgpu.BindGroupEntry
	offsets [1]uint32
	rec     recorder   // the pass's dispatches, unless profiled
	capture *Recording // non-nil: dispatches are also added here (Capture)
	dry     bool       // see NewDryBatch
	done    bool       // submitted or discarded: its resources released
}

// paramsChunk is a uniform buffer and its host image.
type paramsChunk struct {
	buf  *wgpu.Buffer
	data []byte // bytes used so far
}

// NewBatch starts a batch.
func (d *Device) NewBatch(label string) (*Batch, error) {
	if d.closed {
		return nil, fmt.Errorf("gpu: batch %q: device is closed", label)
	}
	enc, err := d.dev.CreateCommandEncoder(&wgpu.CommandEncoderDescriptor{Label: label})
	if err != nil {
		return nil, fmt.Errorf("gpu: batch %q: %w", label, err)
	}
	d.binds.begin()
	return &Batch{d: d, label: label, enc: enc, pass: enc.BeginComputePass(nil)}, nil
}

// NewDryBatch starts a batch that makes what its dispatches need — their
// pipelines, bind groups and params — as a batch that runs would, records
// nothing for the GPU and can only be discarded: a warm-up records a pass
// into one to build its pipelines (Device.BuildAhead).
func (d *Device) NewDryBatch(label string) (*Batch, error) {
	if d.closed {
		return nil, fmt.Errorf("gpu: batch %q: device is closed", label)
	}
	d.binds.begin()
	return &Batch{d: d, label: label, dry: true}, nil
}

// Device is the device the batch records for.
func (b *Batch) Device() *Device { return b.d }

// Len is the number of dispatches recorded.
func (b *Batch) Len() int { return b.n }

// Dispatch records p into b over a grid of (x, y, z) workgroups, with
// params — a value of the kernel's Params type, or nil for a kernel without
// params — and its storage buffers in binding order. A grid with a zero
// dimension records nothing. After an error the batch is spoiled: Submit
// returns that error.
func Dispatch[P any](b *Batch, p *Pipeline, params *P, bufs []Binding, x, y, z uint32) error {
	if b.err != nil {
		return b.err
	}
	var words []uint32
	if t := p.kernel.Params; params != nil || t != nil {
		if reflect.TypeFor[P]() != t || params == nil {
			b.err = fmt.Errorf("gpu: batch %q: dispatch %s: params %T, want %v", b.label, p.Name(), params, t)
			return b.err
		}
		// Params is a struct of 4-byte fields (checkParams): its memory is
		// the uniform's words.
		words = unsafe.Slice((*uint32)(unsafe.Pointer(params)), unsafe.Sizeof(*params)/4)
	}
	b.err = b.dispatch(p, words, bufs, x, y, z)
	return b.err
}

func (b *Batch) dispatch(p *Pipeline, params []uint32, bufs []Binding, x, y, z uint32) error {
	k, d := &p.kernel, b.d
	fail := func(format string, args ...any) error {
		return fmt.Errorf("gpu: batch %q: dispatch %s: %s", b.label, p.Name(), fmt.Sprintf(format, args...))
	}
	switch {
	case b.ended:
		return fail("batch already submitted")
	case len(bufs) != len(k.Storage):
		return fail("%d storage buffers, want %d", len(bufs), len(k.Storage))
	}
	if maxN := d.limits.MaxComputeWorkgroupsPerDimension; x > maxN || y > maxN || z > maxN {
		return fail("grid (%d, %d, %d) exceeds %d workgroups per dimension", x, y, z, maxN)
	}
	if x == 0 || y == 0 || z == 0 {
		return nil
	}
	entries := b.entries[:0]
	var chunk *wgpu.Buffer
	var off uint64
	if len(params) > 0 {
		var err error
		if chunk, off, err = b.params(params); err != nil {
			return fail("%v", err)
		}
		entries = append(entries, wgpu.BindGroupEntry{Binding: 0, Buffer: chunk, Offset: 0, Size: uint64(4 * len(params))})
	}
	for i, bind := range bufs {
		if err := d.checkBinding(bind); err != nil {
			return fail("binding %d: %v", i+1, err)
		}
		entries = append(entries, wgpu.BindGroupEntry{Binding: uint32(i + 1), Buffer: bind.Buf.buf, Offset: bind.Offset, Size: bind.Size})
	}
	b.entries = entries
	group, err := d.binds.get(d.dev, k.Module, p.bgl, entries)
	if err != nil {
		return fail("%v", err)
	}
	if err := b.emit(p, group, nil, chunk != nil, uint32(off), x, y, z); err != nil {
		return fail("%v", err)
	}
	if c := b.capture; c != nil {
		c.add(p, group, entries, params, x, y, z)
	}
	return nil
}

// emit records one dispatch of p with its bind group, whose params, if it
// has any, lie at offset off of the chunk it binds; slots, if not nil,
// caches what the recorder looks up of p and group.
func (b *Batch) emit(p *Pipeline, group *wgpu.BindGroup, slots *objectSlots, hasParams bool, off uint32, x, y, z uint32) error {
	if b.dry {
		b.n++
		return nil
	}
	if p.pipe == nil { // queued by a BuildAhead that did not build it
		if err := b.d.buildQueued(p); err != nil {
			return err
		}
	}
	var offsets []uint32
	if hasParams {
		b.offsets[0] = off
		offsets = b.offsets[:]
	}
	if b.prof == nil {
		b.rec.dispatch(b.d, b.pass, p.pipe, group, slots, offsets, x, y, z)
	} else {
		if err := b.beginDispatch(p.Name()); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		b.pass.SetPipeline(p.pipe)
		b.pass.SetBindGroup(0, group, offsets)
		b.pass.DispatchWorkgroups(x, y, z)
		if err := b.endDispatch(); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	b.n++
	return nil
}

// checkBinding reports a binding WebGPU would reject, with the buffer's name.
func (d *Device) checkBinding(bind Binding) error {
	switch {
	case bind.Buf == nil || bind.Buf.buf == nil:
		return errors.New("nil or released buffer")
	case bind.Size == 0 || bind.Size%4 != 0:
		return fmt.Errorf("buffer %q: binding size %d is not a positive multiple of 4", bind.Buf.label, bind.Size)
	case bind.Offset+bind.Size > bind.Buf.size:
		return fmt.Errorf("buffer %q: range [%d, %d) exceeds its %d bytes", bind.Buf.label, bind.Offset, bind.Offset+bind.Size, bind.Buf.size)
	case bind.Offset%uint64(d.limits.MinStorageBufferOffsetAlignment) != 0:
		return fmt.Errorf("buffer %q: offset %d is not a multiple of %d", bind.Buf.label, bind.Offset, d.limits.MinStorageBufferOffsetAlignment)
	case bind.Size > d.limits.MaxStorageBufferBindingSize:
		return fmt.Errorf("buffer %q: binding of %d bytes exceeds the device's maxStorageBufferBindingSize %d", bind.Buf.label, bind.Size, d.limits.MaxStorageBufferBindingSize)
	}
	return nil
}

// params places one dispatch's params in the current uniform chunk,
// starting a new chunk when it is full, and returns where they are.
func (b *Batch) params(words []uint32) (*wgpu.Buffer, uint64, error) {
	d := b.d
	stride := alignUp(uint64(len(words)*4), uint64(max(d.limits.MinUniformBufferOffsetAlignment, 16)))
	if len(b.chunks) == 0 || uint64(len(b.chunks[len(b.chunks)-1].data))+stride > paramsChunkSize {
		c, err := d.takeChunk()
		if err != nil {
			return nil, 0, err
		}
		b.chunks = append(b.chunks, c)
	}
	c := b.chunks[len(b.chunks)-1]
	off := uint64(len(c.data))
	c.data = append(c.data, asBytes(words)...)
	c.data = append(c.data, paramsPad[:off+stride-uint64(len(c.data))]...)
	return c.buf, off, nil
}

// paramsPad is zeros to pad params to their stride with: less than the
// uniform offset alignment, which WebGPU caps at 256.
var paramsPad [256]byte

// takeChunk returns a free uniform chunk, emptied, making one if none is
// free. A chunk keeps its host image from batch to batch: a step records
// several batches, and a fresh 64 KiB image each would be garbage to
// collect (in the browser's Go, a cost the step feels).
func (d *Device) takeChunk() (*paramsChunk, error) {
	if n := len(d.chunks); n > 0 {
		c := d.chunks[n-1]
		d.chunks = d.chunks[:n-1]
		c.data = c.data[:0]
		return c, nil
	}
	buf, err := d.dev.CreateBuffer(&wgpu.BufferDescriptor{
		Label: "params", Size: paramsChunkSize, Usage: wgpu.BufferUsageUniform | wgpu.BufferUsageCopyDst,
	})
	if err == nil {
		err = d.check("creating a params chunk")
	}
	if err != nil {
		if buf != nil {
			buf.Release()
		}
		return nil, err
	}
	return &paramsChunk{buf: buf, data: make([]byte, 0, paramsChunkSize)}, nil
}

// Submit ends the pass, writes the params, submits the batch and reports
// any device error raised by it — in the browser, where that check is a
// round trip to the GPU process, the next Read reports them (and a lost
// device at once). It does not wait for the GPU: a Read afterwards does.
// The batch cannot be used again.
func (b *Batch) Submit() error {
	return b.checked(b.submit(nil))
}

// checked is err, the batch's submission's, or else what the device's
// check after a submission reports (checkSubmit), which runs either way.
func (b *Batch) checked(err error) error {
	if cerr := b.d.checkSubmit("submitting batch " + b.label); err == nil && cerr != nil {
		err = fmt.Errorf("gpu: batch %q: %w", b.label, cerr)
	}
	return err
}

// SubmitRead is Submit followed by ReadRanges(ranges...), in one
// submission: the copies into the staging buffer follow the pass in the
// batch's own command buffer (a submission and its command encoder fewer
// a read, which in the browser costs the host more than the copies). It
// waits for the GPU and returns each range's bytes, with the device's
// errors since the last check, as ReadRanges does.
func (b *Batch) SubmitRead(ranges ...Binding) ([][]byte, error) {
	if b.ended {
		return nil, fmt.Errorf("gpu: batch %q: already submitted or discarded", b.label)
	}
	if b.dry {
		b.Discard()
		return nil, fmt.Errorf("gpu: batch %q: a dry batch cannot be submitted", b.label)
	}
	rd, err := b.d.newRead(ranges)
	if err != nil {
		b.Discard()
		return nil, err
	}
	if err := b.submit(rd); err != nil {
		return nil, b.checked(err)
	}
	if rd.total == 0 {
		return rd.out, b.checked(nil)
	}
	return rd.wait()
}

// submit ends the pass, records rd's copies after it (rd non-nil), writes
// the params and submits the batch.
func (b *Batch) submit(rd *read) error {
	if b.ended {
		return fmt.Errorf("gpu: batch %q: already submitted or discarded", b.label)
	}
	d := b.d
	b.ended = true
	if b.err != nil { // a recording error, which names the batch already
		b.Discard()
		return b.err
	}
	if b.dry {
		b.Discard()
		return fmt.Errorf("gpu: batch %q: a dry batch cannot be submitted", b.label)
	}
	var err error
	if b.prof == nil {
		b.rec.flush(d, b.pass)
		err = endPass(b.pass)
	} else {
		err = b.resolveTimestamps()
	}
	if err == nil && rd != nil && rd.total > 0 {
		err = rd.copy(b.enc)
	}
	var cmd *wgpu.CommandBuffer
	if err == nil {
		cmd, err = b.enc.Finish(nil)
	}
	for _, c := range b.chunks {
		if err == nil {
			err = d.writeBuffer(c.buf, 0, c.data)
		}
	}
	if err == nil {
		d.queue.Submit(cmd)
	}
	// Queue writes are ordered after this submission, so the chunks can
	// serve the next batch at once; bind groups stay in the device's cache.
	b.release()
	if cmd != nil {
		cmd.Release()
	}
	if err != nil {
		return fmt.Errorf("gpu: batch %q: %w", b.label, err)
	}
	return nil
}

// Discard drops a batch without submitting it.
func (b *Batch) Discard() {
	if b.done {
		return
	}
	b.ended = true
	b.rec.reset()
	if b.pass != nil {
		endPass(b.pass)
	}
	if b.prof != nil {
		b.prof.release()
	}
	b.release()
	b.d.scopes.check() // drop whatever the abandoned recording raised
}

func (b *Batch) release() {
	b.done = true
	b.d.chunks = append(b.d.chunks, b.chunks...)
	b.chunks = nil
	if b.pass != nil {
		b.pass.Release()
	}
	if b.enc != nil {
		b.enc.Release()
	}
	b.pass, b.enc = nil, nil
	b.d.binds.end()
}
