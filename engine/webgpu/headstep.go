package webgpu

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
	"webdraft/sampling"
	"webdraft/treemask"
)

// headIn is one entry of a head pass as given: its sequences, its tokens
// and their parents (nil: a line), how many of its last rows are read out
// and the most likely tokens each lists.
type headIn struct {
	seq, target     engine.Sequence
	tokens, parents []int
	read, topN      int
	params          sampling.Params // with propose or draws: VerifyEntry.Sampling
	propose         [][]float32     // VerifyEntry.Propose
	draws           []sampling.Draw // VerifyEntry.Draws: coupled, no proposals
}

// headFeed is one entry of a head pass, planned: its tokens, their
// placement (package treemask, slots token indices: token i's row is the
// head's cache slot i−1), for each the stage that computes its row (−1:
// token 0, no row) and whether the row reads the target's features (else
// an output of the head's: the row before's for a line token, the
// parent's for a node); the last read tokens' rows are read out, topN
// most likely tokens each.
type headFeed struct {
	seq        *headSequence
	target     *kernels.KVSeq
	tokens     []int
	parents    []int
	read, topN int
	// A Verify entry's proposals (headpropose.go): their distribution's
	// sampling, each row's uniforms, and (takeSlots) each row's Q-store
	// slot, −1 where it draws none.
	params  sampling.Params
	propose [][]float32
	slots   []int
	// A Verify entry's coupled draws (VerifyEntry.Draws), a row each:
	// each row's Sample is the Gumbel-max draw under its key.
	draws []sampling.Draw
	L     int // the tokens the sequence held before the pass
	place []treemask.Row
	stage []int
	feat  []bool
	base  int // the tree's first slot, with the feed's nodes in
}

// node reports whether token t is a tree node.
func (f *headFeed) node(t int) bool { return f.place[t].Parent != treemask.Line }

// firstRead is the first token whose row is read out.
func (f *headFeed) firstRead() int { return len(f.tokens) - f.read }

// Step feeds each entry's tokens to its sequence, each row over its
// Target's features or the head's own output (engine.Head), and reads out
// the draft after each entry's last token, in the target's vocabulary. It
// takes no tree nodes (Parents): the head drafts its trees through Verify.
//
// A row that reads the head's output at the row before cannot run in the
// pass that computes that row, so a step runs in stages, as cpu.Head's
// does: the first computes every row whose input is at hand (the rows over
// the target's features, or a first row over the sequence's last output),
// each later stage the next row of each entry that drafts past the target.
// A stage is one pass (several where its rows outnumber HeadOptions.
// MaxRows); the host writes each pass's inputs and submits it without
// waiting for the one before, the read-out is recorded after the last, and
// one read brings every entry's token back. The first pass makes the
// target's pending KV moves (its sequences' kept paths) first, so that the
// features it gathers are where the target's line has them. Nothing
// changes when the batch is refused.
func (h *Head) Step(ctx context.Context, batch []*engine.Entry) error {
	if err := engine.CheckBatch(&h.engCfg, batch); err != nil {
		return fmt.Errorf("webgpu head: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	return h.step(ctx, batch)
}

// step is Step over a checked, non-empty batch, the group's lock held.
func (h *Head) step(ctx context.Context, batch []*engine.Entry) error {
	rows, err := h.call(ctx, func() ([]headFeed, error) { return h.stepFeeds(batch) }, false)
	if err != nil {
		return err
	}
	engine.TakeNext(batch, rows)
	return nil
}

// Verify feeds each entry's tokens to its sequence — line tokens as Step
// does, then (Parents) a token tree's nodes, each over the head's own
// output at its parent's row (engine.Head) — and reads out each entry's
// last Out rows: the argmax, its log-probability, the log-sum-exp and the
// TopN most likely tokens over the draft vocabulary, in the target's
// vocabulary. The rows run in stages as Step's do — a node a stage after
// its parent where the call feeds both —, each pass reading out its rows
// of the entries' last Out into the results buffer on the device, which
// one read brings back after the last. With Sampling and Propose an
// entry's rows draw proposals from the head's distribution (VerifyRow.Drawn
// and Q, a DeviceDist: headpropose.go); with Sampling and coupled Draws
// each row's Sample is its coupled draw, the Gumbel-max draw from the
// head's distribution under the row's key (argmax.wgsl's coupled rows, as
// SampleN's), in the target's vocabulary with its log-probability: a
// keyed token tree's levels. A Tree is refused (engine.CheckHeadVerify).
// Nothing changes when the batch is refused.
func (h *Head) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	if err := engine.CheckHeadVerify(&h.engCfg, batch); err != nil {
		return fmt.Errorf("webgpu head: %w", err)
	}
	if len(batch) == 0 {
		return nil
	}
	proposes := slices.ContainsFunc(batch, func(en *engine.VerifyEntry) bool { return en.Propose != nil })
	ins := make([]headIn, len(batch))
	for i, en := range batch {
		if proposes && en.Draws != nil {
			return fmt.Errorf("webgpu head: batch entry %d: coupled draws in a batch that draws proposals: a pass reads its rows out one way", i)
		}
		ins[i] = headIn{seq: en.Seq, target: en.Target, tokens: en.Tokens, parents: en.Parents, read: en.Out, topN: en.TopN}
		switch {
		case en.Propose != nil:
			ins[i].params, ins[i].propose = en.Sampling, en.Propose
		case en.Draws != nil && !en.Sampling.Greedy():
			ins[i].params, ins[i].draws = en.Sampling, en.Draws
		}
	}
	h.g.mu.Lock()
	defer h.g.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	rows, err := h.call(ctx, func() ([]headFeed, error) { return h.feeds(ins) }, true)
	if err != nil {
		return err
	}
	for i, en := range batch {
		en.Rows = rows[i]
	}
	return nil
}

// call plans a call's feeds and, unless ctx is done, runs them (forward),
// the group's lock held.
func (h *Head) call(ctx context.Context, plan func() ([]headFeed, error), verify bool) ([][]engine.VerifyRow, error) {
	feeds, err := plan()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return h.forward(feeds, verify)
}

// stepFeeds checks a Step batch — lines only — and returns its feeds,
// planned, each reading out its last row.
func (h *Head) stepFeeds(batch []*engine.Entry) ([]headFeed, error) {
	ins := make([]headIn, len(batch))
	for i, en := range batch {
		if en.Parents != nil {
			return nil, fmt.Errorf("webgpu head: batch entry %d: tree nodes (Parents) in a step: an EAGLE-3 head drafts token trees through Verify", i)
		}
		ins[i] = headIn{seq: en.Seq, target: en.Target, tokens: en.Tokens, read: 1, topN: en.TopN}
	}
	return h.feeds(ins)
}

// feeds checks every entry — a sequence of the head's once in the batch, a
// Target sequence of the head's target, neither released, rows to compute
// and read out — and returns its feed, planned.
func (h *Head) feeds(ins []headIn) ([]headFeed, error) {
	feeds := make([]headFeed, len(ins))
	for i, in := range ins {
		s, ok := in.seq.(*headSequence)
		switch {
		case !ok || s.owner != h:
			return nil, fmt.Errorf("webgpu head: batch entry %d: a sequence of another engine (%T)", i, in.seq)
		case s.released:
			return nil, fmt.Errorf("webgpu head: batch entry %d: a released sequence", i)
		case in.target == nil:
			return nil, fmt.Errorf("webgpu head: batch entry %d: no Target sequence: an EAGLE-3 head reads its target's features", i)
		}
		tq, ok := in.target.(*kernels.KVSeq)
		switch {
		case ok && tq.Cache() == nil:
			return nil, fmt.Errorf("webgpu head: batch entry %d: a released Target sequence", i)
		case !ok || tq.Cache() != h.target.kv:
			return nil, fmt.Errorf("webgpu head: batch entry %d: the Target sequence (%T) is not of the head's target engine", i, in.target)
		}
		for _, p := range feeds[:i] {
			if p.seq == s {
				return nil, fmt.Errorf("webgpu head: batch entry %d repeats a sequence of the batch", i)
			}
		}
		feeds[i] = headFeed{seq: s, target: tq, tokens: in.tokens, parents: in.parents, read: in.read, topN: in.topN,
			params: in.params, propose: in.propose, draws: in.draws, L: s.len}
		if err := feeds[i].plan(i); err != nil {
			return nil, err
		}
	}
	return feeds, nil
}

// plan places entry i's tokens (headFeed) as the target engine places its
// own (treemask), and plans their rows (eagle3.PlanRows: which read the
// target's features, which the head's output — the store's row or the
// node store's —, and in which stage).
func (f *headFeed) plan(i int) error {
	T := len(f.tokens)
	if f.L == 0 && f.read == T {
		if T == 1 {
			return fmt.Errorf("webgpu head: batch entry %d: token 0 alone: %w", i, eagle3.ErrTokenZero)
		}
		return fmt.Errorf("webgpu head: batch entry %d: reads out token 0, which has no row: %w", i, eagle3.ErrTokenZero)
	}
	place, err := f.seq.tree.Place(f.L, T, f.parents)
	if err != nil {
		return fmt.Errorf("webgpu head: batch entry %d: %w", i, err)
	}
	rp, err := eagle3.PlanRows(f.L, place, f.target.Line(), f.seq.outRow, f.seq.tree.Base(), f.seq.tree.Len())
	if err != nil {
		return fmt.Errorf("webgpu head: batch entry %d: %w", i, err)
	}
	f.place, f.base, f.stage, f.feat = place, rp.Base, rp.Stage, rp.Feat
	return nil
}

// headPart is a run of one feed's rows in a head pass, line rows or tree
// nodes: its tokens t0 … t0+T−1, at the pass's rows row0 … row0+T−1; slot
// is its sequence's (table row and store row).
type headPart struct {
	feed, slot, t0, T, row0 int
	node                    bool
}

// headRead is a row a Verify pass reads out: read-out row j of feed.
type headRead struct{ feed, j int }

// readOrder is the rows a Verify pass reads out, in the order writePass
// reads them (ps.reads, which it sets as it places the rows).
func (ps *headPass) readOrder(feeds []headFeed) []headRead {
	var reads []headRead
	for _, p := range ps.parts {
		f := &feeds[p.feed]
		for t := p.t0; t < p.t0+p.T; t++ {
			if t >= f.firstRead() {
				reads = append(reads, headRead{feed: p.feed, j: t - f.firstRead()})
			}
		}
	}
	return reads
}

// headPass is one pass of a head call: rows of one stage, runs of them a
// part, the short parts first — rows 0 … decode−1 attend through decode
// attention, the longer parts through prefill tiles —; nfc of its rows
// read the target's features, nx their hidden from the store (or fc's
// rows), nnx from the node store; nsave parts keep their last output in
// the store, nnsave nodes theirs in the node store.
type headPass struct {
	parts       []headPart
	rows        int
	decode      int
	maxLen      int // the longest context a decode row sees
	nread       int // the rows it reads out (planning: at most S)
	nfc, nsave  int
	nx, nnx     int
	nnsave      int
	first, last bool // the call's first pass, and its last
	// rowBuf holds the rows' places in the head's cache (nil: the
	// activations' rowBuf); a chained step's are its own (StepN).
	rowBuf *gpu.Buffer
	// out, for a Verify, lays out the results: the pass reads its rows out
	// (reads, in order) into them at resultsAt. Nil for a step, whose
	// read-out after its last pass reads the store.
	out       *verifyLayout
	resultsAt uint64
	reads     []headRead
	// A chain's (StepN): mapped, the read-out's greedy choice is the
	// target's token (kernels.ArgmaxOf over the draft vocabulary's ids),
	// which the step after embeds from next (fromNext); a Verify pass
	// with coupled draws is mapped too, its draws (under keys) copied
	// into the results beside sample.wgsl's words. A chained step's
	// row i is entry i's: its residual is row i of x as the step before
	// left it (xHeld: that step chained too, so x holds its output there),
	// its output stays in x for the next (noSave: no copy into the store
	// but for the last step) and is read out from there (readX).
	mapped, fromNext, xHeld, noSave, readX bool
	// A mapped chain's step reads out straight into the chain's results:
	// its ids to readIDs, their log-probabilities (and log-sum-exps) to
	// readLP; where fromNext, its ids are the step before's there
	// (fromIDs). Zero Bindings: next, as for every other pass.
	readIDs, readLP, fromIDs gpu.Binding
	// keys, where set, are a mapped pass's read-out rows' coupled keys
	// (kernels.ArgmaxOfCoupled; couple.go).
	keys gpu.Binding
	// treeLevel: a level of a tree drafted on the device (DraftVerifyTree),
	// every row read out, in order, after the pass.
	treeLevel bool
	// propose: a Verify pass whose rows read out over the vocabulary,
	// some drawing proposals (headpropose.go).
	propose bool
	// A chained speculative step's first pass (DraftVerifyN): its gathers'
	// pairs are pairs' (nil: the activations'), and with featsIn its nfc
	// rows' features are in fcIn already (the target's verification put
	// them there), and fc writes its rows' hidden straight into x.
	pairs   *gpu.Buffer
	featsIn bool
}

// verifyLayout is where a Verify's results buffer holds each pass's
// read-out words: at its offset, sample.wgsl's words (S rows of
// kernels.SampleWords), from topAt its top tokens (S, topN, 2) u32 where
// topN > 0; each part at an offset a binding takes.
type verifyLayout struct {
	stride, topAt uint64
	topN          int
	drawnAt       uint64 // with proposals: their tokens drawn (0: none)
	// With coupled draws: from coupledAt the rows' draws (S u32, target
	// tokens), from coupledLP their log-probabilities (S f32); 0: none.
	coupledAt, coupledLP uint64
}

// verifyLayout lays out the results of a Verify whose rows list topN most
// likely tokens, with propose the tokens they draw, and with coupled
// their coupled draws.
func (h *Head) verifyLayout(topN int, propose, coupled bool) verifyLayout {
	align := uint64(h.dev.Limits().MinStorageBufferOffsetAlignment)
	up := func(n uint64) uint64 { return (n + align - 1) / align * align }
	S := h.act.S
	l := verifyLayout{topN: topN, topAt: up(uint64(S*kernels.SampleWords) * 4)}
	l.stride = l.topAt
	if topN > 0 {
		l.stride += up(topBytes(S, topN))
	}
	if propose {
		l.drawnAt = l.stride
		l.stride += up(uint64(S*kernels.ProposeDrawnWords) * 4)
	}
	if coupled {
		l.coupledAt = l.stride
		l.coupledLP = l.coupledAt + up(uint64(S)*4)
		l.stride = l.coupledLP + up(uint64(S)*4)
	}
	return l
}

// topBytes is the bytes of n rows of topN top tokens, rounded up to a copy's
// 16.
func topBytes(n, topN int) uint64 { return uint64(n*topN*2*4+15) &^ 15 }

// passes lays the feeds' rows out in passes, stage by stage, each of at
// most R rows of which at most S are read out (a stage's long run split
// over several).
func (h *Head) passes(feeds []headFeed) []headPass {
	var out []headPass
	var cur headPass
	flush := func() {
		if cur.rows > 0 {
			out = append(out, h.lay(cur, feeds))
			cur = headPass{}
		}
	}
	for stage := 0; ; stage++ {
		some := false
		for i := range feeds {
			f := &feeds[i]
			for t0 := 0; t0 < len(f.tokens); {
				if f.stage[t0] != stage {
					t0++
					continue
				}
				end := t0 + 1 // the run: the stage's tokens, lines and nodes apart
				for end < len(f.tokens) && f.stage[end] == stage && f.node(end) == f.node(t0) {
					end++
				}
				some = true
				for t0 < end {
					n := min(end-t0, h.act.R-cur.rows)
					if r0 := max(t0, f.firstRead()); t0+n > r0 {
						n = min(n, r0-t0+h.act.S-cur.nread)
					}
					if n == 0 {
						flush()
						continue
					}
					cur.parts = append(cur.parts, headPart{feed: i, slot: f.seq.kv.Slot(), t0: t0, T: n, node: f.node(t0)})
					cur.rows += n
					cur.nread += max(0, t0+n-max(t0, f.firstRead()))
					t0 += n
				}
			}
		}
		if !some {
			break
		}
		flush()
	}
	out[0].first, out[len(out)-1].last = true, true
	return out
}

// lay orders a pass's parts — those that attend through decode attention
// (decodeEntryRows rows at most, or any where the prefill kernel does not
// take the head_dim) first — and places their rows.
func (h *Head) lay(ps headPass, feeds []headFeed) headPass {
	prefill := h.kv.PrefillSupported()
	long := func(p headPart) int {
		if prefill && p.T > decodeEntryRows {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(ps.parts, func(a, b headPart) int { return cmp.Compare(long(a), long(b)) })
	row := 0
	for i := range ps.parts {
		p := &ps.parts[i]
		p.row0, row = row, row+p.T
		if long(*p) == 0 {
			ps.decode = row
			ps.maxLen = max(ps.maxLen, feeds[p.feed].L+p.t0+p.T-1) // the last row's slot, plus one
		}
	}
	return ps
}

// forward runs the passes of planned feeds — a Verify's (verify), else a
// step's — over blocks it reserves, and returns each feed's rows read out;
// the sequences then hold the tokens fed. On an error every sequence is as
// it was, and an error of the device breaks the group.
func (h *Head) forward(feeds []headFeed, verify bool) ([][]engine.VerifyRow, error) {
	seqs, need := make([]*kernels.KVSeq, len(feeds)), make([]int, len(feeds))
	trees := false
	for i, f := range feeds {
		seqs[i], need[i] = f.seq.kv, f.L+len(f.tokens)-1
		trees = trees || f.seq.tree.Len() > 0 || slices.ContainsFunc(f.place, func(r treemask.Row) bool { return r.Parent != treemask.Line })
	}
	if trees {
		if err := h.act.ensureNodes(h.dev, h.cfg.HiddenSize); err != nil {
			return nil, fmt.Errorf("webgpu head: %w", err)
		}
	}
	if err := h.kv.Reserve(seqs, need); err != nil {
		return nil, fmt.Errorf("webgpu head: %w", kvError(err))
	}
	rows, submitted, err := h.run(feeds, verify)
	if err != nil {
		for _, f := range feeds {
			f.seq.kv.Truncate(f.seq.rows())
			if submitted { // the store may hold rows of this call
				f.seq.outRow = -1
			}
		}
		return nil, h.target.broken(err)
	}
	return rows, nil
}

// run records and submits the passes of planned feeds and reads their
// read-out back, and commits the sequences. submitted reports whether any
// pass went to the device.
func (h *Head) run(feeds []headFeed, verify bool) (_ [][]engine.VerifyRow, submitted bool, err error) {
	seqs := make([]*kernels.KVSeq, len(feeds))
	topN := 0
	for i, f := range feeds {
		seqs[i] = f.seq.kv
		topN = max(topN, min(f.topN, h.cfg.DraftVocabSize))
	}
	if err := h.kv.SyncTables(seqs); err != nil {
		return nil, false, err
	}
	passes := h.passes(feeds)
	var lay verifyLayout
	proposing := false
	var keys func(k int) gpu.Binding
	if verify {
		var err error
		if proposing, err = h.takeSlots(feeds); err != nil {
			return nil, false, err
		}
		if keys, err = h.verifyKeys(feeds, passes); err != nil {
			return nil, false, err
		}
		lay = h.verifyLayout(topN, proposing, keys != nil)
		if err := h.act.ensureChain(h.dev, 0, uint64(len(passes))*lay.stride); err != nil {
			return nil, false, err
		}
	}
	for k := range passes {
		ps := &passes[k]
		if verify {
			ps.out, ps.resultsAt = &lay, uint64(k)*lay.stride
			if keys != nil && len(ps.readOrder(feeds)) > 0 {
				ps.mapped, ps.keys = true, keys(k)
			}
		}
		if err := h.writePass(feeds, ps); err != nil {
			return nil, submitted, err
		}
		if ps.mapped && !slices.Equal(ps.reads, ps.readOrder(feeds)) {
			return nil, submitted, fmt.Errorf("head pass %d of %d: its coupled keys are not in its read-out's order", k+1, len(passes))
		}
		if proposing && len(ps.reads) > 0 {
			ps.propose = true
			if err := h.writeProposals(feeds, ps); err != nil {
				return nil, submitted, err
			}
		}
		submitted = true
		if err := h.target.submit(h.passSteps(ps, len(feeds), topN), submitEvery); err != nil {
			return nil, true, fmt.Errorf("head pass %d of %d: %w", k+1, len(passes), err)
		}
	}
	if proposing {
		if err := h.act.writeGreedy(); err != nil {
			return nil, true, err
		}
	}
	var rows [][]engine.VerifyRow
	if verify {
		rows, err = h.readVerify(feeds, passes, lay)
	} else {
		rows, err = h.readOut(feeds, topN)
	}
	if err != nil {
		return nil, true, err
	}
	return rows, true, h.commit(feeds, 0)
}

// commit records that each feed's sequence holds its tokens and more line
// tokens past them (a chain's drafted ones): its cache's rows, its tree's
// nodes, the rows over the target's features and the row the store holds.
func (h *Head) commit(feeds []headFeed, more int) error {
	for _, f := range feeds {
		s := f.seq
		if n := f.L + len(f.tokens) - 1 + more; n > 0 {
			if err := s.kv.Commit(n, nil); err != nil {
				return err
			}
		}
		s.tree.Commit(f.L, f.place)
		line := more // the line tokens fed: the feed's first, then more
		for t := range f.tokens {
			if f.feat[t] && f.L+t-1 == s.targetRows {
				s.targetRows++
			}
			if !f.node(t) {
				line++
			}
		}
		if line > 0 && f.L+line >= 2 {
			s.outRow = f.L + line - 2 // the last line token's row
		}
		s.len += len(f.tokens) + more
	}
	return nil
}

// writePass writes pass ps's inputs: its tokens, its rows' places in the
// head's cache (a node's its tree's, shifted a slot as its row is), and
// the pairs of its gathers — the features of the rows over the target's
// (their pool rows in the target's cache), each row's hidden (fc's output,
// the store's row of its sequence for a line row past the target or a
// root, its parent's row of the node store for another node), the outputs
// kept (each line part's last row into the store, each node's into the
// node store), and the read-out's: a Verify's rows of this pass read out,
// or after a step's last pass each entry's store row.
func (h *Head) writePass(feeds []headFeed, ps *headPass) error {
	a := h.act
	ids, rows := make([]uint32, ps.rows), make([]uint32, ps.rows*kernels.RowWords)
	pairs := make([]uint32, a.regions.words)
	put := func(region uint64, i int, dst, src int) {
		w := region/4 + uint64(i*kernels.GatherPairWords)
		pairs[w], pairs[w+1] = uint32(dst), uint32(src)
	}
	nf := len(a.regions.features)
	ps.nfc, ps.nsave, ps.nx, ps.nnx, ps.nnsave, ps.reads = 0, 0, 0, 0, 0, nil
	for _, p := range ps.parts {
		f, slot := &feeds[p.feed], p.slot
		nodeRow := func(tok int) int { return slot*treemask.MaxNodes + tok - f.base }
		for k := range p.T {
			t, r := p.t0+k, p.row0+k
			j := f.L + t - 1
			at := f.place[t]
			ids[r] = uint32(f.tokens[t])
			// The token's row is the cache slot before its own (token 0 has
			// none): its position and the rows it reads shift with it.
			kernels.PutRow(rows[r*kernels.RowWords:], slot, j, treemask.Row{Pos: at.Pos - 1, Base: at.Base - 1, Mask: at.Mask})
			switch {
			case f.feat[t]:
				pool, err := f.target.PoolRow(j)
				if err != nil {
					return fmt.Errorf("the target's features at position %d: %w", j, err)
				}
				for i, region := range a.regions.features {
					put(region, ps.nfc, ps.nfc*nf+i, pool)
				}
				put(a.regions.x, ps.nx, r, ps.nfc)
				ps.nfc++
				ps.nx++
			case !f.node(t) || at.Parent == f.base-1: // the row before's output; a root's parent is the line's last
				put(a.regions.x, ps.nx, r, a.R+slot)
				ps.nx++
			default:
				put(a.regions.nodeX, ps.nnx, r, nodeRow(at.Parent))
				ps.nnx++
			}
			if p.node {
				put(a.regions.nodeSave, ps.nnsave, nodeRow(f.L+t), r)
				ps.nnsave++
			}
			if ps.out != nil && t >= f.firstRead() {
				put(a.regions.read, len(ps.reads), len(ps.reads), r)
				ps.reads = append(ps.reads, headRead{feed: p.feed, j: t - f.firstRead()})
			}
		}
		if !p.node {
			put(a.regions.save, ps.nsave, a.R+slot, p.row0+p.T-1)
			ps.nsave++
		}
	}
	if ps.last && ps.out == nil {
		for i, f := range feeds {
			put(a.regions.read, i, i, a.R+f.seq.kv.Slot())
		}
	}
	for _, w := range []struct {
		buf *gpu.Buffer
		v   []uint32
	}{{a.ids, ids}, {a.rowBuf, rows}, {a.pairs, pairs}} {
		if err := w.buf.WriteU32(0, w.v); err != nil {
			return err
		}
	}
	return nil
}

// passSteps lists a head pass's operations — reference.Head.Forward, step
// by step — over its R rows, and its read-out: a Verify pass's rows read
// out, or after a step's last pass its n entries' (their topN most likely
// tokens where topN > 0).
func (h *Head) passSteps(ps *headPass, n, topN int) []step {
	a, w, c, t := h.act, h.w, &h.cfg, h.target
	R, H, heads, eps := ps.rows, c.HiddenSize, c.NumAttentionHeads, c.RMSNormEps
	rowBuf := a.rowBuf
	if ps.rowBuf != nil {
		rowBuf = ps.rowBuf
	}
	gather := func(dst, src *gpu.Buffer, region uint64, n, words int) step {
		return h.gatherFrom(ps.pairs, dst, src, region, n, words)
	}
	var steps []step
	if ps.first {
		// The target's sequences' kept paths, moved: the features read
		// below are where its line has them.
		steps = append(steps, func(b *gpu.Batch) error { return t.kv.RecordMoves(b) })
	}
	switch {
	case ps.featsIn:
		// hidden_states = fc(the features the target's pass left in fcIn),
		// the residual from the start
		steps = append(steps, func(b *gpu.Batch) error { return kernels.MatMul(b, a.x, a.fcIn, w.fc, ps.nfc, false) })
	case ps.nfc > 0:
		// hidden_states = fc(cat(the target's features)): (nfc, 3·Ht) → (nfc, H)
		for i, region := range a.regions.features {
			steps = append(steps, gather(a.fcIn, t.kv.Feature(i), region, ps.nfc, c.TargetHiddenSize))
		}
		steps = append(steps, func(b *gpu.Batch) error { return kernels.MatMul(b, a.hid, a.fcIn, w.fc, ps.nfc, false) })
	}
	// residual = hidden: fc's rows, or the row before's output (the store;
	// for a chained step, x as the step before left it: xHeld), or a
	// node's parent's (the node store)
	if !ps.xHeld {
		steps = append(steps, gather(a.x, a.hid, a.regions.x, ps.nx, H))
	}
	steps = append(steps, gather(a.x, a.nodes, a.regions.nodeX, ps.nnx, H))
	ids := a.ids.All()
	switch {
	case ps.fromIDs.Buf != nil:
		ids = ps.fromIDs
	case ps.fromNext:
		ids = a.next.All()
	}
	steps = append(steps,
		// in = cat(input_layernorm(embed_tokens(ids)), hidden_norm(hidden)): (R, 2H)
		func(b *gpu.Batch) error {
			return kernels.EmbedRMSNormPair(b, a.in, 2*H, 0, ids, w.embed, w.inputNorm, a.x, w.hiddenNorm, a.emb, R, H, eps)
		},
		// q | k | v = qkv_proj(in); RoPE at each row's position, no q/k norm
		// (a Llama layer); the keys and values into the head's cache
		func(b *gpu.Batch) error {
			return kernels.QKVProjRopeKVNormed(b, a.q, a.qkv, a.in, w.qkv, w.rope, h.kv, 0, rowBuf, R, heads, eps, false)
		},
		// attn = softmax(q·kᵀ/√D + mask)·v over the head's cache, GQA: the
		// mask causal for a line row, a node's the line and its ancestors
		func(b *gpu.Batch) error {
			if ps.decode == 0 {
				return nil
			}
			return kernels.AttentionDecode(b, a.attn, a.q, h.kv, 0, rowBuf, ps.decode, heads, ps.maxLen)
		},
		func(b *gpu.Batch) error {
			for _, p := range ps.parts {
				if p.row0 >= ps.decode {
					if err := kernels.AttentionPrefill(b, a.attn, a.q, h.kv, 0, p.slot, rowBuf, p.row0, p.T, heads); err != nil {
						return err
					}
				}
			}
			return nil
		},
		// hidden = residual + o_proj(attn); hidden += down(silu(gate(x))·up(x)),
		// x = post_attention_layernorm(hidden): the output before norm
		func(b *gpu.Batch) error { return kernels.MatMul(b, a.x, a.attn, w.o, R, true) },
		func(b *gpu.Batch) error { return kernels.MatMulNorm(b, a.gateUp, a.x, w.postNorm, w.gateUp, R, eps) },
		func(b *gpu.Batch) error { return kernels.MatMulSwiGLU(b, a.x, a.gateUp, w.down, R, true) },
	)
	// each line part's last output into its sequence's store row (but a
	// chained step's before the last: noSave), each node's into its row of
	// the node store
	if !ps.noSave {
		steps = append(steps, gather(a.hid, a.x, a.regions.save, ps.nsave, H))
	}
	steps = append(steps, gather(a.nodes, a.x, a.regions.nodeSave, ps.nnsave, H))
	switch {
	case ps.out != nil && len(ps.reads) > 0:
		// A Verify's rows of this pass read out, their words into the
		// results.
		k, l := len(ps.reads), ps.out
		steps = append(steps, h.readSteps(a.x, k, l.topN, true, ps)...)
		steps = append(steps, func(b *gpu.Batch) error {
			return kernels.CopyTo(b, a.results, ps.resultsAt, a.sampled, uint64(k*kernels.SampleWords)*4)
		})
		if l.topN > 0 {
			steps = append(steps, func(b *gpu.Batch) error {
				return kernels.CopyTo(b, a.results, ps.resultsAt+l.topAt, a.top, topBytes(k, l.topN))
			})
		}
		if ps.mapped { // coupled draws: argmax.wgsl's ids and log-probabilities
			words := uint64((k+3)&^3) * 4
			steps = append(steps, func(b *gpu.Batch) error {
				if err := kernels.CopyRange(b, a.results, ps.resultsAt+l.coupledAt, a.next.Slice(0, words)); err != nil {
					return err
				}
				return kernels.CopyRange(b, a.results, ps.resultsAt+l.coupledLP, a.next.Slice(a.nextLP, words))
			})
		}
	case ps.treeLevel:
		steps = append(steps, h.readSteps(a.x, ps.rows, topN, true, ps)...)
	case ps.out == nil && ps.last:
		steps = append(steps, h.readSteps(a.hid, n, topN, topN > 0, ps)...)
	}
	return steps
}

// gather is a step of GatherRows: n rows of words words from src into dst
// by the pairs of region (nothing for n = 0).
func (h *Head) gather(dst, src *gpu.Buffer, region uint64, n, words int) step {
	return h.gatherFrom(nil, dst, src, region, n, words)
}

// gatherFrom is gather by the pairs of region of pairs (nil: the
// activations').
func (h *Head) gatherFrom(pairs, dst, src *gpu.Buffer, region uint64, n, words int) step {
	if pairs == nil {
		pairs = h.act.pairs
	}
	return func(b *gpu.Batch) error {
		if n == 0 {
			return nil
		}
		return kernels.GatherRows(b, dst, src, pairs.Slice(region, uint64(n*kernels.GatherPairWords)*4), n, words)
	}
}

// readSteps records the read-out of n rows of outputs before norm, those
// of src the read region's pairs name (x's first n rows in place where
// ps.readX): logits = lm_head(norm(output)) over the draft vocabulary, and
// through sample.wgsl (sample, greedy) or argmax.wgsl each row's argmax —
// a draft token, or with ps.mapped the target's —, log-probability and,
// with sample, its log-sum-exp and topN most likely tokens.
func (h *Head) readSteps(src *gpu.Buffer, n, topN int, sample bool, ps *headPass) []step {
	a, w, c := h.act, h.w, &h.cfg
	H, Vd, eps := c.HiddenSize, c.DraftVocabSize, c.RMSNormEps
	var steps []step
	rows := a.x
	if !ps.readX {
		rows = a.hLast
		steps = append(steps, h.gatherFrom(ps.pairs, a.hLast, src, a.regions.read, n, H))
	}
	logits := func(b *gpu.Batch) error { return kernels.MatMulNorm(b, a.logits, rows, w.norm, w.lmHead, n, eps) }
	if ps.propose {
		return append(append(steps, logits), h.proposeSteps(ps, n, topN)...)
	}
	return append(steps, logits,
		func(b *gpu.Batch) error {
			if sample {
				if err := kernels.Sample(b, a.sampled, a.top, a.next, a.lp(), a.logits, a.draws, a.temps, n, Vd, topN); err != nil {
					return err
				}
				if !ps.mapped {
					return nil
				}
				// A mapped chain that lists top tokens (its drafts coupled):
				// sample.wgsl lists them, argmax.wgsl writes the drafts.
			}
			switch {
			case ps.mapped && ps.readIDs.Buf != nil:
				return kernels.ArgmaxOfCoupled(b, ps.readIDs, ps.readLP, a.logits, w.targetIDs, ps.keys, n, Vd, lseAt(n))
			case ps.mapped:
				return kernels.ArgmaxOfCoupled(b, a.next.All(), a.lp(), a.logits, w.targetIDs, ps.keys, n, Vd, lseAt(n))
			}
			return kernels.Argmax(b, a.next.All(), a.lp(), a.logits, n, Vd, lseAt(n))
		},
	)
}

// readOut reads a step's read-out back: each feed's row — the argmax (the
// lowest draft token of a tie, as a target token), its log-softmax over
// the draft vocabulary and its TopN most likely tokens (at most the draft
// vocabulary's); the log-sum-exp where the pass lists top tokens.
func (h *Head) readOut(feeds []headFeed, topN int) ([][]engine.VerifyRow, error) {
	a, n := h.act, len(feeds)
	out := make([][]engine.VerifyRow, n)
	if topN == 0 {
		raw, err := gpu.ReadRanges(a.next.Slice(0, uint64(n)*4), a.next.Slice(a.nextLP, uint64(n)*4))
		if err != nil {
			return nil, fmt.Errorf("read back: %w", err)
		}
		ids, lps := u32s(raw[0]), u32s(raw[1])
		for i := range feeds {
			if ids[i] == kernels.ArgmaxNaN || int(ids[i]) >= len(h.tokens) {
				return nil, fmt.Errorf("batch entry %d: %w", i, sampling.ErrNaN)
			}
			out[i] = []engine.VerifyRow{{Row: sampling.Row{Argmax: int(h.tokens[ids[i]]), ArgmaxLogprob: math.Float32frombits(lps[i])}}}
		}
		return out, nil
	}
	raw, err := gpu.ReadRanges(a.sampled.Slice(0, uint64(n*kernels.SampleWords)*4), a.top.Slice(0, uint64(n*topN*2)*4))
	if err != nil {
		return nil, fmt.Errorf("read back: %w", err)
	}
	words, top := u32s(raw[0]), u32s(raw[1])
	for i, f := range feeds {
		r, err := h.sampledRow(words, top, i, topN, f.topN, false)
		if err != nil {
			return nil, fmt.Errorf("batch entry %d: %w", i, err)
		}
		out[i] = []engine.VerifyRow{r}
	}
	return out, nil
}

// readVerify reads a Verify's results back (one read) and returns each
// feed's rows read out.
func (h *Head) readVerify(feeds []headFeed, passes []headPass, l verifyLayout) ([][]engine.VerifyRow, error) {
	raw, err := h.act.results.Read(0, uint64(len(passes))*l.stride)
	if err != nil {
		return nil, fmt.Errorf("read back: %w", err)
	}
	words := u32s(raw)
	out := make([][]engine.VerifyRow, len(feeds))
	for i, f := range feeds {
		out[i] = make([]engine.VerifyRow, f.read)
	}
	for _, ps := range passes {
		at := ps.resultsAt / 4
		sampled, top, drawn := words[at:], words[at+l.topAt/4:], words[at+l.drawnAt/4:]
		for k, rd := range ps.reads {
			f := &feeds[rd.feed]
			r, err := h.sampledRow(sampled, top, k, l.topN, f.topN, ps.propose)
			if err == nil && ps.propose {
				err = h.readProposals(f, rd.j, &r, drawn, k)
			}
			if err == nil && f.draws != nil {
				err = h.coupledRow(&r, words[at+l.coupledAt/4+uint64(k)], words[at+l.coupledLP/4+uint64(k)])
			}
			if err != nil {
				return nil, fmt.Errorf("batch entry %d row %d: %w", rd.feed, rd.j, err)
			}
			out[rd.feed][rd.j] = r
		}
	}
	return out, nil
}

// coupledRow sets a Verify row's coupled draw from argmax.wgsl's words:
// the target token id and its log-probability.
func (h *Head) coupledRow(r *engine.VerifyRow, id, lp uint32) error {
	if id == kernels.ArgmaxNaN || int(id) >= h.engCfg.VocabSize {
		return sampling.ErrNaN
	}
	r.Sample, r.SampleLogprob = int(id), math.Float32frombits(lp)
	return nil
}

// sampledRow decodes read-out row k of sample.wgsl's words and top tokens
// (topN a row) as a head's row in the target's vocabulary: the argmax,
// its log-probability, the log-sum-exp and the first n top tokens (the
// numbers cpu.Head gives). Their tokens are draft tokens, or with
// scattered the target's (a proposing pass's rows, read out over the
// vocabulary).
func (h *Head) sampledRow(words, top []uint32, k, topN, n int, scattered bool) (engine.VerifyRow, error) {
	row, err := kernels.SampleRow(words[k*kernels.SampleWords:])
	if err != nil {
		return engine.VerifyRow{}, err
	}
	token := func(t int) int {
		if scattered {
			return t
		}
		return int(h.tokens[t])
	}
	limit := len(h.tokens)
	if scattered {
		limit = h.engCfg.VocabSize
	}
	if row.Argmax < 0 || row.Argmax >= limit {
		return engine.VerifyRow{}, sampling.ErrNaN
	}
	r := engine.VerifyRow{Row: sampling.Row{Argmax: token(row.Argmax), LogSumExp: row.LogSumExp,
		ArgmaxLogprob: row.ArgmaxLogprob, Threshold: float32(math.Inf(-1))}}
	if n = min(n, topN); n > 0 {
		r.Top = kernels.SampleTop(top[k*topN*2:], n)
		for j := range r.Top {
			r.Top[j].Token = token(r.Top[j].Token)
		}
	}
	return r, nil
}
