//go:build js

package gpu

import (
	"fmt"

	"github.com/cogentcore/webgpu/wgpu"
)

// mapRead maps staging (MapRead, size bytes) once the queue is done with it
// and returns a copy of its contents. The library's MapAsync awaits the
// browser's promise.
func (d *Device) mapRead(staging *wgpu.Buffer, size uint64) (out []byte, err error) {
	// The library reports success even when the promise rejects; the
	// browser then throws in getMappedRange, which syscall/js panics with.
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("mapping failed: %v", r)
		}
	}()
	if err := staging.MapAsync(wgpu.MapModeRead, 0, size, func(wgpu.BufferMapAsyncStatus) {}); err != nil {
		return nil, err
	}
	out = staging.GetMappedRange(0, uint(size)) // already a copy on js
	if err := staging.Unmap(); err != nil {
		return nil, err
	}
	return out, nil
}
