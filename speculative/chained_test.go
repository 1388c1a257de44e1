package speculative_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"webdraft/engine"
	"webdraft/speculative"
)

// specChainer chains an EAGLE-3 head's fused steps the plain way, as
// engine.SpecChainer's contract has a device do it: DraftVerifyN runs
// engine.DraftVerify m times, each step accepted greedily on the host
// (both caches cut back to the accepted drafts and the target's token
// after them, which the next step feeds first), the last step's caches
// left as DraftVerify leaves them.
type specChainer struct {
	engine.Head
	mu    sync.Mutex
	calls []int // m of each call
}

func (c *specChainer) Fuses(target engine.Engine) bool { return target == c.Head.Target() }

func (c *specChainer) DraftVerify(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n int) ([][]engine.Token, error) {
	return engine.DraftVerify(ctx, c.Head, target, steps, n) // two calls: the head does not fuse
}

func (c *specChainer) DraftVerifyN(ctx context.Context, target engine.Engine, steps []engine.ChainStep, n, m int) ([]engine.ChainedStep, error) {
	c.mu.Lock()
	c.calls = append(c.calls, m)
	c.mu.Unlock()
	// Each entry's text from base on: the tokens either model has yet to
	// feed, then what each step emits.
	base := make([]int, len(steps))
	tail := make([][]int, len(steps))
	for i, s := range steps {
		hl, tl := s.Draft.Seq.Len(), s.Verify.Seq.Len()
		base[i], tail[i] = min(hl, tl), slices.Clone(s.Draft.Tokens)
		if tl < hl {
			tail[i] = slices.Clone(s.Verify.Tokens)
		}
	}
	var out []engine.ChainedStep
	for j := range m {
		step := make([]engine.ChainStep, len(steps))
		for i, s := range steps {
			hq, tq := s.Draft.Seq, s.Verify.Seq
			step[i] = engine.ChainStep{
				Draft:  &engine.Entry{Seq: hq, Target: tq, Tokens: slices.Clone(tail[i][hq.Len()-base[i]:]), TopN: s.Draft.TopN},
				Verify: &engine.VerifyEntry{Seq: tq, Tokens: slices.Clone(tail[i][tq.Len()-base[i]:]), Out: n + 1, TopN: s.Verify.TopN},
				Take:   n,
			}
		}
		drafts, err := engine.DraftVerify(ctx, c.Head, target, step, n)
		if err != nil {
			return nil, err
		}
		cs := engine.ChainedStep{Drafts: make([][]engine.Token, len(steps)), Rows: make([][]engine.VerifyRow, len(steps)), Accepted: make([]int, len(steps))}
		for i, s := range step {
			rows := s.Verify.Rows
			a := 0
			for a < n && drafts[i][a].ID == rows[a].Argmax {
				a++
			}
			cs.Drafts[i], cs.Rows[i], cs.Accepted[i] = drafts[i][:n], rows, a
			if j == m-1 {
				continue
			}
			for _, d := range drafts[i][:a] {
				tail[i] = append(tail[i], d.ID)
			}
			tail[i] = append(tail[i], rows[a].Argmax)
			for _, q := range []engine.Sequence{s.Draft.Seq, s.Verify.Seq} {
				q.Truncate(min(q.Len(), base[i]+len(tail[i])-1))
			}
		}
		out = append(out, cs)
	}
	return out, nil
}

// TestSpecChained: where the drafter chains fused speculative steps
// (engine.SpecChainer), the runner runs several a call — as many as fit
// the span, about as many as the generation nearest its end is expected
// to need — and accepts each as a step of its own: batched generations of
// different lengths (one may stop inside a chain) equal the target alone (with
// their top tokens where they ask), each step streamed and counted (τ the
// steps' own), a stop token inside a
// chain ends the generation there and leaves the caches as long as the
// context (the next turn, from the cache, still equals the target alone),
// and OnStep stopping inside a chain drops the steps after it.
func TestSpecChained(t *testing.T) {
	defer speculative.SetAloneSpan(time.Hour)() // every chain as long as it may be
	ps := prompts(9, 4)
	const n, k = 37, 3
	base := headPair(t, ps, n)
	drafter := &specChainer{Head: base.drafter.(engine.Head)}
	var mu sync.Mutex
	var emitted, stepped int
	g := start(t, pair{target: base.target, drafter: drafter}, speculative.Options{OnStep: func(st speculative.StepStats) {
		mu.Lock()
		emitted += st.Emitted
		stepped += st.Sequences
		mu.Unlock()
	}})
	ctx := context.Background()
	var wg sync.WaitGroup
	accepted, chained := 0, 0
	for i, pr := range ps {
		wg.Go(func() {
			var streamed []int
			steps := 0
			limit := n - 5*i
			res, err := g.Submit(ctx, speculative.Request{Prompt: pr, MaxTokens: limit, K: k, TopN: i % 3, DraftTopN: i % 2,
				OnStep: func(s speculative.Step) bool {
					steps++
					if s.Chained {
						mu.Lock()
						chained++
						mu.Unlock()
					}
					streamed = append(streamed, ids(s.Tokens)...)
					return len(s.Tokens) == s.Accepted+1 || len(streamed) == limit
				}})
			if err != nil {
				t.Error(err)
				return
			}
			if got, want := ids(res.Tokens), greedy(t, base.target, pr, limit); !slices.Equal(got, want) || !slices.Equal(streamed, got) {
				t.Errorf("prompt %d: %v (streamed %v), target alone %v", i, got, streamed, want)
			}
			for j, tok := range res.Tokens {
				if len(tok.Top) != i%3 || len(tok.Top) > 0 && tok.Top[0].Token != tok.ID {
					t.Errorf("prompt %d token %d: %+v, want its %d top tokens", i, j, tok, i%3)
				}
			}
			if st := res.Stats; st.Steps != steps || st.Tokens != limit || st.Accepted+st.Steps < limit || res.Finish != speculative.FinishLength {
				t.Errorf("prompt %d: %d steps streamed, stats %+v, finish %q", i, steps, st, res.Finish)
			}
			mu.Lock()
			accepted += res.Stats.Accepted
			mu.Unlock()
		})
	}
	wg.Wait()
	if !slices.ContainsFunc(drafter.calls, func(m int) bool { return m > 1 }) || accepted == 0 || chained == 0 {
		t.Errorf("chains of %v steps, %d drafts accepted, %d steps streamed as chained: want chains of several steps that accept drafts", drafter.calls, accepted, chained)
	}
	mu.Lock()
	if want := len(ps)*n - 5*(0+1+2+3); emitted != want {
		t.Errorf("OnStep's stats: %d tokens emitted over %d generations' steps, want %d", emitted, stepped, want)
	}
	mu.Unlock()

	prompt := ps[0]
	want := greedy(t, base.target, prompt, 30)
	stopThenOn(t, g, base.target, prompt, want, 17, k) // past the first chained call's first step

	var streamed []int
	res, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: 30, K: k, OnStep: func(s speculative.Step) bool {
		streamed = append(streamed, ids(s.Tokens)...)
		return len(streamed) < 8
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(res.Tokens); !slices.Equal(got, want[:len(got)]) || !slices.Equal(streamed, got) || len(got) < 8 || res.Finish != speculative.FinishStop {
		t.Errorf("OnStep stopping after 8 tokens: %v streamed, result %v (%s), want a prefix of %v of 8 tokens or more", streamed, got, res.Finish, want)
	}
}
