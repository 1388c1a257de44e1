package speculative_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"webdraft/checkpoint"
	"webdraft/engine"
	enginecpu "webdraft/engine/cpu"
	"webdraft/engine/webgpu"
	"webdraft/gpu/gputest"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
	"webdraft/specdec"
	"webdraft/speculative"
)

// load reads a golden checkpoint (vocabulary 1024) in format q.
func load(t *testing.T, name string, q checkpoint.Quant) *checkpoint.Model {
	t.Helper()
	m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", name), checkpoint.LoadOptions{Quant: q})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func cpu(t *testing.T, m *checkpoint.Model) engine.Engine {
	t.Helper()
	e, err := engine.NewReference(m.Config, m.Weights, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func gpu(t *testing.T, m *checkpoint.Model) engine.Engine {
	t.Helper()
	e, err := webgpu.New(gputest.Device(t), m.Config, m.Weights, webgpu.Options{KVBytes: 16 << 20, MaxSequences: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// gpuGroup opens WebGPU engines in one group on the test binary's device,
// so that a pair of them shares its drafter's distributions (sampled
// drafts verified on the device).
func gpuGroup(t *testing.T) func(*testing.T, *checkpoint.Model) engine.Engine {
	var g *webgpu.Group // on the first engine: a test that opens none needs no GPU
	return func(t *testing.T, m *checkpoint.Model) engine.Engine {
		t.Helper()
		if g == nil {
			g = webgpu.NewGroup(gputest.Device(t))
		}
		// Sequence slots for a full batch of generations (speculative's
		// 64) and the prefix cache.
		e, err := g.New(m.Config, m.Weights, webgpu.Options{KVBytes: 32 << 20, MaxSequences: 160})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
}

// pair is a target and two drafters: the target's own weights in int4 (it
// agrees often) and another model (it agrees by chance).
type pair struct {
	name            string
	target, drafter engine.Engine
}

func pairs(t *testing.T, open func(*testing.T, *checkpoint.Model) engine.Engine) []pair {
	target := open(t, load(t, "untied", checkpoint.F32))
	return []pair{
		{"int4-self", target, open(t, load(t, "untied", checkpoint.Int4))},
		{"other", target, open(t, load(t, "tied", checkpoint.F32))},
	}
}

// start runs a generator until the test ends.
func start(t *testing.T, p pair, opts speculative.Options) *speculative.Generator {
	t.Helper()
	g, err := speculative.New(p.drafter, p.target, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return g
}

// greedyDrafter hides an engine's sampled drafts (engine.SamplesDrafts):
// a sampled generation's drafter then proposes its greedy tokens.
type greedyDrafter struct{ engine.Engine }

// greedyHead is greedyDrafter for an EAGLE-3 head (engine.Head).
type greedyHead struct{ engine.Head }

// sampleCounting counts a drafter's SampleN calls — its coupled drafts
// outside fused steps (engine.DraftsCoupled) — and hides its fused steps.
type sampleCounting struct {
	engine.Engine
	calls *atomic.Int64
}

func (s sampleCounting) SampleN(ctx context.Context, batch []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	s.calls.Add(1)
	return engine.SampleN(ctx, s.Engine, batch, n)
}

func (s sampleCounting) DraftsCoupled() bool { return engine.DraftsCoupled(s.Engine) }

// sampleCountingHead is sampleCounting for an EAGLE-3 head (engine.Head).
type sampleCountingHead struct {
	engine.Head
	calls *atomic.Int64
}

func (s sampleCountingHead) SampleN(ctx context.Context, batch []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	s.calls.Add(1)
	return engine.SampleN(ctx, s.Head, batch, n)
}

func (s sampleCountingHead) DraftsCoupled() bool { return engine.DraftsCoupled(s.Head) }

func (s sampleCountingHead) DraftsTrees() bool { return engine.DraftsTrees(s.Head) }

// greedy is the target's own greedy continuation, no drafter.
func greedy(t *testing.T, e engine.Engine, prompt []int, n int) []int {
	t.Helper()
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	out, err := engine.Draft(context.Background(), e, seq, prompt, n)
	if err != nil {
		t.Fatal(err)
	}
	return engine.IDs(out)
}

func ids(tokens []speculative.Token) []int {
	out := make([]int, len(tokens))
	for i, t := range tokens {
		out[i] = t.ID
	}
	return out
}

func prompts(seed uint64, n int) [][]int {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]int, n)
	for i := range out {
		out[i] = make([]int, 1+rng.IntN(40))
		for j := range out[i] {
			out[i][j] = rng.IntN(1024)
		}
	}
	return out
}

// TestGreedyEqualsTarget: greedy speculative output is token for token the
// target's greedy output, for k ∈ {1, 4, 16} and the target alone, each
// prompt alone and all of them batched (a one-token prompt and prompts
// longer than a prefill chunk among them), on the reference engine and on
// WebGPU, and with an EAGLE-3 head drafting for a target of each engine.
func TestGreedyEqualsTarget(t *testing.T) {
	for _, backend := range []struct {
		name string
		open func(*testing.T, *checkpoint.Model) engine.Engine
	}{{"cpu", cpu}, {"webgpu", gpu}} {
		t.Run(backend.name, func(t *testing.T) {
			ps, n := append(prompts(1, 6), []int{5}), 24
			all := pairs(t, backend.open)
			if backend.name == "webgpu" { // lavapipe: the CPU covers the rest
				ps, n = append(ps[:3:3], ps[len(ps)-1]), 12
				all = append(all[:1], webgpuHeadPair(t, ps, n))
				// The head's steps chained on the device (and the target
				// alone's) as long as they may be, however slow lavapipe.
				defer speculative.SetAloneSpan(time.Hour)()
			} else {
				all = append(all, headPair(t, ps, n))
			}
			for _, p := range all {
				g := start(t, p, speculative.Options{PrefillChunk: 16, PrefillBudget: 48})
				want := make([][]int, len(ps))
				for i, pr := range ps {
					want[i] = greedy(t, p.target, pr, n)
				}
				for _, k := range []int{1, 4, 16, speculative.NoDraft} {
					t.Run(fmt.Sprintf("%s/k%d", p.name, k), func(t *testing.T) {
						var tau []float64
						accepted := 0
						check := func(how string, i int, res speculative.Result) {
							if got := ids(res.Tokens); !slices.Equal(got, want[i]) {
								t.Errorf("%s, prompt %d: %v, target alone %v", how, i, got, want[i])
							}
							st := res.Stats
							if res.Finish != speculative.FinishLength || st.Tokens != n || st.Accepted > st.Drafted || st.Accepted+st.Steps != n {
								t.Errorf("%s, prompt %d: finish %q, stats %+v", how, i, res.Finish, st)
							}
							if k == speculative.NoDraft && (st.Drafted != 0 || st.Steps != n) {
								t.Errorf("the target alone drafted: %+v", st)
							}
							tau = append(tau, st.Tau())
							accepted += st.Accepted
						}
						for i, pr := range ps {
							res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n, K: k})
							if err != nil {
								t.Fatal(err)
							}
							check("alone", i, res)
						}
						results := make([]speculative.Result, len(ps))
						var wg sync.WaitGroup
						for i, pr := range ps {
							wg.Go(func() {
								res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n, K: k})
								if err != nil {
									t.Error(err)
								}
								results[i] = res
							})
						}
						wg.Wait()
						for i := range ps {
							check("batched", i, results[i])
						}
						t.Logf("τ %.2f", tau)
						if k != speculative.NoDraft && p.name != "other" && accepted == 0 {
							t.Errorf("no draft token was accepted: the drafts never reached the target")
						}
					})
				}
			}
		})
	}
}

// TestTauEqualsOffline: for greedy decoding the live loop's τ is the
// offline measurement's (package specdec, the target's continuation
// computed first), an EAGLE-3 head's included.
func TestTauEqualsOffline(t *testing.T) {
	ps := prompts(2, 8)
	for _, p := range append(pairs(t, cpu), headPair(t, ps, 20)) {
		for _, k := range []int{2, 5} {
			const n = 20
			off, err := specdec.Run(context.Background(), p.target, p.drafter, ps, specdec.Options{K: k, NewTokens: n})
			if err != nil {
				t.Fatal(err)
			}
			g := start(t, p, speculative.Options{})
			var steps, tokens int
			for _, pr := range ps {
				res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n, K: k})
				if err != nil {
					t.Fatal(err)
				}
				steps += res.Stats.Steps
				tokens += res.Stats.Tokens
			}
			if live := float64(tokens) / float64(steps); live != off.Tau() || steps != off.Steps {
				t.Errorf("%s k %d: live τ %.4f over %d steps, offline %.4f over %d", p.name, k, live, steps, off.Tau(), off.Steps)
			}
		}
	}
}

// TestSamplingFollowsTarget: sampled speculative output follows the
// target's own distribution. Over many seeds, the first two tokens after a
// prompt — the first two rows of a verification of two draft tokens, or
// a correction and the verification after it — are counted against the
// target's
// probabilities of each pair (the nucleus at the temperature, from the
// reference's logits); a chi-square bound at p = 1e-6 holds. A rule that
// accepts the proposal too often, or draws the proposal again after a
// rejection, fails it.
func TestSamplingFollowsTarget(t *testing.T) {
	params := sampling.Params{Temperature: 0.9, TopP: 0.95}
	prompt := []int{17, 400, 3, 999, 250}
	m := load(t, "untied", checkpoint.F32)
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	type variant struct {
		name    string
		drafter func(pair) engine.Engine
		topK    int
		// uncoupled: proposals drawn from the drafter's distribution and
		// held to the multi-draft rule (Options.Uncoupled), where a keyed
		// generation's rows draw coupled under its seed's keys.
		uncoupled bool
	}
	sampled := func(p pair) engine.Engine { return p.drafter }
	for _, backend := range []struct {
		name     string
		open     func(*testing.T, *checkpoint.Model) engine.Engine
		pair     func(*testing.T) pair // instead of open's first pair
		seeds    int
		variants []variant
	}{
		// Keyed chains and trees (coupled drafts, the trees' children
		// Gumbel-top-b), and unkeyed: the drafter samples its proposals
		// (the reference engine SamplesDrafts), chains and trees held to
		// the multi-draft rule; and a drafter that proposes its greedy
		// tokens (one that does not).
		{"reference", cpu, nil, 2000, []variant{{"keyed-chain", sampled, 1, false}, {"keyed-tree", sampled, 3, false},
			{"sampled-chain", sampled, 1, true}, {"sampled-tree", sampled, 3, true},
			{"greedy-drafts", func(p pair) engine.Engine { return greedyDrafter{p.drafter} }, 1, false}}},
		// The WebGPU pair in one group: proposals drawn and trees walked
		// on the device (lavapipe: fewer seeds, a tree).
		{"webgpu", gpuGroup(t), nil, 400, []variant{{"sampled-tree", sampled, 3, true}}},
		// An EAGLE-3 head on the CPU engine: keyed trees, sampling its
		// proposals (chains and trees), and proposing its greedy tokens.
		{"cpu-head", nil, func(t *testing.T) pair { return headPair(t, [][]int{prompt}, 3) }, 2000,
			[]variant{{"keyed-tree", sampled, 3, false}, {"sampled-chain", sampled, 1, true}, {"sampled-tree", sampled, 3, true},
				{"greedy-drafts", func(p pair) engine.Engine { return greedyHead{p.drafter.(engine.Head)} }, 1, false}}},
		// The head on the WebGPU engine: its proposals drawn and kept on
		// the device, a tree (its chains stay greedy: they chain).
		{"webgpu-head", nil, func(t *testing.T) pair { return webgpuHeadPair(t, [][]int{prompt}, 3) }, 400,
			[]variant{{"sampled-tree", sampled, 3, true}}},
	} {
		if backend.pair == nil {
			backend.pair = func(t *testing.T) pair {
				return pairs(t, backend.open)[0] // the other drafter's tokens are all but never accepted
			}
		}
		p := backend.pair(t)
		for _, v := range backend.variants {
			t.Run(backend.name+"/"+v.name, func(t *testing.T) {
				seeds := backend.seeds
				g := start(t, pair{v.name, p.target, v.drafter(p)}, speculative.Options{TopK: v.topK, TreeNodes: 10, Uncoupled: v.uncoupled})
				counts := map[[2]int]int{}
				var mu sync.Mutex
				var wg sync.WaitGroup
				sem := make(chan struct{}, 64)
				var accepted, drafted int
				for s := range seeds {
					sem <- struct{}{}
					wg.Go(func() {
						defer func() { <-sem }()
						res, err := g.Submit(context.Background(), speculative.Request{Prompt: prompt, MaxTokens: 3, K: 4, Sampling: params, Seed: uint64(s)})
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						counts[[2]int{res.Tokens[0].ID, res.Tokens[1].ID}]++
						accepted += res.Stats.Accepted
						drafted += res.Stats.Drafted
						mu.Unlock()
					})
				}
				wg.Wait()
				t.Logf("%d of %d draft tokens accepted", accepted, drafted)
				first := probs(t, ref, prompt, params)
				expected := map[[2]int]float64{}
				for a, pa := range first {
					if pa*float64(seeds) < 1 {
						continue // its pairs join the rest
					}
					for b, pb := range probs(t, ref, append(slices.Clone(prompt), a), params) {
						expected[[2]int{a, b}] = pa * pb * float64(seeds)
					}
				}
				chi2, df := chiSquare(counts, expected, seeds)
				bound := chiSquareBound(df, 4.753) // z for p = 1e-6
				t.Logf("χ² %.1f over %d degrees of freedom (bound %.1f)", chi2, df, bound)
				if chi2 > bound {
					t.Errorf("the output does not follow the target's distribution: χ² %.1f > %.1f (df %d)", chi2, bound, df)
				}
			})
		}
	}
}

// probs is the target's next-token distribution after tokens under p.
func probs(t *testing.T, ref *reference.Model, tokens []int, p sampling.Params) map[int]float64 {
	t.Helper()
	logits, err := ref.Forward(ref.NewSequence(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	all, err := samplingtest.Probs(logits, p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]float64{}
	for i, q := range all {
		if q > 0 {
			out[i] = q
		}
	}
	return out
}

// chiSquare compares counts with expected counts: pairs expected at least
// 5 times are bins of their own, the rest one bin together.
func chiSquare(counts map[[2]int]int, expected map[[2]int]float64, n int) (float64, int) {
	var chi2, restExp float64
	restObs, bins := n, 0
	for k, e := range expected {
		if e < 5 {
			continue
		}
		o := float64(counts[k])
		chi2 += (o - e) * (o - e) / e
		restObs -= counts[k]
		bins++
	}
	restExp = float64(n)
	for _, e := range expected {
		if e >= 5 {
			restExp -= e
		}
	}
	if restExp > 1 {
		chi2 += (float64(restObs) - restExp) * (float64(restObs) - restExp) / restExp
		bins++
	}
	return chi2, bins - 1
}

// chiSquareBound is the chi-square quantile for df degrees of freedom at
// the standard normal quantile z (Wilson–Hilferty).
func chiSquareBound(df int, z float64) float64 {
	d := float64(df)
	h := 2 / (9 * d)
	return d * math.Pow(1-h+z*math.Sqrt(h), 3)
}

// TestSameSeedSameOutput: a seed replays its generation; another seed
// gives another.
func TestSameSeedSameOutput(t *testing.T) {
	for _, p := range pairs(t, cpu) {
		g := start(t, p, speculative.Options{})
		for _, topK := range []int{1, 3} { // sampled chains and trees
			run := func(seed uint64) []int {
				res, err := g.Submit(context.Background(), speculative.Request{Prompt: []int{5, 6, 7}, MaxTokens: 30, K: 3, TopK: topK,
					Sampling: sampling.Params{Temperature: 1}, Seed: seed})
				if err != nil {
					t.Fatal(err)
				}
				return ids(res.Tokens)
			}
			a, b, c := run(7), run(7), run(8)
			if !slices.Equal(a, b) {
				t.Errorf("%s, top k %d: seed 7 twice: %v, then %v", p.name, topK, a, b)
			}
			if slices.Equal(a, c) {
				t.Errorf("%s, top k %d: seeds 7 and 8 gave the same %v", p.name, topK, a)
			}
		}
	}
}

// TestStops: a stop token ends the generation before it; OnStep can end
// it; p_min 1 drafts nothing and changes no token; logprobs and top tokens
// come with each token.
func TestStops(t *testing.T) {
	p := pairs(t, cpu)[0]
	g := start(t, p, speculative.Options{K: 4})
	prompt := []int{9, 8, 7, 6}
	want := greedy(t, p.target, prompt, 16)
	ctx := context.Background()

	res, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: 16, Stop: []int{want[5]}})
	if err != nil {
		t.Fatal(err)
	}
	cut := slices.Index(want, want[5])
	if got := ids(res.Tokens); !slices.Equal(got, want[:cut]) || res.Finish != speculative.FinishStop {
		t.Errorf("stop token %d: %v (%s), want %v", want[5], got, res.Finish, want[:cut])
	}

	var steps []speculative.Step
	res, err = g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: 16, OnStep: func(s speculative.Step) bool {
		steps = append(steps, s)
		return len(steps) < 2
	}})
	if err != nil {
		t.Fatal(err)
	}
	var streamed []int
	for _, s := range steps {
		streamed = append(streamed, ids(s.Tokens)...)
		if s.Accepted > len(s.Draft) || len(s.Tokens) != s.Accepted+1 {
			t.Errorf("step %+v", s)
		}
	}
	if len(steps) != 2 || res.Finish != speculative.FinishStop || !slices.Equal(ids(res.Tokens), streamed) || !slices.Equal(streamed, want[:len(streamed)]) {
		t.Errorf("OnStep stopping after 2 steps: %d steps, %v streamed, result %v (%s)", len(steps), streamed, ids(res.Tokens), res.Finish)
	}

	res, err = g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: 16, PMin: 1, TopN: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(res.Tokens); !slices.Equal(got, want) || res.Stats.Drafted != 0 {
		t.Errorf("p_min 1: %v, %d drafted; want %v and none", got, res.Stats.Drafted, want)
	}
	for i, tok := range res.Tokens {
		if len(tok.Top) != 3 || tok.Top[0].Token != tok.ID || tok.Logprob != tok.Top[0].Logprob || tok.Logprob > 0 {
			t.Errorf("token %d: %+v", i, tok)
		}
	}
}

// TestPrefixCache: a conversation's next turn (the last prompt, its
// answer and more) reuses both models' caches and still equals the target
// alone.
func TestPrefixCache(t *testing.T) {
	p := pairs(t, cpu)[0]
	g := start(t, p, speculative.Options{})
	ctx := context.Background()
	prompt := prompts(3, 1)[0]
	first, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	next := append(append(slices.Clone(prompt), ids(first.Tokens)...), 1, 2, 3)
	res, err := g.Submit(ctx, speculative.Request{Prompt: next, MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.CachedTokens < len(prompt) {
		t.Errorf("the next turn reused %d positions, want at least the first prompt's %d", res.Stats.CachedTokens, len(prompt))
	}
	if got, want := ids(res.Tokens), greedy(t, p.target, next, 10); !slices.Equal(got, want) {
		t.Errorf("after the cache: %v, target alone %v", got, want)
	}
	// Fresh computes it all again, to the same tokens.
	again, err := g.Submit(ctx, speculative.Request{Prompt: next, MaxTokens: 10, Fresh: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Stats.CachedTokens != 0 || !slices.Equal(ids(again.Tokens), ids(res.Tokens)) {
		t.Errorf("fresh: %d cached, %v; want 0 and %v", again.Stats.CachedTokens, ids(again.Tokens), ids(res.Tokens))
	}
}

// TestDraftTop: with DraftTopN each draft token comes with the drafter's
// alternatives (its own token first: it drafts greedily), and each step
// with the time of its passes.
func TestDraftTop(t *testing.T) {
	p := pairs(t, cpu)[0]
	g := start(t, p, speculative.Options{K: 3})
	var steps []speculative.Step
	_, err := g.Submit(context.Background(), speculative.Request{Prompt: []int{4, 5, 6}, MaxTokens: 12, DraftTopN: 5, TopN: 5,
		OnStep: func(s speculative.Step) bool { steps = append(steps, s); return true }})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range steps {
		if s.VerifyTime <= 0 || len(s.Draft) > 0 && s.DraftTime <= 0 {
			t.Errorf("step %d: times %v, %v", i, s.DraftTime, s.VerifyTime)
		}
		for j, d := range s.Draft {
			if len(d.Top) != 5 || d.Top[0].Token != d.ID || d.Top[0].Logprob != d.Logprob {
				t.Errorf("step %d draft %d: %+v", i, j, d)
			}
		}
		for j, tok := range s.Tokens {
			if len(tok.Top) != 5 || tok.Top[0].Token != tok.ID {
				t.Errorf("step %d token %d: %+v", i, j, tok)
			}
		}
	}
}

// TestBadRequests: each gets a clear error, and the loop goes on.
func TestBadRequests(t *testing.T) {
	p := pairs(t, cpu)[0]
	g := start(t, p, speculative.Options{})
	ctx := context.Background()
	for _, r := range []speculative.Request{
		{MaxTokens: 4},
		{Prompt: []int{1}, MaxTokens: 0},
		{Prompt: []int{1024}, MaxTokens: 4},
		{Prompt: []int{1}, MaxTokens: 4, K: speculative.MaxK + 1},
		{Prompt: []int{1}, MaxTokens: 4, PMin: 2},
		{Prompt: []int{1}, MaxTokens: 4, TopN: engine.MaxTopN + 1},
		{Prompt: []int{1}, MaxTokens: 4, Sampling: sampling.Params{Temperature: 1, TopP: 2}},
		{Prompt: make([]int, 512), MaxTokens: 4},
	} {
		if _, err := g.Submit(ctx, r); err == nil {
			t.Errorf("%+v: no error", r)
		}
	}
	if _, err := g.Submit(ctx, speculative.Request{Prompt: make([]int, 511), MaxTokens: 4}); err != nil {
		t.Errorf("a prompt one short of the context: %v", err)
	}
	if _, err := speculative.New(p.drafter, otherVocab{p.target}, speculative.Options{}); err == nil {
		t.Error("a pair with different vocabularies was accepted")
	}
}

// TestFullBudget: a generation that needs the whole of both KV budgets
// (its prompt, its tokens and its draft) runs, drafting, as the target
// alone would — where its drafter's reservation for drafts as long as any
// request's (MaxK) once kept it waiting for room it would never get.
func TestFullBudget(t *testing.T) {
	p := pairs(t, cpu)[0]
	prompt, n, k := []int{5, 6, 7, 8, 9, 10}, 20, 4
	need := len(prompt) + n + k
	g := start(t, p, speculative.Options{K: k, DraftTokens: need, TargetTokens: need})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: n})
	if err != nil {
		t.Fatalf("a generation filling both budgets: %v", err)
	}
	if got, want := ids(res.Tokens), greedy(t, p.target, prompt, n); !slices.Equal(got, want) {
		t.Errorf("tokens %v, the target's %v", got, want)
	}
	if res.Stats.Drafted == 0 {
		t.Error("it drafted nothing")
	}
	if _, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: n + 1}); !errors.Is(err, speculative.ErrTooLarge) {
		t.Errorf("one position more: %v, want ErrTooLarge", err)
	}
}

// otherVocab is an engine that says its vocabulary is another size.
type otherVocab struct{ engine.Engine }

func (o otherVocab) Config() qwen3.Config {
	c := o.Engine.Config()
	c.VocabSize++
	return c
}

// TestCancel: a client that leaves ends its generation at the next step.
func TestCancel(t *testing.T) {
	p := pairs(t, cpu)[0]
	g := start(t, p, speculative.Options{K: 2})
	ctx, cancel := context.WithCancel(context.Background())
	_, err := g.Submit(ctx, speculative.Request{Prompt: []int{1, 2}, MaxTokens: 400, OnStep: func(speculative.Step) bool {
		cancel()
		return true
	}})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled generation: %v", err)
	}
	if res, err := g.Submit(context.Background(), speculative.Request{Prompt: []int{1, 2}, MaxTokens: 3}); err != nil || len(res.Tokens) != 3 {
		t.Errorf("after a cancel: %v, %v", res, err)
	}
}

// TestTreesEqualTarget: greedy speculation over token trees is token for
// token the target's greedy output, for trees of several widths and node
// budgets (and the chain, b = 1), each prompt alone and all batched, on
// the reference and CPU engines and on WebGPU — engines apart (an EAGLE-3
// head's steps unfused: a level a call), and in one group, where steps are
// drafted and verified in one submission (device trees, fused chains) by a
// drafter and by a head; each step's tree marks the accepted path its
// draft begins with.
func TestTreesEqualTarget(t *testing.T) {
	fast := func(t *testing.T, m *checkpoint.Model) engine.Engine {
		t.Helper()
		e, err := enginecpu.New(m.Config, m.Weights, enginecpu.Options{KVBytes: 32 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	type shape struct{ k, b, n int }
	shapes := []shape{{4, 1, 16}, {4, 2, 4}, {6, 2, 16}, {4, 4, 16}, {8, 4, 64}}
	for _, backend := range []struct {
		name string
		open func(*testing.T, *checkpoint.Model) engine.Engine
	}{{"reference", cpu}, {"cpu", fast}, {"webgpu", gpu}, {"webgpu-fused", gpuGroup(t)}} {
		t.Run(backend.name, func(t *testing.T) {
			ps, n := prompts(3, 5), 24
			all := pairs(t, backend.open)
			switch backend.name { // lavapipe: the CPU covers the rest
			case "cpu": // and an EAGLE-3 head drafting for the CPU engine's target
				all = append(all, headPair(t, ps, n))
			case "webgpu": // engines apart: each level a drafter call; and an EAGLE-3 head drafting trees for the WebGPU target, unfused
				ps, n, shapes = ps[:2], 12, []shape{{4, 2, 8}, {6, 4, 32}}
				all = append(all[:1], webgpuHeadPair(t, ps, n))
			case "webgpu-fused": // one group: chains and trees drafted and verified in one submission, by a drafter and by an EAGLE-3 head
				ps, n, shapes = ps[:2], 12, []shape{{4, 1, 8}, {4, 2, 8}, {6, 4, 32}}
				all = append(all[:1], webgpuHeadPair(t, ps, n))
				// Greedy chains chained on the device, several steps a
				// call, however slow lavapipe.
				defer speculative.SetAloneSpan(time.Hour)()
			}
			for _, p := range all {
				g := start(t, p, speculative.Options{PrefillChunk: 16, PrefillBudget: 48, Unfused: backend.name == "webgpu"})
				want := make([][]int, len(ps))
				for i, pr := range ps {
					want[i] = greedy(t, p.target, pr, n)
				}
				for _, sh := range shapes {
					t.Run(fmt.Sprintf("%s/k%d-b%d-n%d", p.name, sh.k, sh.b, sh.n), func(t *testing.T) {
						var mu sync.Mutex
						var tau []float64
						fused := 0
						onStep := func(st speculative.Step) bool {
							mu.Lock()
							defer mu.Unlock()
							if st.Fused {
								fused++
							}
							accepted := 0
							for _, nd := range st.Tree {
								if nd.Accepted {
									accepted++
								}
								if nd.Accepted && !nd.Verified {
									t.Errorf("an accepted node the target never saw: %+v", nd)
								}
							}
							if sh.b > 1 && len(st.Draft) > 0 && (accepted != st.Accepted || len(st.Tree) == 0) {
								t.Errorf("step: %d nodes marked accepted of %d, %d accepted", accepted, len(st.Tree), st.Accepted)
							}
							for i := range min(st.Accepted, len(st.Tokens)) {
								if st.Draft[i].ID != st.Tokens[i].ID || !st.Tokens[i].Drafted {
									t.Errorf("step: draft %v, tokens %v, %d accepted", engine.IDs(st.Draft), st.Tokens, st.Accepted)
									break
								}
							}
							return true
						}
						req := func(pr []int) speculative.Request {
							return speculative.Request{Prompt: pr, MaxTokens: n, K: sh.k, TopK: sh.b, TreeNodes: sh.n, OnStep: onStep}
						}
						check := func(how string, i int, res speculative.Result) {
							if got := ids(res.Tokens); !slices.Equal(got, want[i]) {
								t.Errorf("%s, prompt %d: %v, target alone %v", how, i, got, want[i])
							}
							st := res.Stats
							if res.Finish != speculative.FinishLength || st.Tokens != n || st.Accepted > st.Drafted || st.Accepted+st.Steps != n {
								t.Errorf("%s, prompt %d: finish %q, stats %+v", how, i, res.Finish, st)
							}
							mu.Lock()
							tau = append(tau, st.Tau())
							mu.Unlock()
						}
						for i, pr := range ps {
							res, err := g.Submit(context.Background(), req(pr))
							if err != nil {
								t.Fatal(err)
							}
							check("alone", i, res)
						}
						results := make([]speculative.Result, len(ps))
						var wg sync.WaitGroup
						for i, pr := range ps {
							wg.Go(func() {
								res, err := g.Submit(context.Background(), req(pr))
								if err != nil {
									t.Error(err)
								}
								results[i] = res
							})
						}
						wg.Wait()
						for i := range ps {
							check("batched", i, results[i])
						}
						// The random head's draft vocabulary has two tokens
						// (randomHead): it drafts a wider tree a level a call.
						wantFused := backend.name == "webgpu-fused" && (p.name != "eagle3-head" || sh.b <= 2)
						if wantFused != (fused > 0) {
							t.Errorf("%d steps fused", fused)
						}
						t.Logf("τ %.2f, %d steps fused", tau, fused)
					})
				}
			}
		})
	}
}

// chainer is an engine that chains its greedy steps (engine.Chainer), as
// the WebGPU engine does on its device, each call's n recorded.
type chainer struct {
	engine.Engine
	mu    sync.Mutex
	calls []int
}

func (c *chainer) StepN(ctx context.Context, batch []*engine.Entry, n int) ([][]engine.Token, error) {
	c.mu.Lock()
	c.calls = append(c.calls, n)
	c.mu.Unlock()
	return engine.StepN(ctx, c.Engine, batch, n) // the inner engine steps n times
}

// SampleN is engine.SampleChainer's contract as n Verify calls of the
// inner engine, each fed the token the one before drew.
func (c *chainer) SampleN(ctx context.Context, batch []*engine.VerifyEntry, n int) ([][]engine.Token, error) {
	c.mu.Lock()
	c.calls = append(c.calls, n)
	c.mu.Unlock()
	out := make([][]engine.Token, len(batch))
	for j := range n {
		vs := make([]*engine.VerifyEntry, len(batch))
		for i, v := range batch {
			tokens := v.Tokens
			if j > 0 {
				tokens = []int{out[i][j-1].ID}
			}
			vs[i] = &engine.VerifyEntry{Seq: v.Seq, Tokens: tokens, Out: 1, Sampling: v.Sampling, Draws: v.Draws[j : j+1], TopN: v.TopN}
		}
		if err := c.Engine.Verify(ctx, vs); err != nil {
			return nil, err
		}
		for i, v := range vs {
			r := v.Rows[0]
			out[i] = append(out[i], engine.Token{ID: r.Sample, Logprob: r.SampleLogprob, Top: r.Top})
		}
	}
	return out, nil
}

// TestAloneSampledChained: sampled, the target alone over a target that
// chains sampled steps (engine.SampleChainer) draws several tokens a call,
// each with the draws a token a call would have taken: a seed gives the
// same tokens chained and not, batched, cut by MaxTokens or a stop token
// inside a chain.
func TestAloneSampledChained(t *testing.T) {
	defer speculative.SetAloneSpan(time.Hour)() // every chain as long as it may be
	base := pairs(t, cpu)[0]
	target := &chainer{Engine: base.target}
	chained := start(t, pair{target: target, drafter: base.drafter}, speculative.Options{})
	plain := start(t, pair{target: base.target, drafter: base.drafter}, speculative.Options{})
	ctx := context.Background()
	params := sampling.Params{Temperature: 0.8, TopP: 0.95}
	run := func(g *speculative.Generator, prompt []int, seed uint64, max int, stop []int) speculative.Result {
		res, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: max, K: speculative.NoDraft, TopN: 1, Sampling: params, Seed: seed, Stop: stop})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	const n = 37 // two chains of 16 and one of 5
	var wg sync.WaitGroup
	for i, pr := range prompts(7, 4) {
		wg.Go(func() {
			got, want := run(chained, pr, uint64(i), n, nil), run(plain, pr, uint64(i), n, nil)
			if !slices.Equal(ids(got.Tokens), ids(want.Tokens)) || got.Stats.Steps != n || got.Finish != speculative.FinishLength {
				t.Errorf("prompt %d: %v in %d steps (%s), a token a call %v", i, ids(got.Tokens), got.Stats.Steps, got.Finish, ids(want.Tokens))
			}
			for j, tok := range got.Tokens {
				if w := want.Tokens[j]; math.Abs(float64(tok.Logprob-w.Logprob)) > 1e-5 || len(tok.Top) != 1 {
					t.Errorf("prompt %d token %d: %+v, a token a call %+v", i, j, tok, w)
				}
			}
		})
	}
	wg.Wait()
	if !slices.ContainsFunc(target.calls, func(k int) bool { return k == 16 }) {
		t.Errorf("the target's chains: %v, want some of 16 tokens", target.calls)
	}
	pr := prompts(1, 5)[0]
	want := ids(run(plain, pr, 9, 30, nil).Tokens)
	cut := 20
	stop := want[cut] // inside the second chain
	cut = slices.Index(want, stop)
	if got := run(chained, pr, 9, 30, []int{stop}); !slices.Equal(ids(got.Tokens), want[:cut]) || got.Finish != speculative.FinishStop {
		t.Errorf("stop token %d: %v (%s), want %v", stop, ids(got.Tokens), got.Finish, want[:cut])
	}
}

// TestAloneChained: the target alone over a target that chains generates
// several tokens a call (engine.StepN), each still a step of its own, to
// the target's greedy tokens — batched, cut by MaxTokens, a stop token
// inside a chain or OnStep, each token with its TopN —, and a stop inside
// a chain leaves the cache as long as the context: the next turn, from the
// cache, still equals the target alone.
func TestAloneChained(t *testing.T) {
	defer speculative.SetAloneSpan(time.Hour)() // every chain as long as it may be
	base := pairs(t, cpu)[0]
	target := &chainer{Engine: base.target}
	g := start(t, pair{target: target, drafter: base.drafter}, speculative.Options{})
	ctx := context.Background()
	ps := prompts(7, 4)
	const n = 37 // two chains of 16 and one of 5
	var wg sync.WaitGroup
	for i, pr := range ps {
		wg.Go(func() {
			var steps int
			res, err := g.Submit(ctx, speculative.Request{Prompt: pr, MaxTokens: n, K: speculative.NoDraft, TopN: 2,
				OnStep: func(s speculative.Step) bool { steps++; return len(s.Tokens) == 1 && s.VerifyTime > 0 }})
			if err != nil {
				t.Error(err)
				return
			}
			if got, want := ids(res.Tokens), greedy(t, base.target, pr, n); !slices.Equal(got, want) {
				t.Errorf("prompt %d: %v, target alone %v", i, got, want)
			}
			if st := res.Stats; st.Steps != n || steps != n || st.Drafted != 0 || res.Finish != speculative.FinishLength {
				t.Errorf("prompt %d: %d steps streamed, stats %+v, finish %q; want %d steps", i, steps, st, res.Finish, n)
			}
			for j, tok := range res.Tokens {
				if len(tok.Top) != 2 || tok.Top[0].Token != tok.ID {
					t.Errorf("prompt %d token %d: %+v", i, j, tok)
				}
			}
		})
	}
	wg.Wait()
	if !slices.ContainsFunc(target.calls, func(k int) bool { return k == 16 }) {
		t.Errorf("the target's chains: %v, want some of 16 tokens", target.calls)
	}

	prompt := ps[0]
	want := greedy(t, base.target, prompt, 30)
	stopThenOn(t, g, base.target, prompt, want, 20, speculative.NoDraft) // inside the second chain

	var streamed []int
	res, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: 30, K: speculative.NoDraft, OnStep: func(s speculative.Step) bool {
		streamed = append(streamed, ids(s.Tokens)...)
		return len(streamed) < 3
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(res.Tokens); !slices.Equal(got, want[:3]) || !slices.Equal(streamed, got) || res.Finish != speculative.FinishStop {
		t.Errorf("OnStep stopping after 3 tokens: %v streamed, result %v (%s), want %v", streamed, got, res.Finish, want[:3])
	}
}

// stopThenOn checks a generation of prompt (drafting k) that stops at
// want[at], the target alone's token there: its output is the target
// alone's up to it, and the next turn, the prompt and that output, starts
// from the cache and equals the target alone.
func stopThenOn(t *testing.T, g *speculative.Generator, target engine.Engine, prompt, want []int, at, k int) {
	t.Helper()
	ctx := context.Background()
	stop := want[at]
	res, err := g.Submit(ctx, speculative.Request{Prompt: prompt, MaxTokens: len(want), K: k, Stop: []int{stop}})
	if err != nil {
		t.Fatal(err)
	}
	cut := slices.Index(want, stop)
	if got := ids(res.Tokens); !slices.Equal(got, want[:cut]) || res.Finish != speculative.FinishStop {
		t.Errorf("stop token %d: %v (%s), want %v", stop, got, res.Finish, want[:cut])
	}
	next := append(slices.Clone(prompt), want[:cut]...)
	res, err = g.Submit(ctx, speculative.Request{Prompt: next, MaxTokens: 12, K: k})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(res.Tokens), greedy(t, target, next, 12); !slices.Equal(got, want) || res.Stats.CachedTokens < len(prompt) {
		t.Errorf("the next turn: %v from %d cached positions, target alone %v", got, res.Stats.CachedTokens, want)
	}
}

// slowEngine makes each of an engine's passes take per longer, whatever
// its rows, as a GPU's small passes do.
type slowEngine struct {
	engine.Engine
	per time.Duration
}

// The adaptive tests' passes: long enough that a loaded machine's
// scheduling delays (a few milliseconds, two test packages on two cores)
// do not turn a decision that rests on one timed step.
const (
	slowTarget  = 20 * time.Millisecond
	slowDrafter = 8 * time.Millisecond
)

func (s slowEngine) Step(ctx context.Context, batch []*engine.Entry) error {
	time.Sleep(s.per)
	return s.Engine.Step(ctx, batch)
}

func (s slowEngine) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	time.Sleep(s.per)
	return s.Engine.Verify(ctx, batch)
}

// TestAdaptive: where the target's pass costs the same whatever its rows,
// an adaptive generation (Request.Adaptive) whose drafts seldom pass runs
// the target alone after its first speculative steps, one whose drafts
// mostly pass goes on speculating, and one that is not adaptive
// speculates throughout; each one's output is the target alone's.
func TestAdaptive(t *testing.T) {
	ps := pairs(t, cpu)
	same := pair{"same", ps[0].target, cpu(t, load(t, "untied", checkpoint.F32))} // every draft accepted
	prompt := prompts(1, 6)[0]
	const n, k = 40, 3
	want := greedy(t, ps[0].target, prompt, n)
	for _, c := range []struct {
		pair            pair
		adaptive, alone bool
	}{{ps[1], true, true}, {same, true, false}, {ps[1], false, false}} {
		slow := pair{target: slowEngine{c.pair.target, slowTarget}, drafter: slowEngine{c.pair.drafter, slowDrafter}}
		g := start(t, slow, speculative.Options{})
		res, err := g.Submit(context.Background(), speculative.Request{Prompt: prompt, MaxTokens: n, K: k, Adaptive: c.adaptive})
		if err != nil {
			t.Fatal(err)
		}
		st := res.Stats
		if got := ids(res.Tokens); !slices.Equal(got, want) {
			t.Errorf("%s, adaptive %v: %v, target alone %v", c.pair.name, c.adaptive, got, want)
		}
		if st.Alone != c.alone || c.alone && st.Drafted != 4*k || !c.alone && st.Drafted <= 4*k {
			t.Errorf("%s, adaptive %v: alone %v after %d tokens drafted (τ %.2f), want alone %v", c.pair.name, c.adaptive, st.Alone, st.Drafted, st.Tau(), c.alone)
		}
	}
	// Alone, a generation speculates again every adaptRetry tokens, and is
	// weighed anew (here: alone again each time).
	defer speculative.SetAdaptRetry(10)()
	g := start(t, pair{target: slowEngine{ps[1].target, slowTarget}, drafter: slowEngine{ps[1].drafter, slowDrafter}}, speculative.Options{})
	res, err := g.Submit(context.Background(), speculative.Request{Prompt: prompt, MaxTokens: n, K: k, Adaptive: true})
	if err != nil {
		t.Fatal(err)
	}
	if st := res.Stats; !slices.Equal(ids(res.Tokens), want) || !st.Alone || st.Drafted < 2*4*k || st.Drafted > 4*4*k {
		t.Errorf("retrying every 10 tokens: %d tokens drafted, alone %v; output equal: %v", st.Drafted, st.Alone, slices.Equal(ids(res.Tokens), want))
	}
}

// stallEngine is slowEngine whose passes take stall instead while stalled
// is set: a GPU's first steps of a shape, which build its pipelines.
type stallEngine struct {
	slowEngine
	stall   time.Duration
	stalled *atomic.Bool
}

func (s stallEngine) Verify(ctx context.Context, batch []*engine.VerifyEntry) error {
	if s.stalled.Load() {
		time.Sleep(s.stall)
		return s.Engine.Verify(ctx, batch)
	}
	return s.slowEngine.Verify(ctx, batch)
}

// TestForgetTimings: a generation stepped through a stall (a warm-up's)
// leaves the loop believing the target alone slow, so that the next
// adaptive generation whose drafts seldom pass speculates on; after
// ForgetTimings the loop times the target alone anew and that generation
// runs it alone, as TestAdaptive's does.
func TestForgetTimings(t *testing.T) {
	ps := pairs(t, cpu)
	prompt := prompts(1, 6)[0]
	const n, k = 40, 3
	for _, forget := range []bool{false, true} {
		var stalled atomic.Bool
		target := stallEngine{slowEngine{ps[1].target, slowTarget}, 300 * time.Millisecond, &stalled}
		g := start(t, pair{target: target, drafter: slowEngine{ps[1].drafter, slowDrafter}}, speculative.Options{})
		// The warm-up: its probes of the target alone, and its speculative
		// steps, stall alike, so it speculates on; what it timed stays.
		stalled.Store(true)
		res, err := g.Submit(context.Background(), speculative.Request{Prompt: prompt, MaxTokens: 12, K: k, Adaptive: true})
		if err != nil {
			t.Fatal(err)
		}
		stalled.Store(false)
		if forget {
			g.ForgetTimings()
		}
		res, err = g.Submit(context.Background(), speculative.Request{Prompt: prompt, MaxTokens: n, K: k, Adaptive: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stats.Alone != forget {
			t.Errorf("forget %v: the next generation ran alone %v (τ %.2f), want %v", forget, res.Stats.Alone, res.Stats.Tau(), forget)
		}
	}
}

// TestSeedIsDrafterInvariant: a sampled generation's rows are keyed by the
// positions they decide (sampling.Keys), so a seed gives the target
// alone's tokens whatever drafts: the CPU engine's drafters, which draft
// coupled draws a pass at a time (the int4 self-drafter, another model, an
// EAGLE-3 head), greedy drafts (a drafter that does not draw), the WebGPU
// pair fused and chained on the device, and a WebGPU head; at several
// temperatures, in a nucleus and not, chains of 1 to 4 drafts and token
// trees, batched.
// Drafts pass (each of these drafters agrees with the target often enough
// at these temperatures).
func TestSeedIsDrafterInvariant(t *testing.T) {
	ps := prompts(31, 3)
	const n = 24
	params := []sampling.Params{{Temperature: 0.7}, {Temperature: 1, TopP: 0.9}, {Temperature: 0.3, TopP: 0.95}}
	// The unfused WebGPU drafters draft coupled draws outside fused steps
	// (SampleN, counted).
	var sampled atomic.Int64
	cases := []struct {
		name    string
		pair    func(t *testing.T) pair
		unfused bool
	}{
		{"cpu", func(t *testing.T) pair { return pairs(t, cpu)[0] }, false},
		{"cpu-other", func(t *testing.T) pair { return pairs(t, cpu)[1] }, false},
		{"cpu-greedy-drafts", func(t *testing.T) pair {
			p := pairs(t, cpu)[0]
			p.drafter = greedyDrafter{p.drafter}
			return p
		}, false},
		{"cpu-head", func(t *testing.T) pair { return headPair(t, ps, n) }, false},
		{"webgpu", func(t *testing.T) pair { return pairs(t, gpuGroup(t))[0] }, false},
		{"webgpu-head", func(t *testing.T) pair { return webgpuHeadPair(t, ps, n) }, false},
		{"webgpu-unfused", func(t *testing.T) pair {
			p := pairs(t, gpuGroup(t))[0]
			p.drafter = sampleCounting{p.drafter, &sampled}
			return p
		}, true},
		{"webgpu-head-unfused", func(t *testing.T) pair {
			p := webgpuHeadPair(t, ps, n)
			p.drafter = sampleCountingHead{p.drafter.(engine.Head), &sampled}
			return p
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sampled.Store(0)
			g := start(t, c.pair(t), speculative.Options{Unfused: c.unfused})
			ctx := context.Background()
			var mu sync.Mutex
			accepted := 0
			var wg sync.WaitGroup
			var treeSteps atomic.Int64
			// Chains of 1 to 4 drafts, and trees (depth, children a node):
			// keyed trees' children are Gumbel-top-b under the same keys.
			shapes := []struct{ k, topK int }{{1, 1}, {2, 1}, {3, 1}, {4, 1}, {3, 3}, {4, 2}}
			for i, prompt := range ps {
				for j, sh := range shapes {
					wg.Go(func() {
						req := speculative.Request{Prompt: prompt, MaxTokens: n, Sampling: params[i], Seed: uint64(100*i + j), TopK: sh.topK, TreeNodes: 8}
						if sh.topK > 1 {
							req.OnStep = func(s speculative.Step) bool {
								if s.Tree != nil {
									treeSteps.Add(1)
								}
								return true
							}
						}
						alone := req
						alone.K, req.K = speculative.NoDraft, sh.k
						k := sh.k
						got, err := g.Submit(ctx, req)
						if err != nil {
							t.Error(err)
							return
						}
						want, err := g.Submit(ctx, alone)
						if err != nil {
							t.Error(err)
							return
						}
						if !slices.Equal(ids(got.Tokens), ids(want.Tokens)) {
							t.Errorf("prompt %d (%+v), k %d, top k %d: speculative %v, the target alone %v", i, params[i], k, sh.topK, ids(got.Tokens), ids(want.Tokens))
						}
						mu.Lock()
						accepted += got.Stats.Accepted
						mu.Unlock()
					})
				}
			}
			wg.Wait()
			if accepted == 0 {
				t.Error("no draft accepted")
			}
			if treeSteps.Load() == 0 {
				t.Error("no step drafted a tree")
			}
			if c.unfused && sampled.Load() == 0 {
				t.Error("the drafter drafted no coupled draws outside fused steps (SampleN)")
			}
			t.Logf("%d drafts accepted", accepted)
		})
	}
}

// TestGumbelTop: a keyed node's children are the row's coupled draw, then
// the listed tokens in the order of their noisy values under the row's
// key, b at most, the draw never twice; each scores the log-softmax of its
// noisy value among them, so the draw leads.
func TestGumbelTop(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		var top []sampling.TokenLogprob
		for i := range 1 + rng.IntN(12) {
			top = append(top, sampling.TokenLogprob{Token: 100 + 7*i, Logprob: -0.3 * float32(i) * rng.Float32()})
		}
		draw := sampling.Draw{X: sampling.NoProposal, U: rng.Float32(), V: rng.Float32(), Coupled: true}
		T := []float32{0.5, 1, 1.5}[trial%3]
		// The row's coupled draw: a listed token (its largest noisy value)
		// or, half the time, one past the list.
		row := engine.VerifyRow{Top: top}
		k0, k1 := draw.Key()
		noisy := func(c sampling.TokenLogprob) float64 { return float64(c.Logprob/T + sampling.Gumbel(k0, k1, c.Token)) }
		best := slices.MaxFunc(top, func(a, b sampling.TokenLogprob) int { return cmp.Compare(noisy(a), noisy(b)) })
		row.Sample, row.SampleLogprob = best.Token, best.Logprob
		if trial%2 == 1 {
			row.Sample, row.SampleLogprob = 9999, -9
		}
		b := 1 + rng.IntN(5)
		got, scores := speculative.GumbelTop(row, b, T, draw)
		if got[0].Token != row.Sample || len(got) != min(b, 1+len(slices.DeleteFunc(slices.Clone(top), func(c sampling.TokenLogprob) bool { return c.Token == row.Sample }))) {
			t.Fatalf("trial %d, b %d: children %v of the draw %d and the list %v", trial, b, got, row.Sample, top)
		}
		for i := 1; i < len(got); i++ {
			if got[i].Token == row.Sample || i > 1 && noisy(got[i]) > noisy(got[i-1]) {
				t.Fatalf("trial %d: children %v are not the draw, then the list by noisy value", trial, got)
			}
			if scores[i] > scores[0] || i > 1 && scores[i] > scores[i-1] {
				t.Fatalf("trial %d: scores %v of children %v do not fall", trial, scores, got)
			}
		}
		var mass float64
		for _, s := range scores {
			mass += math.Exp(s)
		}
		if math.Abs(mass-1) > 1e-9 {
			t.Fatalf("trial %d: the scores' probabilities sum to %v", trial, mass)
		}
	}
}
