// Package webgpu is the WebGPU engine: Qwen3 forward passes recorded as WGSL
// kernels (package kernels) into one compute pass per forward pass, on any
// WebGPU device — natively through wgpu-native (Vulkan) and in the browser.
// Weights are uploaded once; the KV cache is a paged pool shared by all
// sequences (kernels.KVCache, its one owner); each pass reads back a few
// words per row it reads out (a token id and its log-probability; for a
// verification the acceptance, a draw, the top-N), never logits. A
// sequence (kernels.KVSeq) may hold a token tree past its line
// (Entry.Parents, package treemask): each row goes to its cache slot,
// rotated at its own position, attending by its ancestor mask; KeepPath
// moves the kept path's keys and values on the device at the start of the
// engine's next pass.
//
// Engines on one device form a Group: one lock, one fault, and a Q store
// where a drafter's sampled proposals keep their distributions for a
// target of the group to verify them by the multi-draft rule on the
// device (engine.SamplesDrafts; sampled.go).
//
// An engine may keep, at each position its passes feed, the residual
// stream entering chosen layers (Options.FeatureLayers) in its KV cache's
// feature rows; an EAGLE-3 draft head of its group (Head) reads them
// there, never on the host.
//
// The files: engine.go the engine and its sequences; group.go engines
// sharing a device, and the Q store; step.go Step and StepN, a pass at a
// time or chained on the device, and Verify; pass.go one forward pass —
// which rows it takes, its inputs, its kernels, what it reads out;
// sampled.go sampled drafts, proposed and walked; fused.go and
// fusedtree.go drafts verified in the same submission; activations.go the
// buffers a pass works in; weights.go the model on the device; head.go
// the EAGLE-3 head and its sequences, headstep.go its step and its token
// trees (Verify), headchain.go its chained steps, headbuffers.go its
// weights and buffers.
package webgpu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// Options size the engine; zero values take the defaults.
type Options struct {
	KVBytes      int64 // KV-cache memory (default 256 MiB)
	BlockSize    int   // positions per KV block (default 16)
	MaxSequences int   // sequence slots: running and cached (default 256, or half the KV blocks when those are fewer)
	MaxRows      int   // tokens per forward pass; larger batches take several (default 512)
	// KV is the KV cache's element type: "f16" (half the memory and the
	// bytes attention reads; the default where the adapter has shader-f16)
	// or "f32". No kernel needs shader-f16 either way.
	KV string
	// FeatureLayers are target layers (0 … L−1, each once, in the order
	// given) whose input — the residual stream entering the layer, the
	// embedding itself for layer 0 — every pass keeps on the device, f32,
	// at each fed row's cache slot (kernels.KVCache's features, a buffer a
	// layer, moved and cut with the keys and values): the features an
	// EAGLE-3 head reads (Head), never read back. Their memory counts in
	// KVBytes. Nil keeps none.
	FeatureLayers []int
	// Device is how Open picks and opens the device (New takes one open).
	Device gpu.Options
}

func (o *Options) defaults() {
	if o.KVBytes <= 0 {
		o.KVBytes = 256 << 20
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	if o.MaxSequences <= 0 {
		o.MaxSequences = 256
	}
	if o.MaxRows <= 0 {
		o.MaxRows = 512
	}
}

// Engine runs a Qwen3 model on a gpu.Device, in a Group of engines that
// share it.
type Engine struct {
	g    *Group // its lock is held by every call; the device's state is its
	dev  *gpu.Device
	cfg  qwen3.Config
	opts Options
	w    *weights
	kv   *kernels.KVCache
	act  *activations
	tree treeBuffers // trees drafted on the device (DraftVerifyTree), made by the first
	// spec is a drafter's chains of speculative steps (DraftVerifyN): its
	// state, ids and results buffers, made by the first.
	spec specBuffers
	// features are the layers whose input every pass keeps in the cache's
	// feature buffers (Options.FeatureLayers); featureAt[l] is layer l's
	// buffer, −1 for a layer not kept.
	features  []int
	featureAt []int

	// recorded holds the kernels of decode passes by shape, replayed by
	// the next pass of the shape (replay.go).
	recorded map[passKey]recordedPass

	closed  bool
	profile *gpu.Profile // non-nil while Profile runs: GPU time per kernel
}

var _ engine.Engine = (*Engine)(nil)

// Open opens the best WebGPU adapter as opts.Device says (gpu.ErrNoAdapter
// when there is none) and builds an engine that owns the device: a group
// of one (OpenGroup opens a device for several).
func Open(cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	g, err := OpenGroup(opts.Device)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return g.New(cfg, w, opts)
}

// New uploads w to dev and allocates the KV cache and activations: an
// engine in a group of its own (NewGroup makes one for several), which
// shares no distributions with other engines on dev. The caller keeps dev,
// and uses it and the engine from one goroutine at a time.
func New(dev *gpu.Device, cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	g := NewGroup(dev)
	defer g.Close()
	return g.New(cfg, w, opts)
}

// build builds an engine of g (whose lock the caller holds).
func build(g *Group, cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	dev := g.dev
	sequencesDefaulted := opts.MaxSequences <= 0
	opts.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := engine.CheckHead(&cfg, w); err != nil {
		return nil, err
	}
	featureAt := make([]int, cfg.NumHiddenLayers)
	for l := range featureAt {
		featureAt[l] = -1
	}
	for i, l := range opts.FeatureLayers {
		if l < 0 || l >= cfg.NumHiddenLayers || featureAt[l] >= 0 {
			return nil, fmt.Errorf("webgpu engine: feature layers %v: want distinct layers of 0 … %d", opts.FeatureLayers, cfg.NumHiddenLayers-1)
		}
		featureAt[l] = i
	}
	e := &Engine{g: g, dev: dev, cfg: cfg, opts: opts, features: slices.Clone(opts.FeatureLayers), featureAt: featureAt, recorded: map[passKey]recordedPass{}}
	e.opts.FeatureLayers = e.features
	var err error
	if e.w, err = upload(dev, &cfg, w); err != nil {
		return nil, fmt.Errorf("upload weights: %w", err)
	}
	half := dev.F16()
	switch opts.KV {
	case "f16":
		half = true
	case "f32":
		half = false
	case "":
	default:
		e.release()
		return nil, fmt.Errorf("KV cache type %q: want f16 or f32", opts.KV)
	}
	elem := 4
	if half {
		elem = 2
	}
	featureBytes := len(e.features) * cfg.HiddenSize * 4 // a position's features, f32
	blockBytes := int64((engine.KVBytesPerToken(&cfg, elem) + featureBytes) * opts.BlockSize)
	blocks := int(opts.KVBytes / blockBytes)
	if sequencesDefaulted && blocks <= opts.MaxSequences {
		// A small budget for a deep model: as many sequences as leave each
		// a block to grow into.
		opts.MaxSequences = max(1, blocks/2)
		e.opts.MaxSequences = opts.MaxSequences
	}
	if blocks <= opts.MaxSequences {
		e.release()
		return nil, fmt.Errorf("KV budget of %d MiB holds %d blocks of %d positions: too few for %d sequences", opts.KVBytes>>20, blocks, opts.BlockSize, opts.MaxSequences)
	}
	e.kv, err = kernels.NewKVCache(dev, kernels.KVShape{
		Layers: cfg.NumHiddenLayers, KVHeads: cfg.NumKeyValueHeads, D: cfg.HeadDim,
		BlockSize: opts.BlockSize, Blocks: blocks, Seqs: opts.MaxSequences,
		MaxBlocks: (cfg.MaxPositionEmbeddings + opts.BlockSize - 1) / opts.BlockSize, F16: half,
		Features: len(e.features), FeatureWidth: cfg.HiddenSize,
	})
	if err != nil {
		e.release()
		return nil, fmt.Errorf("KV cache: %w", err)
	}
	if e.act, err = newActivations(dev, &cfg, opts.MaxRows, opts.MaxSequences, e.w.headRows, len(e.features) > 0); err != nil {
		e.release()
		return nil, err
	}
	return e, nil
}

func (e *Engine) Config() qwen3.Config { return e.cfg }

// FeatureLayers returns the layers whose input the engine keeps at its
// sequences' slots (Options.FeatureLayers), in their order there.
func (e *Engine) FeatureLayers() []int { return slices.Clone(e.features) }

// Device is the engine's device (for benchmarks that measure it alongside).
func (e *Engine) Device() *gpu.Device { return e.dev }

// DeviceBytes is the memory of the device's buffers (gpu.Device.
// BufferBytes): weights, KV cache, activations, staging.
func (e *Engine) DeviceBytes() int64 { return e.dev.BufferBytes() }

// KVElemBytes is the size of one cached key or value: 2 (f16) or 4 (f32).
func (e *Engine) KVElemBytes() int { return e.kv.ElemBytes() }

func (e *Engine) Info() engine.Info {
	kv := "f32"
	if e.kv.F16 {
		kv = "f16"
	}
	return engine.Info{Backend: "webgpu", Adapter: e.dev.Info().String() + ", " + kv + " KV cache", Software: e.dev.Info().Software()}
}

// KVCapacity is the positions the cache holds for certain (KVCache.Capacity).
func (e *Engine) KVCapacity() int { return e.kv.Capacity() }

// KVBlockSize is the positions a block of the KV cache holds.
func (e *Engine) KVBlockSize() int { return e.kv.BlockSize }

// Profile runs f (which calls Step) with every dispatch timed on the GPU in
// a pass of its own, and returns the time per kernel in timestamp ticks.
// Passes of one dispatch each cost extra: use it to see where time goes,
// not to time the whole.
func (e *Engine) Profile(f func() error) (gpu.Profile, error) {
	if !e.dev.Timestamps() {
		return gpu.Profile{}, fmt.Errorf("%s offers no timestamp queries", e.dev.Info())
	}
	e.profile = &gpu.Profile{}
	defer func() { e.profile = nil }()
	err := f()
	return *e.profile, err
}

// Fault is the device failure that broke the engine — or another engine
// of its group, on the same device — (wrapping engine.ErrFault), or nil
// while it works.
func (e *Engine) Fault() error {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	return e.g.fault
}

// LoseDevice loses the engine's device as a GPU fault would (gpu.Device.
// Lose), for fault drills: the next pass fails and breaks the engine.
func (e *Engine) LoseDevice(why string) { e.dev.Lose(why) }

// usable is the error of a call on a closed or broken engine.
func (e *Engine) usable() error {
	if e.closed {
		return errClosed
	}
	return e.g.fault
}

// broken records a pass's error as the group's fault and returns it: a
// pass that did not complete leaves the device's state unknown, for every
// engine on it. A pass stopped by its context is not a fault (the
// sequences are rolled back).
func (e *Engine) broken(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if e.g.fault == nil {
		e.g.fault = fmt.Errorf("webgpu engine: %w: %w", engine.ErrFault, err)
	}
	return e.g.fault
}

// Close releases the engine's GPU resources (and the device, when it is
// the last engine of a group that owns it). Closing a closed engine does
// nothing.
func (e *Engine) Close() error {
	e.g.closeMember(&e.closed, e.release)
	return nil
}

// release frees the engine's weights, KV cache, activations and tree
// buffers.
func (e *Engine) release() {
	if e.w != nil {
		e.w.release()
	}
	if e.kv != nil {
		e.kv.Release()
	}
	if e.act != nil {
		e.act.release()
	}
	e.tree.release()
	e.spec.release()
	e.w, e.kv, e.act = nil, nil, nil
}

var errClosed = errors.New("webgpu engine: closed")

// NewSequence takes a free slot of the KV cache (engine.ErrNoCapacity when
// none is left). The sequence is a *kernels.KVSeq.
func (e *Engine) NewSequence() (engine.Sequence, error) {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	if err := e.usable(); err != nil {
		return nil, err
	}
	s, err := e.kv.NewSeq()
	if err != nil {
		return nil, kvError(err)
	}
	return s, nil
}

// sequences returns a batch's n sequences, checking that each is this
// engine's and appears once.
func (e *Engine) sequences(n int, seq func(i int) engine.Sequence) ([]*kernels.KVSeq, error) {
	seqs := make([]*kernels.KVSeq, n)
	seen := map[*kernels.KVSeq]bool{}
	for i := range n {
		s, ok := seq(i).(*kernels.KVSeq)
		if !ok || s.Cache() != e.kv {
			return nil, fmt.Errorf("webgpu engine: batch entry %d: a sequence of another engine, or released", i)
		}
		if seen[s] {
			return nil, fmt.Errorf("webgpu engine: batch entry %d repeats a sequence", i)
		}
		if s.FeaturesOnly() {
			return nil, fmt.Errorf("webgpu engine: batch entry %d: %w", i, engine.ErrFeaturesOnly)
		}
		seen[s] = true
		seqs[i] = s
	}
	return seqs, nil
}

// kvError makes the cache's kernels.ErrKVFull an engine.ErrNoCapacity, as
// the scheduler expects.
func kvError(err error) error {
	if errors.Is(err, kernels.ErrKVFull) {
		return noCapacity{err}
	}
	return err
}

type noCapacity struct{ error }

func (e noCapacity) Is(target error) bool { return target == engine.ErrNoCapacity }
func (e noCapacity) Unwrap() error        { return e.error }
