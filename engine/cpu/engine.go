// Package cpu is webdraft's fast CPU engine (--backend cpu): the Qwen3
// forward pass of package reference, restructured for the machine. int4
// matrices are multiplied by vector kernels (package ops: with AVX-512
// VNNI from a packed copy made at load, against fixed-point inputs as
// precise as f32; otherwise read in place by f32 kernels); every matrix
// is read once for all the rows of a pass — a verification's k+1 rows
// and every sequence of a batch, the 151,936-row head included; a team
// of persistent workers (parallel.Pool) splits each phase of the pass
// and meets at barriers, so a step starts no goroutine and reuses the
// pass's buffers (it allocates only its few small results). A row read
// out at a temperature is sampled over the head's rows in f32 by vector
// kernels, its work split across the same workers (sample.go: the draw,
// a drafter's proposals, a tree's walk), by package sampling's rule. A
// greedy read-out of two rows or more screens the head instead: every
// logit to 16 bits of its input, then exactly only those that can reach
// the argmax or the top tokens asked for (pass.go's screenHead,
// Options.NoScreen).
//
// Where asked (Options.FeatureLayers) every pass also keeps, in its
// sequences beside their keys and values, the residual stream entering
// chosen layers: what an EAGLE-3 draft head reads, which runs over the
// engine's sequences on the same workers (Head, head.go).
//
// It passes the engine suite (enginetest) against the reference, the
// oracle it is tested against and which stays the reference engine
// (--backend reference).
package cpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"webdraft/engine"
	"webdraft/engine/cpu/ops"
	"webdraft/internal/parallel"
	"webdraft/qwen3"
	"webdraft/tensor"
	"webdraft/treemask"
)

// Engine is the CPU engine. Its passes are serialized: a server drives
// one engine from two goroutines (its /draft scheduler and its
// generator), and a pass's buffers are the engine's.
type Engine struct {
	mu      sync.Mutex // one pass at a time: pass and pool are shared
	cfg     qwen3.Config
	embed   interface{ Row(r int, dst []float32) } // embed_tokens: the head itself when tied
	layers  []layer
	norm    []float32
	head    *ops.Linear
	tokens  []int32   // the token of each head row, ascending; nil: row i is token i
	screen  bool      // greedy read-outs screen the head (Options.NoScreen)
	invFreq []float32 // (D/2) RoPE inverse frequencies
	kvBytes int64
	pool    *parallel.Pool
	ownPool bool // pool is the engine's own (Options.Threads), not the shared one
	pass    pass // the buffers of a forward pass, reused
	// features are the layers whose input every pass keeps in its
	// sequences (Options.FeatureLayers); featureAt[l] is layer l's index
	// among them, −1 for a layer not kept.
	features  []int
	featureAt []int
}

// layer is one decoder layer's weights, ready for the kernels.
type layer struct {
	inputNorm, postNorm []float32
	qNorm, kNorm        []float32
	q, k, v, o          *ops.Linear
	gate, up, down      *ops.Linear
}

// A chain of greedy steps (engine.StepN) is the same passes as that many
// Steps on the CPU, so the engine leaves it to engine.StepN's.
var _ engine.Engine = (*Engine)(nil)

// Options configure New.
type Options struct {
	// KVBytes is the memory for KV caches (f32 keys and values) the
	// engine reports as its capacity.
	KVBytes int64
	// Threads is the number of workers. 0 takes the process's shared
	// team of GOMAXPROCS workers, which every engine made so shares: a
	// drafter and a target in one process then hand the same workers back
	// and forth, rather than one engine's workers spinning for its next
	// pass while the other's run on the same cores.
	Threads int
	// FeatureLayers are target layers (0 … L−1, each once, in the order
	// given) whose input — the residual stream entering the layer, the
	// embedding itself for layer 0 — every pass keeps in its sequences,
	// concatenated in this order (len(FeatureLayers)·H floats a
	// position) at each fed row's cache slot, as its keys and values:
	// the features an EAGLE-3 head reads (Head). Nil keeps none.
	FeatureLayers []int
	// NoScreen computes every logit of a greedy read-out exactly. By
	// default a pass reading out two rows or more, all greedy, screens
	// the head (ops.Linear.Screen, where the machine runs it): every
	// logit to 16 bits of its input, then exactly only those whose bound
	// lets them reach the argmax or the top tokens asked for — the same
	// tokens and their logits as without, the log-sum-exp over the
	// screened rest (within ~5e-4 on the embedded target).
	NoScreen bool
}

// shared is the team engines made with Threads 0 share, started by the
// first of them and never stopped.
var shared = sync.OnceValue(func() *parallel.Pool { return parallel.NewPool(0) })

// New returns the CPU engine over a loaded weight tree. Where its int4
// matrices take the fixed-point kernel the engine keeps its own packed
// copies and copies of the small vectors (norms), so that w need not stay
// in memory after: a caller done with w may free it.
func New(cfg qwen3.Config, w *qwen3.Weights, opts Options) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(w.Layers) != cfg.NumHiddenLayers || w.EmbedTokens == nil || w.LMHead == nil {
		return nil, fmt.Errorf("cpu engine: weights do not match the config (%d layers, want %d)", len(w.Layers), cfg.NumHiddenLayers)
	}
	if err := engine.CheckHead(&cfg, w); err != nil {
		return nil, err
	}
	if rows, _ := w.LMHead.Shape(); rows != w.HeadRows(&cfg) {
		return nil, fmt.Errorf("cpu engine: the head has %d rows, want %d", rows, w.HeadRows(&cfg))
	}
	if opts.KVBytes < 0 || opts.Threads < 0 {
		return nil, fmt.Errorf("cpu engine: KV bytes %d, threads %d: want ≥ 0", opts.KVBytes, opts.Threads)
	}
	featureAt := make([]int, cfg.NumHiddenLayers)
	for l := range featureAt {
		featureAt[l] = -1
	}
	for i, l := range opts.FeatureLayers {
		if l < 0 || l >= cfg.NumHiddenLayers || featureAt[l] >= 0 {
			return nil, fmt.Errorf("cpu engine: feature layers %v: want distinct layers of 0 … %d", opts.FeatureLayers, cfg.NumHiddenLayers-1)
		}
		featureAt[l] = i
	}
	head, tokens, err := sortedHead(w.LMHead, w.HeadTokens)
	if err != nil {
		return nil, fmt.Errorf("cpu engine: %w", err)
	}
	e := &Engine{
		cfg: cfg, embed: w.EmbedTokens, norm: slices.Clone(w.Norm), head: ops.NewLinear(head),
		tokens: tokens, invFreq: cfg.RopeInvFreq(), kvBytes: opts.KVBytes,
		ownPool: opts.Threads > 0, features: slices.Clone(opts.FeatureLayers), featureAt: featureAt,
	}
	if w.EmbedTokens == w.LMHead {
		e.embed = e.head // its packed copy, so that the original may be freed
	}
	e.pool = shared()
	if e.ownPool {
		e.pool = parallel.NewPool(opts.Threads)
	}
	for _, l := range w.Layers {
		e.layers = append(e.layers, layer{
			inputNorm: slices.Clone(l.InputLayernorm), postNorm: slices.Clone(l.PostAttentionLayernorm),
			qNorm: slices.Clone(l.QNorm), kNorm: slices.Clone(l.KNorm),
			q: ops.NewLinear(l.QProj), k: ops.NewLinear(l.KProj), v: ops.NewLinear(l.VProj), o: ops.NewLinear(l.OProj),
			gate: ops.NewLinear(l.GateProj), up: ops.NewLinear(l.UpProj), down: ops.NewLinear(l.DownProj),
		})
	}
	e.screen = !opts.NoScreen && e.head.EnableScreen()
	e.pass.init(e)
	return e, nil
}

// sortedHead returns a head over part of the vocabulary with its rows in
// token order (lm_head.token_ids need not be sorted), gathered from head
// where they are not, and the tokens ascending; a head over every token
// (tokens nil) as it is. Token order is package sampling's: its argmax
// takes the lowest token of a tie, and its draws run through the
// vocabulary in index order, so that the read-out in head rows follows
// them exactly.
func sortedHead(head tensor.Matrix, tokens []int32) (tensor.Matrix, []int32, error) {
	if tokens == nil || slices.IsSorted(tokens) {
		return head, slices.Clone(tokens), nil
	}
	order := make([]int32, len(tokens))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return int(tokens[a]) - int(tokens[b]) })
	sorted := make([]int32, len(tokens))
	for i, r := range order {
		sorted[i] = tokens[r]
	}
	head, err := tensor.GatherRows(head, order)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", qwen3.HeadTokensName, err)
	}
	return head, sorted, nil
}

func (e *Engine) Config() qwen3.Config { return e.cfg }

// FeatureLayers returns the layers whose input the engine's sequences keep
// (Options.FeatureLayers), in their order there.
func (e *Engine) FeatureLayers() []int { return slices.Clone(e.features) }

// featureWidth is the floats a position's features take: len(features)·H.
func (e *Engine) featureWidth() int { return len(e.features) * e.cfg.HiddenSize }

func (e *Engine) Info() engine.Info {
	return engine.Info{Backend: "cpu", Adapter: fmt.Sprintf("Go CPU engine, %s kernels, %d threads", ops.Vector(), e.pool.Workers())}
}

// KVCapacity is the positions of f32 keys and values the KV budget holds.
func (e *Engine) KVCapacity() int {
	return int(e.kvBytes / int64(engine.KVBytesPerToken(&e.cfg, 4)))
}

// Close stops the engine's own workers (the shared team stays).
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ownPool {
		e.pool.Close()
	}
	return nil
}

// NewSequence returns an empty sequence.
func (e *Engine) NewSequence() (engine.Sequence, error) {
	return &sequence{owner: e, k: make([][]float32, len(e.layers)), v: make([][]float32, len(e.layers))}, nil
}

// sequence is one sequence's KV cache: per layer, (len, kv_heads·D) keys
// (RoPE applied) and values, grown as positions come; and, where the
// engine keeps features, (len, featureWidth) of them, slot by slot as the
// keys and values.
type sequence struct {
	owner *Engine
	len   int
	k, v  [][]float32
	feat  []float32
	tree  treemask.Tree
	// featuresOnly: AppendFeatures gave the sequence positions whose keys
	// and values the model never computed; it serves a head (Entry.Target)
	// until truncated to none.
	featuresOnly bool
}

func (s *sequence) Len() int { return s.len }

func (s *sequence) Truncate(n int) {
	if n >= 0 && n < s.len {
		s.len = n
		s.tree.Truncate(n)
	}
	if s.len == 0 {
		s.featuresOnly = false
	}
}

// KeepPath ends the sequence's token tree keeping the nodes of path, their
// keys and values copied to follow the line (treemask.Tree.KeepPath).
func (s *sequence) KeepPath(path []int) error {
	if s.k == nil {
		return errors.New("cpu engine: keep path: a released sequence")
	}
	moves, n, err := s.tree.KeepPath(s.len, path)
	if err != nil {
		return err
	}
	kvDim, F := s.owner.cfg.KVDim(), s.owner.featureWidth()
	for l := range s.k {
		for _, m := range moves {
			copy(s.k[l][m.To*kvDim:(m.To+1)*kvDim], s.k[l][m.From*kvDim:(m.From+1)*kvDim])
			copy(s.v[l][m.To*kvDim:(m.To+1)*kvDim], s.v[l][m.From*kvDim:(m.From+1)*kvDim])
		}
	}
	for _, m := range moves {
		copy(s.feat[m.To*F:(m.To+1)*F], s.feat[m.From*F:(m.From+1)*F])
	}
	s.len = n
	return nil
}

func (s *sequence) Release() { s.k, s.v, s.feat, s.len = nil, nil, nil, 0 }

// reserve makes room for n more positions in every layer's cache, and in
// the features where the engine keeps them, growing them as append does.
func (s *sequence) reserve(n, kvDim int) {
	have, want := s.len*kvDim, (s.len+n)*kvDim
	for l := range s.k {
		s.k[l] = slices.Grow(s.k[l][:have], want-have)[:want]
		s.v[l] = slices.Grow(s.v[l][:have], want-have)[:want]
	}
	if F := s.owner.featureWidth(); F > 0 {
		s.feat = slices.Grow(s.feat[:s.len*F], n*F)[:(s.len+n)*F]
	}
}

// FeatureWidth is the floats of one position's features
// (engine.FeatureReader): len(FeatureLayers)·hidden, 0 when none are kept.
func (e *Engine) FeatureWidth() int { return e.featureWidth() }

// Features returns positions from … to−1 of seq's features
// (engine.FeatureReader).
func (e *Engine) Features(seq engine.Sequence, from, to int) ([]float32, error) {
	s, err := e.featureSequence(seq)
	if err != nil {
		return nil, err
	}
	if from < 0 || to < from || to > s.len {
		return nil, fmt.Errorf("cpu engine: features of positions %d … %d: the sequence holds %d", from, to-1, s.len)
	}
	F := e.featureWidth()
	return slices.Clone(s.feat[from*F : to*F]), nil
}

// AppendFeatures extends seq by the positions whose features rows holds
// (engine.FeatureWriter), computing nothing.
func (e *Engine) AppendFeatures(seq engine.Sequence, rows []float32) error {
	s, err := e.featureSequence(seq)
	if err != nil {
		return err
	}
	F := e.featureWidth()
	if len(rows)%F != 0 {
		return fmt.Errorf("cpu engine: %d feature values: want rows of %d", len(rows), F)
	}
	n := len(rows) / F
	if s.len+n > e.cfg.MaxPositionEmbeddings {
		return fmt.Errorf("cpu engine: %d positions and %d more of features exceed the model's %d", s.len, n, e.cfg.MaxPositionEmbeddings)
	}
	if n == 0 {
		return nil
	}
	s.reserve(n, e.cfg.KVDim())
	copy(s.feat[s.len*F:], rows)
	s.len += n
	s.featuresOnly = true
	return nil
}

// featureSequence checks that seq is a live sequence of e and that e keeps
// features.
func (e *Engine) featureSequence(seq engine.Sequence) (*sequence, error) {
	s, ok := seq.(*sequence)
	switch {
	case len(e.features) == 0:
		return nil, errors.New("cpu engine: the engine keeps no features (Options.FeatureLayers)")
	case !ok || s.owner != e:
		return nil, fmt.Errorf("cpu engine: features: a sequence of another engine (%T)", seq)
	case s.k == nil:
		return nil, errors.New("cpu engine: features: a released sequence")
	case s.tree.Len() > 0:
		return nil, errors.New("cpu engine: features: the sequence holds a token tree")
	}
	return s, nil
}

// features is the features the sequence keeps at slot i.
func (s *sequence) features(i int) []float32 {
	F := s.owner.featureWidth()
	return s.feat[i*F : (i+1)*F : (i+1)*F]
}

// sequences checks that every entry's sequence is this engine's, once in
// the batch and not released.
func (e *Engine) sequences(feeds []feed) ([]*sequence, error) {
	out := make([]*sequence, len(feeds))
	for i, f := range feeds {
		s := f.seq
		q, ok := s.(*sequence)
		switch {
		case !ok || q.owner != e:
			return nil, fmt.Errorf("cpu engine: batch entry %d: a sequence of another engine (%T)", i, s)
		case q.k == nil:
			return nil, fmt.Errorf("cpu engine: batch entry %d: a released sequence", i)
		case q.featuresOnly:
			return nil, fmt.Errorf("cpu engine: batch entry %d: %w", i, engine.ErrFeaturesOnly)
		}
		for _, p := range out[:i] {
			if p == q {
				return nil, fmt.Errorf("cpu engine: batch entry %d repeats a sequence of the batch", i)
			}
		}
		out[i] = q
	}
	return out, nil
}

// Step runs one forward pass over the batch and reads out each entry's
// greedy token after its last one.
func (e *Engine) Step(ctx context.Context, batch []*engine.Entry) error {
	if err := engine.CheckBatch(&e.cfg, batch); err != nil {
		return err
	}
	feeds := make([]feed, len(batch))
	for i, en := range batch {
		feeds[i] = feed{en.Seq, en.Tokens, en.Parents, readout{rows: 1, topN: en.TopN}}
	}
	rows, err := e.forward(ctx, feeds)
	if err != nil {
		return err
	}
	engine.TakeNext(batch, rows)
	return nil
}

// SamplesDrafts: the CPU engine reads out sampled drafts on the host
// (engine.SamplesDrafts).
func (e *Engine) SamplesDrafts() bool { return true }

// DraftsCoupled reports that the engine drafts coupled draws a pass at a
// time (engine.DraftsCoupled): a coupled row's Sample, its read-out as a
// target's.
func (e *Engine) DraftsCoupled() bool { return true }

// Verify runs one forward pass over the batch and reads out each entry's
// last Out rows: greedy rows here, sampled ones by package sampling's
// rule over the row's logits.
func (e *Engine) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	if err := engine.CheckVerify(&e.cfg, batch); err != nil {
		return err
	}
	feeds := make([]feed, len(batch))
	for i, en := range batch {
		rd := readout{rows: en.Out, topN: en.TopN, params: en.Sampling, draws: en.Draws}
		if en.Propose != nil || en.Tree != nil {
			rd.draws, rd.sampled = nil, en
		}
		feeds[i] = feed{en.Seq, en.Tokens, en.Parents, rd}
	}
	rows, err := e.forward(ctx, feeds)
	if err != nil {
		return err
	}
	for i, en := range batch {
		en.Rows = rows[i]
	}
	return nil
}
