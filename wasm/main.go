//go:build js && wasm

// Command wasm is the drafter in the browser: the same Go engine and the same
// WGSL kernels as the native build (engine/webgpu), compiled with
// GOOS=js GOARCH=wasm and run on the page's WebGPU device.
//
// It installs one global, webdraft, whose functions return Promises (see
// README.md):
//
//	webdraft.adapter()                      → Promise<{name, backend, features, f16}>
//	webdraft.load(url, options)             → Promise<Model>
//	webdraft.loadFiles(files, dir, options) → Promise<Model>  (options.head: an EAGLE-3 head over it, Model.head)
//	model.draft(ids, n)                     → Promise<number[]>
//	model.session()                         → Session (edge drafting's sequences kept between calls; null for a closed model)
//	session.draft(tokens, reset, k, features, coupled) → Promise<{tokens, ms}>  (features: a head's; coupled: a sampled run's keys; both as the server's draft_request has them)
//	session.warm()                          → Promise<void>
//	session.close()                         → Promise<void>
//	model.close()                           → Promise<void>
//	webdraft.live(drafter, target, onEvent) → Promise<Live>
//	live.send(message)                      (the page's start and stop)
//	live.close()                            → Promise<void>
//
// Every call does its work on a goroutine of its own and settles its Promise
// from there; a goroutine waiting on the GPU or the network gives the page's
// event loop back, so the page stays responsive while a draft runs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sync"
	"syscall/js"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/webgpu"
	"webdraft/gpu"
	"webdraft/tokenizer"
)

// Defaults of load's options: a browser tab has less memory to give than a
// server, and drafts for one user.
const (
	defaultKVMiB        = 64
	defaultMaxSequences = 4
)

func main() {
	d := &drafter{models: map[int]*model{}}
	js.Global().Set("webdraft", d.object())
	select {} // the callbacks above keep running; main must not return
}

// drafter holds the WebGPU device, opened on first use and shared by every
// model loaded.
type drafter struct {
	// mu serializes all GPU work: a gpu.Device is used by one goroutine at
	// a time, and several engines share this one.
	mu  sync.Mutex
	dev *gpu.Device
	// group holds every engine on dev: a drafter's sampled proposals keep
	// their distributions there, for the target to verify on the device.
	group  *webgpu.Group
	models map[int]*model // by the id their Model objects carry
	nextID int
}

// object is the webdraft global.
func (d *drafter) object() js.Value {
	obj := js.Global().Get("Object").New()
	obj.Set("adapter", js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			dev, err := d.device()
			if err != nil {
				return nil, err
			}
			return adapterJS(dev), nil
		})
	}))
	obj.Set("load", js.FuncOf(func(_ js.Value, args []js.Value) any {
		base := arg(args, 0)
		opts, err := parseLoadOptions(arg(args, 1))
		return promise(func() (any, error) {
			if base.Type() != js.TypeString || base.String() == "" {
				return nil, errors.New("webdraft.load: the first argument must be the model folder's URL")
			}
			if err != nil {
				return nil, fmt.Errorf("webdraft.load: %w", err)
			}
			fsys, dir, err := fetchModel(base.String())
			if err != nil {
				return nil, fmt.Errorf("webdraft.load %s: %w", base.String(), err)
			}
			var head *headSource
			if opts.head != "" {
				hfs, hdir, err := fetchModel(opts.head)
				if err != nil {
					return nil, fmt.Errorf("webdraft.load %s: head %s: %w", base.String(), opts.head, err)
				}
				head = &headSource{fsys: hfs, dir: hdir}
			}
			m, err := d.load(fsys, dir, opts, head)
			if err != nil {
				return nil, fmt.Errorf("webdraft.load %s: %w", base.String(), err)
			}
			return m.object(), nil
		})
	}))
	obj.Set("loadFiles", js.FuncOf(func(_ js.Value, args []js.Value) any {
		fsys, filesErr := filesFS(arg(args, 0))
		dir := arg(args, 1)
		opts, err := parseLoadOptions(arg(args, 2))
		return promise(func() (any, error) {
			switch {
			case filesErr != nil:
				return nil, fmt.Errorf("webdraft.loadFiles: files: %w", filesErr)
			case dir.Type() != js.TypeString:
				return nil, errors.New("webdraft.loadFiles: the second argument must be the model's folder among the files")
			case err != nil:
				return nil, fmt.Errorf("webdraft.loadFiles: %w", err)
			}
			var head *headSource
			if opts.head != "" {
				head = &headSource{fsys: fsys, dir: opts.head}
			}
			m, err := d.load(fsys, dir.String(), opts, head)
			if err != nil {
				return nil, fmt.Errorf("webdraft.loadFiles %s: %w", dir.String(), err)
			}
			return m.object(), nil
		})
	}))
	// A fault drill: the device is lost as a GPU reset would lose it
	// (gpu.Device.Lose destroys it); every engine on it then fails.
	obj.Set("loseDevice", js.FuncOf(func(_ js.Value, args []js.Value) any {
		why := "a fault drill"
		if a := arg(args, 0); a.Type() == js.TypeString {
			why = a.String()
		}
		return promise(func() (any, error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.dev == nil {
				return nil, errors.New("webdraft.loseDevice: no device is open")
			}
			d.dev.Lose(why)
			return nil, nil
		})
	}))
	// reset closes every model and the device, so that the next load
	// opens a new device: the way on after a fault.
	obj.Set("reset", js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) {
			d.mu.Lock()
			defer d.mu.Unlock()
			var errs []error
			for _, m := range d.models {
				if m.e != nil {
					errs = append(errs, m.e.Close())
					m.e = nil
				}
			}
			clear(d.models)
			if d.dev != nil {
				d.group.Close()
				d.dev.Close()
				d.dev, d.group = nil, nil
			}
			return nil, errors.Join(errs...)
		})
	}))
	obj.Set("live", js.FuncOf(func(_ js.Value, args []js.Value) any {
		drafter, target, onEvent := d.loaded(arg(args, 0)), d.loaded(arg(args, 1)), arg(args, 2)
		return promise(func() (any, error) {
			switch {
			case drafter == nil || target == nil:
				return nil, errors.New("webdraft.live: the first two arguments must be models load or loadFiles gave")
			case onEvent.Type() != js.TypeFunction:
				return nil, errors.New("webdraft.live: the third argument must be a function (it gets each event)")
			}
			l, err := newLive(d, drafter, target, onEvent)
			if err != nil {
				return nil, fmt.Errorf("webdraft.live: %w", err)
			}
			return l.object(), nil
		})
	}))
	return obj
}

// loaded is the model behind a Model object, or nil.
func (d *drafter) loaded(v js.Value) *model {
	if v.Type() != js.TypeObject || v.Get("id").Type() != js.TypeNumber {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.models[v.Get("id").Int()]
}

// device opens the device on first use. d.mu must be held.
func (d *drafter) device() (*gpu.Device, error) {
	if d.dev == nil {
		dev, err := gpu.Open(gpu.Options{})
		if err != nil {
			return nil, err
		}
		d.dev, d.group = dev, webgpu.NewGroup(dev)
	}
	return d.dev, nil
}

// loadOptions are load's second argument.
type loadOptions struct {
	quant        checkpoint.Quant // how an HF checkpoint is held: int4 (default), f16, f32
	kvBytes      int64
	maxSequences int
	// head is an EAGLE-3 head's folder (loadFiles: among the files; load:
	// its URL) to load over the model, which then keeps the features the
	// head reads.
	head string
}

func parseLoadOptions(v js.Value) (loadOptions, error) {
	o := loadOptions{quant: checkpoint.Int4, kvBytes: defaultKVMiB << 20, maxSequences: defaultMaxSequences}
	if v.IsUndefined() || v.IsNull() {
		return o, nil
	}
	if v.Type() != js.TypeObject {
		return o, errors.New("options must be an object")
	}
	if q := v.Get("quant"); !q.IsUndefined() {
		if q.Type() != js.TypeString {
			return o, errors.New("options.quant must be a string")
		}
		var err error
		if o.quant, err = checkpoint.ParseQuant(q.String()); err != nil {
			return o, err
		}
	}
	if kv, ok, err := intOption(v, "kvMiB"); err != nil {
		return o, err
	} else if ok {
		o.kvBytes = int64(kv) << 20
	}
	if h := v.Get("head"); !h.IsUndefined() {
		if h.Type() != js.TypeString || h.String() == "" {
			return o, errors.New("options.head must be an EAGLE-3 head's folder (a non-empty string)")
		}
		o.head = h.String()
	}
	if n, ok, err := intOption(v, "maxSequences"); err != nil {
		return o, err
	} else if ok {
		o.maxSequences = n
	}
	return o, nil
}

// intOption reads a positive integer field of an options object.
func intOption(v js.Value, name string) (n int, ok bool, err error) {
	f := v.Get(name)
	if f.IsUndefined() {
		return 0, false, nil
	}
	n, err = jsInt(f)
	if err == nil && n <= 0 {
		err = errors.New("not positive")
	}
	if err != nil {
		return 0, false, fmt.Errorf("options.%s: %w", name, err)
	}
	return n, true, nil
}

// model is one loaded model: its engine on the shared device — a Qwen3
// model's, or an EAGLE-3 head's over a model loaded with it (head and
// target link the two).
type model struct {
	d    *drafter
	id   int
	name string
	e    engine.Engine // nil once closed
	tok  *tokenizer.Tokenizer
	stop []int // the tokens that end a generation
	info map[string]any
	head *model // the EAGLE-3 head loaded over this model (options.head)
	// target is the model a head drafts for, whose features it reads.
	target *model
}

// headSource is where an EAGLE-3 head's folder lies.
type headSource struct {
	fsys fs.FS
	dir  string
}

// load converts the model folder dir of fsys per opts and uploads it;
// with head, an EAGLE-3 head over it too (model.head), the model keeping
// the features the head reads.
func (d *drafter) load(fsys fs.FS, dir string, opts loadOptions, head *headSource) (*model, error) {
	// Quantizing an HF checkpoint is CPU work on the page's thread; a
	// folder written by `webdraft convert` skips it.
	ckpt, err := checkpoint.LoadFS(fsys, dir, checkpoint.LoadOptions{Quant: opts.quant})
	if err != nil {
		return nil, err
	}
	tokJSON, _, err := ckpt.TokenizerJSON()
	if err != nil {
		ckpt.Close()
		return nil, err
	}
	tok, err := tokenizer.ForModel(dir, tokJSON, ckpt.Config.VocabSize)
	if err != nil && !errors.Is(err, tokenizer.ErrNoTokenizer) {
		ckpt.Close()
		return nil, err
	}
	// The engine keeps nothing of the CPU weights: drop the fetched bytes
	// once they are on the GPU.
	defer ckpt.Close()
	var h *checkpoint.Eagle3
	var features []int
	if head != nil {
		if h, err = checkpoint.LoadEagle3FS(head.fsys, head.dir, checkpoint.LoadOptions{Quant: opts.quant}); err != nil {
			return nil, fmt.Errorf("head %s: %w", head.dir, err)
		}
		defer h.Close()
		if err := h.Config.Check(ckpt.Config); err != nil {
			return nil, fmt.Errorf("head %s does not fit %s: %w", head.dir, dir, err)
		}
		features = h.Config.Aux(ckpt.Config.NumHiddenLayers)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	dev, err := d.device()
	if err != nil {
		return nil, err
	}
	e, err := d.group.New(ckpt.Config, ckpt.Weights, webgpu.Options{KVBytes: opts.kvBytes, MaxSequences: opts.maxSequences, FeatureLayers: features})
	if err != nil {
		return nil, err
	}
	var he *webgpu.Head
	if h != nil {
		// The head's cache holds as many positions as the model's (the
		// default).
		if he, err = webgpu.NewHead(e, h.Config, h.Weights, webgpu.HeadOptions{MaxSequences: opts.maxSequences}); err != nil {
			e.Close()
			return nil, fmt.Errorf("head %s: %w", head.dir, err)
		}
	}
	c := ckpt.Config
	info := adapterJS(dev)
	info["quant"] = string(ckpt.Quant)
	info["converted"] = ckpt.Converted
	info["config"] = map[string]any{
		"vocabSize":             c.VocabSize,
		"hiddenSize":            c.HiddenSize,
		"numHiddenLayers":       c.NumHiddenLayers,
		"maxPositionEmbeddings": c.MaxPositionEmbeddings,
		"tieWordEmbeddings":     c.TieWordEmbeddings,
	}
	info["kvCapacity"] = e.KVCapacity()
	info["tokenizer"] = tok != nil
	d.nextID++
	m := &model{d: d, id: d.nextID, name: dir, e: e, tok: tok, info: info}
	if tok != nil {
		m.stop = tokenizer.StopIDs(c.EOSTokenIDs, tok)
	}
	info["id"] = m.id
	d.models[m.id] = m
	if he != nil {
		d.nextID++
		hinfo := adapterJS(dev)
		hinfo["quant"] = string(h.Quant)
		hinfo["converted"] = h.Converted
		hinfo["config"] = map[string]any{
			"vocabSize":      h.Config.VocabSize,
			"draftVocabSize": h.Config.DraftVocabSize,
			"hiddenSize":     h.Config.HiddenSize,
			"targetLayers":   intsJS(features),
			"eagle3":         true,
		}
		hinfo["kvCapacity"] = he.KVCapacity()
		hinfo["tokenizer"] = false
		m.head = &model{d: d, id: d.nextID, name: "EAGLE-3 head " + head.dir, e: he, info: hinfo, target: m}
		hinfo["id"] = m.head.id
		d.models[m.head.id] = m.head
	}
	return m, nil
}

// object is the Drafter a load resolves to: the model's description plus its
// draft and close methods.
func (m *model) object() js.Value {
	obj := js.ValueOf(m.info)
	draft := js.FuncOf(func(_ js.Value, args []js.Value) any {
		ids, idsErr := jsInts(arg(args, 0))
		n, nErr := jsInt(arg(args, 1))
		return promise(func() (any, error) {
			switch {
			case idsErr != nil:
				return nil, fmt.Errorf("draft: ids: %w", idsErr)
			case nErr != nil:
				return nil, fmt.Errorf("draft: n: %w", nErr)
			}
			out, err := m.draft(ids, n)
			if err != nil {
				return nil, fmt.Errorf("draft: %w", err)
			}
			return intsJS(out), nil
		})
	})
	closeFn := js.FuncOf(func(js.Value, []js.Value) any {
		return promise(func() (any, error) { return nil, m.close() })
	})
	session := js.FuncOf(func(js.Value, []js.Value) any {
		s, err := newDraftSession(m)
		if err != nil {
			js.Global().Get("console").Call("error", "webdraft: session: "+err.Error())
			return js.Null()
		}
		return s.object()
	})
	// draft, session and close are never released: calling a released
	// js.Func ends the Go program, and a closed model answers with an error
	// instead.
	obj.Set("draft", draft)
	obj.Set("session", session)
	obj.Set("close", closeFn)
	if m.head != nil {
		obj.Set("head", m.head.object())
	}
	return obj
}

// draft returns the n greedy tokens after ids, on a fresh sequence.
func (m *model) draft(ids []int, n int) ([]int, error) {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	if m.e == nil {
		return nil, errors.New("the model is closed")
	}
	seq, err := m.e.NewSequence()
	if err != nil {
		return nil, err
	}
	defer seq.Release()
	draft, err := engine.Draft(context.Background(), m.e, seq, ids, n)
	return engine.IDs(draft), err
}

// close frees the model's GPU memory — a model's with the head over it,
// which cannot draft without it —; the device stays open for others.
func (m *model) close() error {
	m.d.mu.Lock()
	defer m.d.mu.Unlock()
	var err error
	if m.head != nil {
		err = m.head.closeLocked()
	}
	return errors.Join(err, m.closeLocked())
}

// closeLocked closes the model's engine, the drafter's lock held.
func (m *model) closeLocked() error {
	if m.e == nil {
		return nil
	}
	err := m.e.Close()
	m.e = nil
	delete(m.d.models, m.id)
	return err
}

// adapterJS describes the device's adapter.
func adapterJS(dev *gpu.Device) map[string]any {
	info := dev.Info()
	features := make([]any, len(info.Features))
	for i, f := range info.Features {
		features[i] = f
	}
	return map[string]any{"adapter": info.Name, "backend": info.Backend, "features": features, "f16": dev.F16()}
}

// promise runs work on a goroutine of its own and returns a Promise that it
// settles: resolved with work's value, or rejected with an Error carrying
// its error (or its panic: one bad call must not end the Go program, which
// would take every later call with it).
func promise(work func() (any, error)) js.Value {
	executor := js.FuncOf(func(_ js.Value, args []js.Value) any {
		resolve, reject := args[0], args[1]
		go func() {
			v, err := safely(work)
			if err != nil {
				e := js.Global().Get("Error").New(err.Error())
				if errors.Is(err, engine.ErrFault) {
					e.Set("fault", true) // the GPU failed: the device is done for
				}
				reject.Invoke(e)
				return
			}
			resolve.Invoke(v)
		}()
		return nil
	})
	defer executor.Release() // the Promise constructor has run it already
	return js.Global().Get("Promise").New(executor)
}

func safely(work func() (any, error)) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	return work()
}

// arg returns args[i], or undefined past the end.
func arg(args []js.Value, i int) js.Value {
	if i < len(args) {
		return args[i]
	}
	return js.Undefined()
}

// jsInt reads a JavaScript number that must be an integer.
func jsInt(v js.Value) (int, error) {
	if v.Type() != js.TypeNumber {
		return 0, fmt.Errorf("%s is not a number", v.Type())
	}
	f := v.Float()
	if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("%v is not an integer", f)
	}
	return int(f), nil
}

// jsInts reads an array (or typed array) of integers.
func jsInts(v js.Value) ([]int, error) {
	if v.Type() != js.TypeObject || v.Get("length").Type() != js.TypeNumber {
		return nil, errors.New("not an array")
	}
	out := make([]int, v.Length())
	for i := range out {
		n, err := jsInt(v.Index(i))
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		out[i] = n
	}
	return out, nil
}

// intsJS converts for js.ValueOf, which takes []any but not []int.
func intsJS(v []int) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}
