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
	"webdraft/engine/webgpu"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
	"webdraft/safetensors"
	"webdraft/speculative"
)

// webgpuHeadPair is the golden untied target on the WebGPU engine, keeping
// on the device the features of the layers an EAGLE-3 head reads, and a
// random head for it in the target's group (webgpu.NewHead), whose draft
// vocabulary is the two tokens the target's greedy continuations of
// prompts use most, as headPair's.
func webgpuHeadPair(t *testing.T, prompts [][]int, n int) pair {
	t.Helper()
	m := load(t, "untied", checkpoint.F32)
	g := webgpu.NewGroup(gputest.Device(t))
	target, err := g.New(m.Config, m.Weights, webgpu.Options{KVBytes: 16 << 20, MaxSequences: 32,
		FeatureLayers: eagle3.DefaultAux(m.Config.NumHiddenLayers)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	used := map[int32]int{}
	for _, p := range prompts {
		for _, tok := range greedy(t, target, p, n) {
			used[int32(tok)]++
		}
	}
	vocab := make([]int32, 0, len(used))
	for tok := range used {
		vocab = append(vocab, tok)
	}
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
	head, err := webgpu.NewHead(target, h.Config, h.Weights, webgpu.HeadOptions{KVBytes: 4 << 20, MaxSequences: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close() })
	return pair{"webgpu-eagle3-head", target, head}
}

// TestHeadGreedyEqualsTargetWebGPU: with an EAGLE-3 head drafting on the
// WebGPU engine over a WebGPU target, greedy speculative output is token
// for token the target's greedy output, each prompt alone and all
// batched, a one-token prompt and a prompt longer than a prefill chunk
// included; drafts are accepted. (Fewer prompts and tokens than the CPU
// head's runs: lavapipe.)
func TestHeadGreedyEqualsTargetWebGPU(t *testing.T) {
	ps, n := append(prompts(11, 3), []int{5}, append(prompts(13, 1)[0], prompts(14, 1)[0]...)), 12
	p := webgpuHeadPair(t, ps, n)
	if engine.ReadsTarget(p.drafter) != p.target {
		t.Fatal("the head does not name its target")
	}
	g := start(t, p, speculative.Options{PrefillChunk: 16, PrefillBudget: 48})
	want := make([][]int, len(ps))
	for i, pr := range ps {
		want[i] = greedy(t, p.target, pr, n)
	}
	for _, k := range []int{1, 4} {
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
				res, err := g.Submit(context.Background(), speculative.Request{Prompt: pr, MaxTokens: n, K: k, DraftTopN: 2})
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
