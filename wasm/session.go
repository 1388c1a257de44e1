//go:build js && wasm

package main

import (
	"context"
	"errors"
	"fmt"
	"syscall/js"
	"time"

	"webdraft/engine"
	"webdraft/speculative"
)

// draftSession is a drafting sequence kept between calls: edge drafting,
// where the page's drafter proposes each step of a generation the server's
// target verifies. Each draft extends the context (or, with reset, starts
// a new one); the sequence's KV cache keeps the longest prefix of what it
// holds that the new context shares — the draft tokens the target
// accepted — and feeds only the rest.
type draftSession struct {
	m       *model
	seq     engine.Sequence // of m.e, which a model never replaces (only closes)
	held    []int           // the tokens in seq's cache
	context []int
	closed  bool
}

// object is the Session a model's session() returns.
func (s *draftSession) object() js.Value {
	obj := js.Global().Get("Object").New()
	obj.Set("draft", js.FuncOf(func(_ js.Value, args []js.Value) any {
		tokens, tokErr := jsInts(arg(args, 0))
		reset := arg(args, 1).Truthy()
		k, kErr := jsInt(arg(args, 2))
		return promise(func() (any, error) {
			switch {
			case tokErr != nil:
				return nil, fmt.Errorf("session.draft: tokens: %w", tokErr)
			case kErr != nil:
				return nil, fmt.Errorf("session.draft: k: %w", kErr)
			case k < 1 || k > speculative.MaxK:
				return nil, fmt.Errorf("session.draft: k %d: want 1…%d", k, speculative.MaxK)
			}
			start := time.Now()
			out, err := s.draft(tokens, reset, k)
			if err != nil {
				return nil, fmt.Errorf("session.draft: %w", err)
			}
			return map[string]any{"tokens": intsJS(out), "ms": float64(time.Since(start).Microseconds()) / 1000}, nil
		})
	}))
	obj.Set("close", js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) {
			s.m.d.mu.Lock()
			defer s.m.d.mu.Unlock()
			s.release()
			s.closed = true
			return nil, nil
		})
	}))
	return obj
}

// draft extends the context by tokens (reset: replaces it) and drafts k
// greedy tokens after it.
func (s *draftSession) draft(tokens []int, reset bool, k int) ([]int, error) {
	d := s.m.d
	d.mu.Lock()
	defer d.mu.Unlock()
	e := s.m.e
	switch {
	case s.closed:
		return nil, errors.New("the session is closed")
	case e == nil:
		return nil, errors.New("the model is closed")
	case !reset && s.seq == nil:
		return nil, errors.New("the first draft of a session must reset it (reset true, the whole context)")
	}
	c := e.Config()
	for i, t := range tokens {
		if t < 0 || t >= c.VocabSize {
			return nil, fmt.Errorf("token %d at index %d is outside the vocabulary [0, %d)", t, i, c.VocabSize)
		}
	}
	if reset {
		s.release()
		s.context, s.held = nil, nil
	}
	all := append(s.context, tokens...)
	switch {
	case len(all) == 0:
		return nil, errors.New("an empty context")
	case len(all)+k > c.MaxPositionEmbeddings:
		return nil, fmt.Errorf("a context of %d tokens and %d more exceed the model's %d positions", len(all), k, c.MaxPositionEmbeddings)
	}
	if s.seq == nil {
		seq, err := e.NewSequence()
		if err != nil {
			return nil, err
		}
		s.seq, s.held = seq, nil
	}
	keep := 0
	for keep < min(len(s.held), len(all)-1) && s.held[keep] == all[keep] {
		keep++
	}
	s.seq.Truncate(keep)
	out, err := engine.Draft(context.Background(), e, s.seq, all[keep:], k)
	if err != nil {
		// The cache may be anywhere: start over at the next draft.
		s.release()
		s.context, s.held = nil, nil
		return nil, err
	}
	ids := engine.IDs(out)
	s.context = all
	s.held = append(append(make([]int, 0, len(all)+k), all...), ids...)[:s.seq.Len()]
	return ids, nil
}

// release frees the sequence. d.mu must be held.
func (s *draftSession) release() {
	if s.seq != nil && s.m.e != nil { // a closed model's sequences went with it
		s.seq.Release()
	}
	s.seq = nil
}
