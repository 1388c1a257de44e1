//go:build js

package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"syscall/js"

	"github.com/cogentcore/webgpu/wgpu"
)

// mapReadChecked maps staging (MapRead, size bytes) once the queue is done
// with it and returns a copy of its contents (mapErr: the mapping failed),
// and what the device's error scopes caught since the last check (checkErr,
// naming op), as check does. The scopes are popped before the mapping is
// awaited, and both answers are awaited together: a read is one round trip
// to the GPU process, not a mapping's and then the scopes'. The scopes see
// the same work either way: everything submitted before the read.
//
// One JavaScript function (readJS) does all of it and hands the Go program
// the bytes, or a report of what failed: each JavaScript value the Go
// program holds costs it a finalizer, and each call a crossing, which
// around a read once were more than the rest of a drafted token's host
// time in the browser.
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
	v := s.state.reads.await(func(id int) {
		s.state.reads.fn.Invoke(s.dev, bufferJS(staging), size, id, s.state.reads.done)
	})
	var report readReport
	if v.Type() == js.TypeString {
		if err := json.Unmarshal([]byte(v.String()), &report); err != nil {
			return nil, fmt.Errorf("mapping: reading its report: %w", err), nil
		}
	}
	if err := s.caught(report.scopeErrors()); err != nil {
		checkErr = fmt.Errorf("gpu: %s: %w", op, err)
	}
	if err := d.checkState(op); err != nil { // lost while waiting
		return nil, nil, err
	}
	if report.Map != "" {
		return nil, fmt.Errorf("mapping failed: %s", report.Map), checkErr
	}
	if v.Type() == js.TypeString {
		return nil, nil, checkErr // mapped, but a scope caught an error
	}
	out = make([]byte, size)
	js.CopyBytesToGo(out, v)
	return out, nil, checkErr
}

// readJS(dev, buffer, size, id, done) maps buffer for reading, pops the
// device's catch-all scopes (innermost first) and pushes them again, and
// once the mapping and the pops have settled calls done(id, bytes) — a
// copy of the mapped bytes, the buffer unmapped — or, when the mapping
// failed or a scope caught an error, done(id, report): a JSON readReport.
const readJS = `
const mapping = buffer.mapAsync(1, 0, size); // GPUMapMode.READ
const pops = [dev.popErrorScope(), dev.popErrorScope(), dev.popErrorScope()];
for (const f of ["validation", "out-of-memory", "internal"]) dev.pushErrorScope(f);
Promise.allSettled([mapping, ...pops]).then((rs) => {
  const mapped = rs[0].status === "fulfilled";
  const scopes = rs.slice(1).reverse().map((r) => r.status !== "fulfilled" ? {failed: true} : r.value ? {message: String(r.value.message)} : {});
  if (mapped && scopes.every((r) => !r.failed && r.message === undefined)) {
    const bytes = new Uint8Array(buffer.getMappedRange(0, size)).slice();
    buffer.unmap();
    done(id, bytes);
    return;
  }
  if (mapped) buffer.unmap();
  const why = mapped ? "" : (rs[0].reason && typeof rs[0].reason.message === "string" ? rs[0].reason.message : String(rs[0].reason));
  done(id, JSON.stringify({map: why, scopes}));
});`

// readReport is readJS's report: why the mapping failed ("" if it did
// not), and each catch-all scope's answer in scopeFilters' order.
type readReport struct {
	Map    string `json:"map"`
	Scopes []struct {
		Failed  bool    `json:"failed"`
		Message *string `json:"message"`
	} `json:"scopes"`
}

// scopeErrors is what the report's scopes caught, innermost first, as
// popErrors words it.
func (r readReport) scopeErrors() error {
	var errs []error
	for i := len(r.Scopes) - 1; i >= 0; i-- {
		switch sc := r.Scopes[i]; {
		case sc.Failed:
			errs = append(errs, errors.New("popping an error scope failed"))
		case sc.Message != nil:
			errs = append(errs, fmt.Errorf("%s error: %s", scopeFilters[i], *sc.Message))
		}
	}
	return errors.Join(errs...)
}

// reads runs readJS: one function and one callback a device, made once,
// the callback handing each read's answer to the goroutine waiting for it.
type reads struct {
	fn, done js.Value
	next     int
	waiting  map[int]chan js.Value
}

func newReads() *reads {
	r := &reads{fn: js.Global().Get("Function").New("dev", "buffer", "size", "id", "done", readJS), waiting: map[int]chan js.Value{}}
	// Never released, like the lost promise's handler: an answer can land
	// after the device is closed, and calling a released js.Func ends the
	// Go program.
	r.done = js.FuncOf(func(_ js.Value, args []js.Value) any {
		if ch, ok := r.waiting[args[0].Int()]; ok {
			delete(r.waiting, args[0].Int())
			ch <- args[1]
		}
		return nil
	}).Value
	return r
}

// await starts a read with start(id) and waits for its answer.
func (r *reads) await(start func(id int)) js.Value {
	r.next++
	id, ch := r.next, make(chan js.Value, 1)
	r.waiting[id] = ch
	defer delete(r.waiting, id) // also when start panics (a JavaScript exception)
	start(id)
	return <-ch
}
