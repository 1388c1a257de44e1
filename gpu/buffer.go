package gpu

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// storageUsage is what every Buffer can do: be bound as storage, and be
// written by the queue and copied from (for reads).
const storageUsage = wgpu.BufferUsageStorage | wgpu.BufferUsageCopyDst | wgpu.BufferUsageCopySrc

// writeChunk bounds the staging memory of one Fill write.
const writeChunk = 4 << 20

// Buffer is a storage buffer on a Device. Sizes are in bytes, always a
// multiple of 4.
type Buffer struct {
	d     *Device
	buf   *wgpu.Buffer
	size  uint64
	label string
}

// NewBuffer returns a zero-filled storage buffer of size bytes (rounded up
// to a multiple of 4).
func (d *Device) NewBuffer(label string, size uint64) (*Buffer, error) {
	if d.closed {
		return nil, fmt.Errorf("gpu: buffer %q: device is closed", label)
	}
	size = alignUp(max(size, 4), 4)
	if size > d.limits.MaxBufferSize {
		return nil, fmt.Errorf("gpu: buffer %q: %d bytes exceed the device's maxBufferSize %d", label, size, d.limits.MaxBufferSize)
	}
	buf, err := d.dev.CreateBuffer(&wgpu.BufferDescriptor{Label: label, Size: size, Usage: storageUsage})
	if err == nil {
		err = d.check("creating buffer " + label)
	}
	if err != nil {
		if buf != nil {
			buf.Release()
		}
		return nil, fmt.Errorf("gpu: buffer %q (%d bytes): %w", label, size, err)
	}
	d.bufferBytes.Add(int64(size))
	return &Buffer{d: d, buf: buf, size: size, label: label}, nil
}

// Upload returns a new buffer holding data (zero-padded to a multiple of 4
// bytes).
func (d *Device) Upload(label string, data []byte) (*Buffer, error) {
	b, err := d.NewBuffer(label, uint64(len(data)))
	if err != nil {
		return nil, err
	}
	if err := b.Write(0, data); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

// UploadF32 returns a new buffer holding v.
func (d *Device) UploadF32(label string, v []float32) (*Buffer, error) {
	return d.Upload(label, asBytes(v))
}

// UploadU32 returns a new buffer holding v.
func (d *Device) UploadU32(label string, v []uint32) (*Buffer, error) {
	return d.Upload(label, asBytes(v))
}

// UploadU16 returns a new buffer holding v (f16 bits, say), padded with a
// zero half when len(v) is odd; shaders read it as u32 pairs, the first
// value in the low half.
func (d *Device) UploadU16(label string, v []uint16) (*Buffer, error) {
	return d.Upload(label, asBytes(v))
}

// Size is the buffer's size in bytes.
func (b *Buffer) Size() uint64 { return b.size }

// Label is the name the buffer was made with.
func (b *Buffer) Label() string { return b.label }

// Write copies data (its length a multiple of 4) into the buffer at offset
// (a multiple of 4). It is ordered before the next submitted batch.
func (b *Buffer) Write(offset uint64, data []byte) error {
	if err := b.usable("writing"); err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	if len(data)%4 != 0 {
		data = append(data[:len(data):len(data)], make([]byte, 4-len(data)%4)...)
	}
	if offset%4 != 0 || offset+uint64(len(data)) > b.size {
		return fmt.Errorf("gpu: writing %d bytes at %d into buffer %q of %d bytes: out of range or misaligned", len(data), offset, b.label, b.size)
	}
	if err := b.d.writeBuffer(b.buf, offset, data); err != nil {
		return fmt.Errorf("gpu: writing buffer %q: %w", b.label, err)
	}
	return nil
}

// WriteF32 copies v into the buffer at offset bytes.
func (b *Buffer) WriteF32(offset uint64, v []float32) error { return b.Write(offset, asBytes(v)) }

// WriteU32 copies v into the buffer at offset bytes.
func (b *Buffer) WriteU32(offset uint64, v []uint32) error { return b.Write(offset, asBytes(v)) }

// Fill sets every 32-bit word of the buffer to word: tests poison outputs
// with a NaN (Fill(NaN32)) so that a word a kernel forgot to write shows.
func (b *Buffer) Fill(word uint32) error {
	chunk := make([]byte, min(b.size, writeChunk))
	for i := 0; i < len(chunk); i += 4 {
		binary.LittleEndian.PutUint32(chunk[i:], word)
	}
	for off := uint64(0); off < b.size; off += uint64(len(chunk)) {
		if err := b.Write(off, chunk[:min(uint64(len(chunk)), b.size-off)]); err != nil {
			return err
		}
	}
	return nil
}

// BufferBytes is the memory of the device's buffers alive now — storage
// buffers and the readback staging buffer — in bytes: what webdraft holds
// on the GPU beyond pipelines and small uniform chunks. Safe from any
// goroutine.
func (d *Device) BufferBytes() int64 { return d.bufferBytes.Load() }

// NaN32 is a quiet f32 NaN with a recognizable payload, for Fill.
const NaN32 = 0x7fc00bad

// usable reports a buffer that was released or whose device was closed.
func (b *Buffer) usable(op string) error {
	switch {
	case b.buf == nil:
		return fmt.Errorf("gpu: %s buffer %q: released", op, b.label)
	case b.d.closed:
		return fmt.Errorf("gpu: %s buffer %q: device is closed", op, b.label)
	}
	return nil
}

// Release frees the buffer's memory once the work submitted before it is
// done (free), rather than when it is collected.
func (b *Buffer) Release() {
	if b.buf != nil {
		b.d.binds.forget(b.buf)
		free(b.buf)
		b.buf = nil
		b.d.bufferBytes.Add(-int64(b.size))
	}
}

// Read copies size bytes at offset out of the buffer, after every batch
// submitted before it has run.
func (b *Buffer) Read(offset, size uint64) ([]byte, error) {
	out, err := ReadRanges(Binding{Buf: b, Offset: offset, Size: size})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// ReadRanges copies each range out of its buffer, after every batch
// submitted before it has run, in one read: one copy a range into the
// device's staging buffer, one mapping for all (a wait for the GPU, in the
// browser a round trip to its process). The buffers must share a device.
// Batch.SubmitRead does the same as part of a batch's submission.
func ReadRanges(ranges ...Binding) ([][]byte, error) {
	if len(ranges) == 0 {
		return nil, nil
	}
	d := ranges[0].Buf.d
	rd, err := d.newRead(ranges)
	if err != nil {
		return nil, err
	}
	if rd.total == 0 {
		return rd.out, nil
	}
	enc, err := d.dev.CreateCommandEncoder(nil)
	if err != nil {
		return nil, fmt.Errorf("gpu: reading buffer %q: %w", rd.label, err)
	}
	defer enc.Release()
	if err := rd.copy(enc); err != nil {
		return nil, err
	}
	cmd, err := enc.Finish(nil)
	if err != nil {
		return nil, fmt.Errorf("gpu: reading buffer %q: %w", rd.label, err)
	}
	defer cmd.Release()
	d.queue.Submit(cmd)
	return rd.wait()
}

// read is a read of ranges of one device's buffers through its staging
// buffer: checked and placed (newRead), copied into the staging buffer by a
// command encoder (copy), then mapped once the queue is done (wait).
type read struct {
	d       *Device
	ranges  []Binding
	at      []uint64 // each range's offset in the staging buffer
	total   uint64
	label   string // the first range's buffer's, for errors
	staging *wgpu.Buffer
	out     [][]byte
}

// newRead checks ranges (all on d, 4-byte aligned, within their buffers)
// and places them one after the other in d's staging buffer.
func (d *Device) newRead(ranges []Binding) (*read, error) {
	rd := &read{d: d, ranges: ranges, at: make([]uint64, len(ranges)), out: make([][]byte, len(ranges))}
	if len(ranges) == 0 {
		return rd, nil
	}
	rd.label = ranges[0].Buf.label
	for i, r := range ranges {
		b := r.Buf
		if err := b.usable("reading"); err != nil {
			return nil, err
		}
		if b.d != d {
			return nil, fmt.Errorf("gpu: reading buffer %q: another device's than buffer %q", b.label, rd.label)
		}
		if r.Offset%4 != 0 || r.Size%4 != 0 || r.Offset+r.Size > b.size {
			return nil, fmt.Errorf("gpu: reading %d bytes at %d from buffer %q of %d bytes: out of range or misaligned", r.Size, r.Offset, b.label, b.size)
		}
		rd.at[i], rd.total = rd.total, rd.total+r.Size
	}
	if rd.total == 0 {
		return rd, nil
	}
	staging, err := d.readbackBuffer(rd.total)
	if err != nil {
		return nil, fmt.Errorf("gpu: reading buffer %q: %w", rd.label, err)
	}
	rd.staging = staging
	return rd, nil
}

// copy records the copies of the ranges into the staging buffer.
func (rd *read) copy(enc *wgpu.CommandEncoder) error {
	for i, r := range rd.ranges {
		if r.Size == 0 {
			continue
		}
		if err := enc.CopyBufferToBuffer(r.Buf.buf, r.Offset, rd.staging, rd.at[i], r.Size); err != nil {
			return fmt.Errorf("gpu: reading buffer %q: %w", r.Buf.label, err)
		}
	}
	return nil
}

// wait maps the staging buffer once the copies have run and returns each
// range's bytes, with what the device's error scopes caught since the last
// check.
func (rd *read) wait() ([][]byte, error) {
	d := rd.d
	raw, err, cerr := d.mapReadChecked(rd.staging, rd.total, "reading buffer "+rd.label)
	if err != nil {
		d.dropReadback() // its mapping state is unknown now
	}
	if cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("gpu: reading buffer %q: %w", rd.label, err)
	}
	for i, r := range rd.ranges {
		if r.Size > 0 {
			rd.out[i] = raw[rd.at[i] : rd.at[i]+r.Size]
		}
	}
	return rd.out, nil
}

// readbackBuffer returns the device's MapRead staging buffer, at least size
// bytes: one, reused by every Read rather than one created and destroyed a
// Read, grown to the next power of two when too small.
func (d *Device) readbackBuffer(size uint64) (*wgpu.Buffer, error) {
	if d.readback != nil && d.readbackSize >= size {
		return d.readback, nil
	}
	grown := uint64(4096)
	for grown < size {
		grown *= 2
	}
	staging, err := d.dev.CreateBuffer(&wgpu.BufferDescriptor{Label: "readback", Size: grown, Usage: wgpu.BufferUsageMapRead | wgpu.BufferUsageCopyDst})
	if err != nil {
		return nil, err
	}
	d.dropReadback()
	d.readback, d.readbackSize = staging, grown
	d.bufferBytes.Add(int64(grown))
	return staging, nil
}

// dropReadback frees the readback staging buffer (Close, growth, a failed
// mapping).
func (d *Device) dropReadback() {
	if d.readback != nil {
		d.readback.Destroy()
		d.readback.Release()
		d.bufferBytes.Add(-int64(d.readbackSize))
		d.readback, d.readbackSize = nil, 0
	}
}

// ReadF32 returns the whole buffer as f32s.
func (b *Buffer) ReadF32() ([]float32, error) {
	raw, err := b.Read(0, b.size)
	if err != nil {
		return nil, err
	}
	return fromBytes[float32](raw), nil
}

// ReadU32 returns the whole buffer as u32s.
func (b *Buffer) ReadU32() ([]uint32, error) {
	raw, err := b.Read(0, b.size)
	if err != nil {
		return nil, err
	}
	return fromBytes[uint32](raw), nil
}

// asBytes views a slice of fixed-size numbers as its little-endian bytes
// (every WebGPU target is little-endian).
func asBytes[T float32 | uint32 | uint16 | int32](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(v[0])))
}

// fromBytes copies raw into a new slice of T.
func fromBytes[T float32 | uint32](raw []byte) []T {
	out := make([]T, len(raw)/4)
	copy(asBytes(out), raw)
	return out
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }
