//go:build js && wasm

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"syscall/js"
	"testing/fstest"

	"webdraft/engine"
	"webdraft/live"
	"webdraft/speculative"
)

// liveSession is speculative decoding in the page: both models on the
// page's GPU, run by the same loop and the same live view as on the server
// (package live), its events handed to onEvent as JSON text.
type liveSession struct {
	runner  *live.Runner
	cancel  context.CancelFunc // ends the loop
	done    chan struct{}      // closed when the loop has ended
	onEvent js.Value
	inbox   chan []byte // the page's messages, taken in order by one goroutine

	mu     sync.Mutex
	closed bool // inbox is closed
}

func newLive(d *drafter, drafter, target *model, onEvent js.Value) (*liveSession, error) {
	switch {
	case target.tok == nil:
		return nil, errors.New("the target has no tokenizer: the live view takes text")
	case drafter.target != nil && drafter.target != target:
		return nil, fmt.Errorf("the %s drafts for %s, not for %s", drafter.name, drafter.target.name, target.name)
	case drafter.e == nil || target.e == nil:
		return nil, errors.New("a model is closed")
	}
	// Both engines are in the page's group (one device): a sampled run's
	// drafter proposes from its distribution, kept on the device, where
	// the target verifies the proposals by the multi-draft rule.
	te := &locked{d: d, Engine: target.e}
	de := &locked{d: d, Engine: drafter.e}
	if drafter.target != nil {
		de.target = te // an EAGLE-3 head reads te's features
	}
	gen, err := speculative.New(de, te, speculative.Options{MaxBatch: 2})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &liveSession{cancel: cancel, done: make(chan struct{}), onEvent: onEvent, inbox: make(chan []byte, 16)}
	go func() {
		defer close(l.done)
		switch err := gen.Run(ctx); {
		case errors.Is(err, engine.ErrFault):
			// The GPU failed (the device lost, say): these engines are done
			// for; the worker opens new ones (webdraft.reset, then load).
			l.emit(map[string]any{"type": "fault", "message": err.Error()})
		case err != nil && !errors.Is(err, context.Canceled):
			l.emit(map[string]any{"type": "error", "message": "the loop stopped: " + err.Error()})
		}
	}()
	// A first generation compiles the pipelines a run needs (the drafter's
	// chained steps, the target's verification of a few rows): slow on a
	// CPU-rendered adapter, and better paid before the page says ready.
	warm := speculative.Request{Prompt: make([]int, 16), MaxTokens: 5, K: 4, Fresh: true}
	if _, err := gen.Submit(ctx, warm); err != nil {
		cancel()
		<-l.done
		return nil, fmt.Errorf("warming up: %w", err)
	}
	dc, tc := drafter.e.Config(), target.e.Config()
	l.runner = &live.Runner{
		Gen: gen, Tokenizer: target.tok, Stop: target.stop,
		MaxContext: min(dc.MaxPositionEmbeddings, tc.MaxPositionEmbeddings), Emit: l.emit,
		// The alternatives' read-out (sample.wgsl, a workgroup a row) is
		// what a CPU-rendered adapter is slowest at: 33 s for a step's 4
		// draft tokens with the top 5 on SwiftShader.
		TopN: 0,
		// The browser's GPU compiles a shape's pipelines on its first run.
		WarmRaces: true,
	}
	go func() {
		for msg := range l.inbox {
			l.receive(msg) // End waits for the run: never on the event loop's turn
		}
	}()
	l.emit(map[string]any{"type": "hello", "session": "in-browser", "drafter": drafter.name, "target": target.name,
		"k": gen.K(), "backend": "webgpu", "adapter": drafter.info["adapter"]})
	return l, nil
}

// emit hands an event to the page's callback.
func (l *liveSession) emit(event map[string]any) {
	b, err := json.Marshal(event)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"type": "error", "message": "an event: " + err.Error()}) // a map of strings marshals
	}
	l.onEvent.Invoke(string(b))
}

// object is the Live a live call resolves to.
func (l *liveSession) object() js.Value {
	obj := js.Global().Get("Object").New()
	obj.Set("send", js.FuncOf(func(_ js.Value, args []js.Value) any {
		msg := arg(args, 0)
		text := msg
		if msg.Type() == js.TypeObject {
			text = js.Global().Get("JSON").Call("stringify", msg)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.closed {
			l.emit(map[string]any{"type": "error", "message": "this live session is closed"})
			return nil
		}
		select {
		case l.inbox <- []byte(text.String()):
		default:
			l.emit(map[string]any{"type": "error", "message": "too many messages at once: this one was dropped"})
		}
		return nil
	}))
	obj.Set("close", js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) {
			l.mu.Lock()
			if !l.closed {
				l.closed = true
				close(l.inbox) // its goroutine ends after the messages already in it
			}
			l.mu.Unlock()
			l.runner.End()
			l.cancel()
			<-l.done
			return nil, nil
		})
	}))
	return obj
}

// receive takes one of the page's messages: start or stop, as the
// server's websocket takes them.
func (l *liveSession) receive(data []byte) {
	var m live.Start
	if err := strictJSON(data, &m); err != nil {
		l.emit(map[string]any{"type": "error", "message": err.Error()})
		return
	}
	switch m.Type {
	case "start":
		req, err := l.runner.Request(m)
		if err != nil {
			l.emit(map[string]any{"type": "error", "message": err.Error()})
			return
		}
		l.runner.Begin(req, m.Race)
	case "stop":
		l.runner.End()
	default:
		l.emit(map[string]any{"type": "error", "message": fmt.Sprintf("type %q: want start or stop", m.Type)})
	}
}

// strictJSON decodes one object, refusing unknown fields.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("a message: %w", err)
	}
	return nil
}

// locked runs an engine under the drafter's lock: every engine of the page
// shares one device, which one goroutine uses at a time.
type locked struct {
	d *drafter
	engine.Engine
	// target is, for an EAGLE-3 head, its target's locked engine
	// (engine.Head); nil for a drafter that reads text alone.
	target engine.Engine
}

// Target is the locked engine whose features an EAGLE-3 head reads
// (engine.ReadsTarget), nil for a drafter.
func (l *locked) Target() engine.Engine { return l.target }

// DraftsTrees is the engine's (engine.DraftsTrees).
func (l *locked) DraftsTrees() bool { return engine.DraftsTrees(l.Engine) }

func (l *locked) Step(ctx context.Context, batch []*engine.Entry) error {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return l.Engine.Step(ctx, batch)
}

func (l *locked) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return l.Engine.Verify(ctx, batch)
}

func (l *locked) StepN(ctx context.Context, batch []*engine.Entry, n int) ([][]engine.Token, error) {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return engine.StepN(ctx, l.Engine, batch, n)
}

// Fuses reports whether the drafter's engine fuses with the target's
// (engine.Fuser): both in the page's group, as they are. Fused, a step is
// one submission and one read-back, where the drafter's chain and the
// target's verification would each wait for theirs.
func (l *locked) Fuses(target engine.Engine) bool {
	f, ok := l.Engine.(engine.Fuser)
	t, same := target.(*locked)
	return ok && same && t.d == l.d && f.Fuses(t.Engine)
}

// DraftVerify is the engine's (engine.Fuser), under the page's lock.
func (l *locked) DraftVerify(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n int) ([][]engine.Token, error) {
	if !l.Fuses(target) {
		return nil, errors.New("draft and verify: the target is not fused with the drafter")
	}
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return l.Engine.(engine.Fuser).DraftVerify(ctx, target.(*locked).Engine, steps, n)
}

// FusesTree reports whether the drafter's engine drafts trees on the device
// and has the target verify them in one submission (engine.TreeFuser):
// both in the page's group, as they are.
func (l *locked) FusesTree(target engine.Engine, steps []engine.TreeStep) bool {
	f, ok := l.Engine.(engine.TreeFuser)
	t, same := target.(*locked)
	return ok && same && t.d == l.d && f.FusesTree(t.Engine, steps)
}

// DraftVerifyTree is the engine's (engine.TreeFuser), under the page's
// lock.
func (l *locked) DraftVerifyTree(ctx context.Context, target engine.Engine, steps []engine.TreeStep) error {
	if !l.FusesTree(target, steps) {
		return errors.New("draft and verify a tree: the target or the steps do not fuse with the drafter")
	}
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return l.Engine.(engine.TreeFuser).DraftVerifyTree(ctx, target.(*locked).Engine, steps)
}

// SamplesDrafts is the engine's (engine.SamplesDrafts).
func (l *locked) SamplesDrafts() bool { return engine.SamplesDrafts(l.Engine) }

// DistDomain is the engine's (engine.SampledPair).
func (l *locked) DistDomain() any { return engine.DistDomain(l.Engine) }

func (l *locked) NewSequence() (engine.Sequence, error) {
	l.d.mu.Lock()
	defer l.d.mu.Unlock()
	return l.Engine.NewSequence()
}

// filesFS makes the in-memory file system of an object of paths to
// Uint8Arrays (the page's fetched, cached model files).
func filesFS(v js.Value) (fstest.MapFS, error) {
	if v.Type() != js.TypeObject {
		return nil, errors.New("not an object of paths to Uint8Arrays")
	}
	keys := js.Global().Get("Object").Call("keys", v)
	fsys := fstest.MapFS{}
	for i := range keys.Length() {
		name := keys.Index(i).String()
		arr := v.Get(name)
		if arr.Type() != js.TypeObject || arr.Get("byteLength").Type() != js.TypeNumber {
			return nil, fmt.Errorf("%s: not a Uint8Array", name)
		}
		data := make([]byte, arr.Get("byteLength").Int())
		js.CopyBytesToGo(data, js.Global().Get("Uint8Array").New(arr.Get("buffer"), arr.Get("byteOffset"), arr.Get("byteLength")))
		fsys[name] = &fstest.MapFile{Data: data}
	}
	return fsys, nil
}
