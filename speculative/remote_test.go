package speculative_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/speculative"
)

// counted counts an engine's sequences not released (its own wrappers,
// unwrapped around each pass).
type counted struct {
	engine.Engine
	live atomic.Int64
}

type countedSeq struct {
	engine.Sequence
	c        *counted
	released bool
}

func (s *countedSeq) Release() {
	if !s.released {
		s.released = true
		s.c.live.Add(-1)
	}
	s.Sequence.Release()
}

func (c *counted) NewSequence() (engine.Sequence, error) {
	s, err := c.Engine.NewSequence()
	if err != nil {
		return nil, err
	}
	c.live.Add(1)
	return &countedSeq{Sequence: s, c: c}, nil
}

func (c *counted) Step(ctx context.Context, batch []*engine.Entry) error {
	outer := make([]engine.Sequence, len(batch))
	for i, e := range batch {
		outer[i], e.Seq = e.Seq, e.Seq.(*countedSeq).Sequence
	}
	defer func() {
		for i, e := range batch {
			e.Seq = outer[i]
		}
	}()
	return c.Engine.Step(ctx, batch)
}

func (c *counted) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	outer := make([]engine.Sequence, len(batch))
	for i, e := range batch {
		outer[i], e.Seq = e.Seq, e.Seq.(*countedSeq).Sequence
	}
	defer func() {
		for i, e := range batch {
			e.Seq = outer[i]
		}
	}()
	return c.Engine.Verify(ctx, batch)
}

// fakeEdge plays the browser: it keeps each generation's context from the
// asks and answers with draft(context, k), from a goroutine of its own
// after delay (or never, with draft nil).
type fakeEdge struct {
	t       *testing.T
	remote  *speculative.Remote
	context []int
	draft   func(context []int, k int) []int
	delay   time.Duration
	asks    []speculative.DraftAsk
	mu      sync.Mutex
}

func newFakeEdge(t *testing.T, timeout time.Duration, draft func([]int, int) []int) *fakeEdge {
	f := &fakeEdge{t: t, draft: draft}
	f.remote = speculative.NewRemote(f.ask, timeout)
	return f
}

func (f *fakeEdge) ask(a speculative.DraftAsk) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asks = append(f.asks, a)
	if a.Reset {
		f.context = nil
	}
	f.context = append(f.context, a.Tokens...)
	if f.draft == nil {
		return
	}
	ctx := slices.Clone(f.context)
	go func() {
		time.Sleep(f.delay)
		tokens := f.draft(ctx, a.K)
		if err := f.remote.Answer(speculative.DraftAnswer{ID: a.ID, Tokens: tokens, DraftTime: time.Millisecond}); err != nil {
			f.t.Errorf("answer %d: %v", a.ID, err)
		}
	}()
}

// nativeDrafter drafts as the browser's drafter does: greedy tokens after
// the context, on an engine of its own.
func nativeDrafter(t *testing.T, e engine.Engine) func([]int, int) []int {
	var mu sync.Mutex
	return func(context_ []int, k int) []int {
		mu.Lock()
		defer mu.Unlock()
		seq, err := e.NewSequence()
		if err != nil {
			t.Error(err)
			return nil
		}
		defer seq.Release()
		out, err := engine.Draft(context.Background(), e, seq, context_, k)
		if err != nil {
			t.Error(err)
			return nil
		}
		return engine.IDs(out)
	}
}

// TestRemoteDraft: a generation drafted remotely — by a stand-in for the
// browser drafting with the same drafter, or by one that drafts wrong,
// too long or outside the vocabulary — gives the target's greedy output,
// beside generations drafted locally; the asks carry the prompt first and
// then the tokens emitted since; a sampled generation drafted remotely
// with the same drafter equals the local one of the same seed.
func TestRemoteDraft(t *testing.T) {
	target := &counted{Engine: cpu(t, load(t, "untied", checkpoint.F32))}
	p := pair{"int4-self", target, cpu(t, load(t, "untied", checkpoint.Int4))}
	edgeEngine := cpu(t, load(t, "untied", checkpoint.Int4))
	g := start(t, p, speculative.Options{K: 4})
	ps, n := prompts(7, 4), 20
	native := nativeDrafter(t, edgeEngine)
	drafters := map[string]func([]int, int) []int{
		"native": native,
		"wrong":  func(c []int, k int) []int { return slices.Repeat([]int{(c[len(c)-1] + 1) % 1024}, k) },
		"vocab":  func(c []int, k int) []int { return append(native(c, k)[:k-1], 1024) },
		"short":  func(c []int, k int) []int { return native(c, k)[:1] },
		"none":   func([]int, int) []int { return []int{} },
		"neg":    func(c []int, k int) []int { return []int{-1} },
	}
	for name, draft := range drafters {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			for i, pr := range ps {
				want := greedy(t, p.target, pr, n)
				localStats := make(chan speculative.Stats, 1)
				wg.Add(2)
				go func() { // a local generation beside it
					defer wg.Done()
					res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n})
					if err != nil || !slices.Equal(ids(res.Tokens), want) {
						t.Errorf("prompt %d, local: %v %v, want %v", i, ids(res.Tokens), err, want)
					}
					localStats <- res.Stats
				}()
				go func() {
					defer wg.Done()
					f := newFakeEdge(t, 10*time.Second, draft)
					f.delay = time.Duration(i) * time.Millisecond
					steps := 0
					res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n, Remote: f.remote,
						OnStep: func(s speculative.Step) bool {
							steps++
							if !s.Remote || s.DraftTime > time.Millisecond || s.NetworkTime < 0 || len(s.Draft) > 0 && s.DraftTime == 0 {
								t.Errorf("a remote step: %+v", s)
							}
							return true
						}})
					if err != nil || !slices.Equal(ids(res.Tokens), want) {
						t.Errorf("prompt %d, remote %s: %v %v, want %v", i, name, ids(res.Tokens), err, want)
						return
					}
					f.mu.Lock()
					defer f.mu.Unlock()
					if len(f.asks) == 0 || !f.asks[0].Reset || !slices.Equal(f.asks[0].Tokens, pr) || f.asks[0].K != 4 {
						t.Errorf("prompt %d: the first ask %+v", i, f.asks[:min(1, len(f.asks))])
					}
					if got := slices.Concat(pr, ids(res.Tokens)); !slices.Equal(f.context, got[:len(f.context)]) || len(got)-len(f.context) > 5 {
						t.Errorf("prompt %d: the remote was sent %v, the context is %v", i, f.context, got)
					}
					// The same drafter drafts the same: the same speculation.
					if l := <-localStats; name == "native" && (res.Stats.Accepted != l.Accepted || res.Stats.Drafted != l.Drafted || res.Stats.Steps != l.Steps) {
						t.Errorf("prompt %d: %d of %d accepted in %d steps drafting remotely, %d of %d in %d locally", i,
							res.Stats.Accepted, res.Stats.Drafted, res.Stats.Steps, l.Accepted, l.Drafted, l.Steps)
					}
				}()
			}
			wg.Wait()
		})
	}

	sampled := speculative.Request{Prompt: ps[0], MaxTokens: n, Sampling: sampling.Params{Temperature: 0.8}, Seed: 3}
	local, err := g.Submit(context.Background(), sampled)
	if err != nil {
		t.Fatal(err)
	}
	sampled.Remote = newFakeEdge(t, 10*time.Second, native).remote
	remote, err := g.Submit(context.Background(), sampled)
	if err != nil || !slices.Equal(ids(local.Tokens), ids(remote.Tokens)) {
		t.Errorf("sampled: remote %v %v, local %v", ids(remote.Tokens), err, ids(local.Tokens))
	}
}

// TestRemoteFailures: a remote that never answers ends its generation
// after the timeout, one that closes at once, one that fails with its
// error, a client that leaves while it waits at once; the others go on,
// bad answers are refused, and no sequence is left behind.
func TestRemoteFailures(t *testing.T) {
	target := &counted{Engine: cpu(t, load(t, "untied", checkpoint.F32))}
	p := pair{"int4-self", target, cpu(t, load(t, "untied", checkpoint.Int4))}
	g, err := speculative.New(p.drafter, p.target, speculative.Options{K: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { g.Run(ctx); close(ran) }()
	defer func() { stop(); <-ran }()
	pr := []int{5, 6, 7, 8}
	fresh := func(r speculative.Request) speculative.Request { r.Fresh = true; return r }

	// Never answered: the timeout; a local generation goes on meanwhile.
	silent := newFakeEdge(t, 300*time.Millisecond, nil)
	begin := time.Now()
	done := make(chan error)
	go func() {
		_, err := g.Submit(context.Background(), fresh(speculative.Request{Prompt: pr, MaxTokens: 10, Remote: silent.remote}))
		done <- err
	}()
	if res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: 10}); err != nil || len(res.Tokens) != 10 {
		t.Errorf("a local generation beside a silent remote: %v %v", res, err)
	}
	if err := <-done; !errors.Is(err, speculative.ErrRemoteTimeout) || time.Since(begin) > 5*time.Second {
		t.Errorf("a silent remote: %v after %v", err, time.Since(begin))
	}
	// Bad answers to it, now: stale (it has ended), never asked.
	if err := silent.remote.Answer(speculative.DraftAnswer{ID: 1}); !errors.Is(err, speculative.ErrStaleDraft) {
		t.Errorf("an answer after the timeout: %v", err)
	}

	// Answers the loop refuses, then a good one.
	f := newFakeEdge(t, 10*time.Second, nil)
	go func() {
		_, err := g.Submit(context.Background(), fresh(speculative.Request{Prompt: pr, MaxTokens: 3, Remote: f.remote}))
		done <- err
	}()
	var ask speculative.DraftAsk
	for ok := false; !ok; ask, ok = f.remote.Pending() {
		time.Sleep(time.Millisecond)
	}
	for _, bad := range []struct {
		a    speculative.DraftAnswer
		want string
	}{
		{speculative.DraftAnswer{ID: ask.ID + 1}, "no such draft"},
		{speculative.DraftAnswer{ID: 0}, "no such draft"},
		{speculative.DraftAnswer{ID: ask.ID, Tokens: make([]int, ask.K+1)}, "more than"},
	} {
		if err := f.remote.Answer(bad.a); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("answer %+v: %v, want %q", bad.a, err, bad.want)
		}
	}
	if err := f.remote.Answer(speculative.DraftAnswer{ID: ask.ID, Tokens: []int{1}}); err != nil {
		t.Error(err)
	}
	if err := f.remote.Answer(speculative.DraftAnswer{ID: ask.ID, Tokens: []int{1}}); err == nil {
		t.Error("an answer twice")
	}
	go func() { // the later asks
		for {
			a, ok := f.remote.Pending()
			if ok && a.ID > ask.ID {
				if f.remote.Answer(speculative.DraftAnswer{ID: a.ID}) != nil {
					return
				}
				ask = a
			}
			time.Sleep(time.Millisecond)
		}
	}()
	if err := <-done; err != nil {
		t.Errorf("after refused answers: %v", err)
	}

	// Closed (the socket went), failed (the browser's GPU), and a client
	// that leaves: each ends at once, well before the timeout.
	for _, c := range []struct {
		name string
		end  func(*fakeEdge, context.CancelFunc)
		want error
	}{
		{"closed", func(f *fakeEdge, _ context.CancelFunc) { f.remote.Close(errClosed) }, errClosed},
		{"failed", func(f *fakeEdge, _ context.CancelFunc) {
			a, _ := f.remote.Pending()
			f.remote.Answer(speculative.DraftAnswer{ID: a.ID, Err: errClosed})
		}, errClosed},
		{"canceled", func(_ *fakeEdge, cancel context.CancelFunc) { cancel() }, context.Canceled},
	} {
		f := newFakeEdge(t, time.Minute, nil)
		held := target.live.Load()
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			_, err := g.Submit(ctx, fresh(speculative.Request{Prompt: pr, MaxTokens: 10, Remote: f.remote}))
			done <- err
		}()
		for _, ok := f.remote.Pending(); !ok; _, ok = f.remote.Pending() {
			time.Sleep(time.Millisecond)
		}
		begin := time.Now()
		c.end(f, cancel)
		if err := <-done; !errors.Is(err, c.want) || time.Since(begin) > 2*time.Second {
			t.Errorf("%s: %v after %v", c.name, err, time.Since(begin))
		}
		cancel()
		if n := target.live.Load(); n != held && c.want != context.Canceled { // a canceled one's goes to the prefix cache
			t.Errorf("%s: %d target sequences held, %d before", c.name, n, held)
		}
	}

	if err := g.Check(speculative.Request{Prompt: pr, MaxTokens: 3, K: speculative.NoDraft, Remote: f.remote}); err == nil {
		t.Error("a remote with the target alone: no error")
	}
	stop()
	<-ran
	if n := target.live.Load(); n != 0 {
		t.Errorf("%d target sequences left after the loop ended", n)
	}
}

var errClosed = errors.New("the page's socket closed")
