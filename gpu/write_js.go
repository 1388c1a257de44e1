//go:build js

package gpu

import (
	"syscall/js"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// writeBuffer queues a write of data into buf at offset, copied first into
// memory of JavaScript's own. The library's WriteBuffer hands the browser a
// view of Go's memory instead, and making that view races with the memory
// growing: Go allocates between reading the memory's buffer and
// constructing the view on it, a growth detaches that buffer, and the
// construction throws ("Cannot perform Construct on a detached
// ArrayBuffer"), more often the larger the heap.
func (d *Device) writeBuffer(buf *wgpu.Buffer, offset uint64, data []byte) error {
	arr := uint8Array.New(len(data))
	js.CopyBytesToJS(arr, data)
	d.scopes.dev.Get("queue").Call("writeBuffer", bufferJS(buf), offset, arr)
	return nil
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
