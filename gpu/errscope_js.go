//go:build js

package gpu

import (
	"errors"
	"fmt"
	"syscall/js"

	"github.com/cogentcore/webgpu/jsx"
)

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
	funcs      []js.Func
}

func newErrorScopes(dev js.Value) errorScopes {
	s := errorScopes{dev: dev, state: &scopeState{}}
	onLost := js.FuncOf(func(_ js.Value, args []js.Value) any {
		s.state.lost = fmt.Sprintf("device lost (%s): %s", args[0].Get("reason").String(), args[0].Get("message").String())
		return nil
	})
	onError := js.FuncOf(func(_ js.Value, args []js.Value) any {
		s.state.uncaptured = append(s.state.uncaptured, errors.New(args[0].Get("error").Get("message").String()))
		return nil
	})
	s.state.funcs = []js.Func{onLost, onError}
	dev.Get("lost").Call("then", onLost)
	dev.Call("addEventListener", "uncapturederror", onError)
	s.push()
	return s
}

func (s errorScopes) push() {
	for _, f := range scopeFilters {
		s.dev.Call("pushErrorScope", f)
	}
}

// pop pops the catch-all scopes and returns what they caught.
func (s errorScopes) pop() error {
	var errs []error
	for i := len(scopeFilters) - 1; i >= 0; i-- {
		res, ok := jsx.Await(s.dev.Call("popErrorScope"))
		switch {
		case !ok:
			errs = append(errs, errors.New("popping an error scope failed"))
		case res.Truthy():
			errs = append(errs, fmt.Errorf("%s error: %s", scopeFilters[i], res.Get("message").String()))
		}
	}
	return errors.Join(errs...)
}

// check returns the lost state or the errors caught since the last check,
// leaving fresh scopes open.
func (s errorScopes) check() error {
	if s.state.lost != "" {
		return errors.New(s.state.lost)
	}
	err := s.pop()
	s.push()
	err = errors.Join(append(s.state.uncaptured, err)...)
	s.state.uncaptured = nil
	return err
}

// close pops the scopes and drops the callbacks.
func (s errorScopes) close() {
	s.pop()
	for _, f := range s.state.funcs {
		f.Release()
	}
}
