package cpu

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"webdraft/engine"
	"webdraft/engine/cpu/ops"
	"webdraft/internal/parallel"
	"webdraft/sampling"
)

// The sampled read-out: package sampling's rule — Choose's acceptance and
// draw, Dist and DrawDistinct for a drafter's proposals, the multi-draft
// rule for a tree of them — over the head's own rows (in token order:
// sortedHead), with the vector kernels, in f32 as sample.wgsl computes it
// where sampling sums in float64. For a row at temperature T and nucleus
// top_p:
//
//	e_j    = exp((l_j − max) / T)           ops.ExpScaled, block by block
//	θ      = the largest scaled logit whose tokens at or above it hold top_p
//	         of Σ e (sampling's threshold), found as λ, the smallest logit
//	         it keeps: l_j / T ≥ θ ⇔ l_j ≥ λ, as f32 division is monotone
//	w_j    = e_j where l_j ≥ λ, else 0      the row's weights, p = w / Σ w
//
// A row is cut into blocks of sampleBlock head rows, whose weights are
// summed in f32 and the blocks' sums in float64, in row order. A draw
// (inverse CDF in token order) finds its block by those sums and then its
// token in the block; a token left out of a draw (a proposal X, tokens
// drawn before) has its block summed again without it, not subtracted (a
// difference of sums could round its neighbours away). Tokens the head
// leaves out have probability 0 and are never drawn.
//
// θ is found without sorting the row: prepare measures, beside each
// block's weights, its mass at or above a few pivots (max − T·pivots),
// which bracket the threshold's logit; the logits in the bracket are
// compacted (ops.Between) and bisected over the order of f32 bit
// patterns, each pass over fewer of them, exact to the element. Ties at
// the edge come in together, as sampling's do.

// sampleBlock is how many head rows a block of a sampled row holds.
const sampleBlock = 512

// pivots are the distances (max − l) / T at which prepare measures a
// nucleus row's mass at or above, bracketing its threshold: weights of
// e^−1 … e^−16 of the largest.
var pivots = [...]float32{1, 2, 3, 4, 6, 8, 11, 16}

// dist is one sampled row's distribution over the head's rows.
type dist struct {
	logits   []float32 // (n) the row's logits
	w        []float32 // (n) its weights; a block whose sum is 0 reads as zeros
	blocks   []float64 // (nb) Σ w over each block
	top      []float32 // (nb) each block's largest logit
	piv      []float32 // (nb, len(pivots)) each block's Σ e at or above each pivot
	max, lse float32   // the row's largest logit and its log-sum-exp (at T = 1)
	p        sampling.Params
	pivot    [len(pivots)]float32 // max − T·pivots, the logits pivots stand for
	lambda   float32              // the smallest logit the nucleus keeps
	theta    float32              // sampling.Row.Threshold: λ / T (−Inf: every token)
	mass     float64              // Σ blocks: the kept tokens' weight
}

// nucleus reports whether d keeps only part of the row.
func (d *dist) nucleus() bool { return d.p.TopP > 0 && d.p.TopP < 1 }

// weight is head row j's weight.
func (d *dist) weight(j int) float32 {
	if d.blocks[j/sampleBlock] == 0 {
		return 0
	}
	return d.w[j]
}

// slot is the memory of one row's dist, kept from pass to pass.
type slot struct {
	w, top, piv []float32
	blocks      []float64
}

// sampler is a pass's sampled read-out: its rows' dists and its scratch,
// kept from pass to pass. Rows are prepared (their weights, in parallel
// on the engine's workers) an entry at a time, or a tree's node at a
// time, as the walk comes to it.
type sampler struct {
	pool   *parallel.Pool
	tokens []int32 // head row → token, ascending; nil: row j is token j
	rowOf  []int32 // token → head row, −1 where the head leaves it out; nil: token t is row t
	vocab  int
	n, nb  int // head rows, blocks a row

	slots []slot
	dists []dist
	todo  []*dist // prepare's rows

	cx, ce []float32 // (n + 16) a nucleus's candidates: logits and weights; ce a coupled row's limits
	cands  [][]int32 // a coupled row's candidates (ops.HashBelow), a worker's part each
	res    []float32 // (n) a tree node's residual p
	resB   []float64 // (nb) its blocks' sums
	q      []float32 // (n) a node's q at the head's tokens, where q.P is not that
	drawB  []float64 // (nb) a draw's blocks' sums, the rows left out excepted
	out    []int32   // head rows a draw leaves out
	kids   []int     // a node's children's tokens
	saved  []float32 // the residual at the children removed from q
	rp     residualPass
}

func newSampler(pool *parallel.Pool, tokens []int32, vocab, n int) sampler {
	s := sampler{pool: pool, tokens: tokens, vocab: vocab, n: n, nb: (n + sampleBlock - 1) / sampleBlock}
	if tokens != nil {
		s.rowOf = make([]int32, vocab)
		for i := range s.rowOf {
			s.rowOf[i] = -1
		}
		for j, t := range tokens {
			s.rowOf[t] = int32(j)
		}
	}
	return s
}

// row is token t's head row, −1 where the head leaves it out.
func (s *sampler) row(t int) int {
	if s.rowOf == nil {
		return t
	}
	return int(s.rowOf[t])
}

// token is head row j's token.
func (s *sampler) token(j int) int {
	if s.tokens == nil {
		return j
	}
	return int(s.tokens[j])
}

// reset forgets the rows added, keeping their memory.
func (s *sampler) reset() {
	s.dists = s.dists[:0]
}

// add makes a dist of logits (a head row) under p, prepared by prepare;
// the pointer stays valid until reset, of up to rows added before it.
func (s *sampler) add(logits []float32, max, lse float32, p sampling.Params, rows int) *dist {
	k := len(s.dists)
	if k == 0 {
		s.dists = grow(s.dists, rows)[:0]
	}
	for len(s.slots) <= k {
		s.slots = append(s.slots, slot{
			w: make([]float32, s.n), top: make([]float32, s.nb),
			piv: make([]float32, s.nb*len(pivots)), blocks: make([]float64, s.nb),
		})
	}
	sl := &s.slots[k]
	s.dists = append(s.dists, dist{logits: logits, w: sl.w, blocks: sl.blocks, top: sl.top, piv: sl.piv, max: max, lse: lse, p: p})
	d := &s.dists[k]
	for i, dk := range pivots {
		d.pivot[i] = max - p.Temperature*dk
	}
	return d
}

// trim drops the memory of rows past keepReads.
func (s *sampler) trim() {
	if len(s.slots) > keepReads {
		s.slots = slices.Clip(s.slots[:keepReads])
	}
}

// prepare computes ds' weights, split by blocks across the workers, and
// then each one's nucleus.
func (s *sampler) prepare(ds ...*dist) {
	s.todo = append(s.todo[:0], ds...)
	s.pool.Run(s.weigh)
	for _, d := range ds {
		s.nucleus(d)
	}
}

// weigh is worker w's share of prepare's blocks: e = exp((l − max) / T),
// the block's sums and largest logit, and its mass at or above each
// pivot where the row has a nucleus.
func (s *sampler) weigh(w int) {
	lo, hi := s.pool.Split(len(s.todo)*s.nb, w)
	for it := lo; it < hi; it++ {
		d, b := s.todo[it/s.nb], it%s.nb
		j0, j1 := b*sampleBlock, min((b+1)*sampleBlock, s.n)
		l, e := d.logits[j0:j1], d.w[j0:j1]
		sum, top := ops.ExpScaled(e, l, d.max, d.p.Temperature)
		d.blocks[b], d.top[b] = float64(sum), top
		if !d.nucleus() {
			continue
		}
		piv := d.piv[b*len(pivots) : (b+1)*len(pivots)]
		for k, v := range d.pivot {
			piv[k] = 0
			if top >= v {
				piv[k], _ = ops.AtLeast(e, l, v)
			}
		}
	}
}

// nucleus finds d's threshold and keeps its weights there: λ, θ, the
// blocks' sums of the kept weights and their total.
func (s *sampler) nucleus(d *dist) {
	d.lambda, d.theta = float32(math.Inf(-1)), float32(math.Inf(-1))
	if d.nucleus() {
		d.lambda = s.edge(d)
		if !math.IsInf(float64(d.lambda), -1) {
			d.theta = d.lambda / d.p.Temperature
			for b := range s.nb {
				if d.blocks[b] == 0 {
					continue
				}
				if d.top[b] < d.lambda {
					d.blocks[b] = 0 // every token of the block left out
					continue
				}
				j0, j1 := b*sampleBlock, min((b+1)*sampleBlock, s.n)
				d.blocks[b] = float64(ops.KeepAtLeast(d.w[j0:j1], d.logits[j0:j1], d.lambda))
			}
		}
	}
	d.mass = 0
	for _, m := range d.blocks {
		d.mass += m
	}
}

// edge returns the smallest logit the nucleus of d keeps: the largest
// logit v of the row whose tokens at or above it hold top_p of the mass,
// lowered to the first logit whose scaled value is v's (sampling's ties,
// which the scaling can make of logits apart). The row's weights are not
// yet cut.
func (s *sampler) edge(d *dist) float32 {
	var total float64
	for _, m := range d.blocks {
		total += m
	}
	goal := float64(d.p.TopP) * total
	// The bracket [lo, hi): the first pivot whose mass reaches the goal,
	// the mass at or above hi.
	lo, hi := float32(math.Inf(-1)), float32(math.Inf(1))
	var above float64
	for k, v := range d.pivot {
		var m float64
		for b := range s.nb {
			m += float64(d.piv[b*len(pivots)+k])
		}
		if m >= goal {
			lo = v
			break
		}
		above, hi = m, v
	}
	// Its logits, compacted.
	s.cx, s.ce = grow(s.cx, s.n+16), grow(s.ce, s.n+16)
	n := 0
	for b := range s.nb {
		if d.top[b] >= lo {
			j0, j1 := b*sampleBlock, min((b+1)*sampleBlock, s.n)
			n += ops.Between(s.cx[n:], s.ce[n:], d.logits[j0:j1], d.w[j0:j1], lo, hi)
		}
	}
	cx, ce := s.cx[:n], s.ce[:n]
	// The largest key k whose logits (at or above unkey(k)) with those
	// above the bracket reach the goal. Each pass drops the candidates it
	// settles: below a threshold that reaches the goal, or at or above
	// one that does not (their mass joins above), once they are half.
	klo, khi := key(lo), key(d.max)
	if !math.IsInf(float64(hi), 1) {
		khi = key(hi) - 1
	}
	for klo < khi {
		mid := klo + (khi-klo+1)/2
		v := unkey(mid)
		m, k := massAtLeast(cx, ce, v)
		if above+m >= goal {
			klo = mid
			if 2*k <= len(cx) {
				n := ops.Between(cx, ce, cx, ce, v, float32(math.Inf(1)))
				cx, ce = cx[:n], ce[:n]
			}
			continue
		}
		khi = mid - 1
		if 2*k >= len(cx) {
			above += m
			n := ops.Between(cx, ce, cx, ce, float32(math.Inf(-1)), v)
			cx, ce = cx[:n], ce[:n]
		}
	}
	v := unkey(klo)
	if math.IsInf(float64(v), -1) {
		return v
	}
	// Lower v to the first f32 of its scaled value (a few ulps at most
	// for a temperature near 1; else the row's own logits tell).
	T := d.p.Temperature
	theta := v / T
	for range 64 {
		down := math.Nextafter32(v, float32(math.Inf(-1)))
		if down/T < theta {
			return v
		}
		v = down
	}
	for b := range s.nb {
		if d.top[b] < v {
			continue
		}
		for _, l := range d.logits[b*sampleBlock : min((b+1)*sampleBlock, s.n)] {
			if l < v && l/T >= theta {
				v = l
			}
		}
	}
	return v
}

// massAtLeast is Σ e over the x at or above v, in float64 across chunks,
// and how many there are.
func massAtLeast(x, e []float32, v float32) (float64, int) {
	var sum float64
	n := 0
	for i := 0; i < len(x); i += sampleBlock {
		m, k := ops.AtLeast(e[i:min(i+sampleBlock, len(x))], x[i:min(i+sampleBlock, len(x))], v)
		sum, n = sum+float64(m), n+k
	}
	return sum, n
}

// key maps an f32 to a uint32 of the same order (negative values
// reversed), as sample.wgsl's key; unkey is its inverse.
func key(x float32) uint32 {
	b := math.Float32bits(x)
	if b&(1<<31) != 0 {
		return ^b
	}
	return b | 1<<31
}

func unkey(k uint32) float32 {
	if k&(1<<31) != 0 {
		return math.Float32frombits(k &^ (1 << 31))
	}
	return math.Float32frombits(^k)
}

// A drawer draws head rows from a row's weights by the inverse CDF in row
// (token) order, rows left out one by one.
type drawer struct {
	w      []float32
	blocks []float64 // (nb) Σ w over each block, the rows left out excepted
	out    []int32   // the rows left out
}

// drawer returns a drawer over weights w with blocks' sums blocks (a
// block of sum 0 reads as zeros), nothing left out; it uses s's scratch.
func (s *sampler) drawer(w []float32, blocks []float64) drawer {
	s.drawB = append(s.drawB[:0], blocks...)
	return drawer{w: w, blocks: s.drawB, out: s.out[:0]}
}

// leaveOut takes head row j out of the draws: its block is summed again
// without the rows left out.
func (dr *drawer) leaveOut(j int) {
	dr.out = append(dr.out, int32(j))
	b := j / sampleBlock
	if dr.blocks[b] == 0 {
		return
	}
	j0, j1 := b*sampleBlock, min((b+1)*sampleBlock, len(dr.w))
	var sum float64
	for i, x := range dr.w[j0:j1] {
		if x > 0 && !slices.Contains(dr.out, int32(j0+i)) {
			sum += float64(x)
		}
	}
	dr.blocks[b] = sum
}

// total is the weight left.
func (dr *drawer) total() float64 {
	var t float64
	for _, m := range dr.blocks {
		t += m
	}
	return t
}

// at returns the row whose cumulative weight first passes target, the
// last row of weight when rounding carries target past the end; −1 when
// no weight is left.
func (dr *drawer) at(target float64) int {
	var acc float64
	hit := -1
	for b, m := range dr.blocks {
		if m <= 0 {
			continue
		}
		if hit = b; target < acc+m {
			break
		}
		acc += m
	}
	if hit < 0 {
		return -1
	}
	j0, j1 := hit*sampleBlock, min((hit+1)*sampleBlock, len(dr.w))
	last := -1
	for j := j0; j < j1; j++ {
		x := dr.w[j]
		if x <= 0 || slices.Contains(dr.out, int32(j)) {
			continue
		}
		acc += float64(x)
		last = j
		if target < acc {
			break
		}
	}
	return last
}

// choose reads out row r's draw by sampling.Choose's rule (r holds the
// row's greedy read-out): the proposal X accepted with probability p(X),
// and a token drawn from p with X left out.
func (s *sampler) choose(d *dist, dr sampling.Draw, r *sampling.Row) {
	r.Threshold = d.theta
	if dr.Coupled {
		s.coupled(d, dr, r)
		return
	}
	draws := s.drawer(d.w, d.blocks)
	if dr.X != sampling.NoProposal {
		x := s.row(dr.X)
		r.XLogprob = float32(math.Inf(-1))
		if x >= 0 {
			r.XLogprob = d.logits[x] - d.lse
			r.Accept = float64(dr.U) < float64(d.weight(x))/d.mass
			draws.leaveOut(x)
		}
	}
	j := draws.at(float64(dr.V) * draws.total())
	if j < 0 { // X is the only token kept
		r.Sample, r.SampleLogprob = dr.X, r.XLogprob
		return
	}
	r.Sample, r.SampleLogprob = s.token(j), d.logits[j]-d.lse
}

// coupled reads out a coupled row (sampling.Choose's rule for one): the
// kept token with the largest l/T + its Gumbel noise under the row's key,
// the lower token on a tie, X accepted iff it is that token. A token's
// noise is at most −log w, w its hash over 2³² (E = −log(1 − w) ≥ w), so
// it can reach best, the largest logit's noisy value, only where w ≤
// exp(l/T − best): ops.ExpScaled gives those limits (with a slack past
// f32's rounding) and ops.HashBelow the few tokens under them — about
// one a row whatever its entropy —, whose noise alone is computed; the
// workers screen a part of the row each. d needs its λ only, not its
// weights (coupledOnly).
func (s *sampler) coupled(d *dist, dr sampling.Draw, r *sampling.Row) {
	T := d.p.Temperature
	k0, k1 := dr.Key()
	noisy := func(j int) float32 { return d.logits[j]/T + sampling.Gumbel(k0, k1, s.token(j)) }
	at := ops.FirstAtLeast(d.logits, d.max)
	best := noisy(at)
	slack := 1e-3 + 1e-5*float32(math.Abs(float64(best)))
	s.ce = grow(s.ce, max(len(s.ce), s.n+16))
	n := len(d.logits)
	lim := s.ce[:n]
	for len(s.cands) < s.pool.Workers() {
		s.cands = append(s.cands, nil)
	}
	s.pool.Run(func(w int) {
		lo, hi := s.pool.Split(n, w)
		ops.ExpScaled(lim[lo:hi], d.logits[lo:hi], (best-slack)*T, T)
		var tokens []int32
		if s.tokens != nil {
			tokens = s.tokens[lo:hi]
		}
		s.cands[w] = ops.HashBelow(s.cands[w][:0], lim[lo:hi], tokens, lo, k0, k1)
	})
	bestAt, bestV := at, best
	for _, cand := range s.cands[:s.pool.Workers()] {
		for _, c := range cand {
			j := int(c)
			if j == at || d.logits[j] < d.lambda {
				continue
			}
			if v := noisy(j); v > bestV || v == bestV && j < bestAt { // rows ascend with their tokens
				bestV, bestAt = v, j
			}
		}
	}
	at = bestAt
	r.Sample, r.SampleLogprob = s.token(at), d.logits[at]-d.lse
	if dr.X != sampling.NoProposal {
		r.XLogprob = float32(math.Inf(-1))
		if x := s.row(dr.X); x >= 0 {
			r.XLogprob = d.logits[x] - d.lse
		}
		r.Accept = r.Sample == dr.X
	}
}

// coupledOnly reports whether every row of draws is coupled: where the
// nucleus keeps every token, such rows need no weights, only their logits.
func coupledOnly(draws []sampling.Draw) bool {
	for _, d := range draws {
		if !d.Coupled {
			return false
		}
	}
	return true
}

// propose draws len(us) distinct tokens from d (sampling.DrawDistinct
// over sampling.Dist) into r, with their log-probabilities and the
// distribution, compacted to its tokens of non-zero probability where
// they are at most half the vocabulary (as engine.HostSampler keeps it).
func (s *sampler) propose(d *dist, us []float32, r *engine.VerifyRow) {
	draws := s.drawer(d.w, d.blocks)
	lm := math.Log(d.mass)
	for _, u := range us {
		left := draws.total()
		if left <= 0 {
			break
		}
		j := draws.at(float64(u) * left)
		if j < 0 {
			break
		}
		draws.leaveOut(j)
		r.Drawn = append(r.Drawn, s.token(j))
		r.DrawnLogprob = append(r.DrawnLogprob, float32(math.Log(float64(d.w[j]))-lm))
	}
	s.out = draws.out
	r.Q = s.keep(d)
}

// keep returns d's distribution as a HostDist: dense over the vocabulary,
// or its tokens of non-zero probability where they are at most half of
// it (a head over at most half the vocabulary, or a nucleus of as few).
func (s *sampler) keep(d *dist) *engine.HostDist {
	inv := float32(1 / d.mass)
	live := s.n // every head row, where no nucleus cuts the row
	if d.nucleus() {
		live = 0
		for b, m := range d.blocks {
			if m > 0 {
				j0, j1 := b*sampleBlock, min((b+1)*sampleBlock, s.n)
				_, k := ops.AtLeast(d.w[j0:j1], d.w[j0:j1], math.SmallestNonzeroFloat32)
				live += k
			}
		}
	}
	if live > s.vocab/2 {
		q := &engine.HostDist{P: make([]float32, s.vocab)}
		for b, m := range d.blocks {
			if m <= 0 {
				continue
			}
			j0, j1 := b*sampleBlock, min((b+1)*sampleBlock, s.n)
			if s.tokens == nil {
				ops.Scale(q.P[j0:j1], d.w[j0:j1], inv)
				continue
			}
			for j := j0; j < j1; j++ {
				q.P[s.tokens[j]] = d.w[j] * inv
			}
		}
		return q
	}
	if !d.nucleus() { // a head over at most half the vocabulary: its rows, in one pass
		q := &engine.HostDist{Tokens: slices.Clone(s.tokens), P: make([]float32, s.n)}
		ops.Scale(q.P, d.w, inv)
		return q
	}
	q := &engine.HostDist{Tokens: make([]int32, 0, live), P: make([]float32, 0, live)}
	for b, m := range d.blocks {
		if m <= 0 {
			continue
		}
		for j := b * sampleBlock; j < min((b+1)*sampleBlock, s.n); j++ {
			if x := d.w[j]; x > 0 {
				q.Tokens, q.P = append(q.Tokens, int32(s.token(j))), append(q.P, x*inv)
			}
		}
	}
	return q
}

// nodeQ is a node's q: its sum over the vocabulary, the children removed
// excepted, q at each child, and (made by dense at the node's first
// rejection) q over the head's rows: q.P itself where it is laid out as
// the head's rows, else s.q.
type nodeQ struct {
	hd   *engine.HostDist
	sum  float64
	kids []float64
	qh   []float32
}

// loadQ reads q for children toks, checked as sampling.AcceptNode checks
// it: weights finite and not negative, some positive, tokens in the
// vocabulary, each child a token q gives weight, none twice.
func (s *sampler) loadQ(q *engine.HostDist, toks []int) (nodeQ, error) {
	nq := nodeQ{hd: q, kids: make([]float64, len(toks))}
	if q.Tokens != nil {
		if len(q.Tokens) != len(q.P) {
			return nq, fmt.Errorf("q: %d tokens, %d probabilities", len(q.Tokens), len(q.P))
		}
		if len(q.Tokens) == 0 {
			return nq, errors.New("q: no tokens")
		}
		lo, hi := ops.RangeInt32(q.Tokens)
		if lo < 0 || int(hi) >= s.vocab {
			return nq, fmt.Errorf("q: tokens %d … %d outside the vocabulary of %d", lo, hi, s.vocab)
		}
	}
	for b := 0; b < len(q.P); b += sampleBlock {
		sum, least := ops.SumMin(q.P[b:min(b+sampleBlock, len(q.P))])
		if !(least >= 0) || math.IsInf(float64(sum), 1) || sum != sum {
			return nq, errors.New("q: a weight is negative, infinite or NaN")
		}
		nq.sum += float64(sum)
	}
	if nq.sum == 0 || math.IsInf(nq.sum, 1) {
		return nq, errors.New("q: no weight is positive, or the weights overflow")
	}
	for i, x := range toks {
		if x < 0 || x >= s.vocab {
			return nq, fmt.Errorf("child %d: token %d outside the vocabulary of %d", i, x, s.vocab)
		}
		if j := slices.Index(toks[:i], x); j >= 0 {
			return nq, fmt.Errorf("children %d and %d are both token %d: drafts are drawn without replacement", j, i, x)
		}
		nq.kids[i] = float64(qAt(q, x))
		if nq.kids[i] <= 0 {
			return nq, fmt.Errorf("child %d: token %d has q = 0: the drafter could not have drawn it", i, x)
		}
	}
	return nq, nil
}

// qAt is q's weight of token x: by a binary search of a compacted q's
// tokens (in order, as engines list them), else by a scan.
func qAt(q *engine.HostDist, x int) float32 {
	if q.Tokens == nil {
		if x < len(q.P) {
			return q.P[x]
		}
		return 0
	}
	if i, ok := slices.BinarySearch(q.Tokens, int32(x)); ok {
		return q.P[i]
	}
	if i := slices.Index(q.Tokens, int32(x)); i >= 0 {
		return q.P[i]
	}
	return 0
}

// dense lays q out over the head's rows, once a node needs it whole.
func (s *sampler) dense(q *nodeQ) {
	if q.qh != nil {
		return
	}
	hd := q.hd
	if hd.Tokens == nil && s.tokens == nil && len(hd.P) >= s.n {
		q.qh = hd.P[:s.n]
		return
	}
	s.q = grow(s.q, s.n)
	q.qh = s.q
	if hd.Tokens != nil {
		clear(s.q)
		for i, t := range hd.Tokens {
			if j := s.row(int(t)); j >= 0 {
				s.q[j] = hd.P[i]
			}
		}
		return
	}
	for j := range s.q {
		s.q[j] = 0
		if t := s.token(j); t < len(hd.P) {
			s.q[j] = hd.P[t]
		}
	}
}

// walk verifies e's tree by the multi-draft rule (sampling.Verifier's
// AcceptNode at each node from the root), as engine.HostSampler does:
// node j's row is prepared when the walk comes to it, from its logits,
// largest logit and log-sum-exp.
func (s *sampler) walk(e *engine.VerifyEntry, row func(j int) (logits []float32, max, lse float32)) error {
	t := e.Tree
	t.Path, t.Logprobs = t.Path[:0], t.Logprobs[:0]
	first := len(e.Tokens) - e.Out
	for node := 0; ; {
		s.reset()
		l, m, lse := row(node)
		d := s.add(l, m, lse, e.Sampling, 1)
		s.prepare(d)
		n := t.Nodes[node]
		s.kids = s.kids[:0]
		for _, ch := range n.Children {
			s.kids = append(s.kids, e.Tokens[first+ch])
		}
		at, j, err := s.acceptNode(d, n, s.kids)
		if err != nil {
			return fmt.Errorf("node %d: %w", node, err)
		}
		lp := float32(math.Inf(-1))
		if j >= 0 {
			lp = l[j] - lse
		}
		if at < 0 {
			tok := -1
			if j >= 0 {
				tok = s.token(j)
			}
			t.Bonus = sampling.TokenLogprob{Token: tok, Logprob: lp}
			return nil
		}
		node = n.Children[at]
		t.Path = append(t.Path, node)
		t.Logprobs = append(t.Logprobs, lp)
	}
}

// acceptNode holds a node's children (tokens toks) to the multi-draft
// rule over p = d's distribution and the node's q: child i is accepted
// when u_i·q(x_i) < p(x_i), else p ← norm(max(0, p − q)) and q ← q
// without x_i, normalized; when every child is rejected a token is drawn
// from the last p at v. It returns the accepted child's index and its
// head row, or −1 and the drawn token's head row (−1 for a child the head
// leaves out, accepted only where rounding leaves p − q no mass).
func (s *sampler) acceptNode(d *dist, n engine.SampledNode, toks []int) (int, int, error) {
	if len(toks) == 0 {
		draws := s.drawer(d.w, d.blocks)
		return -1, draws.at(float64(n.V) * d.mass), nil
	}
	hd, ok := n.Q.(*engine.HostDist)
	if !ok {
		return 0, 0, fmt.Errorf("a distribution of another engine (%T)", n.Q)
	}
	q, err := s.loadQ(hd, toks)
	if err != nil {
		return 0, 0, err
	}
	// The residual p: d's weights until a child is rejected (scale 1/Σ),
	// then res.
	pw, pb, psum := d.w, d.blocks, d.mass
	s.out = s.out[:0] // the children removed from q, as head rows
	for i, x := range toks {
		j := s.row(x)
		var px float64
		if j >= 0 && pb[j/sampleBlock] > 0 {
			px = float64(pw[j]) / psum
		}
		if float64(n.U[i])*q.kids[i]/q.sum < px {
			return i, j, nil
		}
		// Rejected: p ← max(0, p − q), normalized.
		s.dense(&q)
		psum = s.residual(pw, pb, psum, q)
		pw, pb = s.res, s.resB
		if psum == 0 { // p = q up to rounding: the exact rule accepts x
			return i, j, nil
		}
		// q ← q without x.
		q.sum -= q.kids[i]
		if j >= 0 {
			s.out = append(s.out, int32(j))
		}
		if q.sum <= 0 {
			q.sum = 0 // q's mass spent: no child can follow
		}
	}
	draws := s.drawer(pw, pb)
	return -1, draws.at(float64(n.V) * psum), nil
}

// residual sets res = max(0, p/psum − q/q.sum) over the head's rows —
// p's weights pw with blocks' sums pb (res itself after a first
// rejection), q zero at the rows removed (s.out) — and returns Σ res.
func (s *sampler) residual(pw []float32, pb []float64, psum float64, q nodeQ) float64 {
	s.res, s.resB = grow(s.res, s.n), grow(s.resB, s.nb)
	a := float32(1 / psum)
	var b float32
	if q.sum > 0 {
		b = float32(1 / q.sum)
	}
	// The residual at the removed rows is p's alone: kept before res is
	// written over.
	s.saved = s.saved[:0]
	for _, j := range s.out {
		var v float32
		if pb[int(j)/sampleBlock] > 0 {
			v = pw[j] * a
		}
		s.saved = append(s.saved, v)
	}
	s.rp = residualPass{pw: pw, pb: pb, qh: q.qh, a: a, b: b}
	s.pool.Run(s.residualBlocks)
	for k, j := range s.out {
		blk := int(j) / sampleBlock
		s.res[j] = s.saved[k]
		var sum float64
		for _, x := range s.res[blk*sampleBlock : min((blk+1)*sampleBlock, s.n)] {
			sum += float64(x)
		}
		s.resB[blk] = sum
	}
	var total float64
	for _, m := range s.resB {
		total += m
	}
	return total
}

// residualPass is what residual's workers read.
type residualPass struct {
	pw, qh []float32
	pb     []float64
	a, b   float32
}

// residualBlocks is worker w's share of residual's blocks.
func (s *sampler) residualBlocks(w int) {
	r := &s.rp
	lo, hi := s.pool.Split(s.nb, w)
	for blk := lo; blk < hi; blk++ {
		j0, j1 := blk*sampleBlock, min((blk+1)*sampleBlock, s.n)
		if r.pb[blk] <= 0 { // p is 0 here: so is max(0, −q)
			clear(s.res[j0:j1])
			s.resB[blk] = 0
			continue
		}
		s.resB[blk] = float64(ops.Residual(s.res[j0:j1], r.pw[j0:j1], r.a, r.qh[j0:j1], r.b))
	}
}
