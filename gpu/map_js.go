//go:build js

package gpu

import (
	"fmt"
	"syscall/js"

	"github.com/cogentcore/webgpu/jsx"
	"github.com/cogentcore/webgpu/wgpu"
)

// mapReadChecked maps staging (MapRead, size bytes) once the queue is done
// with it and returns a copy of its contents (mapErr: the mapping failed),
// and what the device's error scopes caught since the last check (checkErr,
// naming op), as check does. The scopes are popped before the mapping is
// awaited, and both answers are awaited together: a read is one round trip
// to the GPU process, not a mapping's and then the scopes'. The scopes see
// the same work either way: everything submitted before the read.
func (d *Device) mapReadChecked(staging *wgpu.Buffer, size uint64, op string) (out []byte, mapErr, checkErr error) {
	// A JavaScript exception in a call below panics in syscall/js.
	defer func() {
		if r := recover(); r != nil {
			out, mapErr = nil, fmt.Errorf("mapping failed: %v", r)
		}
	}()
	if err := d.checkState(op); err != nil {
		return nil, nil, err
	}
	s := d.scopes
	mapping := bufferJS(staging).Call("mapAsync", uint32(wgpu.MapModeRead), 0, size)
	pops := s.popStart()
	s.push()
	all := make([]any, 0, 1+len(pops))
	all = append(all, mapping)
	for _, p := range pops {
		all = append(all, p)
	}
	settled, ok := jsx.Await(promise.Call("allSettled", js.ValueOf(all)))
	if !ok {
		return nil, nil, fmt.Errorf("gpu: %s: waiting for the mapping and the error scopes failed", op)
	}
	results := make([]scopeResult, len(pops))
	for i := range pops {
		r := settled.Index(1 + i)
		results[i] = scopeResult{value: r.Get("value"), ok: r.Get("status").String() == "fulfilled"}
	}
	if err := s.caught(popErrors(results)); err != nil {
		checkErr = fmt.Errorf("gpu: %s: %w", op, err)
	}
	if err := d.checkState(op); err != nil { // lost while waiting
		return nil, nil, err
	}
	if m := settled.Index(0); m.Get("status").String() != "fulfilled" {
		return nil, fmt.Errorf("mapping failed: %s", jsError(m.Get("reason"))), checkErr
	}
	out = staging.GetMappedRange(0, uint(size)) // a copy on js
	if err := staging.Unmap(); err != nil {
		return nil, err, checkErr
	}
	return out, nil, checkErr
}

var promise = js.Global().Get("Promise")

// jsError is a rejection's reason as text.
func jsError(reason js.Value) string {
	if reason.Type() == js.TypeObject && reason.Get("message").Type() == js.TypeString {
		return reason.Get("message").String()
	}
	return reason.String()
}
