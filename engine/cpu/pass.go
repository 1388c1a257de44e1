package cpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"webdraft/engine"
	"webdraft/engine/cpu/ops"
	"webdraft/internal/parallel"
	"webdraft/sampling"
	"webdraft/treemask"
)

// feed is one entry of a pass: the tokens appended to its sequence, and
// what is read out.
type feed struct {
	seq     engine.Sequence
	tokens  []int
	parents []int // treemask placement; nil: the line
	read    readout
}

// readout says what a pass reads out of one entry: its last rows, with
// their topN most likely tokens, chosen by params with draws (one a row;
// unused when greedy).
type readout struct {
	rows, topN int
	params     sampling.Params
	draws      []sampling.Draw
	sampled    *engine.VerifyEntry // an entry with sampled proposals or their tree; nil: none
}

// segment locates an entry's rows in the pass: rows r0 … r0+T-1 are its
// positions P … P+T-1.
type segment struct {
	seq      *sequence
	r0, T, P int
	rows     []treemask.Row // each token's position and the slots it reads
}

// pass holds a forward pass's buffers, kept from pass to pass so that a
// step allocates only when a batch outgrows them. R is the pass's rows
// (every entry's new tokens), n the rows read out; H hidden_size, D
// head_dim, I intermediate_size. Inputs of a matrix product are
// ops.Inputs, prepared once for the matrices that read them.
type pass struct {
	e    *Engine
	segs []segment
	R    int
	// per row r of the pass: its segment, the cache slot it writes, and
	// the slots its attention reads
	rowSeg  []int32
	rowSlot []int32
	rowMask []ops.Mask

	x         []float32   // (R, H) the residual stream, hidden_states
	normed    *ops.Input  // (R, H): a normed hidden, the input of q, k, v and gate, up
	attnIn    *ops.Input  // (R, qDim): the attention output, o_proj's input
	q         []float32   // (R, qDim) queries, then normed and rotated in place
	k, v      []float32   // (R, kvDim) new keys and values before the cache
	attn      []float32   // (R, qDim) attention output, natural order
	gate, up  []float32   // (R, I) MLP projections
	mlp       *ops.Input  // (R, I): SiLU(gate)·up, down_proj's input
	cos, sin  []float32   // (R, D/2) RoPE at each row's position
	read      []int32     // (n) the rows read out, in entry order
	headIn    *ops.Input  // (n, H): norm(hidden) of the rows read out
	logits    []float32   // (n, head rows)
	partials  []partial   // (workers, n) each worker's share of a row's read-out
	sums      []float32   // (workers, n) each worker's Σ exp(logit − the row's max)
	tops      topTokens   // the rows' most likely tokens, by worker
	screened  bool        // the read-out screens the head (screenHead)
	bound     []float64   // (n) each read-out row's screening bound (ops.Linear.ScreenBound)
	cuts      [][]topCand // (workers, n) worker w's best screened logits of row i, best first
	workers   []scratch
	attnScale float32
	headRows  int
	sampler   sampler // the sampled read-out's rows and scratch
}

// scratch is one worker's own memory.
type scratch struct {
	mm     []float32 // a matrix product's row-at-a-time scratch
	row    []float32 // one row of up to max(H, qDim, I)
	scores []float32 // attention scores, one per position attended to
	blocks []int     // the head's 16-row blocks a screened read-out computes exactly
	best   []float32 // a screened row's best logits over every worker's chunk
}

// partial is a worker's part of a row's read-out: over its chunk of the
// head's rows, the largest logit and where.
type partial struct {
	max  float32
	at   int
	nan  bool
	none bool // an empty chunk
}

func (p *pass) init(e *Engine) {
	c := &e.cfg
	p.e = e
	p.attnScale = float32(1 / math.Sqrt(float64(c.HeadDim)))
	p.headRows = e.head.Rows
	mm := e.head.ScratchLen()
	wide := max(c.HiddenSize, c.QDim(), c.IntermediateSize)
	var normedBy, attnBy, mlpBy []*ops.Linear
	for _, l := range e.layers {
		for _, m := range []*ops.Linear{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} {
			mm = max(mm, m.ScratchLen())
		}
		normedBy = append(normedBy, l.q, l.k, l.v, l.gate, l.up)
		attnBy, mlpBy = append(attnBy, l.o), append(mlpBy, l.down)
	}
	p.normed, p.attnIn, p.mlp = ops.NewInput(normedBy...), ops.NewInput(attnBy...), ops.NewInput(mlpBy...)
	p.headIn = ops.NewInput(e.head)
	p.sampler = newSampler(e.pool, e.tokens, c.VocabSize, p.headRows)
	p.workers = make([]scratch, e.pool.Workers())
	for i := range p.workers {
		p.workers[i] = scratch{mm: make([]float32, mm), row: make([]float32, wide)}
	}
}

// grow returns buf with length n, reallocated only when too short.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n, n+n/4)
	}
	return buf[:n]
}

// forward appends each entry's tokens to its sequence, runs the pass, and
// reads out each entry's last rows. Nothing changes when the batch is
// refused.
func (e *Engine) forward(ctx context.Context, feeds []feed) ([][]engine.VerifyRow, error) {
	ss, err := e.sequences(feeds)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := &e.cfg
	H, qDim, kvDim, I, half := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.HeadDim/2
	p := &e.pass
	p.segs = p.segs[:0]
	R, n := 0, 0
	for i, s := range ss {
		T := len(feeds[i].tokens)
		rows, err := s.tree.Place(s.len, T, feeds[i].parents)
		if err != nil {
			return nil, fmt.Errorf("cpu engine: batch entry %d: %w", i, err)
		}
		p.segs = append(p.segs, segment{seq: s, r0: R, T: T, P: s.len, rows: rows})
		R += T
		n += feeds[i].read.rows
	}
	p.R = R
	p.rowSeg, p.rowSlot, p.rowMask = grow(p.rowSeg, R), grow(p.rowSlot, R), grow(p.rowMask, R)
	p.x = grow(p.x, R*H)
	p.normed.Resize(R, H)
	p.attnIn.Resize(R, qDim)
	p.mlp.Resize(R, I)
	p.q, p.attn = grow(p.q, R*qDim), grow(p.attn, R*qDim)
	p.k, p.v = grow(p.k, R*kvDim), grow(p.v, R*kvDim)
	p.gate, p.up = grow(p.gate, R*I), grow(p.up, R*I)
	p.cos, p.sin = grow(p.cos, R*half), grow(p.sin, R*half)
	p.read = grow(p.read, n)[:0]
	p.headIn.Resize(n, H)
	p.logits = grow(p.logits, n*p.headRows)
	p.partials, p.sums = grow(p.partials, len(p.workers)*n), grow(p.sums, len(p.workers)*n)
	p.tops.size(n, len(p.workers))
	p.screened = e.screen && n >= screenRows
	for _, f := range feeds {
		p.screened = p.screened && f.read.params.Greedy() && f.read.sampled == nil && f.read.draws == nil
	}
	if p.screened {
		p.bound, p.cuts = grow(p.bound, n), grow(p.cuts, len(p.workers)*n)
	}
	longest := 0
	for i, sg := range p.segs {
		for t := range sg.T {
			r := sg.r0 + t
			row := sg.rows[t]
			p.rowSeg[r], p.rowSlot[r], p.rowMask[r] = int32(i), int32(sg.P+t), ops.Mask{Base: row.Base, Bits: row.Mask}
			// hidden = embed_tokens(input_ids); cos, sin = rotary_emb(positions)
			e.embed.Row(feeds[i].tokens[t], p.x[r*H:(r+1)*H])
			ops.RopeAngles(p.cos[r*half:(r+1)*half], p.sin[r*half:(r+1)*half], row.Pos, e.invFreq)
		}
		for r := sg.r0 + sg.T - feeds[i].read.rows; r < sg.r0+sg.T; r++ {
			p.tops.want[len(p.read)] = feeds[i].read.topN
			p.read = append(p.read, int32(r))
		}
		sg.seq.reserve(sg.T, kvDim)
		longest = max(longest, sg.P+sg.T)
	}
	for i := range p.workers {
		p.workers[i].scores = grow(p.workers[i].scores, longest)
	}

	e.pool.Run(p.run)

	for _, sg := range p.segs {
		sg.seq.tree.Commit(sg.P, sg.rows)
		sg.seq.len += sg.T
	}
	rows, err := p.readOut(feeds)
	p.trim()
	return rows, err
}

// keepRows and keepReads bound the buffers a pass keeps for the next:
// those of a larger pass (a long prefill, a wide batch of verifications)
// go to the collector after it, so that the engine holds what its usual
// passes need rather than the largest it ever ran.
const keepRows, keepReads = 256, 16

// trim drops the buffers sized past keepRows rows or keepReads rows read
// out.
func (p *pass) trim() {
	c := &p.e.cfg
	if cap(p.x) > keepRows*c.HiddenSize {
		p.x, p.q, p.attn, p.k, p.v = nil, nil, nil, nil, nil
		p.gate, p.up, p.cos, p.sin, p.rowSeg, p.rowSlot, p.rowMask = nil, nil, nil, nil, nil, nil, nil
		p.normed.Trim(keepRows)
		p.attnIn.Trim(keepRows)
		p.mlp.Trim(keepRows)
	}
	if cap(p.logits) > keepReads*p.headRows {
		p.logits, p.read, p.partials, p.sums, p.tops = nil, nil, nil, nil, topTokens{}
		p.bound, p.cuts = nil, nil
		p.headIn.Trim(keepReads)
	}
	p.sampler.trim()
	for i := range p.workers {
		if cap(p.workers[i].scores) > 1<<16 {
			p.workers[i].scores = nil
		}
	}
}

// run is one worker's part of the pass (Pool.Run): the decoder layers,
// the final norm and head over the rows read out, and the read-out's
// reductions, phase by phase.
func (p *pass) run(w int) {
	e, c := p.e, &p.e.cfg
	H, qDim, kvDim, I, D := c.HiddenSize, c.QDim(), c.KVDim(), c.IntermediateSize, c.HeadDim
	heads, kvHeads, half := c.NumAttentionHeads, c.NumKeyValueHeads, D/2
	pool, ws, R := e.pool, &p.workers[w], p.R
	eps := c.RMSNormEps

	for l := range e.layers {
		L := &e.layers[l]
		// residual = hidden; h = input_layernorm(hidden): (R, H), blocked.
		// A layer whose input the sequences keep (Options.FeatureLayers):
		// hidden into each row's slot of its sequence's features.
		lo, hi := pool.Split(R, w)
		if a := e.featureAt[l]; a >= 0 {
			for r := lo; r < hi; r++ {
				f := p.segs[p.rowSeg[r]].seq.features(int(p.rowSlot[r]))
				copy(f[a*H:(a+1)*H], p.x[r*H:(r+1)*H])
			}
		}
		for r := lo; r < hi; r++ {
			ops.RMSNorm(ws.row, p.x[r*H:(r+1)*H], L.inputNorm, eps)
			p.normed.Set(r, ws.row)
		}
		pool.Barrier()
		// q, k, v = q_proj(h), k_proj(h), v_proj(h): their rows split as one
		lo, hi = splitRows(pool, qDim+2*kvDim, w)
		project(lo, hi, p.normed, ws.mm, L.q, p.q, L.k, p.k, L.v, p.v)
		pool.Barrier()
		// q_norm, k_norm over each head (head_dim only), RoPE at each
		// row's position; the new keys and values into the cache.
		lo, hi = pool.Split(R*(heads+kvHeads), w)
		for i := lo; i < hi; i++ {
			r, h := i/(heads+kvHeads), i%(heads+kvHeads)
			cos, sin := p.cos[r*half:(r+1)*half], p.sin[r*half:(r+1)*half]
			if h < heads {
				qh := p.q[r*qDim+h*D : r*qDim+(h+1)*D]
				ops.RMSNorm(qh, qh, L.qNorm, eps)
				ops.Rope(qh, cos, sin)
				continue
			}
			h -= heads
			kh := p.k[r*kvDim+h*D : r*kvDim+(h+1)*D]
			ops.RMSNorm(kh, kh, L.kNorm, eps)
			ops.Rope(kh, cos, sin)
			seq, at := p.segs[p.rowSeg[r]].seq, int(p.rowSlot[r])*kvDim+h*D
			copy(seq.k[l][at:at+D], kh)
			copy(seq.v[l][at:at+D], p.v[r*kvDim+h*D:r*kvDim+(h+1)*D])
		}
		pool.Barrier()
		// attn = softmax(q·kᵀ/√D + causal mask)·v, GQA: (R, heads·D)
		lo, hi = pool.Split(R*heads, w)
		for i := lo; i < hi; i++ {
			r, h := i/heads, i%heads
			p.attend(ws, l, r, h)
		}
		pool.Barrier()
		lo, hi = pool.Split(R, w)
		for r := lo; r < hi; r++ {
			p.attnIn.Set(r, p.attn[r*qDim:(r+1)*qDim])
		}
		pool.Barrier()
		// hidden = residual + o_proj(attn)
		lo, hi = splitRows(pool, H, w)
		L.o.MulRows(p.x, H, p.attnIn, lo, hi, true, ws.mm)
		pool.Barrier()
		mlpBlock(pool, w, ws, mlpBuffers{p.x, p.normed, p.gate, p.up, p.mlp}, R, H, I, L.postNorm, eps, L.gate, L.up, L.down)
		pool.Barrier()
	}

	// hidden = norm(hidden) at the rows read out; logits = lm_head(hidden)
	n := len(p.read)
	lo, hi := pool.Split(n, w)
	for i := lo; i < hi; i++ {
		r := int(p.read[i])
		ops.RMSNorm(ws.row, p.x[r*H:(r+1)*H], e.norm, eps)
		p.headIn.Set(i, ws.row)
		if p.screened {
			p.bound[i] = e.head.ScreenBound(p.headIn, i)
		}
	}
	pool.Barrier()
	lo, hi = splitRows(pool, p.headRows, w)
	if p.screened && !slices.ContainsFunc(p.bound[:n], func(b float64) bool { return math.IsInf(b, 1) }) {
		p.screenHead(w, lo, hi, ws)
	} else {
		e.head.MulRows(p.logits, p.headRows, p.headIn, lo, hi, false, ws.mm)
	}
	pool.Barrier()
	// Each row's largest logit and Σ exp(logit − max), over every worker's
	// chunk of the head's rows: the argmax and the log-sum-exp.
	reduceChunk(pool, w, n, p.headRows, lo, hi, p.logits, p.partials, p.sums)
	p.tops.scan(w, p.headRows, lo, hi, p.logits, e.tokens)
}

// screenRows is the fewest rows a read-out screens: one row's product
// is as fast exactly (the weights' reading bounds it), and screening
// adds its scans.
const screenRows = 2

// screenHead is worker w's part of a screened read-out over its chunk
// [lo, hi) of the head's rows: every logit screened (ops.Linear.Screen,
// within bound[i] of its exact value for read-out row i), then computed
// exactly wherever the bound lets it reach the row's k largest exact
// logits — the argmax (k = 1) or the top tokens asked for. With a_k the
// row's k-th largest screened logit, the k largest exact logits are each
// at least a_k − bound (k screened logits are at least a_k), so every one
// of them is screened at a_k − 2·bound or more; a logit screened below
// that is below each of them exactly. So the head's 16-row blocks holding
// a logit at or above a_k − 2·bound are computed exactly (all rows read
// out at once), and the read-out's argmax and top tokens over the result
// are the exact ones, ties included.
func (p *pass) screenHead(w, lo, hi int, ws *scratch) {
	e, W, n := p.e, p.headRows, len(p.read)
	e.head.Screen(p.logits, W, p.headIn, lo, hi)
	mine := p.cuts[w*n : (w+1)*n]
	for i := range mine {
		mine[i] = bestOf(p.logits[i*W+lo:i*W+hi], lo, max(1, p.tops.want[i]), nil, mine[i][:0])
	}
	e.pool.Barrier()
	blocks := ws.blocks[:0]
	for i := range n {
		at, ok := p.screenCut(i, ws)
		if !ok { // no cut to trust (a NaN, or fewer logits than asked for): all exactly
			e.head.MulRows(p.logits, W, p.headIn, lo, hi, false, ws.mm)
			return
		}
		row := p.logits[i*W : (i+1)*W]
		for j := lo; j < hi; j = min((j/16+1)*16, hi) {
			if j += ops.FirstAtLeast(row[j:hi], at); j == hi {
				break
			}
			blocks = append(blocks, j/16)
		}
	}
	slices.Sort(blocks)
	blocks = slices.Compact(blocks)
	for k := 0; k < len(blocks); {
		first := blocks[k]
		for k++; k < len(blocks) && blocks[k] == blocks[k-1]+1; k++ {
		}
		e.head.MulRows(p.logits, W, p.headIn, max(16*first, lo), min(16*(blocks[k-1]+1), hi), false, ws.mm)
	}
	ws.blocks = blocks
}

// screenCut is the screened logit at and above which read-out row i's
// logits are computed exactly (cutBelow over every worker's best of the
// row, gathered in the worker's scratch ws), and whether there is one.
func (p *pass) screenCut(i int, ws *scratch) (float32, bool) {
	n := len(p.read)
	ws.best = ws.best[:0]
	for w := range p.workers {
		for _, c := range p.cuts[w*n+i] {
			ws.best = append(ws.best, c.v)
		}
	}
	return cutBelow(ws.best, max(1, p.tops.want[i]), p.bound[i])
}

// cutBelow is a_k − 2·bound rounded down to an f32, a_k the k-th largest
// of best (screened logits, sorted in place), and whether it is a number:
// not where best holds fewer than k, or a NaN.
func cutBelow(best []float32, k int, bound float64) (float32, bool) {
	if len(best) < k {
		return 0, false
	}
	slices.SortFunc(best, func(a, b float32) int { return cmp.Compare(b, a) })
	cut := float64(best[k-1]) - 2*bound
	at := float32(cut)
	if float64(at) > cut {
		at = math.Nextafter32(at, float32(math.Inf(-1)))
	}
	return at, !math.IsNaN(cut) && !math.IsInf(cut, 0)
}

// reduceChunk is worker w's part of a read-out's reductions, over its
// chunk [lo, hi) of the width-wide logits of n rows: each row's largest
// logit and where (parts), then, the workers met, Σ exp(logit − the row's
// max over every chunk) (sums). An all −∞ row is left for the read-out
// to refuse.
func reduceChunk(pool *parallel.Pool, w, n, width, lo, hi int, logits []float32, parts []partial, sums []float32) {
	mine := parts[w*n : (w+1)*n]
	for i := range mine {
		row := logits[i*width+lo : i*width+hi]
		if len(row) == 0 {
			mine[i] = partial{none: true}
			continue
		}
		m, at, nan := ops.Max(row)
		mine[i] = partial{max: m, at: lo + at, nan: nan}
	}
	pool.Barrier()
	own := sums[w*n : (w+1)*n]
	for i := range mine {
		own[i] = 0
		if mine[i].none || mine[i].nan {
			continue
		}
		m := rowMax(parts, pool.Workers(), n, i)
		if math.IsInf(float64(m), -1) {
			continue
		}
		own[i] = ops.ExpSumFrom(logits[i*width+lo:i*width+hi], m)
	}
}

// rowMax is row i's largest logit over every worker's chunk (parts of n
// rows a worker).
func rowMax(parts []partial, workers, n, i int) float32 {
	m := float32(math.Inf(-1))
	for w := range workers {
		if q := parts[w*n+i]; !q.none {
			m = max(m, q.max)
		}
	}
	return m
}

// rowMax is read row i's largest logit over every worker's chunk.
func (p *pass) rowMax(i int) float32 { return rowMax(p.partials, len(p.workers), len(p.read), i) }

// attend computes row r's attention output for query head h over the
// slots of its sequence it reads: those up to its own that its mask keeps
// (all of them for a line token).
func (p *pass) attend(ws *scratch, l, r, h int) {
	c := &p.e.cfg
	D, qDim, kvDim := c.HeadDim, c.QDim(), c.KVDim()
	seq := p.segs[p.rowSeg[r]].seq
	n := int(p.rowSlot[r]) + 1
	qh := p.q[r*qDim+h*D : r*qDim+(h+1)*D]
	kv := (h / c.GroupSize()) * D
	out := p.attn[r*qDim+h*D : r*qDim+(h+1)*D]
	ops.Attend(out, qh, seq.k[l][kv:], seq.v[l][kv:], kvDim, n, p.attnScale, ws.scores, p.rowMask[r])
}

// splitRows is worker w's share of n weight rows, in whole blocks of 16
// rows (the fixed-point kernel's) but for the last.
func splitRows(pool *parallel.Pool, n, w int) (lo, hi int) {
	lo, hi = pool.Split((n+15)/16, w)
	return min(16*lo, n), min(16*hi, n)
}

// project computes rows [lo, hi) of the matrices ms stacked (q, k, v as
// one matrix): each matrix's share into its own output.
func project(lo, hi int, in *ops.Input, mm []float32, pairs ...any) {
	base := 0
	for i := 0; i < len(pairs); i += 2 {
		m, out := pairs[i].(*ops.Linear), pairs[i+1].([]float32)
		a, b := max(lo-base, 0), min(hi-base, m.Rows)
		m.MulRows(out, m.Rows, in, a, b, false, mm)
		base += m.Rows
	}
}

// errNoLogit: every logit of a read-out row is −Inf.
var errNoLogit = errors.New("every logit is −Inf")

// reduceRow merges the workers' partial reductions of read-out row k (of
// n): the largest logit, where (the first of a tie), and the log-sum-exp.
func reduceRow(parts []partial, sums []float32, workers, n, k int) (best float32, at int, lse float32, err error) {
	best, at = float32(math.Inf(-1)), -1
	var sum float32
	for w := range workers {
		q := parts[w*n+k]
		if q.none {
			continue
		}
		if q.nan {
			return 0, 0, 0, sampling.ErrNaN
		}
		if q.max > best || at < 0 {
			best, at = q.max, q.at
		}
		sum += sums[w*n+k]
	}
	if math.IsInf(float64(best), -1) {
		return 0, 0, 0, errNoLogit
	}
	return best, at, best + float32(math.Log(float64(sum))), nil
}

// mlpBuffers are a pass's buffers for the MLP block: x (R, H), the
// residual stream, to which the block adds; normed (R, H); gate and up
// (R, I); mlp (R, I), down_proj's input.
type mlpBuffers struct {
	x        []float32
	normed   *ops.Input
	gate, up []float32
	mlp      *ops.Input
}

// mlpBlock is worker w's part of a decoder layer's MLP block over R rows
// (the Qwen3 layer's and the EAGLE-3 head's): residual = x;
// x = residual + down_proj(SiLU(gate_proj(h))·up_proj(h)), h =
// post_attention_layernorm(x). It meets the other workers at barriers
// between its phases, not after the last.
func mlpBlock(pool *parallel.Pool, w int, ws *scratch, b mlpBuffers, R, H, I int, postNorm []float32, eps float64, gate, up, down *ops.Linear) {
	lo, hi := pool.Split(R, w)
	for r := lo; r < hi; r++ {
		ops.RMSNorm(ws.row[:H], b.x[r*H:(r+1)*H], postNorm, eps)
		b.normed.Set(r, ws.row[:H])
	}
	pool.Barrier()
	// m = SiLU(gate_proj(h))·up_proj(h): this worker's columns of m, in
	// place of gate.
	lo, hi = splitRows(pool, I, w)
	gate.MulRows(b.gate, I, b.normed, lo, hi, false, ws.mm)
	up.MulRows(b.up, I, b.normed, lo, hi, false, ws.mm)
	for r := range R {
		ops.SiLUMul(b.gate[r*I+lo:r*I+hi], b.up[r*I+lo:r*I+hi])
	}
	pool.Barrier()
	lo, hi = pool.Split(R, w)
	for r := lo; r < hi; r++ {
		b.mlp.Set(r, b.gate[r*I:(r+1)*I])
	}
	pool.Barrier()
	lo, hi = splitRows(pool, H, w)
	down.MulRows(b.x, H, b.mlp, lo, hi, true, ws.mm)
}

// readOut turns the workers' partial reductions into each entry's rows:
// the argmax and log-sum-exp always; a sampled row's draw, proposals or
// tree walk by the sampler (sample.go); the most likely tokens where
// asked.
func (p *pass) readOut(feeds []feed) ([][]engine.VerifyRow, error) {
	e := p.e
	n := len(p.read)
	out := make([][]engine.VerifyRow, len(feeds))
	i := 0
	for en, f := range feeds {
		rd := f.read
		out[en] = make([]engine.VerifyRow, rd.rows)
		i0 := i
		for j := range rd.rows {
			best, at, lse, err := reduceRow(p.partials, p.sums, len(p.workers), n, i)
			if err != nil {
				return nil, fmt.Errorf("cpu engine: batch entry %d row %d: %w", en, j, err)
			}
			out[en][j].Row = sampling.Row{Argmax: e.token(at), LogSumExp: lse, ArgmaxLogprob: best - lse, Threshold: float32(math.Inf(-1))}
			if rd.topN > 0 {
				out[en][j].Top = p.tops.merge(i, len(p.workers), lse)
			}
			i++
		}
		if err := p.sampled(rd, out[en], i0); err != nil {
			return nil, fmt.Errorf("cpu engine: batch entry %d: %w", en, err)
		}
	}
	return out, nil
}

// logitRow is read-out row i's logits, over the head's rows.
func (p *pass) logitRow(i int) []float32 {
	return p.logits[i*p.headRows : (i+1)*p.headRows]
}

// sampled reads out an entry's sampled rows — rows (its greedy read-out,
// from read-out row i0 on) get their draws, proposals or tree walk:
// package sampling's rule, computed by the sampler.
func (p *pass) sampled(rd readout, rows []engine.VerifyRow, i0 int) error {
	if rd.params.Greedy() {
		return nil
	}
	s := &p.sampler
	row := func(j int) (logits []float32, max, lse float32) {
		return p.logitRow(i0 + j), p.rowMax(i0 + j), rows[j].LogSumExp
	}
	add := func(j int) *dist {
		l, m, lse := row(j)
		return s.add(l, m, lse, rd.params, len(rows))
	}
	s.reset()
	switch v := rd.sampled; {
	case rd.draws != nil:
		ds := make([]*dist, len(rows))
		for j := range rows {
			ds[j] = add(j)
		}
		if coupledOnly(rd.draws) && !ds[0].nucleus() {
			for _, d := range ds {
				d.lambda, d.theta = float32(math.Inf(-1)), float32(math.Inf(-1))
			}
		} else {
			s.prepare(ds...)
		}
		for j, d := range ds {
			s.choose(d, rd.draws[j], &rows[j].Row)
		}
	case v != nil && v.Propose != nil:
		v.Rows = rows
		var ds []*dist
		for j, us := range v.Propose {
			if len(us) > 0 {
				ds = append(ds, add(j))
			}
		}
		s.prepare(ds...)
		for j, us := range v.Propose {
			if len(us) > 0 {
				s.propose(ds[0], us, &rows[j])
				ds = ds[1:]
			}
		}
	case v != nil && v.Tree != nil:
		v.Rows = rows
		return s.walk(v, row)
	}
	return nil
}

// token is the vocabulary token of head row i.
func (e *Engine) token(i int) int { return tokenOf(e.tokens, i) }

// tokenOf is the vocabulary token of row i of a head over tokens
// (ascending; nil: row i is token i).
func tokenOf(tokens []int32, i int) int {
	if tokens != nil {
		return int(tokens[i])
	}
	return i
}

// topTokens is a read-out's most likely tokens, found by the workers each
// over its chunk of every row that asks for them (scan) and merged by the
// read-out (merge): the read-out's serial part stays microseconds long,
// so that the pool's helpers do not park between passes.
type topTokens struct {
	want  []int       // (n) how many row i asks for; 0: none
	cands [][]topCand // (workers, n) worker w's best of its chunk of row i, best first
}

// topCand is a logit and its token.
type topCand struct {
	v   float32
	tok int
}

// better orders candidates: the larger logit, the lower token on ties
// (sampling.Top's order).
func (a topCand) better(b topCand) bool { return a.v > b.v || a.v == b.v && a.tok < b.tok }

// size readies t for n rows read out by workers, none asking yet.
func (t *topTokens) size(n, workers int) {
	t.want = grow(t.want, n)
	clear(t.want)
	t.cands = grow(t.cands, workers*n)
}

// scan is worker w's part: the best of its chunk [lo, hi) of each row of
// the width-wide logits that asks for top tokens, over a head's tokens
// (tokenOf).
func (t *topTokens) scan(w, width, lo, hi int, logits []float32, tokens []int32) {
	n := len(t.want)
	for i, k := range t.want {
		if k > 0 {
			t.cands[w*n+i] = bestOf(logits[i*width+lo:i*width+hi], lo, k, tokens, t.cands[w*n+i][:0])
		}
	}
}

// merge returns row i's top tokens over every worker's chunk, most likely
// first, as log-probabilities (lse the row's log-sum-exp).
func (t *topTokens) merge(i, workers int, lse float32) []sampling.TokenLogprob {
	n, k := len(t.want), t.want[i]
	var all []topCand
	for w := range workers {
		all = append(all, t.cands[w*n+i]...)
	}
	slices.SortFunc(all, func(a, b topCand) int {
		if a.better(b) {
			return -1
		}
		if b.better(a) {
			return 1
		}
		return 0
	})
	out := make([]sampling.TokenLogprob, min(k, len(all)))
	for j := range out {
		out[j] = sampling.TokenLogprob{Token: all[j].tok, Logprob: all[j].v - lse}
	}
	return out
}

// bestOf appends to best (empty) the n most likely of a chunk of logits
// whose first is head row from, best first, without sorting the chunk: a
// short list kept in order, which the scan (ops.FirstAtLeast) stops for
// only at a logit at least the list's last once the list is full. NaNs
// never enter it.
func bestOf(logits []float32, from, n int, tokens []int32, best []topCand) []topCand {
	for i := 0; i < len(logits); i++ {
		if len(best) == n {
			if i += ops.FirstAtLeast(logits[i:], best[n-1].v); i == len(logits) {
				break
			}
		}
		c := topCand{logits[i], tokenOf(tokens, from+i)}
		if c.v != c.v || len(best) == n && !c.better(best[n-1]) {
			continue
		}
		k := len(best)
		best = append(best, c)
		for k > 0 && c.better(best[k-1]) {
			best[k] = best[k-1]
			k--
		}
		best[k] = c
		best = best[:min(len(best), n)]
	}
	return best
}
