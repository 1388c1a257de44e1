package cpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/cpu/ops"
	"webdraft/qwen3"
	"webdraft/sampling"
	"webdraft/treemask"
)

// Head is an EAGLE-3 draft head (package eagle3) on the CPU: an
// engine.Head over a CPU target engine that keeps the features the head
// reads (Options.FeatureLayers). It follows reference.Head.Forward, its
// oracle, with the CPU engine's kernels: every matrix through ops.Linear
// (int4 heads on the fast kernels), each phase split across the target's
// workers, the buffers kept from pass to pass.
//
// A line row's input is the target's features at the position before its
// token, through fc (3·Ht → H), or the head's own output before norm at
// the row before (drafting past the target, no fc). A token tree's node
// (Verify with Parents: EAGLE-2's dynamic tree, drafted level by level)
// is a row placed by package treemask as the target engine places its
// nodes — at its parent's position plus one, attending to the line and to
// its own ancestors — whose input is the head's own output at its
// parent's row: the line's last row for a root, else the parent node's,
// which the sequence keeps for every node of its tree. A row that reads
// another row's output cannot run in the pass that computes that row, so
// a pass runs in stages: the first computes every row whose input is at
// hand (the rows over the target's features, a first row over the
// sequence's last output, the nodes whose parents are cached), each later
// stage the rows whose input the stage before computed (the next row of
// an entry that drafts past the target, the children of the nodes just
// computed). norm and lm_head then score the draft vocabulary at the rows
// read out: each Step entry's last row, each Verify entry's last Out rows.
//
// Step takes lines only (Parents refused); Verify takes lines and trees,
// read out greedily. A tree's nodes read the head's own output, so
// KeepPath keeps none of them whatever the path: the next step computes
// the accepted tokens' rows again from the target's features, as Truncate
// has it for the rows a line drafted past the target.
//
// The head's passes and its target's are serialized: a pass holds the
// target while it reads the target's sequences, and both run on the
// target's workers.
type Head struct {
	mu     sync.Mutex // one pass at a time: the pass's buffers are the head's
	target *Engine
	cfg    eagle3.Config
	layer  qwen3.Config // the midlayer's shape (cfg.Layer())
	engCfg qwen3.Config // the head as an engine (Config)
	embed  interface{ Row(r int, dst []float32) }
	// the midlayer's weights, ready for the kernels
	fc, q, k, v, o, gate, up, down, lmHead *ops.Linear
	inputNorm, hiddenNorm, postNorm, norm  []float32
	tokens                                 []int32 // the target token of each draft token, ascending
	invFreq                                []float32
	kvBytes                                int64
	pass                                   headPass
}

var (
	_ engine.Engine = (*Head)(nil)
	_ engine.Head   = (*Head)(nil)
)

// HeadOptions configure NewHead.
type HeadOptions struct {
	// KVBytes is the memory for the head's KV cache (f32 keys and values
	// of its one layer) the head reports as its capacity; 0: as many
	// positions as the target's.
	KVBytes int64
}

// NewHead returns the EAGLE-3 head cfg, w drafting for target, on the
// target's workers. It refuses a head that does not fit the target
// (eagle3.Config.Check), a target that does not keep the features of the
// layers the head reads (Options.FeatureLayers must be cfg.Aux of the
// target's layers, in that order), and incomplete weights. The head embeds
// tokens with its own embedding where its checkpoint has one, else with
// the target's.
func NewHead(target *Engine, cfg eagle3.Config, w *eagle3.Weights, opts HeadOptions) (*Head, error) {
	if target == nil || w == nil {
		return nil, errors.New("cpu head: no target engine or no weights")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cpu head: %w", err)
	}
	tc := target.Config()
	if err := cfg.Check(tc); err != nil {
		return nil, fmt.Errorf("cpu head: %w", err)
	}
	if aux := cfg.Aux(tc.NumHiddenLayers); !slices.Equal(aux, target.features) {
		return nil, fmt.Errorf("cpu head: the head reads the inputs of target layers %v, the target engine keeps those of layers %v (cpu.Options.FeatureLayers)", aux, target.features)
	}
	if opts.KVBytes < 0 {
		return nil, fmt.Errorf("cpu head: KV bytes %d: want ≥ 0", opts.KVBytes)
	}
	if err := w.Validate(&cfg); err != nil {
		return nil, fmt.Errorf("cpu head: incomplete weights: %w", err)
	}
	layer := cfg.Layer()
	engCfg := layer
	engCfg.VocabSize, engCfg.MaxPositionEmbeddings = tc.VocabSize, tc.MaxPositionEmbeddings
	h := &Head{
		target: target, cfg: cfg, layer: layer, engCfg: engCfg, embed: target.embed,
		fc: ops.NewLinear(w.FC), q: ops.NewLinear(w.QProj), k: ops.NewLinear(w.KProj), v: ops.NewLinear(w.VProj),
		o: ops.NewLinear(w.OProj), gate: ops.NewLinear(w.GateProj), up: ops.NewLinear(w.UpProj),
		down: ops.NewLinear(w.DownProj), lmHead: ops.NewLinear(w.LMHead),
		inputNorm: slices.Clone(w.InputLayernorm), hiddenNorm: slices.Clone(w.HiddenNorm),
		postNorm: slices.Clone(w.PostAttentionLayernorm), norm: slices.Clone(w.Norm),
		tokens: slices.Clone(w.TargetIDs), invFreq: layer.RopeInvFreq(), kvBytes: opts.KVBytes,
	}
	if w.EmbedTokens != nil {
		h.embed = w.EmbedTokens
	}
	if h.kvBytes == 0 {
		h.kvBytes = int64(target.KVCapacity() * engine.KVBytesPerToken(&layer, 4))
	}
	h.pass.init(h)
	return h, nil
}

// DraftsTrees: the CPU head drafts token trees through Verify
// (engine.DraftsTrees).
func (h *Head) DraftsTrees() bool { return true }

// SamplesDrafts: the head takes VerifyEntry.Propose, drawing proposals
// from its own distribution (engine.SamplesDrafts); the distributions
// are in host memory, for any target engine that samples.
func (h *Head) SamplesDrafts() bool { return true }

// DraftsCoupled reports that the head drafts coupled draws a pass at a
// time (engine.DraftsCoupled): each row with a coupled draw reads out the
// Gumbel-max draw over its draft vocabulary under the row's key.
func (h *Head) DraftsCoupled() bool { return true }

// Target is the engine whose sequences' features the head reads.
func (h *Head) Target() engine.Engine { return h.target }

// Config describes the head as an engine: the midlayer's shape, one layer,
// over the target's vocabulary and positions (the head takes and returns
// target tokens).
func (h *Head) Config() qwen3.Config { return h.engCfg }

func (h *Head) Info() engine.Info {
	return engine.Info{Backend: "cpu", Adapter: fmt.Sprintf("EAGLE-3 head (draft vocabulary %d) on the Go CPU engine, %s kernels, %d threads",
		h.cfg.DraftVocabSize, ops.Vector(), h.target.pool.Workers())}
}

// KVCapacity is the positions of f32 keys and values the KV budget holds.
func (h *Head) KVCapacity() int {
	return int(h.kvBytes / int64(engine.KVBytesPerToken(&h.layer, 4)))
}

// Close does nothing: the workers are the target's.
func (h *Head) Close() error { return nil }

// NewSequence returns an empty sequence.
func (h *Head) NewSequence() (engine.Sequence, error) {
	return &headSequence{owner: h, outRow: -1}, nil
}

// headSequence is one sequence of the head: len tokens fed, token i ≥ 1
// the row i−1 of the cache — (rows, kv_heads·D) keys (RoPE applied) and
// values —; the output before norm of the line's last row computed; how
// many rows, from the first, read the target's features; and past the
// line a token tree (slots: token indices, as the Parents that place it),
// with the output before norm of each of its nodes' rows.
type headSequence struct {
	owner      *Head
	len        int
	k, v       []float32
	out        []float32 // (H) the output before norm of line row outRow
	outRow     int       // −1: none held
	targetRows int       // rows 0 … targetRows−1 read the target's features
	tree       treemask.Tree
	nodeOut    []float32 // (tree.Len(), H): node slot tree.Base()+i's output before norm
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
	if keep < 0 || keep >= s.len {
		return
	}
	s.len = keep
	s.tree.Truncate(keep) // the tree starts past the line, which holds the rows over the target's
	s.nodeOut = s.nodeOut[:0]
	s.targetRows = min(s.targetRows, s.rows())
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
		return errors.New("cpu head: keep path: a released sequence")
	}
	n, err := s.tree.KeepNone(s.len, path)
	if err != nil {
		return fmt.Errorf("cpu head: keep path: %w", err)
	}
	s.len = n
	s.nodeOut = s.nodeOut[:0]
	return nil
}

func (s *headSequence) Release() {
	s.k, s.v, s.out, s.nodeOut, s.len, s.outRow, s.targetRows, s.released = nil, nil, nil, nil, 0, -1, 0, true
	s.tree = treemask.Tree{}
}

// reserve makes room for rows rows in the cache, growing it as append
// does.
func (s *headSequence) reserve(rows, kvDim int) {
	have, want := s.rows()*kvDim, rows*kvDim
	if want <= have {
		return
	}
	s.k = slices.Grow(s.k[:have], want-have)[:want]
	s.v = slices.Grow(s.v[:have], want-have)[:want]
}

// reserveNodes makes room for the outputs of a tree of nodes nodes, H
// wide, keeping those of the tree's nodes so far.
func (s *headSequence) reserveNodes(nodes, H int) {
	have, want := s.tree.Len()*H, nodes*H
	s.nodeOut = slices.Grow(s.nodeOut[:have], want-have)[:want]
}

// headFeed is one entry of a pass, planned: its tokens, their parents
// (nil: a line) and placement, and for each token the stage that computes
// its row (−1: token 0, no row) and whether the row reads the target's
// features (else an output of the head's: the row before's for a line
// token, the parent's for a node); the last read tokens' rows are read
// out, with their topN most likely tokens.
type headFeed struct {
	seq     *headSequence
	target  *sequence
	tokens  []int
	parents []int
	read    int
	topN    int
	params  sampling.Params // with propose: the distribution proposals are drawn from
	propose [][]float32     // VerifyEntry.Propose: each row read out's uniforms
	draws   []sampling.Draw // VerifyEntry.Draws: each row read out's coupled draw
	L       int             // the tokens the sequence held before the pass
	rows    []treemask.Row  // each token's placement (slots: token indices)
	stage   []int
	feat    []bool
	base    int // the tree's first slot, with the feed's nodes in
	nodes   int // the tree's nodes, with the feed's in
	read0   int // the index of the feed's first read-out row in the pass
}

// readAt is the index among the pass's read-out rows of token t's row, or
// −1 where it is not read out.
func (f *headFeed) readAt(t int) int {
	if k := t - (len(f.tokens) - f.read); k >= 0 {
		return f.read0 + k
	}
	return -1
}

// Step feeds each entry's tokens to its sequence as its line, each row
// over its Target's features or the head's own output (engine.Head), and
// reads out the draft after each entry's last token, in the target's
// vocabulary. It takes no tree nodes (Parents): a head drafts its trees
// through Verify. Nothing changes when the batch is refused.
func (h *Head) Step(ctx context.Context, batch []*engine.Entry) error {
	if err := engine.CheckBatch(&h.engCfg, batch); err != nil {
		return fmt.Errorf("cpu head: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	feeds := make([]headFeed, len(batch))
	for i, en := range batch {
		if en.Parents != nil {
			return fmt.Errorf("cpu head: batch entry %d: tree nodes (Parents) in a step: an EAGLE-3 head drafts token trees through Verify", i)
		}
		f, err := h.feed(i, en.Seq, en.Target, en.Tokens)
		if err != nil {
			return err
		}
		f.read, f.topN = 1, en.TopN
		feeds[i] = f
	}
	rows, err := h.forward(ctx, feeds)
	if err != nil {
		return err
	}
	engine.TakeNext(batch, rows)
	return nil
}

// Verify feeds each entry's tokens to its sequence — line tokens as Step
// does, then (Parents) a token tree's nodes, each over the head's own
// output at its parent's row (engine.Head) — and reads out each entry's
// last Out rows: the argmax, its log-probability and the TopN most likely
// tokens over the draft vocabulary, in the target's vocabulary, the
// numbers Step gives for a row; with Sampling and Propose, the proposals
// each row draws from the head's distribution there and that distribution
// (VerifyRow.Drawn, Q), as a drafter engine's rows do. Draws and Tree are
// refused (engine.CheckHeadVerify). Nothing changes when the batch is
// refused.
func (h *Head) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	if err := engine.CheckHeadVerify(&h.engCfg, batch); err != nil {
		return fmt.Errorf("cpu head: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	feeds := make([]headFeed, len(batch))
	for i, en := range batch {
		f, err := h.feed(i, en.Seq, en.Target, en.Tokens)
		if err != nil {
			return err
		}
		f.parents, f.read, f.topN = en.Parents, en.Out, en.TopN
		if en.Propose != nil || en.Draws != nil {
			f.params, f.propose, f.draws = en.Sampling, en.Propose, en.Draws
		}
		feeds[i] = f
	}
	rows, err := h.forward(ctx, feeds)
	if err != nil {
		return err
	}
	for i, en := range batch {
		en.Rows = rows[i]
	}
	return nil
}

// feed checks entry i — a sequence of the head's, not released; a Target
// sequence of the head's target, not released — and returns its feed to
// plan.
func (h *Head) feed(i int, seq, target engine.Sequence, tokens []int) (headFeed, error) {
	s, ok := seq.(*headSequence)
	switch {
	case !ok || s.owner != h:
		return headFeed{}, fmt.Errorf("cpu head: batch entry %d: a sequence of another engine (%T)", i, seq)
	case s.released:
		return headFeed{}, fmt.Errorf("cpu head: batch entry %d: a released sequence", i)
	case target == nil:
		return headFeed{}, fmt.Errorf("cpu head: batch entry %d: no Target sequence: an EAGLE-3 head reads its target's features", i)
	}
	tq, ok := target.(*sequence)
	switch {
	case !ok || tq.owner != h.target:
		return headFeed{}, fmt.Errorf("cpu head: batch entry %d: the Target sequence (%T) is not of the head's target engine", i, target)
	case tq.k == nil:
		return headFeed{}, fmt.Errorf("cpu head: batch entry %d: a released Target sequence", i)
	}
	return headFeed{seq: s, target: tq, tokens: tokens, L: s.len}, nil
}

// forward plans every feed — each sequence once in the batch — runs the
// head's layer over their rows stage by stage, appends the tokens to the
// sequences (and their nodes to the sequences' trees) and reads out each
// feed's last rows. Nothing changes when a feed is refused.
func (h *Head) forward(ctx context.Context, feeds []headFeed) ([][]engine.VerifyRow, error) {
	for i := range feeds {
		for _, p := range feeds[:i] {
			if p.seq == feeds[i].seq {
				return nil, fmt.Errorf("cpu head: batch entry %d repeats a sequence of the batch", i)
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.target
	t.mu.Lock() // the target's sequences stay as they are while read
	defer t.mu.Unlock()
	n := 0
	for i := range feeds {
		if err := feeds[i].plan(i); err != nil {
			return nil, err
		}
		feeds[i].read0 = n
		n += feeds[i].read
	}
	p, H, kvDim := &h.pass, h.layer.HiddenSize, h.layer.KVDim()
	defer p.trim()
	p.seqs, p.reads = p.seqs[:0], n
	p.readX = grow(p.readX, n*H)
	for i := range feeds {
		f := &feeds[i]
		f.seq.reserve(f.L+len(f.tokens)-1, kvDim)
		f.seq.reserveNodes(f.nodes, H)
		p.seqs = append(p.seqs, f.seq)
	}
	for stage := 0; p.layer(feeds, stage); stage++ { // until a stage has no rows
	}
	for _, f := range feeds {
		f.seq.tree.Commit(f.L, f.rows)
		f.seq.len += len(f.tokens)
	}
	return p.readOut(feeds)
}

// plan places entry i's tokens (headFeed) as the target engine places its
// own (treemask), and plans their rows (eagle3.PlanRows: which read the
// target's features, which the head's output, and in which stage); the
// target holds in its line the positions before its tree.
func (f *headFeed) plan(i int) error {
	T := len(f.tokens)
	if f.L == 0 && f.read == T {
		if T == 1 {
			return fmt.Errorf("cpu head: batch entry %d: token 0 alone: %w", i, eagle3.ErrTokenZero)
		}
		return fmt.Errorf("cpu head: batch entry %d: reads out token 0, which has no row: %w", i, eagle3.ErrTokenZero)
	}
	rows, err := f.seq.tree.Place(f.L, T, f.parents)
	if err != nil {
		return fmt.Errorf("cpu head: batch entry %d: %w", i, err)
	}
	held := f.target.len
	if f.target.tree.Len() > 0 {
		held = f.target.tree.Base()
	}
	rp, err := eagle3.PlanRows(f.L, rows, held, f.seq.outRow, f.seq.tree.Base(), f.seq.tree.Len())
	if err != nil {
		return fmt.Errorf("cpu head: batch entry %d: %w", i, err)
	}
	f.rows, f.base, f.nodes, f.stage, f.feat = rows, rp.Base, rp.Nodes, rp.Stage, rp.Feat
	return nil
}

// headRow is a row of a stage's pass: its sequence (feed), its slot in the
// head's cache, the position it is rotated at and the slots it attends to,
// its token, whether it is a tree node, its index among the read-out rows
// (−1: none), and its input: the target's features it reads (feat, through
// fc), else an output of the head's (own).
type headRow struct {
	feed  int
	slot  int
	pos   int
	mask  ops.Mask
	token int
	node  bool
	read  int
	feat  []float32
	own   []float32
}

// headPass holds the buffers of the head's passes, kept from pass to
// pass: R rows of a stage (n rows read out), H the head's width, Ht the
// target's, D head_dim, I intermediate_size. As in the target's pass, the
// inputs of a matrix product are ops.Inputs.
type headPass struct {
	h       *Head
	rows    []headRow
	fcRows  []int32    // the rows over the target's features, in pass order
	emb     []float32  // (R, H) the tokens' embeddings
	x       []float32  // (R, H) the hidden: fc(features) or an output; the residual stream
	fcIn    *ops.Input // (len(fcRows), 3·Ht): the features
	fcOut   []float32  // (len(fcRows), H)
	in      *ops.Input // (R, 2H): input_layernorm(emb) ‖ hidden_norm(x)
	q       []float32  // (R, qDim), rotated in place
	k, v    []float32  // (R, kvDim)
	attn    []float32  // (R, qDim)
	attnIn  *ops.Input // (R, qDim)
	normed  *ops.Input // (R, H): post_attention_layernorm(x)
	gate    []float32  // (R, I), then SiLU(gate)·up
	up      []float32  // (R, I)
	mlp     *ops.Input // (R, I)
	cos     []float32  // (R, D/2)
	sin     []float32  // (R, D/2)
	seqs    []*headSequence
	reads   int        // n: the rows read out
	readX   []float32  // (n, H) the outputs before norm of the rows read out
	headIn  *ops.Input // (n, H): norm(output) at each row read out
	logits  []float32  // (n, Vd)
	best    []float32  // (n) each row's largest logit
	parts   []partial  // (workers, n)
	sums    []float32  // (workers, n)
	tops    topTokens  // the rows' most likely tokens, by worker
	sampler sampler    // the rows that draw proposals, and the draws' scratch
	workers []scratch
	scale   float32
}

// trim lets go of the pass's sequences and drops the buffers sized past
// keepRows rows or keepReads rows read out (as the target's pass does).
func (p *headPass) trim() {
	clear(p.rows[:cap(p.rows)]) // the target's features and the outputs they point into
	clear(p.seqs)
	c := &p.h.layer
	if cap(p.x) > keepRows*c.HiddenSize {
		p.rows, p.fcRows, p.emb, p.x, p.fcOut, p.q, p.k, p.v, p.attn = nil, nil, nil, nil, nil, nil, nil, nil, nil
		p.gate, p.up, p.cos, p.sin = nil, nil, nil, nil
		for _, in := range []*ops.Input{p.fcIn, p.in, p.attnIn, p.normed, p.mlp} {
			in.Trim(keepRows)
		}
	}
	if cap(p.logits) > keepReads*p.h.cfg.DraftVocabSize {
		p.logits, p.best, p.parts, p.sums, p.seqs, p.readX = nil, nil, nil, nil, nil, nil
		p.headIn.Trim(keepReads)
	}
	p.sampler.trim()
	for i := range p.workers {
		if cap(p.workers[i].scores) > 1<<16 {
			p.workers[i].scores = nil
		}
	}
}

func (p *headPass) init(h *Head) {
	c := &h.layer
	p.h = h
	p.scale = float32(1 / math.Sqrt(float64(c.HeadDim)))
	mm := 0
	for _, m := range []*ops.Linear{h.fc, h.q, h.k, h.v, h.o, h.gate, h.up, h.down, h.lmHead} {
		mm = max(mm, m.ScratchLen())
	}
	p.fcIn, p.in = ops.NewInput(h.fc), ops.NewInput(h.q, h.k, h.v)
	p.attnIn, p.normed, p.mlp = ops.NewInput(h.o), ops.NewInput(h.gate, h.up), ops.NewInput(h.down)
	p.headIn = ops.NewInput(h.lmHead)
	p.sampler = newSampler(h.target.pool, h.tokens, h.engCfg.VocabSize, h.cfg.DraftVocabSize)
	wide := max(2*c.HiddenSize, c.QDim(), c.IntermediateSize)
	p.workers = make([]scratch, h.target.pool.Workers())
	for i := range p.workers {
		p.workers[i] = scratch{mm: make([]float32, mm), row: make([]float32, wide)}
	}
}

// layer runs the midlayer over the rows of the given stage of every feed,
// and keeps each feed's last line output, its nodes' outputs and those of
// the rows read out; false when the stage has no rows.
func (p *headPass) layer(feeds []headFeed, stage int) bool {
	h := p.h
	c := &h.layer
	H, qDim, kvDim, I, half := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.HeadDim/2
	p.rows, p.fcRows = p.rows[:0], p.fcRows[:0]
	longest := 0
	for i := range feeds {
		f := &feeds[i]
		for t, tok := range f.tokens {
			if f.stage[t] != stage {
				continue
			}
			// The token's row is the cache slot before its own (token 0 has
			// none): its position and the rows it reads shift with it.
			at := f.rows[t]
			r := headRow{feed: i, slot: f.L + t - 1, pos: at.Pos - 1, mask: ops.Mask{Base: at.Base - 1, Bits: at.Mask},
				token: tok, node: at.Parent != treemask.Line, read: f.readAt(t)}
			switch {
			case f.feat[t]:
				r.feat = f.target.features(r.slot)
				p.fcRows = append(p.fcRows, int32(len(p.rows)))
			case !r.node || at.Parent == f.base-1: // the row before's output; a root's parent is the line's last
				r.own = f.seq.out
			default:
				n := at.Parent - f.base
				r.own = f.seq.nodeOut[n*H : (n+1)*H]
			}
			p.rows = append(p.rows, r)
			longest = max(longest, r.slot+1)
		}
	}
	R := len(p.rows)
	if R == 0 {
		return false
	}
	p.emb, p.x = grow(p.emb, R*H), grow(p.x, R*H)
	p.fcIn.Resize(len(p.fcRows), 3*h.cfg.TargetHiddenSize)
	p.fcOut = grow(p.fcOut, len(p.fcRows)*H)
	p.in.Resize(R, 2*H)
	p.q, p.attn = grow(p.q, R*qDim), grow(p.attn, R*qDim)
	p.k, p.v = grow(p.k, R*kvDim), grow(p.v, R*kvDim)
	p.attnIn.Resize(R, qDim)
	p.normed.Resize(R, H)
	p.gate, p.up = grow(p.gate, R*I), grow(p.up, R*I)
	p.mlp.Resize(R, I)
	p.cos, p.sin = grow(p.cos, R*half), grow(p.sin, R*half)
	for i := range p.workers {
		p.workers[i].scores = grow(p.workers[i].scores, longest)
	}
	for r, row := range p.rows {
		if row.feat == nil { // an output the sequence holds
			copy(p.x[r*H:(r+1)*H], row.own)
		}
	}

	h.target.pool.Run(p.run)

	// A line row's output is its sequence's last (the stage's rows of a
	// feed come in token order); the line rows over the target's features
	// extend those from the first. A node's output joins its tree's.
	for r, row := range p.rows {
		f := &feeds[row.feed]
		s, x := f.seq, p.x[r*H:(r+1)*H]
		switch {
		case row.node:
			n := row.slot + 1 - f.base
			copy(s.nodeOut[n*H:(n+1)*H], x)
		default:
			if row.feat != nil && row.slot == s.targetRows {
				s.targetRows++
			}
			s.out = append(s.out[:0], x...)
			s.outRow = row.slot
		}
		if row.read >= 0 {
			copy(p.readX[row.read*H:(row.read+1)*H], x)
		}
	}
	return true
}

// run is one worker's part of a stage's pass (Pool.Run), phase by phase,
// as reference.Head.Forward: fc, the two norms, q, k, v with RoPE into the
// cache, GQA attention (causal, or a tree's mask), o_proj and the
// residual, the MLP block.
func (p *headPass) run(w int) {
	h := p.h
	c := &h.layer
	H, qDim, kvDim, I, D := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.HeadDim
	heads, kvHeads, half := c.NumAttentionHeads, c.NumKeyValueHeads, D/2
	pool, ws, R := h.target.pool, &p.workers[w], len(p.rows)
	eps := c.RMSNormEps

	// embeds = embed_tokens(input_ids); cos, sin at each row's position;
	// the target's features, fc's input
	lo, hi := pool.Split(R, w)
	for r := lo; r < hi; r++ {
		row := &p.rows[r]
		h.embed.Row(row.token, p.emb[r*H:(r+1)*H])
		ops.RopeAngles(p.cos[r*half:(r+1)*half], p.sin[r*half:(r+1)*half], row.pos, h.invFreq)
	}
	lo, hi = pool.Split(len(p.fcRows), w)
	for i := lo; i < hi; i++ {
		p.fcIn.Set(i, p.rows[p.fcRows[i]].feat)
	}
	pool.Barrier()
	// hidden = fc(features) at those rows
	lo, hi = splitRows(pool, H, w)
	h.fc.MulRows(p.fcOut, H, p.fcIn, lo, hi, false, ws.mm)
	pool.Barrier()
	// residual = hidden; in = cat(input_layernorm(embeds), hidden_norm(hidden)): (R, 2H)
	lo, hi = pool.Split(len(p.fcRows), w)
	for i := lo; i < hi; i++ {
		r := int(p.fcRows[i])
		copy(p.x[r*H:(r+1)*H], p.fcOut[i*H:(i+1)*H])
	}
	pool.Barrier()
	lo, hi = pool.Split(R, w)
	for r := lo; r < hi; r++ {
		ops.RMSNorm(ws.row[:H], p.emb[r*H:(r+1)*H], h.inputNorm, eps)
		ops.RMSNorm(ws.row[H:2*H], p.x[r*H:(r+1)*H], h.hiddenNorm, eps)
		p.in.Set(r, ws.row[:2*H])
	}
	pool.Barrier()
	// q, k, v = q_proj(in), k_proj(in), v_proj(in): their rows split as one
	lo, hi = splitRows(pool, qDim+2*kvDim, w)
	project(lo, hi, p.in, ws.mm, h.q, p.q, h.k, p.k, h.v, p.v)
	pool.Barrier()
	// RoPE at each row's position (no q/k norm: a Llama layer); the keys
	// and values into the cache
	lo, hi = pool.Split(R*(heads+kvHeads), w)
	for i := lo; i < hi; i++ {
		r, hd := i/(heads+kvHeads), i%(heads+kvHeads)
		cos, sin := p.cos[r*half:(r+1)*half], p.sin[r*half:(r+1)*half]
		if hd < heads {
			ops.Rope(p.q[r*qDim+hd*D:r*qDim+(hd+1)*D], cos, sin)
			continue
		}
		hd -= heads
		kh := p.k[r*kvDim+hd*D : r*kvDim+(hd+1)*D]
		ops.Rope(kh, cos, sin)
		row := &p.rows[r]
		s, at := p.seqs[row.feed], row.slot*kvDim+hd*D
		copy(s.k[at:at+D], kh)
		copy(s.v[at:at+D], p.v[r*kvDim+hd*D:r*kvDim+(hd+1)*D])
	}
	pool.Barrier()
	// attn = softmax(q·kᵀ/√D + mask)·v over the head's cache, GQA: the
	// mask causal for a line row, a node's the line and its ancestors
	lo, hi = pool.Split(R*heads, w)
	for i := lo; i < hi; i++ {
		r, hd := i/heads, i%heads
		row := &p.rows[r]
		s, n := p.seqs[row.feed], row.slot+1
		kv := (hd / c.GroupSize()) * D
		ops.Attend(p.attn[r*qDim+hd*D:r*qDim+(hd+1)*D], p.q[r*qDim+hd*D:r*qDim+(hd+1)*D],
			s.k[kv:], s.v[kv:], kvDim, n, p.scale, ws.scores, row.mask)
	}
	pool.Barrier()
	lo, hi = pool.Split(R, w)
	for r := lo; r < hi; r++ {
		p.attnIn.Set(r, p.attn[r*qDim:(r+1)*qDim])
	}
	pool.Barrier()
	// hidden = residual + o_proj(attn)
	lo, hi = splitRows(pool, H, w)
	h.o.MulRows(p.x, H, p.attnIn, lo, hi, true, ws.mm)
	pool.Barrier()
	// the MLP block: x becomes the output before norm
	mlpBlock(pool, w, ws, mlpBuffers{p.x, p.normed, p.gate, p.up, p.mlp}, R, H, I, h.postNorm, eps, h.gate, h.up, h.down)
}

// readOut scores the draft vocabulary at each row read out — logits =
// lm_head(norm(output)) — and gives each feed's rows: the argmax (the
// lowest draft token of a tie, as a target token), its log-softmax over
// the draft vocabulary, the log-sum-exp, and the topN most likely; and a
// feed's proposals, drawn by the sampler as a drafter engine's are (the
// draft vocabulary's tokens ascend in the target's, as the sampler wants).
func (p *headPass) readOut(feeds []headFeed) ([][]engine.VerifyRow, error) {
	h := p.h
	n, Vd := p.reads, h.cfg.DraftVocabSize
	p.headIn.Resize(n, h.layer.HiddenSize)
	p.logits, p.best = grow(p.logits, n*Vd), grow(p.best, n)
	p.parts, p.sums = grow(p.parts, len(p.workers)*n), grow(p.sums, len(p.workers)*n)
	p.tops.size(n, len(p.workers))
	for _, f := range feeds {
		for j := range f.read {
			p.tops.want[f.read0+j] = f.topN
		}
	}
	h.target.pool.Run(p.score)
	out := make([][]engine.VerifyRow, len(feeds))
	for i, f := range feeds {
		out[i] = make([]engine.VerifyRow, f.read)
		for j := range out[i] {
			k := f.read0 + j
			best, at, lse, err := reduceRow(p.parts, p.sums, len(p.workers), n, k)
			if err != nil {
				return nil, fmt.Errorf("cpu head: batch entry %d row %d: %w", i, j, err)
			}
			p.best[k] = best
			r := &out[i][j]
			r.Row = sampling.Row{Argmax: int(h.tokens[at]), LogSumExp: lse, ArgmaxLogprob: best - lse, Threshold: float32(math.Inf(-1))}
			if f.topN > 0 {
				r.Top = p.tops.merge(k, len(p.workers), lse)
			}
		}
		p.propose(f, out[i])
	}
	return out, nil
}

// propose draws f's proposals or coupled drafts into its rows (from
// read-out row f.read0 on), each row's distribution the head's logits
// there under f.params.
func (p *headPass) propose(f headFeed, rows []engine.VerifyRow) {
	if f.propose == nil && f.draws == nil || f.params.Greedy() {
		return
	}
	s, Vd := &p.sampler, p.h.cfg.DraftVocabSize
	s.reset()
	if f.draws != nil { // coupled drafts: each row's λ only (sampler.coupled)
		for j, dr := range f.draws {
			k := f.read0 + j
			d := s.add(p.logits[k*Vd:(k+1)*Vd], p.best[k], rows[j].LogSumExp, f.params, len(rows))
			if d.nucleus() {
				s.prepare(d)
			} else {
				d.lambda, d.theta = float32(math.Inf(-1)), float32(math.Inf(-1))
			}
			s.choose(d, dr, &rows[j].Row)
		}
		return
	}
	var ds []*dist
	for j, us := range f.propose {
		if len(us) > 0 {
			k := f.read0 + j
			ds = append(ds, s.add(p.logits[k*Vd:(k+1)*Vd], p.best[k], rows[j].LogSumExp, f.params, len(rows)))
		}
	}
	s.prepare(ds...)
	for j, us := range f.propose {
		if len(us) > 0 {
			s.propose(ds[0], us, &rows[j])
			ds = ds[1:]
		}
	}
}

// score is one worker's part of the read-out (Pool.Run): the norm of each
// output read out, its chunk of lm_head's rows, and over that chunk each
// row's largest logit and Σ exp(logit − the row's max).
func (p *headPass) score(w int) {
	h := p.h
	pool, ws := h.target.pool, &p.workers[w]
	n, Vd, H := p.reads, h.cfg.DraftVocabSize, h.layer.HiddenSize
	lo, hi := pool.Split(n, w)
	for i := lo; i < hi; i++ {
		ops.RMSNorm(ws.row[:H], p.readX[i*H:(i+1)*H], h.norm, h.layer.RMSNormEps)
		p.headIn.Set(i, ws.row)
	}
	pool.Barrier()
	lo, hi = splitRows(pool, Vd, w)
	h.lmHead.MulRows(p.logits, Vd, p.headIn, lo, hi, false, ws.mm)
	reduceChunk(pool, w, n, Vd, lo, hi, p.logits, p.parts, p.sums)
	p.tops.scan(w, Vd, lo, hi, p.logits, h.tokens)
}
