package speculative_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"webdraft/checkpoint"
	"webdraft/eagle3"
	"webdraft/engine"
	enginecpu "webdraft/engine/cpu"
	"webdraft/internal/synth"
	"webdraft/safetensors"
	"webdraft/speculative"
)

// headPair is the golden untied target on the CPU engine, keeping the
// features of the layers an EAGLE-3 head reads, and a random head for it
// whose draft vocabulary is the two tokens the target's greedy
// continuations of prompts use most: it agrees by chance often enough to
// accept drafts of many lengths.
func headPair(t *testing.T, prompts [][]int, n int) pair {
	t.Helper()
	m := load(t, "untied", checkpoint.F32)
	aux := eagle3.DefaultAux(m.Config.NumHiddenLayers)
	plain, err := enginecpu.New(m.Config, m.Weights, enginecpu.Options{KVBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	used := map[int32]int{}
	for _, p := range prompts {
		for _, tok := range greedy(t, plain, p, n) {
			used[int32(tok)]++
		}
	}
	vocab := make([]int32, 0, len(used))
	for tok := range used {
		vocab = append(vocab, tok)
	}
	// the two the target uses most
	slices.SortFunc(vocab, func(a, b int32) int { return cmp.Or(used[b]-used[a], int(a-b)) })
	vocab = vocab[:min(2, len(vocab))]
	slices.Sort(vocab)
	t.Logf("draft vocabulary %v of the %d tokens the target emits", vocab, len(used))

	dir := t.TempDir()
	if err := synth.WriteEagle3(dir, m.Config, synth.Eagle3Options{Seed: 7, Std: 0.2, DType: safetensors.F32, DraftVocabSize: len(vocab)}); err != nil {
		t.Fatal(err)
	}
	h, err := checkpoint.LoadEagle3(dir, checkpoint.LoadOptions{Quant: checkpoint.F32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	h.Weights.TargetIDs = vocab
	target, err := enginecpu.New(m.Config, m.Weights, enginecpu.Options{KVBytes: 32 << 20, FeatureLayers: aux})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	head, err := enginecpu.NewHead(target, h.Config, h.Weights, enginecpu.HeadOptions{KVBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return pair{"eagle3-head", target, head}
}

// TestHeadGreedyEqualsTarget: with an EAGLE-3 head drafting, greedy
// speculative output is token for token the target's greedy output, each
// prompt alone and all batched, one-token prompts and prompts longer than
// a prefill chunk included; drafts are accepted, and a tree request drafts
// a chain.
func TestHeadGreedyEqualsTarget(t *testing.T) {
	ps, n := prompts(11, 6), 24
	ps = append(ps, []int{5}, prompts(12, 1)[0][:1], append(prompts(13, 1)[0], prompts(14, 1)[0]...))
	p := headPair(t, ps, n)
	g := start(t, p, speculative.Options{PrefillChunk: 16, PrefillBudget: 48})
	want := make([][]int, len(ps))
	for i, pr := range ps {
		want[i] = greedy(t, p.target, pr, n)
	}
	for _, k := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("k%d", k), func(t *testing.T) {
			accepted, drafted := 0, 0
			check := func(how string, i int, res speculative.Result) {
				if got := ids(res.Tokens); !slices.Equal(got, want[i]) {
					t.Errorf("%s, prompt %d: %v, target alone %v", how, i, got, want[i])
				}
				st := res.Stats
				if res.Finish != speculative.FinishLength || st.Tokens != n || st.Accepted > st.Drafted || st.Accepted+st.Steps != n {
					t.Errorf("%s, prompt %d: finish %q, stats %+v", how, i, res.Finish, st)
				}
				accepted, drafted = accepted+st.Accepted, drafted+st.Drafted
			}
			for i, pr := range ps {
				res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n, K: k, TopK: 3})
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
			t.Logf("%d of %d draft tokens accepted", accepted, drafted)
			if accepted == 0 || drafted == 0 {
				t.Errorf("%d of %d draft tokens accepted: the head's drafts never reached the target", accepted, drafted)
			}
		})
	}
}

// TestHeadOfAnotherTarget: a head drafts only for the target engine whose
// features it reads.
func TestHeadOfAnotherTarget(t *testing.T) {
	p := headPair(t, prompts(11, 1), 4)
	other := cpu(t, load(t, "untied", checkpoint.F32))
	if _, err := speculative.New(p.drafter, other, speculative.Options{}); err == nil {
		t.Fatal("a head paired with another target engine was accepted")
	}
	if engine.ReadsTarget(p.drafter) != p.target {
		t.Fatal("the head does not name its target")
	}
}
