// Package speculative generates text by speculative decoding, a drafter
// and a target engine in one process, with continuous batching.
//
// Each step, every running generation's drafter drafts up to k tokens
// (chained on the device, all generations in one drafter pass), and the
// target checks them in one pass over all generations (engine.Verify),
// which reads out k+1 rows each. A greedy generation keeps the longest
// prefix of the draft equal to the target's argmax plus the target's own
// token there (its correction, or the bonus token when all k matched): the
// output is token for token the target's greedy output. A sampled one
// keeps draft token x with probability p(x) — the drafter proposes its
// greedy token, so min(1, p/q) is p(x) — and on a rejection draws from p
// with x left out (norm(max(0, p − q))): the output follows the target's
// distribution. Both KV caches then roll back past the rejected tokens.
// Prompts are prefilled in chunks between others' steps; new generations
// join between steps; finished ones leave both sequences to prefix caches,
// so that a conversation's next turn prefills only what is new.
//
// A generation may also be drafted elsewhere (Request.Remote: edge
// drafting, the browser's drafter over a websocket): it then asks for each
// step's draft without blocking, and joins the target's pass once the
// draft has come, while the others step on.
package speculative

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"webdraft/engine"
	"webdraft/internal/jobqueue"
	"webdraft/sampling"
)

// Options tune the loop; zero values take the defaults.
type Options struct {
	K int // draft tokens per step unless a request says (default 8)
	// TopK and TreeNodes shape token trees unless a request says: TopK
	// children a node (default 1: a chain), TreeNodes nodes verified
	// (default DefaultTreeNodes).
	TopK, TreeNodes int
	MaxBatch        int // generations stepped together (default 64)
	PrefillChunk    int // prompt tokens of one generation per pass (default 256)
	PrefillBudget   int // prompt tokens of all generations per pass (default 1024)
	MaxQueue        int // requests waiting to start before Submit refuses (default 256)
	// DraftTokens and TargetTokens are the KV budgets in positions, for
	// running and cached sequences together (default and maximum: each
	// engine's KVCapacity; less where another user shares the engine).
	DraftTokens, TargetTokens int
	// Unfused keeps a chain's drafting and its verification in separate
	// calls even where the drafter fuses the target (engine.Fuser): the
	// round trips fusion saves, for measuring it. A keyed generation's
	// drafter then drafts its coupled draws through engine.SampleN
	// (engine.DraftsCoupled), or else its greedy tokens, which keyed rows
	// accept as the greedy rule does.
	Unfused bool
	// Unchained runs every step as a call of its own even where the
	// engines chain them on the device — fused steps (engine.SpecChainer),
	// the target alone's (engine.Chainer, engine.SampleChainer) —: the
	// round trips a chain saves, for measuring it.
	Unchained bool
	// Uncoupled leaves sampled generations unkeyed (Generator.Keyed), for
	// measuring what coupling gains: each row draws by the standard rule
	// from the generation's seeded stream, a drafter that samples its
	// drafts one a pass (engine.SampledPair) proposes draws from its own
	// distribution held to the multi-draft rule, any other its greedy
	// tokens; its steps do not chain on the device (which keys rows by
	// their positions), and a seed's tokens then depend on the drafts.
	Uncoupled bool
	// OnStep, when set, is called after every step (for metrics).
	OnStep func(StepStats)
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.K, 8)
	def(&o.TopK, 1)
	def(&o.TreeNodes, DefaultTreeNodes)
	def(&o.MaxBatch, 64)
	def(&o.PrefillChunk, 256)
	def(&o.PrefillBudget, 1024)
	def(&o.MaxQueue, 256)
}

// MaxK bounds a request's draft length.
const MaxK = 64

// NoDraft as Request.K runs the target alone, one token a pass — greedy
// generations over a target that chains its steps on its device
// (engine.Chainer) several tokens a read-back: the baseline speculation
// is measured against.
const NoDraft = -1

// Request asks for up to MaxTokens tokens after Prompt.
type Request struct {
	Prompt    []int
	MaxTokens int
	// K is the draft length: 0 takes Options.K, NoDraft the target alone.
	// With a tree it is the tree's depth.
	K int
	// TopK above 1 drafts a token tree (see tree.go): each node's TopK
	// most likely children (a keyed generation's: its coupled draw and the
	// likeliest others under the same key), TreeNodes nodes verified; 0
	// takes Options'. With Options.Uncoupled a sampled tree draws TopK
	// children from the drafter's distribution, which needs engines whose
	// drafts can be sampled (engine.SampledPair), else it drafts a chain;
	// remote drafts are chains, and so are those of an EAGLE-3 head that
	// drafts no trees (engine.DraftsTrees).
	TopK, TreeNodes int
	// PMin, above 0, ends a draft early before the first token the drafter
	// gives a probability below it (llama.cpp's --draft-p-min).
	PMin float64
	// Sampling is how tokens are chosen: greedy at temperature 0, else
	// drawn with Seed (the same seed gives the same output).
	Sampling sampling.Params
	Seed     uint64
	TopN     int // the most likely tokens listed with each token, 0 … engine.MaxTopN
	// DraftTopN lists the drafter's most likely tokens with each draft
	// token too (0 … engine.MaxTopN), for a page to show.
	DraftTopN int
	Stop      []int // tokens that end the generation (end of text), not emitted
	// Fresh computes the whole prompt, reusing no cached prefix (a race
	// against another run of the same prompt stays fair).
	Fresh bool
	// Remote, when set, drafts this generation instead of the drafter
	// (edge drafting: see Remote); one Remote serves one generation. PMin
	// and DraftTopN do not apply to it.
	Remote *Remote
	// OnStep, when set, gets each step's outcome as it happens, from the
	// loop's goroutine (it must not block). Returning false ends the
	// generation after that step (a stop string the caller found).
	OnStep func(Step) bool
	// Adaptive lets the loop run the target alone where the generation's
	// speculation is measured not to pay: after a few speculative steps,
	// the tokens a step they emitted against what a speculative step and a
	// token of the target alone take at the batch's size (the loop measures
	// the latter first where it has not); alone, it speculates again every
	// 256 tokens to be weighed anew. A keyed generation's tokens
	// (Generator.Keyed) do not depend on it; an unkeyed one's
	// (Options.Uncoupled) rest on the timings, so its seed replays them
	// only where the choice falls the same way.
	Adaptive bool
}

// Token is a generated token.
type Token struct {
	ID      int
	Logprob float32 // log p under the target (softmax at temperature 1)
	Top     []sampling.TokenLogprob
	Drafted bool // a draft token the target accepted (else the target's own)
}

// Step is what one verification gave a generation.
type Step struct {
	// Draft is the drafter's proposal (with DraftTopN, its alternatives);
	// for a tree, the accepted path and the drafter's best continuation
	// below it among the verified nodes.
	Draft    []engine.Token
	Accepted int // how many of it the target kept
	// Tree is every node a tree step's drafter explored (nil for a chain),
	// parents before children.
	Tree   []DraftNode
	Tokens []Token // emitted: the accepted draft tokens and the target's own, cut at a stop token or MaxTokens
	// The step's drafter passes and target pass, shared by every
	// generation in them; with a Remote, DraftTime is the remote's own
	// time on the draft and NetworkTime the rest of its round trip.
	DraftTime, VerifyTime time.Duration
	// Fused: the step drafted and verified in one submission (StepStats.
	// Fused): VerifyTime is the whole of it, DraftTime zero.
	Fused bool
	// Chained: the step ran in a chain of fused steps on the device, read
	// back together (StepStats.Chained): VerifyTime is its share.
	Chained     bool
	Remote      bool // drafted by Request.Remote
	NetworkTime time.Duration
}

// Finish reasons.
const (
	FinishLength = "length" // MaxTokens, or the models' context, reached
	FinishStop   = "stop"   // a stop token, or OnStep said so
)

// Result is a finished generation.
type Result struct {
	Tokens []Token
	Finish string
	Stats  Stats
}

// Stats count a generation's speculation.
type Stats struct {
	PromptTokens int
	CachedTokens int // prompt positions the target reused from its prefix cache
	Steps        int // verification steps (target passes that emitted tokens)
	Tokens       int // tokens emitted
	Drafted      int // draft tokens proposed (a tree's: the nodes verified)
	Accepted     int // draft tokens accepted
	// AcceptedAt[i] counts the steps that accepted draft position i.
	AcceptedAt []int
	Queue      time.Duration
	Prefill    time.Duration // from start to the first token
	Decode     time.Duration // the rest
	// Alone: the generation (Request.Adaptive) ran the target alone for a
	// while, its speculation measured not to pay.
	Alone bool
}

// Tau is the mean acceptance length: tokens emitted per verification step
// (1 + the draft tokens accepted, but where a stop cut the step short).
func (s Stats) Tau() float64 {
	if s.Steps == 0 {
		return 0
	}
	return float64(s.Tokens) / float64(s.Steps)
}

// StepStats describe one step over all running generations.
type StepStats struct {
	Sequences   int           // generations stepped
	Drafts      int           // of them with a draft
	DraftTokens int           // tokens drafted
	Accepted    int           // draft tokens accepted
	AcceptedAt  []int         // by draft position
	Emitted     int           // tokens generated
	Draft       time.Duration // the drafter's passes
	Verify      time.Duration // the target's pass
	// Fused: the drafter's passes and the target's ran as one submission
	// (engine.DraftVerify); Verify is their time, and Draft zero.
	Fused bool
	// Chained: the step ran in a chain of fused steps, each accepted and
	// the next planned on the device, read back once (engine.SpecChainer);
	// Verify is its share of the chain's time.
	Chained bool
}

var (
	// ErrOverloaded: the queue is full; try again shortly.
	ErrOverloaded = jobqueue.ErrFull
	// ErrTooLarge: the request cannot fit the models' context or KV caches.
	ErrTooLarge = errors.New("request too large")
	// ErrClosed: the loop has stopped.
	ErrClosed = jobqueue.ErrStopped
)

// Generator owns a drafter and a target engine and their prefix caches.
// Submit may be called from any goroutine; Run drives both engines from
// one.
type Generator struct {
	drafter, target engine.Engine
	// head: the drafter reads the target's features (engine.Head, an
	// EAGLE-3 head): a generation's target feeds its prompt before the
	// head's first draft.
	head  bool
	opts  Options
	queue *jobqueue.Queue[*job]
	// The KV budgets in positions (Options.DraftTokens, TargetTokens).
	draftBudget, targetBudget int

	running atomic.Int64
	// The positions running generations reserve in each KV cache (the
	// loop's, published for Gauges).
	targetReserved, draftReserved atomic.Int64
	// wake, of capacity 1, wakes a loop that waits for remote drafts (an
	// answer came, a client left).
	wake chan struct{}
	// forget asks the loop to forget what steps took (ForgetTimings).
	forget atomic.Bool
}

// ForgetTimings makes the loop forget, before its next step, what its
// steps took so far: the times an adaptive generation weighs its
// speculation by (Request.Adaptive) and those that size the chains. A
// warm-up's steps, which built the GPU's pipelines, say nothing of what
// the steps after it take; kept, a stall of the target alone's first
// steps would make the target alone look slow at that batch size until
// it ran alone there again, which an adaptive generation, judging by it,
// would not do.
func (g *Generator) ForgetTimings() { g.forget.Store(true) }

// poke wakes the loop if it waits, without blocking.
func (g *Generator) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// New pairs drafter and target, which must share a vocabulary.
func New(drafter, target engine.Engine, opts Options) (*Generator, error) {
	opts.defaults()
	if opts.K > MaxK {
		return nil, fmt.Errorf("speculative: k %d: want 1…%d", opts.K, MaxK)
	}
	if opts.TopK > MaxTopK || opts.TreeNodes > MaxTreeNodes {
		return nil, fmt.Errorf("speculative: top k %d, tree nodes %d: want 1…%d and 1…%d", opts.TopK, opts.TreeNodes, MaxTopK, MaxTreeNodes)
	}
	if d, t := drafter.Config().VocabSize, target.Config().VocabSize; d != t {
		return nil, fmt.Errorf("speculative: the drafter's vocabulary has %d tokens, the target's %d", d, t)
	}
	head := engine.ReadsTarget(drafter)
	if head != nil && head != target {
		return nil, errors.New("speculative: the drafter is an EAGLE-3 head of another target engine")
	}
	budget := func(want, capacity int) int {
		if want <= 0 || want > capacity {
			return capacity
		}
		return want
	}
	return &Generator{
		drafter: drafter, target: target, head: head != nil, opts: opts,
		queue: jobqueue.New[*job](opts.MaxQueue), wake: make(chan struct{}, 1),
		draftBudget: budget(opts.DraftTokens, drafter.KVCapacity()), targetBudget: budget(opts.TargetTokens, target.KVCapacity()),
	}, nil
}

// K is the default draft length.
func (g *Generator) K() int { return g.opts.K }

// TopK and TreeNodes are the default tree shape (TopK 1: a chain).
func (g *Generator) TopK() int { return g.opts.TopK }

func (g *Generator) TreeNodes() int { return g.opts.TreeNodes }

// Gauges are the loop's current state, for metrics.
type Gauges struct {
	Waiting, Running int64
	// The KV positions running generations reserve in the target's and
	// the drafter's cache, and the budgets they stay within.
	TargetReserved, DraftReserved int64
	TargetBudget, DraftBudget     int64
}

// Gauges reads the current state (safe from any goroutine).
func (g *Generator) Gauges() Gauges {
	return Gauges{Waiting: g.queue.Waiting(), Running: g.running.Load(),
		TargetReserved: g.targetReserved.Load(), DraftReserved: g.draftReserved.Load(),
		TargetBudget: int64(g.targetBudget), DraftBudget: int64(g.draftBudget)}
}

// k is the draft length r asks for.
func (g *Generator) k(r *Request) int {
	switch {
	case r.K == NoDraft:
		return 0
	case r.K == 0:
		return g.opts.K
	}
	return r.K
}

// topK is the tree width r asks for (1: a chain); a head that drafts no
// trees (engine.DraftsTrees) drafts chains.
func (g *Generator) topK(r *Request) int {
	if g.head && !engine.DraftsTrees(g.drafter) {
		return 1
	}
	if r.TopK == 0 {
		return g.opts.TopK
	}
	return r.TopK
}

// Keyed reports whether r, sampled, is keyed: each of its rows draws
// coupled under its seed's key of the position it decides
// (sampling.Keys), so that its tokens are the target alone's for that
// seed — with speculation or without, whatever drafts, chains or trees,
// however it is batched or chained. Only Options.Uncoupled's generations
// are not.
func (g *Generator) Keyed(r *Request) bool {
	return !r.Sampling.Greedy() && !g.opts.Uncoupled
}

// samplesTree reports whether r drafts an unkeyed sampled token tree
// (Options.Uncoupled): drafts drawn from the drafter's distribution and
// held to the multi-draft rule.
func (g *Generator) samplesTree(r *Request) bool {
	return g.opts.Uncoupled && g.k(r) > 0 && r.Remote == nil && !r.Sampling.Greedy() && g.topK(r) > 1 && engine.SampledPair(g.drafter, g.target)
}

// treeNodes is the node budget of r's trees.
func (g *Generator) treeNodes(r *Request) int {
	if r.TreeNodes == 0 {
		return g.opts.TreeNodes
	}
	return r.TreeNodes
}

// Check reports whether r could ever run: a clear error for bad
// parameters, ErrTooLarge when it cannot fit.
func (g *Generator) Check(r Request) error {
	tc := g.target.Config()
	switch {
	case len(r.Prompt) == 0:
		return errors.New("empty prompt")
	case r.MaxTokens < 1:
		return fmt.Errorf("max tokens %d: want at least 1", r.MaxTokens)
	case r.K < NoDraft || r.K > MaxK:
		return fmt.Errorf("k %d: want 0…%d", max(r.K, 0), MaxK)
	case math.IsNaN(r.PMin) || r.PMin < 0 || r.PMin > 1:
		return fmt.Errorf("p_min %v: want 0…1", r.PMin)
	case r.TopN < 0 || r.TopN > engine.MaxTopN || r.DraftTopN < 0 || r.DraftTopN > engine.MaxTopN:
		return fmt.Errorf("top %d, draft top %d: want 0…%d", r.TopN, r.DraftTopN, engine.MaxTopN)
	case r.TopK < 0 || r.TopK > MaxTopK:
		return fmt.Errorf("top k %d: want 0…%d", r.TopK, MaxTopK)
	case r.TreeNodes < 0 || r.TreeNodes > MaxTreeNodes:
		return fmt.Errorf("draft tokens %d: want 0…%d", r.TreeNodes, MaxTreeNodes)
	}
	if r.Remote != nil && r.K == NoDraft {
		return errors.New("a remote drafter with the target alone (k = NoDraft): nothing to draft")
	}
	if r.Remote != nil && r.Remote.features && g.featureWidth() == 0 {
		return errors.New("a remote EAGLE-3 head: the target keeps no features for it (serve an EAGLE-3 head over the target)")
	}
	if err := r.Sampling.Validate(); err != nil {
		return err
	}
	for i, t := range r.Prompt {
		if t < 0 || t >= tc.VocabSize {
			return fmt.Errorf("prompt token %d at index %d is outside the vocabulary [0, %d)", t, i, tc.VocabSize)
		}
	}
	if n := len(r.Prompt) + 1; n > tc.MaxPositionEmbeddings || n > g.drafter.Config().MaxPositionEmbeddings {
		return fmt.Errorf("%w: a prompt of %d tokens leaves no room in the models' context", ErrTooLarge, len(r.Prompt))
	}
	if need := g.need(&r); need > g.targetBudget || r.Remote == nil && need > g.draftBudget {
		return fmt.Errorf("%w: %d positions exceed the KV caches (%d target, %d drafter)", ErrTooLarge, need, g.targetBudget, g.draftBudget)
	}
	return nil
}

// ServesRemoteHeads reports whether a remote EAGLE-3 head may draft for
// the generator (NewHeadRemote): its target keeps the features heads read
// and reads them back.
func (g *Generator) ServesRemoteHeads() bool { return g.featureWidth() > 0 }

// featureWidth is the floats of a position's features the target keeps
// and reads back (engine.FeatureReader), 0 when none.
func (g *Generator) featureWidth() int {
	if f, ok := g.target.(engine.FeatureReader); ok {
		return f.FeatureWidth()
	}
	return 0
}

// targetFeatures reads positions from … to−1 of a target sequence's
// features back, and their width.
func (g *Generator) targetFeatures(seq engine.Sequence, from, to int) ([]float32, int, error) {
	f, ok := g.target.(engine.FeatureReader)
	if !ok || f.FeatureWidth() == 0 {
		return nil, 0, errors.New("the target keeps no features")
	}
	rows, err := f.Features(seq, from, to)
	return rows, f.FeatureWidth(), err
}

// need is the KV positions a generation may hold in each engine: its
// prompt, its tokens and a draft past them, within the models' context.
func (g *Generator) need(r *Request) int {
	n := len(r.Prompt) + r.MaxTokens + g.k(r)
	if g.k(r) > 0 && g.topK(r) > 1 {
		n = len(r.Prompt) + r.MaxTokens + max(g.k(r), g.treeNodes(r))
	}
	return min(n, g.target.Config().MaxPositionEmbeddings, g.drafter.Config().MaxPositionEmbeddings)
}

// Submit queues r and waits for its result, ctx's end, or the loop's.
func (g *Generator) Submit(ctx context.Context, r Request) (Result, error) {
	if err := g.Check(r); err != nil {
		return Result{}, err
	}
	j := &job{Ticket: jobqueue.NewTicket[Result](), req: r, k: g.k(&r), topK: g.topK(&r), nodes: g.treeNodes(&r), arrived: time.Now()}
	j.OnCancel(g.poke) // a loop waiting on remote drafts notices at once
	if err := g.queue.Push(j); err != nil {
		return Result{}, err
	}
	return j.Wait(ctx, g.queue.Stopped()) // a canceled job's OnStep is done with first
}

// job is a request in the loop.
type job struct {
	*jobqueue.Ticket[Result]
	req     Request
	k       int // draft length; 0: the target alone
	topK    int // tree width; 1: a chain
	nodes   int // a tree's node budget
	arrived time.Time
}
