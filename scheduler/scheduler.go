// Package scheduler runs drafting requests on an engine with continuous
// batching: the decode steps of all running requests share one forward pass,
// new requests join between passes, and long prompts are prefilled in chunks
// interleaved with everyone else's decoding. Finished sequences go to a prefix
// cache, so that a request extending an earlier one prefills only what is new.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"webdraft/engine"
	"webdraft/internal/jobqueue"
	"webdraft/prefixcache"
)

// Options tune the scheduler; zero values take the defaults.
type Options struct {
	MaxBatch      int // sequences in one forward pass (default 64)
	PrefillChunk  int // prompt tokens of one sequence per pass (default 256)
	PrefillBudget int // prompt tokens of all sequences per pass (default 1024)
	MaxQueue      int // requests waiting to start before Submit refuses (default 256)
	// ChainSteps is how many decode passes may run chained on the device
	// (engine.StepN) when every running request is decoding and none is
	// waiting: a new request then waits at most that many passes (default
	// 8; 1 turns chaining off).
	ChainSteps int
	// CacheTokens is the KV budget in positions, for running and cached
	// sequences together (default and maximum: the engine's KVCapacity).
	CacheTokens int
	// OnStep, when set, is called after every forward pass.
	OnStep func(StepStats)
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxBatch, 64)
	def(&o.PrefillChunk, 256)
	def(&o.PrefillBudget, 1024)
	def(&o.MaxQueue, 256)
	def(&o.ChainSteps, 8)
}

// StepStats describes one forward pass.
type StepStats struct {
	Sequences int // entries in the batch
	Tokens    int // tokens fed
	// Duration is the pass's time; chained passes share their time evenly.
	Duration time.Duration
}

// Request asks for the N greedy tokens that follow Tokens.
type Request struct {
	Tokens []int
	N      int
	// PMin, when above 0, ends the draft early before the first token the
	// drafter gives a probability below it (llama.cpp's --draft-p-min): the
	// draft then holds fewer than N tokens, perhaps none.
	PMin float64
}

// Result is a finished request.
type Result struct {
	Draft         []int
	CachedTokens  int // prompt positions reused from the prefix cache
	PrefillTokens int // prompt positions computed
	Queue         time.Duration
	Prefill       time.Duration // from start to the first drafted token
	Decode        time.Duration // the remaining N-1 tokens
}

var (
	// ErrOverloaded: the queue is full; try again shortly.
	ErrOverloaded = jobqueue.ErrFull
	// ErrTooLarge: the request cannot fit the model's context or the KV budget.
	ErrTooLarge = errors.New("request too large")
	// ErrClosed: the scheduler has stopped.
	ErrClosed = jobqueue.ErrStopped
)

// Scheduler owns an engine and its prefix cache. Submit may be called from
// any goroutine; Run drives the engine from one.
type Scheduler struct {
	eng   engine.Engine
	opts  Options
	queue *jobqueue.Queue[*job]

	// Read by metrics from other goroutines: one snapshot, published
	// whole after each pass, so that the cache and the reservations are
	// read as they stood together (a job retired moves its positions from
	// one to the other).
	gaugesMu sync.Mutex
	gauges   Gauges
}

// New returns a scheduler for eng; call Run to start it.
func New(eng engine.Engine, opts Options) *Scheduler {
	opts.defaults()
	if c := eng.KVCapacity(); opts.CacheTokens <= 0 || opts.CacheTokens > c {
		opts.CacheTokens = c
	}
	return &Scheduler{eng: eng, opts: opts, queue: jobqueue.New[*job](opts.MaxQueue)}
}

// Gauges are the scheduler's current state, for metrics.
type Gauges struct {
	Waiting, Running, CachedSequences, CachedTokens, ReservedTokens int64
}

// Gauges reads the current state (safe from any goroutine).
func (s *Scheduler) Gauges() Gauges {
	s.gaugesMu.Lock()
	g := s.gauges
	s.gaugesMu.Unlock()
	g.Waiting = s.queue.Waiting()
	return g
}

// CacheBudget is the KV budget in positions (Options.CacheTokens as
// granted): running and cached sequences together stay within it.
func (s *Scheduler) CacheBudget() int { return s.opts.CacheTokens }

// Check reports whether r could ever run: ErrTooLarge when its context
// exceeds the model's or the KV budget.
func (s *Scheduler) Check(r Request) error {
	cfg := s.eng.Config()
	need := len(r.Tokens) + r.N - 1
	switch {
	case len(r.Tokens) == 0 || r.N < 1:
		return fmt.Errorf("empty request")
	case need > cfg.MaxPositionEmbeddings:
		return fmt.Errorf("%w: %d context tokens + %d drafted exceed the model's %d positions", ErrTooLarge, len(r.Tokens), r.N, cfg.MaxPositionEmbeddings)
	case need > s.opts.CacheTokens:
		return fmt.Errorf("%w: %d positions exceed the KV-cache budget of %d", ErrTooLarge, need, s.opts.CacheTokens)
	}
	return nil
}

// Submit queues r and waits for its result, ctx's end, or the scheduler's.
func (s *Scheduler) Submit(ctx context.Context, r Request) (Result, error) {
	if err := s.Check(r); err != nil {
		return Result{}, err
	}
	j := &job{req: r, arrived: time.Now(), Ticket: jobqueue.NewTicket[Result]()}
	if err := s.queue.Push(j); err != nil {
		return Result{}, err
	}
	return j.Wait(ctx, s.queue.Stopped())
}

// job is a request in the scheduler.
type job struct {
	*jobqueue.Ticket[Result]
	req     Request
	arrived time.Time

	// Owned by Run.
	seq      engine.Sequence
	fed      []int // tokens in seq's KV cache
	pending  []int // prompt tokens still to prefill
	draft    []int
	reserved int // KV positions reserved: the final length of the sequence
	started  time.Time
	first    time.Time // when the first draft token came
}

// add appends drafted tokens to the draft, up to the first whose
// probability is below the request's PMin, and reports whether the draft is
// done: N tokens, or cut there.
func (j *job) add(tokens []engine.Token) bool {
	for _, t := range tokens {
		if j.req.PMin > 0 && math.Exp(float64(t.Logprob)) < j.req.PMin {
			return true
		}
		j.draft = append(j.draft, t.ID)
		if len(j.draft) == j.req.N {
			return true
		}
	}
	return false
}

// Run drives the engine until ctx ends or the engine faults; it then fails
// what is still queued or running and releases every sequence. After a
// fault (engine.ErrFault) it returns the fault, which every unfinished
// request gets too; when ctx is cancelled with a cause
// (context.WithCancelCause) they get the cause, else ErrClosed.
func (s *Scheduler) Run(ctx context.Context) (err error) {
	r := &runner{s: s, cache: prefixcache.New(s.opts.CacheTokens)}
	defer func() { r.shutdown(jobqueue.StopError(ctx, err)) }()
	for {
		if len(r.active) == 0 && len(r.waiting) == 0 {
			j, ok := s.queue.Next(ctx)
			if !ok {
				return nil
			}
			r.waiting = append(r.waiting, j)
		}
		if ctx.Err() != nil {
			return nil
		}
		r.waiting = s.queue.Drain(r.waiting)
		r.admit()
		if err := r.step(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, engine.ErrFault) {
				return err
			}
		}
		r.publish()
	}
}

// runner is Run's state.
type runner struct {
	s        *Scheduler
	cache    *prefixcache.Cache
	waiting  []*job
	active   []*job
	reserved int // Σ active jobs' reservations
}

// admit starts waiting jobs, oldest first, while the batch and the KV budget
// have room; cached sequences are evicted to make room.
func (r *runner) admit() {
	budget := r.s.opts.CacheTokens
	for len(r.waiting) > 0 && len(r.active) < r.s.opts.MaxBatch {
		j := r.waiting[0]
		if j.Canceled() {
			r.waiting = r.waiting[1:]
			r.s.queue.Started()
			j.Finish(context.Canceled)
			continue
		}
		need := len(j.req.Tokens) + j.req.N - 1
		if r.reserved+need > budget {
			return // wait for running jobs to finish
		}
		entry, shared := r.cache.Take(j.req.Tokens)
		// Leave at least one prompt token to feed: its logits give the first draft.
		shared = min(shared, len(j.req.Tokens)-1)
		r.cache.Shrink(budget - r.reserved - need) // evict idle sequences to make room
		var seq engine.Sequence
		if entry != nil && shared > 0 {
			seq = entry.Seq
			seq.Truncate(shared)
		} else {
			if entry != nil {
				entry.Seq.Release()
			}
			shared = 0
			var err error
			if seq, err = r.newSequence(); err != nil {
				r.waiting = r.waiting[1:]
				r.s.queue.Started()
				j.Finish(fmt.Errorf("new sequence: %w", err))
				continue
			}
		}
		r.waiting = r.waiting[1:]
		r.s.queue.Started()
		j.seq, j.started = seq, time.Now()
		j.fed = append([]int(nil), j.req.Tokens[:shared]...)
		j.pending = j.req.Tokens[shared:]
		j.Result.CachedTokens, j.Result.PrefillTokens = shared, len(j.pending)
		j.Result.Queue = j.started.Sub(j.arrived)
		j.reserved = need
		r.reserved += need
		r.active = append(r.active, j)
	}
}

// newSequence asks the engine for a sequence, evicting cached ones while
// the engine is out of sequence slots.
func (r *runner) newSequence() (engine.Sequence, error) {
	for {
		seq, err := r.s.eng.NewSequence()
		if !errors.Is(err, engine.ErrNoCapacity) || r.cache.Len() == 0 {
			return seq, err
		}
		r.cache.Shrink(r.cache.Tokens() - 1) // evicts at least the oldest entry
	}
}

// step runs one forward pass over the active jobs: one token for each
// decoding job, a chunk of prompt for prefilling ones within the budget.
// When every job is decoding and none waits, it chains several passes on
// the device instead (up to the fewest tokens a job still needs, at most
// ChainSteps).
func (r *runner) step(ctx context.Context) error {
	var batch []*engine.Entry
	var jobs []*job
	prefill := r.s.opts.PrefillBudget
	chain := r.s.opts.ChainSteps
	if len(r.waiting) > 0 || r.s.queue.Pending() {
		chain = 1
	}
	for _, j := range r.active {
		if j.Canceled() {
			continue
		}
		var tokens []int
		if len(j.pending) > 0 {
			n := min(len(j.pending), r.s.opts.PrefillChunk, prefill)
			if n == 0 {
				continue // over this pass's prefill budget: next pass
			}
			prefill -= n
			tokens = j.pending[:n]
			chain = 1
		} else {
			tokens = j.draft[len(j.draft)-1:]
			chain = min(chain, j.req.N-len(j.draft))
		}
		batch = append(batch, &engine.Entry{Seq: j.seq, Tokens: tokens})
		jobs = append(jobs, j)
	}
	var err error
	var chained [][]engine.Token // each entry's greedy tokens, chain > 1
	if len(batch) > 0 {
		start := time.Now()
		if chain > 1 {
			chained, err = engine.StepN(ctx, r.s.eng, batch, chain)
		} else {
			chain, err = 1, r.s.eng.Step(ctx, batch)
		}
		if r.s.opts.OnStep != nil {
			tokens := 0
			for _, e := range batch {
				tokens += len(e.Tokens)
			}
			for range chain {
				r.s.opts.OnStep(StepStats{Sequences: len(batch), Tokens: tokens, Duration: time.Since(start) / time.Duration(chain)})
			}
		}
	}
	jobErr := err
	if err != nil {
		jobErr = fmt.Errorf("forward pass: %w", err)
		if ctx.Err() != nil {
			jobErr = jobqueue.StopError(ctx, nil)
		}
	}
	now := time.Now()
	for i, j := range jobs {
		if err != nil {
			r.retire(j, jobErr, false)
			continue
		}
		e := batch[i]
		j.fed = append(j.fed, e.Tokens...)
		var done bool
		if chained != nil { // decoding jobs only: fed the first chain-1 tokens
			j.fed = append(j.fed, engine.IDs(chained[i][:chain-1])...)
			done = j.add(chained[i])
		} else {
			if len(j.pending) > 0 {
				j.pending = j.pending[len(e.Tokens):]
				if len(j.pending) > 0 {
					continue // still prefilling: this pass's logits are not needed
				}
				j.first = now
			}
			done = j.add([]engine.Token{{ID: e.Next, Logprob: e.Logprob}})
		}
		if done {
			j.Result.Draft = append([]int{}, j.draft...) // [] for a draft p_min cut to nothing
			j.Result.Prefill = j.first.Sub(j.started)
			j.Result.Decode = now.Sub(j.first)
			r.retire(j, nil, true)
		}
	}
	// Jobs whose clients left keep what their KV cache holds for later reuse.
	for _, j := range r.active {
		if j.Canceled() {
			r.retire(j, context.Canceled, true)
		}
	}
	r.compact()
	return err
}

// retire ends a job; its sequence goes to the prefix cache when keep is set
// and it holds anything, else it is released.
func (r *runner) retire(j *job, err error, keep bool) {
	if j.seq == nil {
		return
	}
	r.reserved -= j.reserved
	if keep && len(j.fed) > 0 && j.seq.Len() == len(j.fed) {
		r.cache.Put(j.fed, j.seq)
	} else {
		j.seq.Release()
	}
	j.seq = nil
	j.Finish(err)
}

// compact drops retired jobs from the active list.
func (r *runner) compact() {
	kept := r.active[:0]
	for _, j := range r.active {
		if j.seq != nil {
			kept = append(kept, j)
		}
	}
	clear(r.active[len(kept):])
	r.active = kept
}

func (r *runner) publish() {
	g := Gauges{Running: int64(len(r.active)), CachedSequences: int64(r.cache.Len()),
		CachedTokens: int64(r.cache.Tokens()), ReservedTokens: int64(r.reserved)}
	r.s.gaugesMu.Lock()
	r.s.gauges = g
	r.s.gaugesMu.Unlock()
}

// shutdown fails everything still queued or running with err and frees
// every sequence.
func (r *runner) shutdown(err error) {
	r.s.queue.Stop()
	r.waiting = r.s.queue.Drain(r.waiting)
	for _, j := range r.waiting {
		j.Finish(err)
	}
	for _, j := range r.active {
		r.retire(j, err, false)
	}
	r.active, r.waiting = nil, nil
	r.cache.Clear()
	r.publish()
}
