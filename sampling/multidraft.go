package sampling

// Sampled drafts. A drafter that samples its proposals draws each from its
// own distribution q (the request's temperature and top_p applied to the
// drafter's logits), one child per node in a chain, several in a token
// tree. A node's children are drawn from q without replacement: x₁ ~ q,
// x₂ ~ q with x₁ removed and renormalized, and so on. The target holds
// them to the multi-draft rule (recursive rejection sampling, as SpecInfer
// and the verifiers of SGLang and vLLM do): with p the target's
// distribution at the node, try the children in order,
//
//   - accept xᵢ with probability min(1, p(xᵢ)/q(xᵢ));
//   - on rejection, p ← norm(max(0, p − q)) and q ← q with xᵢ removed,
//     renormalized, and go on with the next child;
//   - when every child is rejected (or there are none), draw the token
//     from the last p.
//
// Each step is speculative sampling of one proposal xᵢ drawn from the q it
// is held to, so the token that comes out is distributed as that step's
// p; by induction from the last step back, as the node's own p.

import (
	"errors"
	"fmt"
	"math"
)

// Dist is the distribution a row's token is drawn from under p, in
// float64: the softmax of logits/T over the nucleus (the tokens Choose may
// draw, those at or above its Threshold) and 0 elsewhere, normalized; a
// one-hot at the argmax (the lowest index on ties) when p is greedy. The
// scaling, the nucleus and the sums are Choose's, so Dist(t) is the mass
// Choose's draw gives t. A −Inf logit has probability 0; a NaN is ErrNaN
// (wrapped), and +Inf, a row of −Inf or an empty row are refused, as no
// distribution comes out of them.
func Dist(logits []float32, p Params) ([]float64, error) {
	return distTo(nil, logits, p)
}

// Dist is the package's Dist written into the Verifier's own row, which
// the next call to Dist overwrites: a caller reading row after row
// allocates nothing once it has grown to the vocabulary.
func (ver *Verifier) Dist(logits []float32, p Params) ([]float64, error) {
	d, err := distTo(ver.dist, logits, p)
	if d != nil {
		ver.dist = d
	}
	return d, err
}

// distTo is Dist into dst, grown as needed.
func distTo(dst []float64, logits []float32, p Params) ([]float64, error) {
	if len(logits) == 0 {
		return nil, errors.New("sampling: an empty row")
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("sampling: %w", err)
	}
	best, argmax := float32(math.Inf(-1)), 0
	for i, l := range logits {
		switch {
		case l != l:
			return nil, fmt.Errorf("sampling: logit %d: %w", i, ErrNaN)
		case math.IsInf(float64(l), 1):
			return nil, fmt.Errorf("sampling: logit %d is +Inf", i)
		case l > best:
			best, argmax = l, i
		}
	}
	if math.IsInf(float64(best), -1) {
		return nil, errors.New("sampling: every logit is −Inf")
	}
	if p.Greedy() {
		d := grow(dst, len(logits))
		clear(d)
		d[argmax] = 1
		return d, nil
	}
	e := grow(dst, len(logits))
	total := scaledInto(e, logits, best, p.Temperature)
	threshold, kept := float32(math.Inf(-1)), total
	if !p.keepsAll() {
		threshold, kept = nucleus(logits, e, total, p)
	}
	for i, l := range logits { // e becomes the distribution in place
		if l/p.Temperature >= threshold {
			e[i] /= kept
		} else {
			e[i] = 0
		}
	}
	return e, nil
}

// DrawDistinct draws len(u) distinct tokens from q without replacement, in
// draw order: the i-th by the inverse CDF of q with the tokens drawn before
// it removed, at u[i] of the remaining mass, summed in index order
// (rounding that carries u[i] past the end takes the last token left). q
// may be unnormalized weights (finite, not negative, some positive); it is
// not modified. The draws stop early when no mass is left, so fewer than
// len(u) tokens come back when q has fewer than len(u) tokens of positive
// weight. Each u[i] is a uniform in [0, 1). A drafter's children at a node
// are DrawDistinct(Dist(its logits, the request's Params), u).
func DrawDistinct(q []float64, u []float32) ([]int, error) {
	var ver Verifier
	return ver.DrawDistinct(q, u)
}

// DrawDistinct is the package's DrawDistinct with the Verifier's own
// scratch row.
func (ver *Verifier) DrawDistinct(q []float64, u []float32) ([]int, error) {
	if _, err := mass(q); err != nil {
		return nil, fmt.Errorf("sampling: q: %w", err)
	}
	if err := uniforms(u); err != nil {
		return nil, fmt.Errorf("sampling: %w", err)
	}
	ver.draw = append(ver.draw[:0], q...)
	w := ver.draw
	drawn := make([]int, 0, len(u))
	for _, ui := range u {
		left := sum(w)
		if left <= 0 {
			break
		}
		x := inverseCDF(w, float64(ui)*left)
		drawn = append(drawn, x)
		w[x] = 0
	}
	return drawn, nil
}

// AcceptNode is Verifier.AcceptNode with buffers of its own.
func AcceptNode(p, q []float64, children []int, u []float32, v float32) (accepted, token int, err error) {
	var ver Verifier
	return ver.AcceptNode(p, q, children, u, v)
}

// A Verifier holds the multi-draft rule's scratch rows, so that a caller
// verifying node after node allocates nothing once they have grown to the
// vocabulary. Its zero value is ready; it is not safe for concurrent use.
type Verifier struct {
	p, q   []float64 // the node's residual p and q, normalized
	dist   []float64 // Dist's row
	draw   []float64 // DrawDistinct's weights, drawn tokens zeroed
	tokens []int     // AcceptTree: a node's children's tokens
	fault  fault     // a deliberate mistake the tests must catch; 0 in use
}

// fault names a mistake in the rule that the tests' goodness-of-fit check
// must detect (see multidraft_export_test.go). The zero fault is the rule.
type fault int

const (
	faultNone       fault = iota
	faultIgnoreQ          // accept x with probability p(x), as if q were a point mass
	faultKeepQ            // after a rejection, keep the rejected child in q
	faultBonusFromP       // draw the last token from the node's p, not the residual
)

// AcceptNode holds a node's children to the multi-draft rule. p is the
// target's distribution at the node and q the drafter's; children are the
// tokens the drafter drew from q without replacement, in draw order (as
// DrawDistinct draws them), and u holds one uniform in [0, 1) per child,
// v one for the last draw. Child xᵢ is accepted when u[i]·q(xᵢ) < p(xᵢ)
// (q and p being the residuals of the rejections before it); when every
// child is rejected, the token is drawn from the last residual p by the
// inverse CDF in index order at v. It returns the accepted child's index
// in children and the token (that child), or −1 and the drawn token.
//
// p and q may be unnormalized weights (finite, not negative, some
// positive); they are normalized here, on copies: the inputs are not
// modified. q is not read when there are no children (it may be nil);
// otherwise it is the same length as p. Each child must be a token q could
// have drawn: in the row, q(x) > 0, and not drawn before. Sums run in
// float64, in index order.
//
// Rounding. A rejection needs q(x) > p(x), and two distributions that both
// sum to 1 then leave p − q some positive mass. A residual with none comes
// only of rounding: p and q agree to within the rounding of their sums,
// and the mass the exact rule would move off x, q(x) − p(x), is below what
// the rows resolve. AcceptNode then accepts x (as the exact rule does
// surely where p = q), which is as exact as the rows are. Once the
// children have taken all of q's mass, q is left all zero; no child can
// follow then, and none is read.
func (ver *Verifier) AcceptNode(p, q []float64, children []int, u []float32, v float32) (accepted, token int, err error) {
	if err := ver.load(p, q, children, u, v); err != nil {
		return -1, -1, fmt.Errorf("sampling: %w", err)
	}
	accepted, token = ver.accept(p, children, u, v)
	return accepted, token, nil
}

// load checks AcceptNode's inputs and copies p and q, normalized, into the
// scratch rows.
func (ver *Verifier) load(p, q []float64, children []int, u []float32, v float32) error {
	pm, err := mass(p)
	if err != nil {
		return fmt.Errorf("p: %w", err)
	}
	if len(u) != len(children) {
		return fmt.Errorf("%d uniforms for %d children", len(u), len(children))
	}
	if err := uniforms(u); err != nil {
		return err
	}
	if err := uniforms([]float32{v}); err != nil {
		return fmt.Errorf("v: %w", err)
	}
	ver.p = normalized(ver.p, p, pm)
	ver.q = ver.q[:0]
	if len(children) == 0 {
		return nil
	}
	if len(q) != len(p) {
		return fmt.Errorf("q has %d tokens, p %d", len(q), len(p))
	}
	qm, err := mass(q)
	if err != nil {
		return fmt.Errorf("q: %w", err)
	}
	ver.q = normalized(ver.q, q, qm)
	for i, x := range children {
		switch {
		case x < 0 || x >= len(q):
			return fmt.Errorf("child %d: token %d outside the row of %d", i, x, len(q))
		case ver.q[x] == 0:
			return fmt.Errorf("child %d: token %d has q = 0: the drafter could not have drawn it", i, x)
		}
		for j := range i {
			if children[j] == x {
				return fmt.Errorf("children %d and %d are both token %d: drafts are drawn without replacement", j, i, x)
			}
		}
	}
	return nil
}

// accept runs the rule on the loaded rows; p is the node's own
// distribution, read only by faultBonusFromP.
func (ver *Verifier) accept(p []float64, children []int, u []float32, v float32) (accepted, token int) {
	rp, rq := ver.p, ver.q
	for i, x := range children {
		if ver.fault == faultIgnoreQ {
			if float64(u[i]) < rp[x] {
				return i, x
			}
		} else if float64(u[i])*rq[x] < rp[x] {
			return i, x
		}
		// Rejected: p ← norm(max(0, p − q)).
		var left float64
		for t := range rp {
			if r := rp[t] - rq[t]; r > 0 {
				rp[t] = r
				left += r
			} else {
				rp[t] = 0
			}
		}
		if left == 0 { // p = q up to rounding: the exact rule accepts x
			return i, x
		}
		scale(rp, left)
		if ver.fault == faultKeepQ {
			continue
		}
		// q ← q without x, renormalized (all zero once q's mass is spent).
		rq[x] = 0
		if left := sum(rq); left > 0 {
			scale(rq, left)
		}
	}
	if ver.fault == faultBonusFromP {
		rp = normalized(rp, p, sum(p))
	}
	return -1, inverseCDF(rp, float64(v)*sum(rp))
}

// Node is one node of a token tree of drafts, as AcceptTree walks it.
type Node struct {
	// Token is the drafted token the node holds. The root's is not read:
	// the root stands for the last token already emitted.
	Token int
	// Children are the indexes (into the tree) of the nodes drafted after
	// this one, in the order the drafter drew their tokens from Q (without
	// replacement); each is greater than the node's own index.
	Children []int
	// P is the target's distribution for the token after this node (a
	// leaf's gives the bonus token), Q the drafter's, which Children's
	// tokens were drawn from (not read at a leaf).
	P, Q []float64
	// U holds a uniform in [0, 1) per child, deciding its acceptance; V the
	// draw from the residual when every child is rejected.
	U []float32
	V float32
}

// AcceptTree walks a tree of drafts from its root, nodes[0]: at each node
// it holds the children to the multi-draft rule (AcceptNode) and moves to
// the accepted child, until a node rejects every child or is a leaf; that
// node's draw is the bonus token. It returns the accepted nodes, the
// root's child first, and the bonus. The tokens emitted — the path's and
// then the bonus — are distributed as the target would emit them one at a
// time, given that each node's P is the target's distribution after the
// tokens on its path and Q the drafter's its children were drawn from.
func (ver *Verifier) AcceptTree(nodes []Node) (path []int, bonus int, err error) {
	if len(nodes) == 0 {
		return nil, -1, errors.New("sampling: a tree with no root")
	}
	for n := 0; ; {
		node := &nodes[n]
		ver.tokens = ver.tokens[:0]
		for _, c := range node.Children {
			if c <= n || c >= len(nodes) {
				return nil, -1, fmt.Errorf("sampling: node %d: child %d is not a node after it in a tree of %d", n, c, len(nodes))
			}
			ver.tokens = append(ver.tokens, nodes[c].Token)
		}
		if err := ver.load(node.P, node.Q, ver.tokens, node.U, node.V); err != nil {
			return nil, -1, fmt.Errorf("sampling: node %d: %w", n, err)
		}
		i, token := ver.accept(node.P, ver.tokens, node.U, node.V)
		if i < 0 {
			return path, token, nil
		}
		n = node.Children[i]
		path = append(path, n)
	}
}

// mass checks that w is a row of weights, finite, not negative and not all
// zero, and returns their sum in index order.
func mass(w []float64) (float64, error) {
	if len(w) == 0 {
		return 0, errors.New("an empty row")
	}
	for i, x := range w {
		if !(x >= 0) || math.IsInf(x, 1) {
			return 0, fmt.Errorf("weight %d is %v", i, x)
		}
	}
	s := sum(w)
	if s == 0 {
		return 0, errors.New("no weight is positive")
	}
	if math.IsInf(s, 1) {
		return 0, errors.New("the weights overflow")
	}
	return s, nil
}

// uniforms checks that each of u is in [0, 1).
func uniforms(u []float32) error {
	for i, x := range u {
		if !(x >= 0 && x < 1) {
			return fmt.Errorf("uniform %d is %v, not in [0, 1)", i, x)
		}
	}
	return nil
}

// normalized returns w/s in dst's storage.
func normalized(dst, w []float64, s float64) []float64 {
	dst = append(dst[:0], w...)
	scale(dst, s)
	return dst
}

// scale divides w by s in place.
func scale(w []float64, s float64) {
	for i := range w {
		w[i] /= s
	}
}

// sum is Σ w in index order.
func sum(w []float64) float64 {
	var s float64
	for _, x := range w {
		s += x
	}
	return s
}

// inverseCDF returns the first token t of positive weight whose cumulative
// weight (in index order) passes target, or the last of positive weight
// when rounding carries target past the end; w has some positive weight.
func inverseCDF(w []float64, target float64) int {
	last := -1
	var acc float64
	for t, x := range w {
		if x <= 0 {
			continue
		}
		acc += x
		last = t
		if target < acc {
			break
		}
	}
	return last
}

// grow returns buf with length n, reallocated only when too short.
func grow(buf []float64, n int) []float64 {
	if cap(buf) < n {
		return make([]float64, n)
	}
	return buf[:n]
}
