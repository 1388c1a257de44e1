// Package engine defines what a backend does — forward passes of a Qwen3
// model over batches of sequences, each with its own KV cache: a drafter's
// greedy steps (Step, StepN), and a verifier's pass that reads out every
// position it feeds (Verify) — and provides the engine over the reference
// model. The CPU engine (engine/cpu) and the WebGPU engine (engine/webgpu)
// implement the same interface, so the server and the command line never
// see a kernel. A drafter may also draft and have its target verify in
// one go on their shared device (Fuser: chains; TreeFuser: token trees);
// DraftVerify falls back to the two calls where it cannot.
package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"webdraft/qwen3"
	"webdraft/sampling"
	"webdraft/treemask"
)

// Info names what an engine runs on.
type Info struct {
	Backend string // "cpu", "reference" or "webgpu"
	Adapter string // the GPU adapter, or the CPU description
	// Software: a WebGPU engine on a renderer that runs on the CPU
	// (lavapipe, SwiftShader), not a GPU.
	Software bool
}

// Engine runs forward passes over batches of sequences.
//
// An Engine is driven by one goroutine at a time (the server's scheduler, or
// a command); Sequences belong to the engine that made them.
type Engine interface {
	Config() qwen3.Config
	Info() Info
	// NewSequence returns an empty sequence.
	NewSequence() (Sequence, error)
	// Step runs one forward pass over every entry of the batch: each entry's
	// tokens are appended to its sequence's cache, and entry.Next is set to
	// the greedy token after its last one (entry.Logprob to its
	// log-probability).
	Step(ctx context.Context, batch []*Entry) error
	// Verify runs one forward pass over every entry's tokens as Step does,
	// and reads out each entry's last Out positions: for each, what
	// sampling.Choose gives for the logits there (the argmax, and with
	// sampling the acceptance of the entry's Draws and a draw), and the
	// TopN most likely tokens. Only those few numbers come back, never a
	// row of logits.
	Verify(ctx context.Context, batch []*VerifyEntry) error
	// KVCapacity is how many positions the engine's KV cache holds for all
	// its sequences together: the scheduler keeps within it.
	KVCapacity() int
	Close() error
}

// Sequence is one sequence's KV cache inside an engine.
type Sequence interface {
	// Len is the number of cached positions.
	Len() int
	// Truncate drops positions from n on (a rejected draft rolls back).
	Truncate(n int)
	// KeepPath ends the sequence's token tree (see Entry.Parents), keeping
	// the nodes of path — slots, a root first, each the child of the one
	// before — moved on the device to follow the line: the cache then holds
	// what feeding the path's tokens as a line would have left. An empty
	// path drops the tree. A path that is not one of the tree's is refused
	// (treemask.ErrPath) and changes nothing.
	KeepPath(path []int) error
	// Release frees the cache; the sequence must not be used afterwards.
	Release()
}

// Entry is one sequence's part of a batched forward pass.
type Entry struct {
	Seq    Sequence
	Tokens []int // appended to Seq; at least one
	// Parents, when set (one per token), makes tokens nodes of a token
	// tree in Seq: token i's parent is the cached slot Parents[i] — the
	// line's last slot for a root, an earlier node's slot otherwise — or
	// treemask.Line for a token that continues the line (only before any
	// node). A node is rotated at its parent's position plus one and
	// attends to the line and its own ancestors (package treemask). Nil:
	// every token continues the line.
	Parents []int
	// Target is, for a drafter that reads its target (ReadsTarget: an
	// EAGLE-3 head), the target's sequence of the same text: each token's
	// row reads the target's features at the position before it.
	Target Sequence
	// TopN, 0 … MaxTopN, asks Step for the most likely tokens after the
	// last one too (a drafter's alternatives, for a page to show).
	TopN int
	// Set by Step: the argmax of the logits after the last token, its
	// log-probability under the model (the softmax at temperature 1), and
	// the TopN most likely tokens, most likely first.
	Next    int
	Logprob float32
	Top     []sampling.TokenLogprob
}

// TakeNext sets each Step entry's Next, Logprob and Top from its row read
// out (rows[i][0]: the row after the entry's last token).
func TakeNext(batch []*Entry, rows [][]VerifyRow) {
	for i, en := range batch {
		r := rows[i][0]
		en.Next, en.Logprob, en.Top = r.Argmax, r.ArgmaxLogprob, r.Top
	}
}

// Token is a token an engine chose, its log-probability under the model,
// and the entry's TopN most likely tokens at its position.
type Token struct {
	ID      int
	Logprob float32
	Top     []sampling.TokenLogprob
}

// IDs returns the tokens' ids.
func IDs(tokens []Token) []int {
	ids := make([]int, len(tokens))
	for i, t := range tokens {
		ids[i] = t.ID
	}
	return ids
}

// VerifyEntry is one sequence's part of a Verify pass.
type VerifyEntry struct {
	Seq    Sequence
	Tokens []int // appended to Seq; at least one
	// Parents places the tokens as Entry.Parents does: a verification of
	// a token tree reads out its nodes' rows (the last Out positions).
	Parents []int
	// Target is, for a head drafting a token tree level by level (Head),
	// the target's sequence, as Entry.Target.
	Target Sequence
	Out    int // the last Out positions are read out, 1 … len(Tokens)
	// Sampling is how each row's Sample is drawn; with Temperature 0 there
	// is no draw and Draws is unused. Draws holds Out draws, one a row.
	Sampling sampling.Params
	Draws    []sampling.Draw
	TopN     int // 0 … MaxTopN: the most likely tokens to read out a row
	// Propose, with sampling, makes the pass a sampled drafter's: read-out
	// row j draws len(Propose[j]) distinct tokens from its distribution
	// under Sampling (sampling.DrawDistinct with those uniforms) into
	// VerifyRow.Drawn, and keeps the distribution as VerifyRow.Q for the
	// target's rule. Nil, or an empty row, draws nothing. Needs an engine
	// that SamplesDrafts.
	Propose [][]float32
	// Tree, with sampling, makes the pass a target's verification of
	// sampled proposals by the multi-draft rule (see SampledTree). Needs
	// an engine that SamplesDrafts.
	Tree *SampledTree
	// Rows is set by Verify: Out rows, for the positions in order.
	Rows []VerifyRow
}

// VerifyRow is one position read out by Verify.
type VerifyRow struct {
	sampling.Row
	Top []sampling.TokenLogprob // TopN of them, most likely first
	// With VerifyEntry.Propose: the tokens drawn, in draw order, their
	// log-probabilities under the row's distribution (Sampling applied),
	// and that distribution.
	Drawn        []int
	DrawnLogprob []float32
	Q            Dist
}

// Dist is a distribution over the vocabulary that a drafter drew
// proposals from (VerifyRow.Q), for a target to hold them to
// (SampledNode.Q). An engine takes the kinds it can read; HostDist every
// engine that SamplesDrafts.
type Dist interface {
	// Len is the number of tokens the distribution may give.
	Len() int
}

// HostDist is a Dist in host memory: P[i] is the probability of token
// Tokens[i] (of token i when Tokens is nil); every other token has 0.
type HostDist struct {
	Tokens []int32
	P      []float32
}

func (d *HostDist) Len() int { return len(d.P) }

// Dense writes d over a vocabulary of n tokens into buf (grown as needed)
// and returns it.
func (d *HostDist) Dense(buf []float64, n int) []float64 {
	if cap(buf) < n {
		buf = make([]float64, n)
	}
	buf = buf[:n]
	if d.Tokens == nil {
		for i, p := range d.P {
			buf[i] = float64(p)
		}
		clear(buf[len(d.P):])
		return buf
	}
	clear(buf)
	for i, t := range d.Tokens {
		buf[t] = float64(d.P[i])
	}
	return buf
}

// SampledTree is a token tree of sampled proposals for Verify to hold to
// the multi-draft rule (package sampling: recursive rejection sampling),
// chains being trees of one child a node. Node j is read-out row j: row 0
// the line's last token (the root), the others the drafted tokens. From
// the root, each node's children are tried in draw order against the
// target's distribution p there (Sampling applied) and the drafter's Q;
// the first accepted becomes the node walked next, and when all are
// rejected a token is drawn from the last residual: the tokens that come
// out follow the target's distribution.
type SampledTree struct {
	Nodes []SampledNode // one a read-out row
	// Set by Verify: the accepted nodes' rows, root first (never 0);
	// each accepted token's log-probability under the target at
	// temperature 1; and the token drawn after the path, with its.
	Path     []int
	Logprobs []float32
	Bonus    sampling.TokenLogprob
}

// SampledNode is one node of a SampledTree.
type SampledNode struct {
	Children []int     // read-out rows of the node's children, in draw order
	Q        Dist      // the drafter's distribution the children were drawn from
	U        []float32 // one uniform in [0, 1) a child
	V        float32   // the uniform of the draw after the node
}

// SamplesDrafts reports whether e takes VerifyEntry.Propose and
// VerifyEntry.Tree: sampled drafts and their exact verification.
func SamplesDrafts(e Engine) bool {
	s, ok := e.(interface{ SamplesDrafts() bool })
	return ok && s.SamplesDrafts()
}

// CouplesDrafts reports whether e, a drafter, drafts by coupled draws in
// its fused steps (DraftVerify, DraftVerifyN): where the verification's
// rows are coupled (sampling.Draw.Coupled), each draft is the Gumbel-max
// draw from the drafter's distribution under the key of the row that
// verifies it, which the target's coupled draw equals far more often than
// a greedy draft. A drafter that does not drafts its greedy tokens, which
// coupled rows accept as the greedy rule does; the target's tokens follow
// its distribution either way.
func CouplesDrafts(e Engine) bool {
	c, ok := e.(interface{ CouplesDrafts() bool })
	return ok && c.CouplesDrafts()
}

// DraftsCoupled reports whether e, a drafter, drafts coupled draws outside
// fused steps: SampleN (through its own SampleN, or its Verify a call a
// token) takes, at a temperature, coupled Draws without proposals, each
// token then the Gumbel-max draw from its distribution under the draw's
// key (an EAGLE-3 head's over its draft vocabulary, as the target's
// token), which a target's coupled row under the same key equals with
// probability near 1 − TV(p, q). Fused steps couple by CouplesDrafts.
func DraftsCoupled(e Engine) bool {
	c, ok := e.(interface{ DraftsCoupled() bool })
	return ok && c.DraftsCoupled()
}

// SampledPair reports whether drafter's sampled drafts can be verified by
// target: both sample drafts, and target reads drafter's distributions —
// host ones (HostDist) every such engine reads, a device's only the
// engines of its domain (an engine's DistDomain: nil for host memory,
// else where its Dists live, e.g. a WebGPU engine's group).
func SampledPair(drafter, target Engine) bool {
	if !SamplesDrafts(drafter) || !SamplesDrafts(target) {
		return false
	}
	d := DistDomain(drafter)
	return d == nil || d == DistDomain(target)
}

// DistDomain is where e's Dists live (nil: host memory).
func DistDomain(e Engine) any {
	if d, ok := e.(interface{ DistDomain() any }); ok {
		return d.DistDomain()
	}
	return nil
}

// MaxTopN bounds Entry.TopN and VerifyEntry.TopN (OpenAI's top_logprobs
// allows 20).
const MaxTopN = 20

// CheckHead refuses a head over fewer tokens than MaxTopN, so that every
// top-N read-out lists tokens of non-zero probability.
func CheckHead(c *qwen3.Config, w *qwen3.Weights) error {
	if n := w.HeadRows(c); n < MaxTopN {
		return fmt.Errorf("the model's head scores %d tokens: at least %d needed", n, MaxTopN)
	}
	return nil
}

var (
	// ErrContextFull reports a sequence that would grow past the model's
	// max_position_embeddings.
	ErrContextFull = errors.New("context longer than the model allows")
	// ErrNoCapacity reports a KV cache (or its sequence slots) used up:
	// release sequences and try again.
	ErrNoCapacity = errors.New("KV cache full")
	// ErrFault reports an engine broken by its device — a GPU error, a
	// lost device: the pass that met it did not complete, none of the
	// engine's sequences can be trusted, and every later call fails with
	// it. Its sequences may still be released; the way on is a new engine.
	ErrFault = errors.New("engine fault")
	// ErrFeaturesOnly refuses a model's pass over a sequence that
	// FeatureWriter.AppendFeatures extended: the model computed none of
	// those positions' keys and values.
	ErrFeaturesOnly = errors.New("a sequence of features only (AppendFeatures): the model computed none of its keys and values")
)

// DeviceBytes is the GPU memory eng's buffers hold, for engines on a GPU
// (false for the engines on the CPU).
func DeviceBytes(eng Engine) (int64, bool) {
	if d, ok := eng.(interface{ DeviceBytes() int64 }); ok {
		return d.DeviceBytes(), true
	}
	return 0, false
}

// KVBlockSize is the positions a block of eng's KV cache holds, the unit
// it allocates KV memory in (the WebGPU engine's pages); 1 for engines
// that allocate position by position (the engines on the CPU).
func KVBlockSize(eng Engine) int {
	if b, ok := eng.(interface{ KVBlockSize() int }); ok {
		return b.KVBlockSize()
	}
	return 1
}

// Fault is the error that broke eng (one wrapping ErrFault), or nil while
// it works; engines that cannot fault (those on the CPU) always say nil.
func Fault(eng Engine) error {
	if f, ok := eng.(interface{ Fault() error }); ok {
		return f.Fault()
	}
	return nil
}

// CheckBatch validates a batch against the model before any work is done:
// tokens in the vocabulary, positions within max_position_embeddings.
func CheckBatch(c *qwen3.Config, batch []*Entry) error {
	for i, e := range batch {
		if err := checkTokens(c, i, e.Seq, e.Tokens, e.Parents); err != nil {
			return err
		}
		if e.TopN < 0 || e.TopN > MaxTopN {
			return fmt.Errorf("batch entry %d: top %d: want 0…%d", i, e.TopN, MaxTopN)
		}
	}
	return nil
}

func checkTokens(c *qwen3.Config, i int, seq Sequence, tokens, parents []int) error {
	if len(tokens) == 0 {
		return fmt.Errorf("batch entry %d: no tokens", i)
	}
	if parents != nil && len(parents) != len(tokens) {
		return fmt.Errorf("batch entry %d: %d parents for %d tokens", i, len(parents), len(tokens))
	}
	if n := seq.Len() + len(tokens); n > c.MaxPositionEmbeddings {
		return fmt.Errorf("batch entry %d: %d positions: %w (max_position_embeddings %d)", i, n, ErrContextFull, c.MaxPositionEmbeddings)
	}
	for j, t := range tokens {
		if t < 0 || t >= c.VocabSize {
			return fmt.Errorf("batch entry %d: token %d at index %d is outside the vocabulary [0, %d)", i, t, j, c.VocabSize)
		}
	}
	return nil
}

// CheckVerify validates a Verify batch as CheckBatch does, and each entry's
// read-out: Out within its tokens, sampling parameters, one draw a row with
// proposals in the vocabulary, TopN within MaxTopN.
func CheckVerify(c *qwen3.Config, batch []*VerifyEntry) error {
	for i, e := range batch {
		if err := checkTokens(c, i, e.Seq, e.Tokens, e.Parents); err != nil {
			return err
		}
		if e.Out < 1 || e.Out > len(e.Tokens) {
			return fmt.Errorf("batch entry %d: reads out %d of %d positions", i, e.Out, len(e.Tokens))
		}
		if e.TopN < 0 || e.TopN > MaxTopN {
			return fmt.Errorf("batch entry %d: top %d: want 0…%d", i, e.TopN, MaxTopN)
		}
		if err := e.Sampling.Validate(); err != nil {
			return fmt.Errorf("batch entry %d: %w", i, err)
		}
		if e.Sampling.Greedy() {
			if e.Propose != nil || e.Tree != nil {
				return fmt.Errorf("batch entry %d: sampled proposals or their tree with greedy decoding", i)
			}
			continue
		}
		if err := checkSampled(c, i, e); err != nil {
			return err
		}
		if e.Tree != nil || e.Propose != nil {
			continue
		}
		if len(e.Draws) != e.Out {
			return fmt.Errorf("batch entry %d: %d draws for %d rows", i, len(e.Draws), e.Out)
		}
		for j, d := range e.Draws {
			if d.X != sampling.NoProposal && (d.X < 0 || d.X >= c.VocabSize) || !(d.U >= 0 && d.U < 1) || !(d.V >= 0 && d.V < 1) {
				return fmt.Errorf("batch entry %d: draw %d %+v: want a proposal in the vocabulary (or none) and uniforms in [0, 1)", i, j, d)
			}
		}
	}
	return nil
}

// CheckHeadVerify validates a head's Verify batch (Head: token trees
// drafted level by level, coupled drafts a pass each) as CheckVerify
// does, and refuses what a head does not read out: a Tree and Draws
// other than coupled ones without proposals (a head drafts and does not
// verify), and Sampling with neither (a head's rows are its greedy
// read-out, proposals drawn from its distribution as a drafter's, or its
// coupled drafts: each row's Sample the Gumbel-max draw from its
// distribution under the row's key).
func CheckHeadVerify(c *qwen3.Config, batch []*VerifyEntry) error {
	if err := CheckVerify(c, batch); err != nil {
		return err
	}
	for i, e := range batch {
		switch {
		case e.Draws != nil && !coupledDrafts(e.Draws):
			return fmt.Errorf("batch entry %d: draws other than coupled ones without proposals: an EAGLE-3 head drafts and does not verify", i)
		case e.Tree != nil:
			return fmt.Errorf("batch entry %d: a sampled tree to verify: an EAGLE-3 head drafts and does not verify", i)
		case !e.Sampling.Greedy() && e.Propose == nil && e.Draws == nil:
			return fmt.Errorf("batch entry %d: sampling at temperature %g without proposals or coupled draws: an EAGLE-3 head's rows are its greedy tokens, proposals drawn from it or its coupled drafts", i, e.Sampling.Temperature)
		}
	}
	return nil
}

// coupledDrafts reports whether draws are a drafter's coupled drafts: each
// coupled, without a proposal (its Sample is then the coupled draw from
// the drafter's distribution).
func coupledDrafts(draws []sampling.Draw) bool {
	for _, d := range draws {
		if !d.Coupled || d.X != sampling.NoProposal {
			return false
		}
	}
	return true
}

// checkSampled validates an entry's sampled drafts: proposals or a tree,
// not both; uniforms in [0, 1); a tree's nodes one a read-out row, each
// child a later row that no other node claims and whose token the entry
// feeds as the node's child (Parents; the next row in a line), and a
// distribution over the vocabulary at every node with children.
func checkSampled(c *qwen3.Config, i int, e *VerifyEntry) error {
	unit := func(u float32) bool { return u >= 0 && u < 1 }
	if e.Propose != nil {
		if e.Tree != nil {
			return fmt.Errorf("batch entry %d: both proposals and a tree to verify", i)
		}
		if len(e.Propose) != e.Out {
			return fmt.Errorf("batch entry %d: proposals for %d rows, %d read out", i, len(e.Propose), e.Out)
		}
		for j, us := range e.Propose {
			if len(us) > MaxTopN {
				return fmt.Errorf("batch entry %d row %d: %d proposals: want at most %d", i, j, len(us), MaxTopN)
			}
			for _, u := range us {
				if !unit(u) {
					return fmt.Errorf("batch entry %d row %d: uniform %v outside [0, 1)", i, j, u)
				}
			}
		}
	}
	t := e.Tree
	if t == nil {
		return nil
	}
	if len(t.Nodes) != e.Out {
		return fmt.Errorf("batch entry %d: a tree of %d nodes, %d rows read out", i, len(t.Nodes), e.Out)
	}
	claimed := make([]bool, e.Out)
	for j, n := range t.Nodes {
		if !unit(n.V) || len(n.U) != len(n.Children) {
			return fmt.Errorf("batch entry %d node %d: %d uniforms for %d children, v %v: want one a child, in [0, 1)", i, j, len(n.U), len(n.Children), n.V)
		}
		first := len(e.Tokens) - e.Out // the token of read-out row 0
		for k, ch := range n.Children {
			if ch <= j || ch >= e.Out || claimed[ch] || !unit(n.U[k]) {
				return fmt.Errorf("batch entry %d node %d: child row %d (uniform %v): want a later row of no other node, uniforms in [0, 1)", i, j, ch, n.U[k])
			}
			parent := first + ch - 1 // a line's token follows the one before
			if e.Parents != nil && e.Parents[first+ch] != treemask.Line {
				parent = e.Parents[first+ch] - e.Seq.Len()
			}
			if parent != first+j {
				return fmt.Errorf("batch entry %d node %d: child row %d is fed as another token's child", i, j, ch)
			}
			claimed[ch] = true
		}
		if len(n.Children) > 0 && (n.Q == nil || n.Q.Len() == 0 || n.Q.Len() > c.VocabSize) {
			return fmt.Errorf("batch entry %d node %d: children without a distribution of the vocabulary", i, j)
		}
	}
	return nil
}

// ReadsTarget returns the target engine whose features drafter reads (an
// EAGLE-3 head: see Head), or nil for a drafter that reads text alone.
func ReadsTarget(drafter Engine) Engine {
	if r, ok := drafter.(interface{ Target() Engine }); ok {
		return r.Target()
	}
	return nil
}

// Head is a drafter that reads its target's hidden states: an EAGLE-3
// draft head. It is an Engine whose Step drafts for the text of each
// entry's Target sequence, with these rules:
//
//   - A head sequence of length L has fed tokens 0 … L−1. Each token i ≥ 1
//     is a row of the head's layer, at position i−1, paired with the
//     features of position i−1: the target's (the residual stream entering
//     the layers the head reads, concatenated) while Entry.Target holds
//     that position, else — drafting past the target — the head's own
//     output for token i−1, whose row must then be the sequence's last.
//     Token 0 has no row: a step must feed a token past it.
//   - Truncate(n) keeps at most the rows that read the target's features:
//     rows the head drafted from its own output go too, so that the next
//     step computes them again from the target's, which by then holds
//     their positions. Len may then be below n.
//   - A head that drafts token trees (DraftsTrees) drafts them through
//     Verify, the entries naming their Target: a node's row reads the head's own output at its
//     parent's row (the line's last row for a root), attends to the line
//     and its ancestors, and its TopN are read out; only greedy read-outs
//     (no Sampling, Draws, Propose or Tree). KeepPath keeps none of the
//     tree, whatever the path: every node read the head's own output.
type Head interface {
	Engine
	// Target is the engine whose sequences' features the head reads; its
	// sequences keep them (for the layers the head was trained on).
	Target() Engine
}

// FeatureReader is a target engine whose sequences keep the features an
// EAGLE-3 head reads (its FeatureLayers' inputs, concatenated) and reads
// them back to the host: edge drafting sends them to a head elsewhere.
type FeatureReader interface {
	// FeatureWidth is the floats of one position's features (0: the
	// engine keeps none).
	FeatureWidth() int
	// Features returns positions from … to−1 of seq's features, row
	// after row, (to − from)·FeatureWidth floats. seq holds no tree.
	Features(seq Sequence, from, to int) ([]float32, error)
}

// FeatureWriter is a target engine whose sequences take features computed
// elsewhere: the engine a head drafts over where its target runs on
// another machine (edge drafting's page). AppendFeatures extends seq by
// len(rows)/FeatureWidth positions holding those rows and computes
// nothing: their keys and values are never set, so from then until it is
// truncated to no positions the sequence only serves a head
// (Entry.Target), and the model's own passes refuse it
// (ErrFeaturesOnly).
type FeatureWriter interface {
	FeatureWidth() int
	AppendFeatures(seq Sequence, rows []float32) error
}

// DraftsTrees reports whether a head drafts token trees (through Verify;
// see Head); one that does not drafts chains.
func DraftsTrees(head Engine) bool {
	t, ok := head.(interface{ DraftsTrees() bool })
	return ok && t.DraftsTrees()
}

// Chainer is an Engine that runs several greedy steps in one call, each
// entry fed its own greedy token on the device: no round trip to the host
// between steps, so the host records a step while the device runs the one
// before.
type Chainer interface {
	// StepN equals n calls of Step, each after the first with every entry's
	// tokens replaced by its Next: it returns each entry's n greedy tokens.
	// The caches then hold the entries' tokens and the first n-1 of those;
	// entry.Next is the last. Entries' Tokens are left as they were.
	StepN(ctx context.Context, batch []*Entry, n int) ([][]Token, error)
}

// StepN runs n greedy steps over batch (see Chainer): through the engine's
// own StepN when it has one, else as n Steps.
func StepN(ctx context.Context, e Engine, batch []*Entry, n int) ([][]Token, error) {
	if n <= 0 {
		return nil, fmt.Errorf("step n: n = %d, want > 0", n)
	}
	for i, en := range batch {
		if en.Parents != nil {
			return nil, fmt.Errorf("step n: batch entry %d: tree nodes (Parents) do not chain", i)
		}
	}
	if c, ok := e.(Chainer); ok {
		return c.StepN(ctx, batch, n)
	}
	tokens := make([][]int, len(batch))
	for i, en := range batch {
		tokens[i] = en.Tokens
	}
	defer func() {
		for i, en := range batch {
			en.Tokens = tokens[i]
		}
	}()
	out := make([][]Token, len(batch))
	for range n {
		if err := e.Step(ctx, batch); err != nil {
			return out, err
		}
		for i, en := range batch {
			out[i] = append(out[i], Token{en.Next, en.Logprob, en.Top})
			en.Tokens = []int{en.Next}
		}
	}
	return out, nil
}

// SampleChainer is an Engine that chains sampled steps on its device, as
// Chainer does greedy ones: each step's token is drawn there and the next
// step embeds it there, so that the host records a step while the device
// runs the one before and reads the tokens back once.
type SampleChainer interface {
	// SampleN equals n Verify calls, each entry reading out one row (Out
	// 1) sampled under its Sampling with the next of its n Draws (no
	// proposals), each call after the first fed the token the one before
	// drew. It returns each entry's n tokens: the token drawn, its
	// log-probability at temperature 1 (VerifyRow.SampleLogprob) and the
	// entry's TopN most likely tokens. The caches then hold the entries'
	// tokens and the first n−1 drawn; the entries are left as they were.
	// On an error every sequence is as it was before the call.
	SampleN(ctx context.Context, batch []*VerifyEntry, n int) ([][]Token, error)
}

// SampleN runs n sampled steps over batch (see SampleChainer): through the
// engine's own SampleN when it has one, else as n Verify calls, each entry
// fed the token the call before drew. Either way a drafter's coupled
// drafts (DraftsCoupled) are its SampleN over coupled draws.
func SampleN(ctx context.Context, e Engine, batch []*VerifyEntry, n int) ([][]Token, error) {
	if c, ok := e.(SampleChainer); ok {
		return c.SampleN(ctx, batch, n)
	}
	c := e.Config()
	if err := CheckSampleN(&c, batch, n); err != nil {
		return nil, err
	}
	lens := make([]int, len(batch))
	for i, en := range batch {
		lens[i] = en.Seq.Len()
	}
	out := make([][]Token, len(batch))
	calls := make([]*VerifyEntry, len(batch))
	for j := range n {
		for i, en := range batch {
			one := *en
			one.Draws, one.Rows = en.Draws[j:j+1], nil
			if j > 0 {
				one.Tokens = []int{out[i][j-1].ID}
			}
			calls[i] = &one
		}
		if err := e.Verify(ctx, calls); err != nil {
			for i, en := range batch {
				en.Seq.Truncate(min(lens[i], en.Seq.Len()))
			}
			return nil, err
		}
		for i, c := range calls {
			row := c.Rows[0]
			out[i] = append(out[i], Token{ID: row.Sample, Logprob: row.SampleLogprob, Top: row.Top})
		}
	}
	return out, nil
}

// CheckSampleN validates a SampleN batch: Verify entries (CheckVerify) at a
// temperature, each reading out one row, with n draws without proposals.
func CheckSampleN(c *qwen3.Config, batch []*VerifyEntry, n int) error {
	if n <= 0 {
		return fmt.Errorf("sample n: n = %d, want > 0", n)
	}
	for i, e := range batch {
		if e.Sampling.Greedy() || e.Out != 1 || len(e.Draws) != n || e.Parents != nil || e.Propose != nil || e.Tree != nil {
			return fmt.Errorf("sample n: batch entry %d: want a line sampled at a temperature, one row read out and %d draws (got temperature %v, %d rows, %d draws)",
				i, n, e.Sampling.Temperature, e.Out, len(e.Draws))
		}
		for j, d := range e.Draws {
			if d.X != sampling.NoProposal {
				return fmt.Errorf("sample n: batch entry %d: draw %d proposes token %d: want none", i, j, d.X)
			}
		}
		one := *e
		one.Draws = e.Draws[:1]
		if err := CheckVerify(c, []*VerifyEntry{&one}); err != nil {
			return fmt.Errorf("sample n: %w", err)
		}
		for j, d := range e.Draws {
			if !(d.U >= 0 && d.U < 1) || !(d.V >= 0 && d.V < 1) {
				return fmt.Errorf("sample n: batch entry %d: draw %d %+v: want uniforms in [0, 1)", i, j, d)
			}
		}
	}
	return nil
}

// A ChainStep is one generation's part of a speculative step drafted as a
// chain and verified (DraftVerify).
type ChainStep struct {
	// Draft is the drafter's entry: its pending tokens, after which the
	// chain goes on with its own greedy tokens, as StepN's.
	Draft *Entry
	// Verify is the target's entry, its Tokens the target's pending tokens:
	// the chain's first Take tokens are fed after them (on return Tokens
	// holds them too), and where the entry samples they are the proposals
	// of its first Take Draws. Out is Take + 1: the draft's rows and the
	// one after it.
	Verify *VerifyEntry
	Take   int
	// Keys are, for DraftVerifyN at a temperature (SpecChainer), the
	// generation's coupled keys: every row of the steps after the first
	// draws coupled under the key of the position it decides (Keys.At;
	// the row after position p's token decides p + 1), the first step's
	// rows drawing Verify.Draws, which must be those keys' draws.
	Keys *sampling.Keys
}

// Fuser is a drafter that drafts chains and has a target verify them in
// one go on one device: the drafted tokens feed the target's pass without
// coming back to the host, the host records the target's pass while the
// device drafts, and the drafts and the verification's rows come back
// together.
type Fuser interface {
	// Fuses reports whether DraftVerify takes target.
	Fuses(target Engine) bool
	// DraftVerify is DraftVerify's work (below) for a target it fuses.
	DraftVerify(ctx context.Context, target Engine, steps []ChainStep, n int) ([][]Token, error)
}

// SpecChainer is a Fuser that chains speculative steps on its device:
// each step's verdict — how many drafts the target accepts (greedy: its
// greedy tokens agree with; sampled: speculative sampling's rule with the
// step's draws) and the target's own token after them — is computed there
// and the next step drafts and verifies from it, so that the host records
// step j + 1 while the device runs step j and reads every step back once.
type SpecChainer interface {
	Fuser
	// DraftVerifyN runs up to m steps: the first is DraftVerify's over
	// steps (chains, every step taking all n drafts, each Verify entry
	// feeding one pending token: the last one emitted; greedy, or sampled
	// with Keys for the steps after the first), each after it
	// drafting n tokens after the accepted drafts and the target's token
	// of the step before, and verifying them. Where the batch does not
	// chain on the device (its shape, top tokens, room in a pass or in the
	// caches) it runs one step. It returns each step's
	// drafts and rows; on return both caches hold what they would after
	// the last step's DraftVerify alone: the context through that step's
	// first verified token, then its drafts (the target all n, the
	// drafter the first n − 1) — accepting the last step cuts them back
	// as after DraftVerify. The Verify entries are left as they were. On
	// an error every sequence is as it was before the call.
	DraftVerifyN(ctx context.Context, target Engine, steps []ChainStep, n, m int) ([]ChainedStep, error)
}

// ChainedStep is one step of a SpecChainer's chain: for each entry of the
// batch, the n drafted tokens and the target's n + 1 rows over them (the
// greedy token, its log-probability and the log-sum-exp; a sampled row's
// acceptance and draw too), and how many of the drafts the device
// accepted.
type ChainedStep struct {
	Drafts   [][]Token
	Rows     [][]VerifyRow
	Accepted []int
}

// A TreeStep is one generation's part of a speculative step drafted as a
// token tree and verified in one submission (TreeFuser): EAGLE-2's dynamic
// tree, Width children a node (its most likely tokens), Depth drafter
// passes, the Nodes best-scored nodes verified — scored by the path's
// summed log-probability under the drafter.
type TreeStep struct {
	// Draft is the drafter's entry: its pending tokens, a line (TopN is
	// the tree's Width).
	Draft *Entry
	// Verify is the target's entry, its Tokens the target's pending
	// tokens, a line, greedy. On return the verified nodes follow them,
	// parents first (Tokens, Parents), and Rows hold the read-out of the
	// last pending token and of each verified node.
	Verify              *VerifyEntry
	Width, Depth, Nodes int
	// Tree is set on return: every node the drafter explored.
	Tree []TreeNode
}

// TreeNode is a node of a tree drafted by a TreeFuser.
type TreeNode struct {
	Token          // the drafter's token and its log-probability
	Parent int     // the parent's index in the tree; −1 for a child of the root (the context's last token)
	Depth  int     // 1 for a child of the root
	Score  float64 // the path's summed log-probability
	// DraftSlot is the node's slot in the drafter's cache (−1: not fed: its
	// children were not drafted); Row its index among the verified nodes
	// (−1: not verified).
	DraftSlot, Row int
}

// TreeFuser is a drafter that drafts token trees level by level and has a
// target verify them in one submission on one device: each level's
// frontier — the best-scored nodes of the level before — chosen and fed
// to the next drafter pass on the device, the verified nodes chosen there
// too, the drafted tokens never coming back to the host between passes.
type TreeFuser interface {
	// FusesTree reports whether DraftVerifyTree takes target and steps
	// (their shapes, and their rows within a pass of each model).
	FusesTree(target Engine, steps []TreeStep) bool
	// DraftVerifyTree drafts and verifies steps (TreeStep); both caches
	// then hold the pending tokens and the tree: the drafter's the nodes
	// it fed, the target's the verified ones. On an error every sequence
	// is as it was before the call.
	DraftVerifyTree(ctx context.Context, target Engine, steps []TreeStep) error
}

// DraftVerify drafts n greedy tokens for each step (StepN over the steps'
// Draft entries) and verifies the first Take of each with the target
// (Verify over their Verify entries, the drafted tokens appended): in one
// submission when the drafter fuses the target (Fuser), else as the two
// calls. It returns each step's n drafted tokens. On an error every
// sequence is as it was before the call.
func DraftVerify(ctx context.Context, drafter, target Engine, steps []ChainStep, n int) ([][]Token, error) {
	if n <= 0 {
		return nil, fmt.Errorf("draft and verify: n = %d, want > 0", n)
	}
	for i, s := range steps {
		switch v := s.Verify; {
		case s.Draft == nil || v == nil:
			return nil, fmt.Errorf("draft and verify: step %d: no drafter or target entry", i)
		case s.Take < 0 || s.Take > n:
			return nil, fmt.Errorf("draft and verify: step %d: takes %d of %d drafted tokens", i, s.Take, n)
		case v.Out != s.Take+1:
			return nil, fmt.Errorf("draft and verify: step %d: reads out %d rows, want %d (the draft's and one)", i, v.Out, s.Take+1)
		case s.Draft.Parents != nil || v.Parents != nil || v.Propose != nil || v.Tree != nil:
			return nil, fmt.Errorf("draft and verify: step %d: chains only (no tree nodes or sampled drafts)", i)
		case v.Draws != nil && len(v.Draws) != v.Out:
			return nil, fmt.Errorf("draft and verify: step %d: %d draws for %d rows", i, len(v.Draws), v.Out)
		}
	}
	if f, ok := drafter.(Fuser); ok && f.Fuses(target) {
		return f.DraftVerify(ctx, target, steps, n)
	}
	batch := make([]*Entry, len(steps))
	lens := make([]int, len(steps))
	for i, s := range steps {
		batch[i], lens[i] = s.Draft, s.Draft.Seq.Len()
	}
	out, err := StepN(ctx, drafter, batch, n)
	if err == nil {
		verify := make([]*VerifyEntry, len(steps))
		for i, s := range steps {
			verify[i] = s.Verify
			AppendDraft(s.Verify, out[i][:s.Take])
		}
		if err = target.Verify(ctx, verify); err != nil {
			for _, s := range steps {
				s.Verify.Tokens = s.Verify.Tokens[:len(s.Verify.Tokens)-s.Take]
			}
		}
	}
	if err != nil {
		for i, s := range steps {
			s.Draft.Seq.Truncate(min(lens[i], s.Draft.Seq.Len()))
		}
		return nil, err
	}
	return out, nil
}

// AppendDraft appends a drafted chain to a verification entry's tokens and,
// where it samples, sets the chain's tokens as its draws' proposals.
func AppendDraft(v *VerifyEntry, draft []Token) {
	v.Tokens = slices.Clip(v.Tokens) // never into a caller's spare capacity
	for j, t := range draft {
		v.Tokens = append(v.Tokens, t.ID)
		if v.Draws != nil {
			v.Draws[j].X = t.ID
		}
	}
}

// Draft feeds tokens to seq and returns the n greedy tokens that follow; the
// cache then holds tokens and the first n-1 drafted ones.
func Draft(ctx context.Context, e Engine, seq Sequence, tokens []int, n int) ([]Token, error) {
	if n <= 0 {
		return nil, fmt.Errorf("draft: n = %d, want > 0", n)
	}
	out, err := StepN(ctx, e, []*Entry{{Seq: seq, Tokens: tokens}}, n)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// KVBytesPerToken is the KV-cache memory of one position: keys and values of
// every layer, elemBytes each.
func KVBytesPerToken(c *qwen3.Config, elemBytes int) int {
	return 2 * c.NumHiddenLayers * c.KVDim() * elemBytes
}

// A Preparer does ahead of any request the one-time work that passes of
// some shapes would otherwise do the first time they meet it: a WebGPU
// engine builds the pipelines of every row count a pass may have and every
// context length its attention may see, where a driver compiling one
// mid-generation stalls that step (tens of milliseconds on a GPU, each).
type Preparer interface {
	Prepare(ctx context.Context) error
}

// Prepare runs e's Prepare where e is a Preparer; other engines have
// nothing to prepare.
func Prepare(ctx context.Context, e Engine) error {
	if p, ok := e.(Preparer); ok {
		return p.Prepare(ctx)
	}
	return nil
}

// Warm runs a short draft on a scratch sequence, so that an engine's
// one-time work (compiling GPU pipelines, first allocations) is done before
// the first request rather than during it.
func Warm(ctx context.Context, e Engine) error {
	seq, err := e.NewSequence()
	if err != nil {
		return err
	}
	defer seq.Release()
	_, err = Draft(ctx, e, seq, []int{0, 0, 0}, 2)
	return err
}
