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
// workers, the buffers kept from step to step.
//
// A row's input is the target's features at the position before its
// token, through fc (3·Ht → H), or the head's own output before norm at
// the row before (drafting past the target, no fc). A row that reads its
// own row before cannot run in the pass that computes that row, so a step
// runs in stages: the first computes every row whose input is at hand (the
// rows over the target's features, or a first row over the sequence's last
// output), each later stage the next row of each entry that drafts past
// the target. norm and lm_head then score the draft vocabulary at each
// entry's last row.
//
// The head's steps and its target's passes are serialized: a step holds
// the target while it reads the target's sequences, and both run on the
// target's workers.
type Head struct {
	mu     sync.Mutex // one step at a time: the pass's buffers are the head's
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
	// of its one layer) the head reports as its capacity.
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
	if err := checkHeadWeights(&cfg, w); err != nil {
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
	h.pass.init(h)
	return h, nil
}

// checkHeadWeights refuses a weight tree with a tensor missing or of
// another shape than cfg's, an embedding of another shape, or target ids
// that are not Vd ascending tokens of the vocabulary.
func checkHeadWeights(c *eagle3.Config, w *eagle3.Weights) error {
	for _, s := range w.Slots(c) {
		if s.Vector != nil {
			if len(*s.Vector) != s.Shape[0] {
				return fmt.Errorf("%s has %d values, want %d", s.Name, len(*s.Vector), s.Shape[0])
			}
			continue
		}
		if *s.Matrix == nil {
			return fmt.Errorf("%s is missing", s.Name)
		}
		if rows, cols := (*s.Matrix).Shape(); rows != s.Shape[0] || cols != s.Shape[1] {
			return fmt.Errorf("%s is %d×%d, want %d×%d", s.Name, rows, cols, s.Shape[0], s.Shape[1])
		}
	}
	if w.EmbedTokens != nil {
		if rows, cols := w.EmbedTokens.Shape(); rows != c.VocabSize || cols != c.HiddenSize {
			return fmt.Errorf("%s is %d×%d, want %d×%d", eagle3.EmbedName, rows, cols, c.VocabSize, c.HiddenSize)
		}
	}
	if len(w.TargetIDs) != c.DraftVocabSize {
		return fmt.Errorf("%d target ids (%s) for a draft vocabulary of %d", len(w.TargetIDs), eagle3.D2TName, c.DraftVocabSize)
	}
	for d, t := range w.TargetIDs {
		if t < 0 || int(t) >= c.VocabSize || d > 0 && t <= w.TargetIDs[d-1] {
			return fmt.Errorf("draft token %d is target token %d: want ascending tokens of [0, %d)", d, t, c.VocabSize)
		}
	}
	return nil
}

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
// values —; the output before norm of the last row computed; and how many
// rows, from the first, read the target's features.
type headSequence struct {
	owner      *Head
	len        int
	k, v       []float32
	out        []float32 // (H) the output before norm of row outRow
	outRow     int       // −1: none held
	targetRows int       // rows 0 … targetRows−1 read the target's features
	released   bool
}

func (s *headSequence) Len() int { return s.len }

// rows is the rows the sequence's tokens have: every token's but token 0's.
func (s *headSequence) rows() int { return max(s.len-1, 0) }

// Truncate keeps at most n tokens and at most the rows that read the
// target's features (engine.Head): a row drafted from the head's own output
// goes, so that the next step computes it again from the target's.
func (s *headSequence) Truncate(n int) {
	keep := min(n, s.targetRows+1)
	if keep < 0 || keep >= s.len {
		return
	}
	s.len = keep
	s.targetRows = min(s.targetRows, s.rows())
	if s.outRow >= s.rows() {
		s.outRow = -1
	}
}

// KeepPath: the head holds no token trees, so an empty path (drop the
// tree) changes nothing and any other is refused.
func (s *headSequence) KeepPath(path []int) error {
	if len(path) == 0 {
		return nil
	}
	return fmt.Errorf("cpu head: keep path: the head drafts no token trees: %w", treemask.ErrPath)
}

func (s *headSequence) Release() {
	s.k, s.v, s.out, s.len, s.outRow, s.targetRows, s.released = nil, nil, nil, 0, -1, 0, true
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

// headFeed is one entry of a step, planned: for each of its tokens the
// stage that computes its row (−1: token 0, no row) and whether the row
// reads the target's features (else the head's output at the row before).
type headFeed struct {
	seq    *headSequence
	target *sequence
	tokens []int
	L      int // the tokens the sequence held before the step
	stage  []int
	feat   []bool
}

// Step feeds each entry's tokens to its sequence, each row over its
// Target's features or the head's own output (engine.Head), and reads out
// the draft after each entry's last token, in the target's vocabulary.
// Nothing changes when the batch is refused.
func (h *Head) Step(ctx context.Context, batch []*engine.Entry) error {
	if err := engine.CheckBatch(&h.engCfg, batch); err != nil {
		return fmt.Errorf("cpu head: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	feeds, err := h.sequences(batch)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.target
	t.mu.Lock() // the target's sequences stay as they are while read
	defer t.mu.Unlock()
	for i := range feeds {
		if err := feeds[i].plan(i); err != nil {
			return err
		}
	}
	p, kvDim := &h.pass, h.layer.KVDim()
	defer p.trim()
	p.seqs = p.seqs[:0]
	for _, f := range feeds {
		f.seq.reserve(f.L+len(f.tokens)-1, kvDim)
		p.seqs = append(p.seqs, f.seq)
	}
	for stage := 0; p.layer(feeds, stage); stage++ { // until a stage has no rows
	}
	for _, f := range feeds {
		f.seq.len += len(f.tokens)
	}
	return p.readOut(feeds, batch)
}

// Verify is refused: a head drafts (Step) for its target, whose text it
// reads through Entry.Target, which a Verify entry does not carry.
func (h *Head) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	return errors.New("cpu head: an EAGLE-3 head drafts (Step) and does not verify")
}

// sequences checks every entry — a sequence of the head's once in the
// batch, a line, a Target sequence of the head's target, neither released,
// a row to compute — and returns the feeds to plan.
func (h *Head) sequences(batch []*engine.Entry) ([]headFeed, error) {
	feeds := make([]headFeed, len(batch))
	for i, en := range batch {
		s, ok := en.Seq.(*headSequence)
		switch {
		case !ok || s.owner != h:
			return nil, fmt.Errorf("cpu head: batch entry %d: a sequence of another engine (%T)", i, en.Seq)
		case s.released:
			return nil, fmt.Errorf("cpu head: batch entry %d: a released sequence", i)
		case en.Parents != nil:
			return nil, fmt.Errorf("cpu head: batch entry %d: tree nodes (Parents): an EAGLE-3 head drafts chains only", i)
		case en.Target == nil:
			return nil, fmt.Errorf("cpu head: batch entry %d: no Target sequence: an EAGLE-3 head reads its target's features", i)
		case s.len == 0 && len(en.Tokens) == 1:
			return nil, fmt.Errorf("cpu head: batch entry %d: token 0 alone: an EAGLE-3 head's first row is token 1's", i)
		}
		tq, ok := en.Target.(*sequence)
		switch {
		case !ok || tq.owner != h.target:
			return nil, fmt.Errorf("cpu head: batch entry %d: the Target sequence (%T) is not of the head's target engine", i, en.Target)
		case tq.k == nil:
			return nil, fmt.Errorf("cpu head: batch entry %d: a released Target sequence", i)
		}
		for _, p := range feeds[:i] {
			if p.seq == s {
				return nil, fmt.Errorf("cpu head: batch entry %d repeats a sequence of the batch", i)
			}
		}
		feeds[i] = headFeed{seq: s, target: tq, tokens: en.Tokens, L: s.len}
	}
	return feeds, nil
}

// plan places entry i's rows (headFeed): token i ≥ 1 is row j = i−1 over
// the target's features at position j while the target holds it in its
// line (a token tree's nodes are no position of the text), else over the
// head's output at row j−1 — the row of the token before in this feed (a
// stage after it), or the sequence's last row, which the sequence must
// hold.
func (f *headFeed) plan(i int) error {
	held := f.target.len
	if f.target.tree.Len() > 0 {
		held = f.target.tree.Base()
	}
	f.stage, f.feat = make([]int, len(f.tokens)), make([]bool, len(f.tokens))
	for t := range f.tokens {
		tok := f.L + t
		j := tok - 1 // the token's row and the position of its features
		switch {
		case tok == 0:
			f.stage[t] = -1
		case j < held:
			f.feat[t] = true
			if t > 0 {
				f.stage[t] = max(f.stage[t-1], 0)
			}
		case j == 0:
			return fmt.Errorf("cpu head: batch entry %d: token 1 reads the target's features at position 0, which its Target sequence does not hold", i)
		case t > 0:
			f.stage[t] = f.stage[t-1] + 1
		case f.seq.outRow != j-1:
			return fmt.Errorf("cpu head: batch entry %d: token %d reads the target's features at position %d (its Target sequence holds %d) or the head's output at row %d, which the sequence no longer holds", i, tok, j, held, j-1)
		}
	}
	return nil
}

// headRow is a row of a stage's pass: its sequence (feed), its slot in the
// head's cache, its token, and the target's features it reads (nil: it
// reads its sequence's last output).
type headRow struct {
	feed  int
	slot  int
	token int
	feat  []float32
}

// headPass holds the buffers of the head's passes, kept from step to
// step: R rows of a stage (n entries for the read-out), H the head's
// width, Ht the target's, D head_dim, I intermediate_size. As in the
// target's pass, the inputs of a matrix product are ops.Inputs.
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
	headIn  *ops.Input // (n, H): norm(output) at each entry's last row
	logits  []float32  // (n, Vd)
	parts   []partial  // (workers, n)
	sums    []float32  // (workers, n)
	workers []scratch
	scale   float32
}

// trim lets go of the step's sequences and drops the buffers sized past
// keepRows rows or keepReads entries (as the target's pass does).
func (p *headPass) trim() {
	clear(p.rows) // the target's features they point into
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
		p.logits, p.parts, p.sums, p.seqs = nil, nil, nil, nil
		p.headIn.Trim(keepReads)
	}
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
	wide := max(2*c.HiddenSize, c.QDim(), c.IntermediateSize)
	p.workers = make([]scratch, h.target.pool.Workers())
	for i := range p.workers {
		p.workers[i] = scratch{mm: make([]float32, mm), row: make([]float32, wide)}
	}
}

// layer runs the midlayer over the rows of the given stage of every feed
// and keeps each feed's last output; false when the stage has no rows.
func (p *headPass) layer(feeds []headFeed, stage int) bool {
	h := p.h
	c := &h.layer
	H, qDim, kvDim, I, half := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.HeadDim/2
	p.rows, p.fcRows = p.rows[:0], p.fcRows[:0]
	longest := 0
	for i, f := range feeds {
		for t, tok := range f.tokens {
			if f.stage[t] != stage {
				continue
			}
			r := headRow{feed: i, slot: f.L + t - 1, token: tok}
			if f.feat[t] {
				r.feat = f.target.features(r.slot)
				p.fcRows = append(p.fcRows, int32(len(p.rows)))
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
		if row.feat == nil { // the row before's output, which the sequence holds
			copy(p.x[r*H:(r+1)*H], feeds[row.feed].seq.out)
		}
	}

	h.target.pool.Run(p.run)

	// Each feed's last row of the stage: its output is the sequence's last;
	// the rows over the target's features extend those from the first.
	for r, row := range p.rows {
		s := feeds[row.feed].seq
		if row.feat != nil && row.slot == s.targetRows {
			s.targetRows++
		}
		if r+1 == R || p.rows[r+1].feed != row.feed {
			s.out = append(s.out[:0], p.x[r*H:(r+1)*H]...)
			s.outRow = row.slot
		}
	}
	return true
}

// run is one worker's part of a stage's pass (Pool.Run), phase by phase,
// as reference.Head.Forward: fc, the two norms, q, k, v with RoPE into the
// cache, causal GQA attention, o_proj and the residual, the MLP block.
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
		ops.RopeAngles(p.cos[r*half:(r+1)*half], p.sin[r*half:(r+1)*half], row.slot, h.invFreq)
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
	// attn = softmax(q·kᵀ/√D + causal mask)·v over the head's cache, GQA
	lo, hi = pool.Split(R*heads, w)
	for i := lo; i < hi; i++ {
		r, hd := i/heads, i%heads
		row := &p.rows[r]
		s, n := p.seqs[row.feed], row.slot+1
		kv := (hd / c.GroupSize()) * D
		ops.Attend(p.attn[r*qDim+hd*D:r*qDim+(hd+1)*D], p.q[r*qDim+hd*D:r*qDim+(hd+1)*D],
			s.k[kv:], s.v[kv:], kvDim, n, p.scale, ws.scores, ops.Mask{Base: n})
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
	// residual = hidden; hidden = residual + down(SiLU(gate(h))·up(h)),
	// h = post_attention_layernorm(hidden): the output before norm
	lo, hi = pool.Split(R, w)
	for r := lo; r < hi; r++ {
		ops.RMSNorm(ws.row[:H], p.x[r*H:(r+1)*H], h.postNorm, eps)
		p.normed.Set(r, ws.row[:H])
	}
	pool.Barrier()
	lo, hi = splitRows(pool, I, w)
	h.gate.MulRows(p.gate, I, p.normed, lo, hi, false, ws.mm)
	h.up.MulRows(p.up, I, p.normed, lo, hi, false, ws.mm)
	for r := range R {
		ops.SiLUMul(p.gate[r*I+lo:r*I+hi], p.up[r*I+lo:r*I+hi])
	}
	pool.Barrier()
	lo, hi = pool.Split(R, w)
	for r := lo; r < hi; r++ {
		p.mlp.Set(r, p.gate[r*I:(r+1)*I])
	}
	pool.Barrier()
	lo, hi = splitRows(pool, H, w)
	h.down.MulRows(p.x, H, p.mlp, lo, hi, true, ws.mm)
}

// readOut scores the draft vocabulary after each feed's last token —
// logits = lm_head(norm(output)) — and sets its entry's Next (the argmax,
// the lowest draft token of a tie, as a target token), Logprob (its
// log-softmax over the draft vocabulary) and Top.
func (p *headPass) readOut(feeds []headFeed, batch []*engine.Entry) error {
	h := p.h
	n, Vd := len(feeds), h.cfg.DraftVocabSize
	p.headIn.Resize(n, h.layer.HiddenSize)
	p.logits = grow(p.logits, n*Vd)
	p.parts, p.sums = grow(p.parts, len(p.workers)*n), grow(p.sums, len(p.workers)*n)
	h.target.pool.Run(p.score)
	for i, en := range batch {
		best, at, sum := float32(math.Inf(-1)), -1, float32(0)
		for w := range p.workers {
			q := p.parts[w*n+i]
			if q.none {
				continue
			}
			if q.nan {
				return fmt.Errorf("cpu head: batch entry %d: %w", i, sampling.ErrNaN)
			}
			if q.max > best || at < 0 {
				best, at = q.max, q.at
			}
			sum += p.sums[w*n+i]
		}
		if math.IsInf(float64(best), -1) {
			return fmt.Errorf("cpu head: batch entry %d: every logit is −Inf", i)
		}
		lse := best + float32(math.Log(float64(sum)))
		en.Next, en.Logprob, en.Top = int(h.tokens[at]), best-lse, nil
		if en.TopN > 0 {
			en.Top = topOf(p.logits[i*Vd:(i+1)*Vd], en.TopN, lse, h.tokens)
		}
	}
	return nil
}

// score is one worker's part of the read-out (Pool.Run): the norm of each
// entry's last output, its chunk of lm_head's rows, and over that chunk
// each row's largest logit and Σ exp(logit − the row's max).
func (p *headPass) score(w int) {
	h := p.h
	pool, ws := h.target.pool, &p.workers[w]
	n, Vd := len(p.seqs), h.cfg.DraftVocabSize
	lo, hi := pool.Split(n, w)
	for i := lo; i < hi; i++ {
		ops.RMSNorm(ws.row, p.seqs[i].out, h.norm, h.layer.RMSNormEps)
		p.headIn.Set(i, ws.row)
	}
	pool.Barrier()
	lo, hi = splitRows(pool, Vd, w)
	h.lmHead.MulRows(p.logits, Vd, p.headIn, lo, hi, false, ws.mm)
	mine := p.parts[w*n : (w+1)*n]
	for i := range mine {
		row := p.logits[i*Vd+lo : i*Vd+hi]
		if len(row) == 0 {
			mine[i] = partial{none: true}
			continue
		}
		m, at, nan := ops.Max(row)
		mine[i] = partial{max: m, at: lo + at, nan: nan}
	}
	pool.Barrier()
	sums := p.sums[w*n : (w+1)*n]
	for i := range mine {
		sums[i] = 0
		if mine[i].none || mine[i].nan {
			continue
		}
		m := float32(math.Inf(-1))
		for v := range p.workers {
			if q := p.parts[v*n+i]; !q.none {
				m = max(m, q.max)
			}
		}
		if math.IsInf(float64(m), -1) {
			continue // an all −∞ row: the read-out refuses it
		}
		sums[i] = ops.ExpSumFrom(p.logits[i*Vd+lo:i*Vd+hi], m)
	}
}
