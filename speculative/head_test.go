package speculative_test

import (
	"cmp"
	"slices"
	"testing"

	"webdraft/checkpoint"
	"webdraft/eagle3"
	"webdraft/engine"
	enginecpu "webdraft/engine/cpu"
	"webdraft/engine/webgpu"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
	"webdraft/safetensors"
	"webdraft/speculative"
)

// headPair is the golden untied target on the CPU engine, keeping the
// features of the layers an EAGLE-3 head reads, and a random head for it
// (randomHead).
func headPair(t *testing.T, prompts [][]int, n int) pair {
	t.Helper()
	m := load(t, "untied", checkpoint.F32)
	target, err := enginecpu.New(m.Config, m.Weights, enginecpu.Options{KVBytes: 32 << 20, FeatureLayers: eagle3.DefaultAux(m.Config.NumHiddenLayers)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	h := randomHead(t, m, target, prompts, n)
	head, err := enginecpu.NewHead(target, h.Config, h.Weights, enginecpu.HeadOptions{KVBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return pair{"eagle3-head", target, head}
}

// webgpuHeadPair is headPair on the WebGPU engine: the target keeping the
// features on the device, the head in its group (webgpu.NewHead).
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
	h := randomHead(t, m, target, prompts, n)
	head, err := webgpu.NewHead(target, h.Config, h.Weights, webgpu.HeadOptions{KVBytes: 4 << 20, MaxSequences: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close() })
	return pair{"eagle3-head", target, head}
}

// randomHead is a random EAGLE-3 head for m (f32) whose draft vocabulary
// is the two tokens target's greedy continuations of prompts use most: it
// agrees by chance often enough to accept drafts of many lengths.
func randomHead(t *testing.T, m *checkpoint.Model, target engine.Engine, prompts [][]int, n int) *checkpoint.Eagle3 {
	t.Helper()
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
	return h
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
