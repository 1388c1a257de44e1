//go:build js

package gpu

import (
	"syscall/js"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// recorder records a batch's dispatches in the browser: each call into
// JavaScript (syscall/js) costs far more than the WebGPU call it makes —
// through Dawn on the H200, 41 % of the engine's host time was spent in
// them, four or more a dispatch (setPipeline, setBindGroup with a JS array
// of offsets built each time, dispatchWorkgroups) — so the dispatches are
// written as words of a command list in Go and replayed into the pass by
// one JavaScript function, two calls a batch: the list copied into a
// Uint32Array, then the replay. Pipelines and bind groups are named by
// their index in the device's object table (objects).
//
// A command: pipeline, bind group, n dynamic offsets, the n offsets, x, y,
// z.
type recorder struct {
	cmds []uint32
}

// objectSlots caches a replayed dispatch's pipeline and bind group's slots
// in the device's object table (a Recording's; slots live while their
// objects do, which a valid Recording's do).
type objectSlots struct {
	pipe, group uint32
	ok          bool
}

func (r *recorder) dispatch(d *Device, _ *wgpu.ComputePassEncoder, pipe *wgpu.ComputePipeline, group *wgpu.BindGroup, slots *objectSlots, offsets []uint32, x, y, z uint32) {
	var pi, gi uint32
	if slots != nil && slots.ok {
		pi, gi = slots.pipe, slots.group
	} else {
		pi, gi = d.objs.index(pipe, jsValueOf(unsafe.Pointer(pipe))), d.objs.index(group, jsValueOf(unsafe.Pointer(group)))
		if slots != nil {
			*slots = objectSlots{pipe: pi, group: gi, ok: true}
		}
	}
	r.cmds = append(r.cmds, pi, gi, uint32(len(offsets)))
	r.cmds = append(r.cmds, offsets...)
	r.cmds = append(r.cmds, x, y, z)
}

// flush replays the recorded dispatches into pass and empties the list.
func (r *recorder) flush(d *Device, pass *wgpu.ComputePassEncoder) {
	if len(r.cmds) == 0 {
		return
	}
	o := &d.objs
	if n := len(r.cmds) * 4; o.words.IsUndefined() || o.bytes.Length() < n {
		buf := js.Global().Get("ArrayBuffer").New(max(n, 2*o.capacity(), 4096))
		o.words = js.Global().Get("Uint32Array").New(buf)
		o.bytes = js.Global().Get("Uint8Array").New(buf)
	}
	js.CopyBytesToJS(o.bytes, unsafe.Slice((*byte)(unsafe.Pointer(&r.cmds[0])), len(r.cmds)*4))
	o.replay.Invoke(jsValueOf(unsafe.Pointer(pass)), o.table, o.words, len(r.cmds))
	r.cmds = r.cmds[:0]
}

// reset drops what the recorder holds.
func (r *recorder) reset() { r.cmds = r.cmds[:0] }

// jsValueOf is the JavaScript object behind a wgpu handle: a
// ComputePipeline's, a BindGroup's or a ComputePassEncoder's only field
// (github.com/cogentcore/webgpu v0.23.0's wgpu/*_js.go, pinned in go.mod).
func jsValueOf(p unsafe.Pointer) js.Value { return *(*js.Value)(p) }

// objects is a device's table of the pipelines and bind groups its
// recorders name, a JavaScript array: an object is added on its first use
// and its slot freed when it is released (forget), for the next to take.
type objects struct {
	table, replay js.Value
	words, bytes  js.Value // the command list's buffer, grown as needed
	slots         map[any]uint32
	free          []uint32
	n             uint32
}

// replayJS replays a command list (recorder) into a compute pass; it skips
// a setPipeline that repeats the one before, and passes one dynamic offset
// (a params chunk's) in a plain array, reused: Dawn takes that faster than
// a range of the Uint32Array (1.9 against 2.2 µs a dispatch on its null
// backend).
const replayJS = `
let last = null;
const one = [0];
for (let i = 0; i < n; ) {
  const pipe = objs[cmds[i]], group = objs[cmds[i + 1]], k = cmds[i + 2];
  if (pipe !== last) { pass.setPipeline(pipe); last = pipe; }
  if (k === 0) pass.setBindGroup(0, group);
  else if (k === 1) { one[0] = cmds[i + 3]; pass.setBindGroup(0, group, one); }
  else pass.setBindGroup(0, group, Array.from(cmds.subarray(i + 3, i + 3 + k)));
  i += 3 + k;
  pass.dispatchWorkgroups(cmds[i], cmds[i + 1], cmds[i + 2]);
  i += 3;
}`

func (o *objects) init() {
	if o.slots != nil {
		return
	}
	o.slots = map[any]uint32{}
	o.table = js.Global().Get("Array").New()
	o.replay = js.Global().Get("Function").New("pass", "objs", "cmds", "n", replayJS)
	o.words, o.bytes = js.Undefined(), js.Undefined()
}

// capacity is the command list's buffer size in bytes (0: none yet).
func (o *objects) capacity() int {
	if o.bytes.IsUndefined() {
		return 0
	}
	return o.bytes.Length()
}

// index is key's slot in the table, v set there on its first use.
func (o *objects) index(key any, v js.Value) uint32 {
	o.init()
	if i, ok := o.slots[key]; ok {
		return i
	}
	var i uint32
	if n := len(o.free); n > 0 {
		i, o.free = o.free[n-1], o.free[:n-1]
	} else {
		i = o.n
		o.n++
	}
	o.table.SetIndex(int(i), v)
	o.slots[key] = i
	return i
}

// forget frees key's slot, if it has one.
func (o *objects) forget(key any) {
	i, ok := o.slots[key]
	if !ok {
		return
	}
	delete(o.slots, key)
	o.table.SetIndex(int(i), js.Undefined())
	o.free = append(o.free, i)
}
