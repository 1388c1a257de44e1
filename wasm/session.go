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
		features, fErr := jsFeatures(arg(args, 3))
		coupled, cErr := jsCoupling(arg(args, 4))
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

// jsCoupling reads a draft request's coupled draws ({keys: [s0, s1],
// temperature, top_p}, as the server sends them: speculative.Coupling);
// undefined or null asks for greedy drafts.
func jsCoupling(v js.Value) (*speculative.Coupling, error) {
	if v.IsUndefined() || v.IsNull() {
		return nil, nil
	}
	if v.Type() != js.TypeObject {
		return nil, errors.New("want an object {keys, temperature, top_p}")
	}
	var c speculative.Coupling
	if err := json.Unmarshal([]byte(js.Global().Get("JSON").Call("stringify", v).String()), &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// jsFeatures reads a draft request's features ({from, width, rows}: rows
// base64 of little-endian f32, as the server sends them); undefined or
// null is none.
func jsFeatures(v js.Value) (*speculative.FeatureRows, error) {
	if v.IsUndefined() || v.IsNull() {
		return nil, nil
	}
	if v.Type() != js.TypeObject {
		return nil, errors.New("want an object {from, width, rows}")
	}
	var f speculative.FeatureRows
	if err := json.Unmarshal([]byte(js.Global().Get("JSON").Call("stringify", v).String()), &f); err != nil {
		return nil, err
	}
	return &f, nil
}
