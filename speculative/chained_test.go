package speculative_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/speculative"
)

// specChainer chains an EAGLE-3 head's fused steps the plain way, as
// engine.SpecChainer's contract has a device do it: DraftVerifyN runs
// engine.DraftVerify m times (one fewer from 3 on), each step accepted on
// the host — greedily, or by its rows' verdicts where it samples, each
// row drawing under the key of the position it decides — (both caches cut back
// to the accepted drafts and the target's token after them, which the
// next step feeds first), the last step's caches left as DraftVerify
// leaves them.
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
	if m > 2 {
		m-- // as a device short of room runs fewer steps than asked
	}
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
				Verify: &engine.VerifyEntry{Seq: tq, Tokens: slices.Clone(tail[i][tq.Len()-base[i]:]), Out: n + 1, TopN: s.Verify.TopN, Sampling: s.Verify.Sampling},
				Take:   n,
			}
			switch {
			case s.Verify.Sampling.Greedy():
			case j == 0:
				step[i].Verify.Draws = slices.Clone(s.Verify.Draws)
			default: // row c decides the position past the text's end and c
				for c := range n + 1 {
					step[i].Verify.Draws = append(step[i].Verify.Draws, s.Keys.At(base[i]+len(tail[i])+c))
				}
			}
		}
		drafts, err := engine.DraftVerify(ctx, c.Head, target, step, n)
		if err != nil {
			return nil, err
		}
		cs := engine.ChainedStep{Drafts: make([][]engine.Token, len(steps)), Rows: make([][]engine.VerifyRow, len(steps)), Accepted: make([]int, len(steps))}
		for i, s := range step {
			rows, greedy := s.Verify.Rows, s.Verify.Sampling.Greedy()
			a := 0
			for a < n && (greedy && drafts[i][a].ID == rows[a].Argmax || !greedy && rows[a].Accept) {
				a++
			}
			cs.Drafts[i], cs.Rows[i], cs.Accepted[i] = drafts[i][:n], rows, a
			if j == m-1 {
				continue
			}
			for _, d := range drafts[i][:a] {
				tail[i] = append(tail[i], d.ID)
			}
			if greedy {
				tail[i] = append(tail[i], rows[a].Argmax)
			} else {
				tail[i] = append(tail[i], rows[a].Sample)
			}
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

// TestSpecChainedSampled: sampled, chained speculative steps key each row
// by the position it decides as steps a call do: a seed gives the same
// tokens chained, with every step a call of its own (Options.Unchained)
// and from the target alone — batched generations of different lengths,
// one greedy among them, the chains running several steps that accept
// drafts —, over the reference chainer of a CPU head and over a WebGPU
// pair (the device keying and accepting by the sampling rule); and the
// WebGPU target alone gives a seed's tokens chained
// (engine.SampleChainer) as a token a call.
func TestSpecChainedSampled(t *testing.T) {
	defer speculative.SetAloneSpan(time.Hour)() // every chain as long as it may be
	ps := prompts(9, 4)
	const n, k = 37, 3
	params := []sampling.Params{{Temperature: 0.3, TopP: 0.9}, {Temperature: 0.8}, {}, {Temperature: 0.5, TopP: 0.95}}
	same := func(t *testing.T, chained, apart *speculative.Generator, k int) {
		ctx := context.Background()
		var mu sync.Mutex
		accepted, steps := 0, 0
		run := func(g *speculative.Generator, i, k int) speculative.Result {
			res, err := g.Submit(ctx, speculative.Request{Prompt: ps[i], MaxTokens: n - 5*i, K: k, TopN: i % 2, Sampling: params[i], Seed: uint64(10 + i),
				OnStep: func(s speculative.Step) bool {
					if g == chained && s.Chained && !params[i].Greedy() {
						mu.Lock()
						steps++
						mu.Unlock()
					}
					return true
				}})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		var wg sync.WaitGroup
		for i := range ps {
			wg.Go(func() {
				got, want, alone := run(chained, i, k), run(apart, i, k), run(apart, i, speculative.NoDraft)
				if !slices.Equal(ids(got.Tokens), ids(want.Tokens)) || !slices.Equal(ids(got.Tokens), ids(alone.Tokens)) || got.Finish != want.Finish {
					t.Errorf("prompt %d (%+v): chained %v (%d accepted, %s), a step a call %v (%d, %s), the target alone %v", i, params[i],
						ids(got.Tokens), got.Stats.Accepted, got.Finish, ids(want.Tokens), want.Stats.Accepted, want.Finish, ids(alone.Tokens))
				}
				mu.Lock()
				accepted += got.Stats.Accepted
				mu.Unlock()
			})
		}
		wg.Wait()
		if k != speculative.NoDraft && (steps == 0 || accepted == 0) {
			t.Errorf("%d sampled steps chained, %d drafts accepted: want chains that accept drafts", steps, accepted)
		}
	}
	t.Run("cpu-head", func(t *testing.T) {
		base := headPair(t, ps, n)
		drafter := &specChainer{Head: base.drafter.(engine.Head)}
		p := pair{target: base.target, drafter: drafter}
		same(t, start(t, p, speculative.Options{}), start(t, p, speculative.Options{Unchained: true}), k)
	})
	t.Run("webgpu", func(t *testing.T) {
		p := pairs(t, gpuGroup(t))[0]
		same(t, start(t, p, speculative.Options{}), start(t, p, speculative.Options{Unchained: true}), k)
		t.Run("alone", func(t *testing.T) {
			apart := pair{target: struct{ engine.Engine }{p.target}, drafter: p.drafter} // hides SampleN
			same(t, start(t, p, speculative.Options{}), start(t, apart, speculative.Options{}), speculative.NoDraft)
		})
	})
}

// TestSplitAlone: a generation that drafts nothing (the target alone)
// beside one that speculates runs in calls of its own, so that the other's
// steps still fuse and chain on the device: over a WebGPU pair, both
// outputs are the target alone's, and every step of the speculating one
// after its first is fused, most of them chained.
func TestSplitAlone(t *testing.T) {
	defer speculative.SetAloneSpan(time.Hour)() // every chain as long as it may be
	p := pairs(t, gpuGroup(t))[0]
	g := start(t, p, speculative.Options{})
	ps := prompts(2, 5)
	ctx := context.Background()
	long := make(chan speculative.Result, 1)
	started := make(chan struct{})
	go func() {
		var once sync.Once
		res, err := g.Submit(ctx, speculative.Request{Prompt: ps[0], MaxTokens: 160, K: speculative.NoDraft,
			OnStep: func(speculative.Step) bool { once.Do(func() { close(started) }); return true }})
		if err != nil {
			t.Error(err)
		}
		long <- res
	}()
	<-started
	var steps []speculative.Step
	res, err := g.Submit(ctx, speculative.Request{Prompt: ps[1], MaxTokens: 24, K: 3,
		OnStep: func(s speculative.Step) bool { steps = append(steps, s); return true }})
	if err != nil {
		t.Fatal(err)
	}
	alone := <-long
	if got, want := ids(res.Tokens), greedy(t, p.target, ps[1], 24); !slices.Equal(got, want) {
		t.Errorf("speculating: %v, target alone %v", got, want)
	}
	if got, want := ids(alone.Tokens), greedy(t, p.target, ps[0], 160); !slices.Equal(got, want) {
		t.Errorf("alone: %v, target alone %v", got, want)
	}
	chained := 0
	for j, s := range steps[1:] {
		if !s.Fused {
			t.Errorf("step %d of %d: not fused", j+2, len(steps))
		}
		if s.Chained {
			chained++
		}
	}
	if alone.Stats.Steps != 160 || 2*chained < len(steps) {
		t.Errorf("the alone generation took %d steps; %d of the other's %d steps chained", alone.Stats.Steps, chained, len(steps))
	}
}
