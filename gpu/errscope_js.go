//go:build js

package gpu

import (
	"errors"
	"fmt"
	"syscall/js"

	"github.com/cogentcore/webgpu/jsx"
)

// checksEachSubmit is false in the browser: popping the error scopes is a
// round trip to the GPU process, awaited, so a submission's errors are
// reported by the next check that has to wait anyway — a Read, a buffer's
// or a pipeline's creation — and the device's loss at once.
const checksEachSubmit = false

// scopeFilters are the GPUErrorFilters of the catch-all scopes, outermost
// first.
var scopeFilters = [...]string{"validation", "out-of-memory", "internal"}

// errorScopes keeps one catch-all scope per filter open on the device, and
// records errors that escape them and the device's loss.
type errorScopes struct {
	dev   js.Value
	state *scopeState
}

type scopeState struct {
	lost       string
	uncaptured []error
	onError    js.Func // the uncapturederror listener, removed by close
	reads      *reads  // mapReadChecked's JavaScript side
}

func newErrorScopes(dev js.Value) errorScopes {
	s := errorScopes{dev: dev, state: &scopeState{reads: newReads()}}
	// onLost is never released: the lost promise can settle after close (a
	// GPU process crash; close's own destroy), and calling a released
	// js.Func ends the Go program.
	onLost := js.FuncOf(func(_ js.Value, args []js.Value) any {
		s.state.lost = fmt.Sprintf("device lost (%s): %s", args[0].Get("reason").String(), args[0].Get("message").String())
		return nil
	})
	s.state.onError = js.FuncOf(func(_ js.Value, args []js.Value) any {
		s.state.uncaptured = append(s.state.uncaptured, errors.New(args[0].Get("error").Get("message").String()))
		return nil
	})
	dev.Get("lost").Call("then", onLost)
	dev.Call("addEventListener", "uncapturederror", s.state.onError)
	s.push()
	return s
}

func (s errorScopes) push() {
	for _, f := range scopeFilters {
		s.dev.Call("pushErrorScope", f)
	}
}

// pop pops the catch-all scopes and returns what they caught. The scopes
// are popped at once, innermost first, and their answers awaited
// afterwards: one round trip to the GPU process instead of one per scope.
func (s errorScopes) pop() error {
	promises := s.popStart()
	results := make([]scopeResult, len(promises))
	for i, p := range promises {
		results[i].value, results[i].ok = jsx.Await(p)
	}
	return popErrors(results)
}

// popStart pops the catch-all scopes, innermost first, and returns their
// answers' promises in scopeFilters' order.
func (s errorScopes) popStart() []js.Value {
	promises := make([]js.Value, len(scopeFilters))
	for i := len(scopeFilters) - 1; i >= 0; i-- {
		promises[i] = s.dev.Call("popErrorScope")
	}
	return promises
}

// scopeResult is a popped scope's answer: its GPUError or null, or ok
// false when popping failed.
type scopeResult struct {
	value js.Value
	ok    bool
}

// popErrors is what popped scopes caught, their results in scopeFilters'
// order.
func popErrors(results []scopeResult) error {
	var errs []error
	for i := len(results) - 1; i >= 0; i-- {
		switch res := results[i]; {
		case !res.ok:
			errs = append(errs, errors.New("popping an error scope failed"))
		case res.value.Truthy():
			errs = append(errs, fmt.Errorf("%s error: %s", scopeFilters[i], res.value.Get("message").String()))
		}
	}
	return errors.Join(errs...)
}

// lost returns the device's loss, if it is lost, without a round trip.
func (s errorScopes) lostErr() error {
	if s.state.lost != "" {
		return errors.New(s.state.lost)
	}
	return nil
}

// check returns the lost state or the errors caught since the last check,
// leaving fresh scopes open.
func (s errorScopes) check() error {
	if s.state.lost != "" {
		return errors.New(s.state.lost)
	}
	err := s.pop()
	s.push()
	return s.caught(err)
}

// caught joins popped, the scopes' errors, with those that escaped them
// since the last check (and forgets those).
func (s errorScopes) caught(popped error) error {
	err := errors.Join(append(s.state.uncaptured, popped)...)
	s.state.uncaptured = nil
	return err
}

// close pops the scopes, removes the error listener and destroys the
// device, which frees its memory now (natively, Device.Close's Release
// does that; the js backend's Release is a no-op).
func (s errorScopes) close() {
	s.pop()
	s.dev.Call("removeEventListener", "uncapturederror", s.state.onError)
	s.state.onError.Release()
	s.dev.Call("destroy")
}
