package scheduler

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"webdraft/checkpoint"
	"webdraft/engine"
)

// newEngine returns the CPU engine over the untied golden model (vocab 1024).
func newEngine(t *testing.T) engine.Engine {
	t.Helper()
	m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", "untied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := engine.NewReference(m.Config, m.Weights, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// start runs a scheduler until the test ends.
func start(t *testing.T, e engine.Engine, opts Options) *Scheduler {
	t.Helper()
	s := New(e, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// alone drafts with a fresh sequence, no scheduler.
func alone(t *testing.T, e engine.Engine, tokens []int, n int) []int {
	t.Helper()
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	out, err := engine.Draft(context.Background(), e, seq, tokens, n)
	if err != nil {
		t.Fatal(err)
	}
	return engine.IDs(out)
}

func randTokens(rng *rand.Rand, n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = rng.IntN(1024)
	}
	return p
}

// TestConcurrentEqualsSequential: N concurrent requests (prompts of mixed
// lengths, prefilled in chunks alongside others' decoding) give exactly the
// drafts N sequential ones give.
func TestConcurrentEqualsSequential(t *testing.T) {
	e := newEngine(t)
	var batches []StepStats
	var mu sync.Mutex
	s := start(t, e, Options{PrefillChunk: 16, PrefillBudget: 40, OnStep: func(st StepStats) {
		mu.Lock()
		batches = append(batches, st)
		mu.Unlock()
	}})
	rng := rand.New(rand.NewPCG(1, 1))
	const n = 12
	prompts := make([][]int, n)
	for i := range prompts {
		prompts[i] = randTokens(rng, 1+rng.IntN(70))
	}
	got := make([][]int, n)
	var wg sync.WaitGroup
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Submit(context.Background(), Request{Tokens: prompts[i], N: 8})
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = res.Draft
		}()
	}
	wg.Wait()
	for i, p := range prompts {
		if want := alone(t, e, p, 8); !slices.Equal(got[i], want) {
			t.Errorf("request %d: concurrent %v, sequential %v", i, got[i], want)
		}
	}
	maxBatch := 0
	for _, b := range batches {
		maxBatch = max(maxBatch, b.Sequences)
		if b.Tokens-b.Sequences > 40 {
			t.Errorf("a pass fed %d tokens for %d sequences: over the prefill budget", b.Tokens, b.Sequences)
		}
	}
	if maxBatch < 2 {
		t.Errorf("no pass batched more than one sequence (%d passes)", len(batches))
	}
}

// TestPrefixCache: a verifier's next call (previous tokens + accepted draft +
// its own token) reuses the cache; a call diverging mid-way reuses the shared
// part; results always equal a fresh computation.
func TestPrefixCache(t *testing.T) {
	e := newEngine(t)
	s := start(t, e, Options{})
	rng := rand.New(rand.NewPCG(2, 2))
	prompt := randTokens(rng, 50)
	first, err := s.Submit(context.Background(), Request{Tokens: prompt, N: 16})
	if err != nil {
		t.Fatal(err)
	}
	if first.CachedTokens != 0 || first.PrefillTokens != 50 {
		t.Errorf("first call: cached %d prefill %d", first.CachedTokens, first.PrefillTokens)
	}
	// Accept 5 draft tokens, then the target's own token.
	next := append(append(slices.Clone(prompt), first.Draft[:5]...), 7)
	res, err := s.Submit(context.Background(), Request{Tokens: next, N: 16})
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 55 || res.PrefillTokens != 1 {
		t.Errorf("extension: cached %d prefill %d, want 55 and 1", res.CachedTokens, res.PrefillTokens)
	}
	if want := alone(t, e, next, 16); !slices.Equal(res.Draft, want) {
		t.Errorf("extension drafted %v, fresh %v", res.Draft, want)
	}
	// Diverge in the middle of the cached tokens.
	diverged := append(slices.Clone(prompt[:30]), 1, 2, 3)
	res, err = s.Submit(context.Background(), Request{Tokens: diverged, N: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 30 || res.PrefillTokens != 3 {
		t.Errorf("divergence: cached %d prefill %d, want 30 and 3", res.CachedTokens, res.PrefillTokens)
	}
	if want := alone(t, e, diverged, 4); !slices.Equal(res.Draft, want) {
		t.Errorf("divergence drafted %v, fresh %v", res.Draft, want)
	}
	// The same request again: everything but the last token is reused.
	res, err = s.Submit(context.Background(), Request{Tokens: diverged, N: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 32 || !slices.Equal(res.Draft, alone(t, e, diverged, 4)) {
		t.Errorf("repeat: cached %d draft %v", res.CachedTokens, res.Draft)
	}
}

func TestEviction(t *testing.T) {
	e := newEngine(t)
	s := start(t, e, Options{CacheTokens: 100})
	rng := rand.New(rand.NewPCG(3, 3))
	a := randTokens(rng, 40)
	for _, p := range [][]int{a, randTokens(rng, 40), randTokens(rng, 40)} {
		if _, err := s.Submit(context.Background(), Request{Tokens: p, N: 4}); err != nil {
			t.Fatal(err)
		}
	}
	if g := idle(t, s); g.CachedTokens > 100 || g.CachedSequences != 2 {
		t.Errorf("gauges %+v: want 2 sequences within 100 tokens", g)
	}
	res, err := s.Submit(context.Background(), Request{Tokens: append(a, 1), N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 0 {
		t.Errorf("the least recently used sequence was not evicted: %d tokens reused", res.CachedTokens)
	}
	if _, err := s.Submit(context.Background(), Request{Tokens: randTokens(rng, 99), N: 4}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the KV budget: %v", err)
	}
	if _, err := s.Submit(context.Background(), Request{Tokens: randTokens(rng, 10), N: 600}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("past max_position_embeddings: %v", err)
	}
}

// idle returns s's gauges once they show nothing running: the scheduler
// publishes them after the step in which a request it answered ends.
func idle(t *testing.T, s *Scheduler) Gauges {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := s.Gauges()
		if g.Running == 0 && g.Waiting == 0 || time.Now().After(deadline) {
			return g
		}
		time.Sleep(time.Millisecond)
	}
}

// slowEngine delays every pass, to fill queues.
type slowEngine struct {
	engine.Engine
	delay time.Duration
}

func (s slowEngine) Step(ctx context.Context, b []*engine.Entry) error {
	time.Sleep(s.delay)
	return s.Engine.Step(ctx, b)
}

func TestOverloadAndShutdown(t *testing.T) {
	e := slowEngine{newEngine(t), 20 * time.Millisecond}
	s := New(e, Options{MaxBatch: 1, MaxQueue: 2})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()

	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := s.Submit(context.Background(), Request{Tokens: []int{1, 2, 3}, N: 20})
			errs <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	stop()
	<-done
	var overloaded, closed, ok int
	for range 8 {
		switch err := <-errs; {
		case errors.Is(err, ErrOverloaded):
			overloaded++
		case errors.Is(err, ErrClosed):
			closed++
		case err == nil:
			ok++
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if overloaded == 0 || closed == 0 {
		t.Errorf("overloaded %d, closed %d, ok %d: want some of the first two", overloaded, closed, ok)
	}
	if _, err := s.Submit(context.Background(), Request{Tokens: []int{1}, N: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("after shutdown: %v", err)
	}
}

func TestClientGoesAway(t *testing.T) {
	e := slowEngine{newEngine(t), 5 * time.Millisecond}
	s := start(t, e, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Submit(ctx, Request{Tokens: []int{1, 2, 3}, N: 64}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	// The scheduler keeps serving, and cached what the abandoned request computed.
	res, err := s.Submit(context.Background(), Request{Tokens: []int{1, 2, 3, 4}, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 3 {
		t.Errorf("cached %d tokens from the abandoned request, want 3", res.CachedTokens)
	}
}
