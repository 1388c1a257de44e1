// Package webgpu is the WebGPU engine: Qwen3 forward passes recorded as WGSL
// kernels (package kernels) into one compute pass per forward pass, on any
// WebGPU device — natively through wgpu-native (Vulkan) and in the browser.
// Weights are uploaded once; the KV cache is a paged pool shared by all
// sequences; each pass reads back one token id per sequence, never logits.
package webgpu

import (
	"context"
	"fmt"
	"sync"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
)

// Options size the engine; zero values take the defaults.
type Options struct {
	KVBytes      int64 // KV-cache memory (default 256 MiB)
	BlockSize    int   // positions per KV block (default 16)
	MaxSequences int   // sequence slots: running and cached (default 256)
	MaxRows      int   // tokens per forward pass; larger batches take several (default 512)
	// KV is the KV cache's element type: "f16" (half the memory and the
	// bytes attention reads; the default where the adapter has shader-f16)
	// or "f32". No kernel needs shader-f16 either way.
	KV string
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

// Engine runs a Qwen3 model on a gpu.Device.
type Engine struct {
	mu   sync.Mutex // the device is used by one goroutine at a time
	dev  *gpu.Device
	cfg  qwen3.Config
	opts Options
	w    *weights
	kv   *kernels.KVCache
	act  *activations

	freeBlocks []uint32 // pool blocks no sequence holds
	freeSlots  []int    // block-table rows no sequence holds
	closed     bool
	ownsDevice bool         // Close closes the device (Open made it)
	profile    *gpu.Profile // non-nil while Profile runs: GPU time per kernel
}

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

// Open opens the best WebGPU adapter as opts.Device says (gpu.ErrNoAdapter
// when there is none) and builds an engine that owns the device.
func Open(cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	dev, err := gpu.Open(opts.Device)
	if err != nil {
		return nil, err
	}
	e, err := New(dev, cfg, w, opts)
	if err != nil {
		dev.Close()
		return nil, err
	}
	e.ownsDevice = true
	return e, nil
}

var _ engine.Engine = (*Engine)(nil)

// New uploads w to dev and allocates the KV cache and activations.
func New(dev *gpu.Device, cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	opts.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{dev: dev, cfg: cfg, opts: opts}
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
		e.Close()
		return nil, fmt.Errorf("KV cache type %q: want f16 or f32", opts.KV)
	}
	elem := 4
	if half {
		elem = 2
	}
	blockBytes := int64(engine.KVBytesPerToken(&cfg, elem) * opts.BlockSize)
	blocks := int(opts.KVBytes / blockBytes)
	maxBlocks := (cfg.MaxPositionEmbeddings + opts.BlockSize - 1) / opts.BlockSize
	if blocks <= opts.MaxSequences {
		e.Close()
		return nil, fmt.Errorf("KV budget of %d MiB holds %d blocks of %d positions: too few for %d sequences", opts.KVBytes>>20, blocks, opts.BlockSize, opts.MaxSequences)
	}
	e.kv, err = kernels.NewKVCache(dev, cfg.NumHiddenLayers, cfg.NumKeyValueHeads, cfg.HeadDim, opts.BlockSize, blocks, opts.MaxSequences, maxBlocks, half)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("KV cache: %w", err)
	}
	if e.act, err = newActivations(dev, &cfg, opts.MaxRows, opts.MaxSequences); err != nil {
		e.Close()
		return nil, err
	}
	for b := blocks - 1; b >= 0; b-- {
		e.freeBlocks = append(e.freeBlocks, uint32(b))
	}
	for s := opts.MaxSequences - 1; s >= 0; s-- {
		e.freeSlots = append(e.freeSlots, s)
	}
	return e, nil
}

func (e *Engine) Config() qwen3.Config { return e.cfg }

// Device is the engine's device (for benchmarks that measure it alongside).
func (e *Engine) Device() *gpu.Device { return e.dev }

// KVElemBytes is the size of one cached key or value: 2 (f16) or 4 (f32).
func (e *Engine) KVElemBytes() int { return e.kv.ElemBytes() }

func (e *Engine) Info() engine.Info {
	kv := "f32"
	if e.kv.F16 {
		kv = "f16"
	}
	return engine.Info{Backend: "webgpu", Adapter: e.dev.Info().String() + ", " + kv + " KV cache"}
}

// KVCapacity: every sequence wastes less than one block, so the blocks
// beyond one per slot are what the scheduler may plan with.
func (e *Engine) KVCapacity() int {
	return (e.kv.Blocks - e.opts.MaxSequences) * e.opts.BlockSize
}

// Close releases every GPU resource (not the device).
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.w != nil {
		e.w.release()
	}
	if e.kv != nil {
		e.kv.Release()
	}
	if e.act != nil {
		e.act.release()
	}
	if e.ownsDevice {
		e.dev.Close()
		e.ownsDevice = false
	}
	return nil
}

// sequence is a block-table row and the pool blocks it maps.
type sequence struct {
	e      *Engine
	slot   int
	blocks []uint32 // logical block i → pool block
	len    int
	dirty  bool // blocks changed since the table row was written
}

// NewSequence takes a free slot; engine.ErrNoCapacity when none is left.
func (e *Engine) NewSequence() (engine.Sequence, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errReleased
	}
	if len(e.freeSlots) == 0 {
		return nil, fmt.Errorf("all %d sequence slots in use: %w", e.opts.MaxSequences, engine.ErrNoCapacity)
	}
	slot := e.freeSlots[len(e.freeSlots)-1]
	e.freeSlots = e.freeSlots[:len(e.freeSlots)-1]
	return &sequence{e: e, slot: slot}, nil
}

func (s *sequence) Len() int { return s.len }

// Truncate drops positions from n on and returns the blocks beyond them.
func (s *sequence) Truncate(n int) {
	if n < 0 || n >= s.len {
		return
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	s.len = n
	keep := (n + s.e.opts.BlockSize - 1) / s.e.opts.BlockSize
	s.e.freeBlocks = append(s.e.freeBlocks, s.blocks[keep:]...)
	s.blocks = s.blocks[:keep]
}

// Release returns the sequence's blocks and slot.
func (s *sequence) Release() {
	if s.e == nil {
		return
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	s.e.freeBlocks = append(s.e.freeBlocks, s.blocks...)
	s.e.freeSlots = append(s.e.freeSlots, s.slot)
	s.blocks, s.e = nil, nil
}

// grow maps blocks for positions up to n; it fails without changes when the
// pool is short.
func (s *sequence) grow(n int) error {
	need := (n+s.e.opts.BlockSize-1)/s.e.opts.BlockSize - len(s.blocks)
	if need <= 0 {
		return nil
	}
	if need > len(s.e.freeBlocks) {
		return fmt.Errorf("%d more KV blocks needed, %d free: %w", need, len(s.e.freeBlocks), engine.ErrNoCapacity)
	}
	free := s.e.freeBlocks
	s.blocks = append(s.blocks, free[len(free)-need:]...)
	s.e.freeBlocks = free[:len(free)-need]
	s.dirty = true
	return nil
}

// Step runs the batch in as few forward passes as its size allows.
func (e *Engine) Step(ctx context.Context, batch []*engine.Entry) error {
	if err := engine.CheckBatch(&e.cfg, batch); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return errReleased
	}
	seqs, err := e.sequences(batch)
	if err != nil {
		return err
	}
	// Map every block the batch needs first, so a full pool changes nothing.
	for i, s := range seqs {
		if err := s.grow(s.len + len(batch[i].Tokens)); err != nil {
			for _, s := range seqs[:i+1] {
				s.shrinkTo(s.len)
			}
			return err
		}
	}
	work := make([]pending, len(batch))
	for i, en := range batch {
		work[i] = pending{entry: en, seq: seqs[i], tokens: en.Tokens}
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		pass := e.plan(work)
		if pass.rows == 0 {
			return nil
		}
		if err := e.forward(pass); err != nil {
			return err
		}
	}
}

// sequences returns the batch's sequences, checking that each is this
// engine's and appears once.
func (e *Engine) sequences(batch []*engine.Entry) ([]*sequence, error) {
	seqs := make([]*sequence, len(batch))
	seen := map[*sequence]bool{}
	for i, en := range batch {
		s, ok := en.Seq.(*sequence)
		if !ok || s.e != e {
			return nil, fmt.Errorf("webgpu engine: batch entry %d: a sequence of another engine", i)
		}
		if seen[s] {
			return nil, fmt.Errorf("webgpu engine: batch entry %d repeats a sequence", i)
		}
		seen[s] = true
		seqs[i] = s
	}
	return seqs, nil
}

// shrinkTo returns blocks mapped beyond n positions (undoing grow).
func (s *sequence) shrinkTo(n int) {
	keep := (n + s.e.opts.BlockSize - 1) / s.e.opts.BlockSize
	if keep < len(s.blocks) {
		s.e.freeBlocks = append(s.e.freeBlocks, s.blocks[keep:]...)
		s.blocks = s.blocks[:keep]
	}
}
