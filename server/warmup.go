package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/scheduler"
	"webdraft/speculative"
)

// Warm-up (Config.Warmup). On a GPU the first run of each shape — a
// verification of k + 1 rows, a head's chained passes, a sampled read-out,
// a prefill's layout — builds its compute pipelines (the driver compiles
// each kernel), once-only work that would otherwise land on the first
// API requests (on an H100 a fresh server's first completion took 0.1–1 s
// against 25–40 ms for the next; BENCHMARKS.md). Before the server
// reports ready, warm runs the shapes
// the default requests take, each once and untimed: a speculative
// generation at the server's k, greedy and sampled, with listed
// alternatives as the page and `logprobs` ask; the target alone, greedy
// and sampled, as adaptive generations run it; a prompt long enough for
// a prefill of several chunks; warmupBatch generations at once, whose
// batch shrinks as they end one by one (a batch's verification is a
// shape of its own), adaptive where the API's are; and warmupBatch /draft
// requests at once. Their steps are left out of /metrics, and the
// generator forgets what they took (speculative.Generator.ForgetTimings).
// Larger batches are not warmed, but before all this every engine builds
// the pipelines of every row count and context length a pass may have
// (engine.Prepare), which no set of generations is sure to meet: at a
// batch's changing row counts, a pipeline first built mid-generation
// stalls its step.

// warmupTokens is each warm-up generation's length: long enough that its
// steps chain as a generation's do (chains of up to 16 steps).
const warmupTokens = 64

// warmupDraft is the warm-up's /draft length (the endpoint's default).
const warmupDraft = 16

// warmupBatch is how many of the warm-up's generations, and of its
// drafts, run at once.
const warmupBatch = 4

// warmupText is the warm-up's prompt where the model has a tokenizer, and
// warmupLong the longer one, for a prefill of several chunks.
const warmupText = "import os\n\n\ndef read_config(path):\n    \"\"\""

var warmupLong = strings.Repeat("def add(a, b):\n    return a + b\n\n\n", 24)

// warm runs st's warm-up: every generation and draft above through the
// generator and the scheduler, which are running. It stops at the first
// part that fails (a fault, or ctx ending) and returns why; its caller
// logs it and serves anyway.
func (s *Server) warm(ctx context.Context, st *state) error {
	start := time.Now()
	s.warming.Store(true)
	defer s.warming.Store(false)
	// Every pipeline a pass may build, whatever its rows and context
	// (engine.Prepare): the generations below meet only some of them.
	for _, m := range []*Model{&st.drafter, st.target, st.head} {
		if m == nil {
			continue
		}
		if err := engine.Prepare(ctx, m.Engine); err != nil {
			return fmt.Errorf("preparing %s: %w", m.Name, err)
		}
	}
	s.log.Info("prepared every pass shape", "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()))
	runs := 0
	if st.gen != nil {
		// What the warm-up's steps took, pipelines built, is not what
		// steps take, however far it got.
		defer st.gen.ForgetTimings()
		// A quarter of the context each for the prompt and the tokens, so
		// that a small model's fit too.
		limit := st.maxContext() / 4
		short, long := warmupPrompt(st.target, warmupText, limit), warmupPrompt(st.target, warmupLong, limit)
		sampled := sampling.Params{Temperature: 0.7, TopP: 1}
		for _, r := range []struct {
			what string
			req  speculative.Request
		}{
			{"speculative, greedy", speculative.Request{Prompt: long}},
			{"speculative, sampled", speculative.Request{Prompt: short, Sampling: sampled, Seed: 1}},
			{"speculative, listing alternatives", speculative.Request{Prompt: short, TopN: 5, DraftTopN: 5}},
			{"the target alone, greedy", speculative.Request{Prompt: short, K: speculative.NoDraft}},
			{"the target alone, sampled", speculative.Request{Prompt: short, K: speculative.NoDraft, Sampling: sampled, Seed: 1}},
		} {
			r.req.MaxTokens, r.req.Fresh = min(warmupTokens, limit), true
			if _, err := st.gen.Submit(ctx, r.req); err != nil {
				return fmt.Errorf("warming up a generation (%s): %w", r.what, err)
			}
			runs++
		}
		// A batch: prompts of different lengths, whose generations
		// accept differently and so end apart; adaptive where the API's
		// are, so that its steps that time the target alone beside the
		// others' speculative rows run too.
		err := together(warmupBatch, func(i int) error {
			_, err := st.gen.Submit(ctx, speculative.Request{Prompt: long[:max(len(long)*(i+1)/warmupBatch, 1)], MaxTokens: min(warmupTokens, limit), Fresh: true, Adaptive: st.adaptive})
			return err
		})
		if err != nil {
			return fmt.Errorf("warming up %d generations at once: %w", warmupBatch, err)
		}
		runs += warmupBatch
	}
	limit := st.drafter.Engine.Config().MaxPositionEmbeddings / 4
	prompt := warmupPrompt(&st.drafter, warmupLong, limit)
	err := together(warmupBatch, func(i int) error {
		_, err := st.sched.Submit(ctx, scheduler.Request{Tokens: prompt[:max(len(prompt)*(i+1)/warmupBatch, 1)], N: min(warmupDraft, limit)})
		return err
	})
	if err != nil {
		return fmt.Errorf("warming up /draft: %w", err)
	}
	s.log.Info("warmed up", "seconds", fmt.Sprintf("%.2f", time.Since(start).Seconds()), "generations", runs, "drafts", warmupBatch)
	return nil
}

// together runs f(i) for i < n at once and returns their errors.
func together(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// warmupPrompt is text's tokens under m's tokenizer, or for a model that
// takes ids only as many ids as text has bytes, counting up from 1 (what
// they say does not matter: the shapes do); at most limit of them.
func warmupPrompt(m *Model, text string, limit int) []int {
	limit = max(limit, 1)
	if m.Tokenizer != nil {
		ids := m.Tokenizer.Encode(text)
		return ids[:min(len(ids), limit)]
	}
	vocab := m.Engine.Config().VocabSize
	ids := make([]int, min(len(text), limit))
	for i := range ids {
		ids[i] = 1 + i%max(vocab-1, 1)
	}
	return ids
}
