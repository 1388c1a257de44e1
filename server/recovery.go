package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"webdraft/engine"
)

// faultState is why the server is not serving: the engine fault it is
// recovering from, and since when.
type faultState struct {
	err   error
	since time.Time
}

// faulted records an engine fault: /health answers "recovering" from now
// until the next state is ready.
func (s *Server) faulted(err error) {
	if s.fault.CompareAndSwap(nil, &faultState{err: err, since: time.Now()}) {
		s.log.Error("engine fault: failing its requests and reopening the engine", "err", err)
	}
}

// unavailable is the 503 of a request that comes while no state serves:
// the models still loading or warming up, or the server recovering from
// a fault.
func (s *Server) unavailable() *apiError {
	if f := s.fault.Load(); f != nil {
		return &apiError{http.StatusServiceUnavailable, "recovering",
			"the server is reopening its engine after a fault (" + clip(f.err.Error()) + "); retry in a moment"}
	}
	if s.warming.Load() {
		return &apiError{http.StatusServiceUnavailable, "loading", "the models are loaded and warming up (each shape's first run builds the GPU's pipelines); retry in a moment"}
	}
	return &apiError{http.StatusServiceUnavailable, "loading", "the models are still loading"}
}

// faultMessage is the message of a request an engine fault failed.
func faultMessage(err error) string {
	return "the GPU failed during this request (" + clip(err.Error()) + "); the server reopens its engine: retry in a moment"
}

// recovery replaces the engines a fault broke. It owns the engines it
// opens (the ones Run was given stay their caller's, who closes them).
type recovery struct {
	s      *Server
	opened []engine.Engine
}

// Backoff between failed reopenings.
const (
	reopenFirstWait = 500 * time.Millisecond
	reopenMaxWait   = 30 * time.Second
)

// recover closes the broken engines of c — those that report a fault
// (engine.Fault), or all when none does — and reopens each through its
// model's Reopen, retrying with backoff until ctx ends. A head runs over
// the target's engine, so where either breaks both are closed (the head
// first) and reopened (the target first: Head's Reopen hands out the head
// opened over the target Target's Reopen opened). It returns c with the
// new engines.
func (r *recovery) recover(ctx context.Context, c Config, fault error) (Config, error) {
	models := []*Model{&c.Drafter}
	if c.Target != nil {
		t := *c.Target
		c.Target = &t
		models = append(models, c.Target)
	}
	if c.Head != nil && c.Target != nil {
		h := *c.Head
		c.Head = &h
		models = append(models, c.Head)
	}
	var broken []*Model
	for _, m := range models {
		if engine.Fault(m.Engine) != nil {
			broken = append(broken, m)
		}
	}
	if len(broken) == 0 {
		broken = models
	}
	if c.Head != nil && (slices.Contains(broken, c.Target) || slices.Contains(broken, c.Head)) {
		broken = slices.DeleteFunc(broken, func(m *Model) bool { return m == c.Target || m == c.Head })
		broken = append(broken, c.Target, c.Head)
	}
	for _, m := range broken {
		if m.Reopen == nil {
			return c, fmt.Errorf("%s: %w (no Reopen to recover through)", m.Name, fault)
		}
	}
	r.s.metrics.recovering()
	for i := len(broken) - 1; i >= 0; i-- {
		m := broken[i]
		if err := m.Engine.Close(); err != nil {
			r.s.log.Warn("closing the broken engine", "model", m.Name, "err", err)
		}
	}
	for _, m := range broken {
		wait := reopenFirstWait
		for attempt := 1; ; attempt++ {
			start := time.Now()
			eng, err := m.Reopen(ctx)
			if err == nil {
				r.s.log.Info("engine reopened", "model", m.Name, "attempt", attempt, "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()))
				m.Engine = eng
				r.opened = append(r.opened, eng)
				break
			}
			r.s.log.Error("reopening the engine", "model", m.Name, "attempt", attempt, "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return c, nil
			case <-time.After(wait):
			}
			wait = min(2*wait, reopenMaxWait)
		}
	}
	return c, nil
}

// closeOpened closes the engines recover opened.
func (r *recovery) closeOpened() {
	for _, eng := range r.opened {
		if err := eng.Close(); err != nil {
			r.s.log.Warn("closing an engine", "err", err)
		}
	}
}
