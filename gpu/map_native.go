//go:build !js

package gpu

import (
	"fmt"
	"time"

	"github.com/cogentcore/webgpu/wgpu"
)

// spinPoll makes mapRead wait for the GPU by polling without sleeping (up
// to spinTimeout, then blocking) instead of blocking in the driver at once.
var spinPoll = false

const spinTimeout = 10 * time.Second

// mapReadChecked is mapRead, then check: the mapping's error and what the
// device's error scopes caught, naming op (the browser's waits for both at
// once).
func (d *Device) mapReadChecked(staging *wgpu.Buffer, size uint64, op string) (out []byte, mapErr, checkErr error) {
	out, mapErr = d.mapRead(staging, size)
	return out, mapErr, d.check(op)
}

// mapRead maps staging (MapRead, size bytes) once the queue is done with it
// and returns a copy of its contents.
func (d *Device) mapRead(staging *wgpu.Buffer, size uint64) ([]byte, error) {
	done := false
	var status wgpu.BufferMapAsyncStatus
	if err := staging.MapAsync(wgpu.MapModeRead, 0, size, func(s wgpu.BufferMapAsyncStatus) {
		status, done = s, true
	}); err != nil {
		return nil, err
	}
	if spinPoll {
		// Poll(false) checks for finished work and runs the callbacks
		// without sleeping.
		for deadline := time.Now().Add(spinTimeout); !done && time.Now().Before(deadline); {
			d.dev.Poll(false, nil)
		}
	}
	// Poll(true) blocks until the queue is idle and runs the callbacks; a
	// second round covers a callback that lands just after.
	for range 2 {
		if done {
			break
		}
		d.dev.Poll(true, nil)
	}
	if !done {
		return nil, fmt.Errorf("mapping never completed")
	}
	if status != wgpu.BufferMapAsyncStatusSuccess {
		return nil, fmt.Errorf("mapping failed: %s", status)
	}
	out := make([]byte, size)
	copy(out, staging.GetMappedRange(0, uint(size)))
	if err := staging.Unmap(); err != nil {
		return nil, err
	}
	return out, nil
}
