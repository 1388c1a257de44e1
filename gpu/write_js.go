//go:build js

package gpu

import (
	"syscall/js"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// writeBuffer queues a write of data into buf at offset, copied first into
// memory of JavaScript's own: the device's write scratch, an array kept
// from write to write (the queue copies what it is given before
// writeBuffer returns). The library's WriteBuffer hands the browser a view
// of Go's memory instead, and making that view races with the memory
// growing: Go allocates between reading the memory's buffer and
// constructing the view on it, a growth detaches that buffer, and the
// construction throws ("Cannot perform Construct on a detached
// ArrayBuffer"), more often the larger the heap. A fresh array a write
// would be garbage for JavaScript to collect, several times a step.
func (d *Device) writeBuffer(buf *wgpu.Buffer, offset uint64, data []byte) error {
	w := &d.writes
	if w.queue.IsUndefined() {
		w.queue = d.scopes.dev.Get("queue")
	}
	if n := len(data); w.arr.IsUndefined() || w.arr.Length() < n {
		w.arr = uint8Array.New(max(n, 2*w.capacity(), 4096))
	}
	js.CopyBytesToJS(w.arr, data)
	w.queue.Call("writeBuffer", bufferJS(buf), offset, w.arr, 0, len(data))
	return nil
}

// writeScratch is the device's queue and the array its writes are copied
// into (writeBuffer).
type writeScratch struct {
	queue, arr js.Value // undefined until the first write
}

// capacity is the scratch's size in bytes (0: none yet).
func (w *writeScratch) capacity() int {
	if w.arr.IsUndefined() {
		return 0
	}
	return w.arr.Length()
}

var uint8Array = js.Global().Get("Uint8Array")

// bufferJS is the GPUBuffer behind the library's Buffer, which holds that
// one js.Value and has no accessor for it; the array sizes below fail to
// compile if the library's Buffer ever holds anything else.
func bufferJS(b *wgpu.Buffer) js.Value { return *(*js.Value)(unsafe.Pointer(b)) }

var (
	_ [unsafe.Sizeof(wgpu.Buffer{}) - unsafe.Sizeof(js.Value{})]struct{}
	_ [unsafe.Sizeof(js.Value{}) - unsafe.Sizeof(wgpu.Buffer{})]struct{}
)
