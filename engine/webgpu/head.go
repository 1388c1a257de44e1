package webgpu

import (
	"errors"
	"fmt"
	"slices"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/qwen3"
	"webdraft/treemask"
)

// Head is an EAGLE-3 draft head (package eagle3) on the WebGPU engine: an
// engine.Head over a target Engine that keeps the features the head reads
// (Options.FeatureLayers), on the target's device and in its Group — one
// lock, one fault —, with a KV cache of its own for its one layer. It
// follows reference.Head.Forward, its oracle, as cpu.Head does, with the
// engine's kernels (headstep.go): a row's input is the target's features
// at the position before its token, gathered from the target's cache on
// the device through fc (3·Ht → H), or the head's own output before norm
// at the row before (drafting past the target, no fc), which the head
// keeps on the device for each sequence; the midlayer takes
// [input_layernorm(embedding); hidden_norm(hidden)] into q, k and v, RoPE
// without q/k norms, attention over the head's cache, o_proj and the MLP;
// norm and lm_head score the draft vocabulary at each entry's last row,
// whose argmax, log-probability and top tokens come back mapped to the
// target's vocabulary. Nothing but those read-out words leaves the device.
// StepN (headchain.go) chains greedy steps on the device: each step's
// argmax, mapped to the target's vocabulary there, is the next step's
// token, and one read brings every step's words back.
//
// Verify drafts token trees (EAGLE-2's dynamic tree, level by level), as
// cpu.Head does: a node (VerifyEntry.Parents) is a row of the head's cache
// placed by package treemask as the target engine places its nodes — at
// its parent's position plus one, its attention masked to the line and its
// own ancestors through the rows buffer the attention kernels read — whose
// input is the head's own output before norm at its parent's row: the
// store's row for a root (the line's last row), else the parent's row of
// the node store, where the head keeps every node's output on the device
// (headActivations.nodes). A tree's levels fed in one call run as stages
// on the device, recorded one after another with no read between them;
// each pass reads out its rows of the entries' last Out into the results,
// which one read brings back. A tree's nodes read the head's own output,
// so KeepPath keeps none of them whatever the path.
type Head struct {
	target *Engine
	g      *Group
	dev    *gpu.Device
	cfg    eagle3.Config
	layer  qwen3.Config // the midlayer's shape (cfg.Layer())
	engCfg qwen3.Config // the head as an engine (Config)
	opts   HeadOptions
	w      *headWeights
	kv     *kernels.KVCache
	act    *headActivations
	tree   headTree    // trees drafted on the device (DraftVerifyTree), made by the first
	spec   specBuffers // chains of speculative steps (DraftVerifyN), made by the first
	tokens []int32     // the target token of each draft token, ascending
	// What Info, KVCapacity and KVBlockSize report, kept past Close.
	kvType              string
	capacity, blockSize int
	closed              bool
}

var (
	_ engine.Engine    = (*Head)(nil)
	_ engine.Head      = (*Head)(nil)
	_ engine.Chainer   = (*Head)(nil)
	_ engine.Fuser     = (*Head)(nil)
	_ engine.TreeFuser = (*Head)(nil)
)

// HeadOptions size a Head; zero values take the defaults.
type HeadOptions struct {
	KVBytes      int64  // the head's KV-cache memory: its one layer's keys and values (default: as many positions as the target's cache, and a block a sequence)
	BlockSize    int    // positions per KV block (default 16)
	MaxSequences int    // sequence slots (default the target's)
	MaxRows      int    // rows a pass (default the target's MaxRows); longer feeds take several
	KV           string // the KV cache's element type, "f16" or "f32", as Options.KV
}

// NewHead returns the EAGLE-3 head cfg, w drafting for target, on the
// target's device and in its group. It refuses a head that does not fit
// the target (eagle3.Config.Check), a target that does not keep the
// features of the layers the head reads (Options.FeatureLayers must be
// cfg.Aux of the target's layers, in that order), incomplete weights
// (eagle3.Weights.Validate), and shapes the kernels do not take. The head
// embeds tokens with its own embedding where its checkpoint has one, else
// with the target's, on the device already.
func NewHead(target *Engine, cfg eagle3.Config, w *eagle3.Weights, opts HeadOptions) (*Head, error) {
	if target == nil || w == nil {
		return nil, errors.New("webgpu head: no target engine or no weights")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	tc := target.Config()
	if err := cfg.Check(tc); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	if aux := cfg.Aux(tc.NumHiddenLayers); !slices.Equal(aux, target.features) {
		return nil, fmt.Errorf("webgpu head: the head reads the inputs of target layers %v, the target engine keeps those of layers %v (webgpu.Options.FeatureLayers)", aux, target.features)
	}
	if opts.KVBytes < 0 || opts.BlockSize < 0 || opts.MaxSequences < 0 || opts.MaxRows < 0 {
		return nil, fmt.Errorf("webgpu head: options %+v: want sizes ≥ 0", opts)
	}
	if err := w.Validate(&cfg); err != nil {
		return nil, fmt.Errorf("webgpu head: incomplete weights: %w", err)
	}
	g := target.g
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case !g.open:
		return nil, errors.New("webgpu head: the target's engine group is closed")
	case g.fault != nil:
		return nil, g.fault
	case target.closed:
		return nil, errors.New("webgpu head: the target engine is closed")
	}
	h, err := buildHead(target, cfg, w, opts)
	if err != nil {
		return nil, fmt.Errorf("webgpu head: %w", err)
	}
	g.engines++
	return h, nil
}

// buildHead uploads the head's weights and allocates its KV cache and
// activations (the group's lock held).
func buildHead(target *Engine, cfg eagle3.Config, w *eagle3.Weights, opts HeadOptions) (_ *Head, err error) {
	tc := target.cfg
	sequencesDefaulted := opts.MaxSequences <= 0
	if opts.BlockSize <= 0 {
		opts.BlockSize = 16
	}
	if sequencesDefaulted {
		opts.MaxSequences = target.opts.MaxSequences
	}
	if opts.MaxRows <= 0 {
		opts.MaxRows = target.opts.MaxRows
	}
	layer := cfg.Layer()
	engCfg := layer
	engCfg.VocabSize, engCfg.MaxPositionEmbeddings = tc.VocabSize, tc.MaxPositionEmbeddings
	h := &Head{target: target, g: target.g, dev: target.dev, cfg: cfg, layer: layer, engCfg: engCfg, opts: opts, tokens: slices.Clone(w.TargetIDs)}
	defer func() {
		if err != nil {
			h.release()
		}
	}()
	if h.w, err = uploadHead(h.dev, &cfg, &layer, w, target.w.embed); err != nil {
		return nil, fmt.Errorf("upload weights: %w", err)
	}
	half := h.dev.F16()
	switch opts.KV {
	case "f16":
		half = true
	case "f32":
		half = false
	case "":
	default:
		return nil, fmt.Errorf("KV cache type %q: want f16 or f32", opts.KV)
	}
	elem := 4
	if half {
		elem = 2
	}
	blockBytes := int64(engine.KVBytesPerToken(&layer, elem) * opts.BlockSize)
	if opts.KVBytes <= 0 {
		// The head drafts along the target's sequences, whose caches hold
		// its drafts too: as many positions as the target's cache holds,
		// in blocks for them and one a sequence slot (what Capacity holds
		// back for a sequence's last block, partly used).
		opts.KVBytes = int64((target.KVCapacity()+opts.BlockSize-1)/opts.BlockSize+opts.MaxSequences) * blockBytes
		h.opts.KVBytes = opts.KVBytes
	}
	blocks := int(opts.KVBytes / blockBytes)
	if sequencesDefaulted && blocks <= opts.MaxSequences {
		opts.MaxSequences = max(1, blocks/2)
		h.opts.MaxSequences = opts.MaxSequences
	}
	if blocks <= opts.MaxSequences {
		return nil, fmt.Errorf("KV budget of %d MiB holds %d blocks of %d positions: too few for %d sequences", opts.KVBytes>>20, blocks, opts.BlockSize, opts.MaxSequences)
	}
	if h.kv, err = kernels.NewKVCache(h.dev, kernels.KVShape{
		Layers: 1, KVHeads: layer.NumKeyValueHeads, D: layer.HeadDim,
		BlockSize: opts.BlockSize, Blocks: blocks, Seqs: opts.MaxSequences,
		MaxBlocks: (engCfg.MaxPositionEmbeddings + opts.BlockSize - 1) / opts.BlockSize, F16: half,
	}); err != nil {
		return nil, fmt.Errorf("KV cache: %w", err)
	}
	h.kvType, h.capacity, h.blockSize = "f32", h.kv.Capacity(), h.kv.BlockSize
	if half {
		h.kvType = "f16"
	}
	if h.act, err = newHeadActivations(h.dev, &cfg, &layer, opts.MaxRows, opts.MaxSequences, len(target.features)); err != nil {
		return nil, err
	}
	return h, nil
}

// release frees what the head holds on the device (not the target's
// embedding it may use).
func (h *Head) release() {
	if h.w != nil {
		h.w.release()
	}
	if h.kv != nil {
		h.kv.Release()
	}
	if h.act != nil {
		h.act.release()
	}
	h.tree.release()
	h.spec.release()
	h.w, h.kv, h.act = nil, nil, nil
}

// DraftsTrees: the head drafts token trees through Verify
// (engine.DraftsTrees).
func (h *Head) DraftsTrees() bool { return true }

// Target is the engine whose sequences' features the head reads.
func (h *Head) Target() engine.Engine { return h.target }

// Config describes the head as an engine: the midlayer's shape, one layer,
// over the target's vocabulary and positions (the head takes and returns
// target tokens).
func (h *Head) Config() qwen3.Config { return h.engCfg }

func (h *Head) Info() engine.Info {
	return engine.Info{Backend: "webgpu", Adapter: fmt.Sprintf("EAGLE-3 head (draft vocabulary %d) on %s, %s KV cache", h.cfg.DraftVocabSize, h.dev.Info(), h.kvType),
		Software: h.dev.Info().Software()}
}

// KVCapacity is the positions the head's cache holds for certain
// (kernels.KVCache.Capacity).
func (h *Head) KVCapacity() int { return h.capacity }

// KVBlockSize is the positions a block of the head's cache holds.
func (h *Head) KVBlockSize() int { return h.blockSize }

// DeviceBytes is the memory of the device's buffers (gpu.Device.
// BufferBytes), the target's included.
func (h *Head) DeviceBytes() int64 { return h.dev.BufferBytes() }

// Fault is the device failure that broke the head's group (wrapping
// engine.ErrFault), or nil while it works.
func (h *Head) Fault() error {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	return h.g.fault
}

// usable is the error of a call on a closed or broken head, or one whose
// target is closed.
func (h *Head) usable() error {
	switch {
	case h.closed:
		return errHeadClosed
	case h.target.closed:
		return errors.New("webgpu head: the target engine is closed")
	}
	return h.g.fault
}

var errHeadClosed = errors.New("webgpu head: closed")

// Close releases the head's GPU resources (and the device, when it is the
// last engine of a group that owns it). Closing a closed head does
// nothing.
func (h *Head) Close() error {
	h.g.closeMember(&h.closed, h.release)
	return nil
}

// NewSequence takes a free slot of the head's KV cache (engine.
// ErrNoCapacity when none is left).
func (h *Head) NewSequence() (engine.Sequence, error) {
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, err
	}
	s, err := h.kv.NewSeq()
	if err != nil {
		return nil, kvError(err)
	}
	return &headSequence{owner: h, kv: s, outRow: -1}, nil
}

// headSequence is one sequence of the head: len tokens fed, token i ≥ 1
// the row i−1 of its cache (kv holds len−1 positions); the row whose
// output before norm the head's store keeps at the sequence's slot; how
// many rows, from the first, read the target's features; and past the
// line a token tree (slots: token indices, as the Parents that place it),
// whose node slot tree.Base()+i keeps its output before norm in row
// kv.Slot()·treemask.MaxNodes + i of the node store.
type headSequence struct {
	owner      *Head
	kv         *kernels.KVSeq
	len        int
	outRow     int // −1: the store holds none of the sequence's
	targetRows int // rows 0 … targetRows−1 read the target's features
	tree       treemask.Tree
	released   bool
}

func (s *headSequence) Len() int { return s.len }

// rows is the rows the sequence's tokens have: every token's but token 0's.
func (s *headSequence) rows() int { return max(s.len-1, 0) }

// Truncate keeps at most n tokens and at most the rows that read the
// target's features (engine.Head): a row drafted from the head's own output
// goes, so that the next step computes it again from the target's — a
// token tree's nodes, past the line, with them.
func (s *headSequence) Truncate(n int) {
	keep := min(n, s.targetRows+1)
	if s.released || keep < 0 || keep >= s.len {
		return
	}
	s.len = keep
	s.tree.Truncate(keep) // the tree starts past the line, which holds the rows over the target's
	s.targetRows = min(s.targetRows, s.rows())
	s.kv.Truncate(s.rows())
	if s.outRow >= s.rows() {
		s.outRow = -1
	}
}

// KeepPath ends the sequence's token tree keeping none of its nodes,
// whatever the path (engine.Head): each read the head's own output, and
// the next step computes the accepted tokens' rows again from the
// target's features. Len drops to the line's. A path that is not one of
// the tree's (treemask.ErrPath) is refused and changes nothing; an empty
// path drops the tree.
func (s *headSequence) KeepPath(path []int) error {
	if s.released {
		return errors.New("webgpu head: keep path: a released sequence")
	}
	n, err := s.tree.KeepNone(s.len, path)
	if err != nil {
		return fmt.Errorf("webgpu head: keep path: %w", err)
	}
	s.len = n
	s.kv.Truncate(s.rows())
	return nil
}

func (s *headSequence) Release() {
	if s.released {
		return
	}
	s.kv.Release()
	s.len, s.outRow, s.targetRows, s.released = 0, -1, 0, true
	s.tree = treemask.Tree{}
}
