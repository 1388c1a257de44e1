//go:build js && wasm

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"syscall/js"
	"time"

	"webdraft/speculative"
)

// draftSession is edge drafting's side in the page: a speculative.Session
// of a model — the drafter, or an EAGLE-3 head whose target model holds
// the features each request brings — answering the draft requests of the
// server's generation, one at a time, under the drafter's lock.
type draftSession struct {
	m *model
	s *speculative.Session // nil once closed
}

// newDraftSession is a session of m.
func newDraftSession(m *model) (*draftSession, error) {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if m.e == nil {
		return nil, errors.New("the model is closed")
	}
	s, err := speculative.NewSession(m.e)
	if err != nil {
		return nil, err
	}
	return &draftSession{m: m, s: s}, nil
}

// object is the Session a model's session() returns.
func (s *draftSession) object() js.Value {
	obj := js.Global().Get("Object").New()
	obj.Set("readsFeatures", s.s.ReadsFeatures())
	obj.Set("draft", js.FuncOf(func(_ js.Value, args []js.Value) any {
		tokens, tokErr := jsInts(arg(args, 0))
		reset := arg(args, 1).Truthy()
		k, kErr := jsInt(arg(args, 2))
		// features: a head's rows ({from, width, rows}, rows base64 of
		// little-endian f32); coupled: a sampled run's keys (greedy drafts
		// without).
		features, fErr := jsObject[speculative.FeatureRows](arg(args, 3), "{from, width, rows}")
		coupled, cErr := jsObject[speculative.Coupling](arg(args, 4), "{keys, temperature, top_p}")
		return promise(func() (any, error) {
			switch {
			case tokErr != nil:
				return nil, fmt.Errorf("session.draft: tokens: %w", tokErr)
			case kErr != nil:
				return nil, fmt.Errorf("session.draft: k: %w", kErr)
			case fErr != nil:
				return nil, fmt.Errorf("session.draft: features: %w", fErr)
			case cErr != nil:
				return nil, fmt.Errorf("session.draft: coupled: %w", cErr)
			}
			start := time.Now()
			out, err := s.draft(speculative.DraftAsk{Tokens: tokens, Reset: reset, K: k, Features: features, Coupled: coupled})
			if err != nil {
				return nil, fmt.Errorf("session.draft: %w", err)
			}
			return map[string]any{"tokens": intsJS(out), "ms": float64(time.Since(start).Microseconds()) / 1000}, nil
		})
	}))
	obj.Set("warm", js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) {
			return nil, s.locked(func(ss *speculative.Session) error { return ss.Warm(context.Background()) })
		})
	}))
	obj.Set("close", js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) {
			s.m.d.mu.Lock()
			defer s.m.d.mu.Unlock()
			if s.s != nil && s.m.e != nil { // a closed model's sequences went with it
				s.s.Close()
			}
			s.s = nil
			return nil, nil
		})
	}))
	return obj
}

// draft answers one draft request.
func (s *draftSession) draft(a speculative.DraftAsk) (out []int, err error) {
	err = s.locked(func(ss *speculative.Session) error {
		out, err = ss.Draft(context.Background(), a)
		return err
	})
	return out, err
}

// locked runs f on the session under the drafter's lock, refusing a
// closed session or model.
func (s *draftSession) locked(f func(*speculative.Session) error) error {
	s.m.d.mu.Lock()
	defer s.m.d.mu.Unlock()
	switch {
	case s.s == nil:
		return errors.New("the session is closed")
	case s.m.e == nil:
		return errors.New("the model is closed")
	}
	return f(s.s)
}

// jsObject reads a draft request's optional object v the way the server
// sends it (its JSON: speculative.FeatureRows, speculative.Coupling);
// undefined or null is none (nil). shape names the object in errors.
func jsObject[T any](v js.Value, shape string) (*T, error) {
	if v.IsUndefined() || v.IsNull() {
		return nil, nil
	}
	if v.Type() != js.TypeObject {
		return nil, errors.New("want an object " + shape)
	}
	var x T
	if err := json.Unmarshal([]byte(js.Global().Get("JSON").Call("stringify", v).String()), &x); err != nil {
		return nil, err
	}
	return &x, nil
}
