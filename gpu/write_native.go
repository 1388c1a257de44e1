//go:build !js

package gpu

import "github.com/cogentcore/webgpu/wgpu"

// writeBuffer queues a write of data into buf at offset.
func (d *Device) writeBuffer(buf *wgpu.Buffer, offset uint64, data []byte) error {
	return d.queue.WriteBuffer(buf, offset, data)
}

// writeScratch is what the browser's writes copy through (none natively).
type writeScratch struct{}
