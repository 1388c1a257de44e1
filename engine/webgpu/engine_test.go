package webgpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/sampling"
	shipped "webdraft/weights"
)

func load(t *testing.T, name string, q checkpoint.Quant) *checkpoint.Model {
	t.Helper()
	m, err := checkpoint.Load(filepath.Join("..", "..", "testdata", "golden", name), checkpoint.LoadOptions{Quant: q})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func newEngine(t *testing.T, m *checkpoint.Model, opts Options) *Engine {
	t.Helper()
	e, err := New(gputest.Device(t), m.Config, m.Weights, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestConformance runs the engine suite (drafts, batching, rollback, bad
// input) against the reference, for every weight format, tied and untied.
func TestConformance(t *testing.T) {
	for _, name := range []string{"tied", "untied"} {
		for _, q := range []checkpoint.Quant{checkpoint.Int4, checkpoint.F16, checkpoint.F32} {
			for _, kv := range []string{"f32", "f16"} {
				t.Run(name+"/"+string(q)+"/kv_"+kv, func(t *testing.T) {
					m := load(t, name, q)
					enginetest.Run(t, newEngine(t, m, Options{KVBytes: 16 << 20, MaxSequences: 16, KV: kv}), m.Config, m.Weights)
				})
			}
		}
	}
}

// TestSmallPasses: batches larger than a pass (rows and last-row room) run
// in several passes with the same result, up to rounding.
func TestSmallPasses(t *testing.T) {
	m := load(t, "untied", checkpoint.Int4)
	m2 := load(t, "untied", checkpoint.Int4)
	small := newEngine(t, m, Options{KVBytes: 16 << 20, MaxSequences: 16, MaxRows: 5})
	big := newEngine(t, m2, Options{KVBytes: 16 << 20, MaxSequences: 16})
	prompts := [][]int{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {7}, {3, 4, 5}}
	draft := func(e *Engine) [][]int {
		var entries []*engine.Entry
		for _, p := range prompts {
			s, err := e.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			entries = append(entries, &engine.Entry{Seq: s, Tokens: p})
		}
		out := make([][]int, len(prompts))
		for range 4 {
			if err := e.Step(context.Background(), entries); err != nil {
				t.Fatal(err)
			}
			for i, en := range entries {
				out[i] = append(out[i], en.Next)
				en.Tokens = []int{en.Next}
			}
		}
		return out
	}
	a, b := draft(small), draft(big)
	for i := range a {
		if !slices.Equal(a[i], b[i]) {
			t.Errorf("prompt %d: %v with 5-row passes, %v with one pass", i, a[i], b[i])
		}
	}
	// Verifications whose rows read out outnumber a pass's: greedy through
	// argmax.wgsl, sampled with a top-N through sample.wgsl, each draw with
	// its own row.
	verify := func(e *Engine, p sampling.Params, topN int) [][]engine.VerifyRow {
		var entries []*engine.VerifyEntry
		for i, pr := range prompts {
			s, err := e.NewSequence()
			if err != nil {
				t.Fatal(err)
			}
			v := &engine.VerifyEntry{Seq: s, Tokens: pr, Out: max(1, len(pr)-i%2), Sampling: p, TopN: topN}
			if !p.Greedy() {
				for j := range v.Out {
					v.Draws = append(v.Draws, sampling.Draw{X: pr[(j+1)%len(pr)], U: float32(j%7) / 7, V: float32(j%5) / 5})
				}
			}
			entries = append(entries, v)
		}
		if err := e.Verify(context.Background(), entries); err != nil {
			t.Fatal(err)
		}
		out := make([][]engine.VerifyRow, len(entries))
		for i, v := range entries {
			out[i] = v.Rows
			v.Seq.Release()
		}
		return out
	}
	for _, c := range []struct {
		p    sampling.Params
		topN int
	}{{sampling.Params{}, 0}, {sampling.Params{Temperature: 0.8, TopP: 0.95}, 3}} {
		a, b := verify(small, c.p, c.topN), verify(big, c.p, c.topN)
		for i := range a {
			for j := range a[i] {
				x, y := a[i][j], b[i][j]
				// Passes of 5 rows and of all 16 may take different
				// kernels (kernels/plan.go: a fused q|k|v projection for
				// few rows), which round differently.
				if x.Argmax != y.Argmax || x.Sample != y.Sample || x.Accept != y.Accept || len(x.Top) != c.topN ||
					math.Abs(float64(x.ArgmaxLogprob-y.ArgmaxLogprob)) > 1e-4*max(1, math.Abs(float64(y.LogSumExp))) {
					t.Errorf("%+v: prompt %d row %d: %+v with 5-row passes, %+v with one pass", c.p, i, j, x, y)
				}
			}
		}
	}
}

// TestCapacity: slots and blocks run out with engine.ErrNoCapacity and come
// back on Release and Truncate.
func TestCapacity(t *testing.T) {
	m := load(t, "tied", checkpoint.Int4)
	// 2 slots; blocks of 16 positions: the budget gives a handful.
	e := newEngine(t, m, Options{KVBytes: 6 * 16 * int64(engine.KVBytesPerToken(&m.Config, 4)), MaxSequences: 2, KV: "f32"})
	if e.KVCapacity() != (6-2)*16 {
		t.Errorf("KVCapacity %d", e.KVCapacity())
	}
	s1 := enginetest.NewSequence(t, e)
	s2 := enginetest.NewSequence(t, e)
	if _, err := e.NewSequence(); err == nil {
		t.Fatal("a third sequence in two slots")
	}
	long := make([]int, 90) // 6 blocks
	if err := e.Step(context.Background(), []*engine.Entry{{Seq: s1, Tokens: long}}); err != nil {
		t.Fatal(err)
	}
	err := e.Step(context.Background(), []*engine.Entry{{Seq: s2, Tokens: []int{1}}})
	if err == nil || s2.Len() != 0 {
		t.Fatalf("the pool is full, yet: err %v, Len %d", err, s2.Len())
	}
	s1.Truncate(20) // keeps 2 blocks
	if err := e.Step(context.Background(), []*engine.Entry{{Seq: s2, Tokens: make([]int, 40)}}); err != nil {
		t.Fatal(err)
	}
	s1.Release()
	if _, err := e.NewSequence(); err != nil {
		t.Errorf("after Release: %v", err)
	}
}

// TestGolden: the engine drafts Hugging Face transformers' greedy tokens for
// the golden prompts (1, 40 and 300 tokens), dense and int4, tied and untied.
func TestGolden(t *testing.T) {
	for _, name := range []string{"tied", "untied"} {
		g := readGolden(t, name)
		models := map[string]*checkpoint.Model{"dense": load(t, name, checkpoint.F32), "int4": load(t, name, checkpoint.Int4)}
		engines := map[string]*Engine{}
		for w, m := range models {
			for _, kv := range []string{"f32", "f16"} {
				engines[w+"/"+kv] = newEngine(t, m, Options{KVBytes: 16 << 20, MaxSequences: 8, KV: kv})
			}
		}
		for _, c := range g.Cases {
			for _, kv := range []string{"f32", "f16"} {
				t.Run(fmt.Sprintf("%s/%s/%d/kv_%s", name, c.Weights, len(c.Prompt), kv), func(t *testing.T) {
					e := engines[c.Weights+"/"+kv]
					seq, err := e.NewSequence()
					if err != nil {
						t.Fatal(err)
					}
					defer seq.Release()
					got, err := engine.Draft(context.Background(), e, seq, c.Prompt, len(c.Greedy))
					if err != nil {
						t.Fatal(err)
					}
					for i := range c.Greedy {
						if got[i].ID == c.Greedy[i] {
							continue
						}
						if c.Margins[i] < 1e-3*c.MaxAbsLogits[i] {
							t.Logf("step %d differs at a near tie (margin %.3g): later steps not compared", i, c.Margins[i])
							break
						}
						t.Fatalf("greedy tokens differ at step %d:\n got %v\nHF   %v", i, engine.IDs(got), c.Greedy)
					}
				})
			}
		}
	}
}

type golden struct {
	Cases []struct {
		Weights      string
		Prompt       []int
		Greedy       []int
		Margins      []float64
		MaxAbsLogits []float64 `json:"max_abs_logits"`
	}
}

func readGolden(t *testing.T, name string) golden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "golden", name, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestLongContext: past 2048 positions (decode attention in long splits,
// prefill over many tiles) the engine drafts what the reference drafts, for
// sequences of different lengths batched together.
func TestLongContext(t *testing.T) {
	cfg := synth.Shapes["tiny"]
	cfg.MaxPositionEmbeddings = 4096
	dir := filepath.Join(t.TempDir(), "long")
	if err := synth.Write(dir, cfg, synth.Options{Seed: 5, Std: 0.3}); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e := newEngine(t, m, Options{KVBytes: 64 << 20, MaxSequences: 8})
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	lengths := []int{2100, 700, 2500}
	var entries []*engine.Entry
	var refSeqs []*reference.Sequence
	for _, n := range lengths {
		p := randomTokens(rng, n, cfg.VocabSize)
		s, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release()
		entries = append(entries, &engine.Entry{Seq: s, Tokens: p})
		refSeqs = append(refSeqs, ref.NewSequence())
	}
	for step := 0; step < 6; step++ {
		inputs := make([]reference.Input, len(entries))
		for i, en := range entries {
			inputs[i] = reference.Input{Seq: refSeqs[i], Tokens: en.Tokens}
		}
		logits, err := ref.ForwardBatch(inputs)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Step(context.Background(), entries); err != nil {
			t.Fatal(err)
		}
		for i, en := range entries {
			want, _ := reference.Argmax(logits[i])
			if en.Next != want {
				top, second := topTwo(logits[i])
				if top-second < 1e-3*maxAbs(logits[i]) {
					t.Logf("sequence %d step %d: near tie (margin %.3g), stopping the comparison", i, step, top-second)
					return
				}
				t.Fatalf("sequence %d (context %d) step %d: engine %d, reference %d", i, refSeqs[i].Len(), step, en.Next, want)
			}
			en.Tokens = []int{want}
		}
	}
}

// randomTokens is n token ids drawn from r, each below vocab.
func randomTokens(r *rand.Rand, n, vocab int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = r.IntN(vocab)
	}
	return out
}

func topTwo(v []float32) (float32, float32) {
	a, b := float32(math.Inf(-1)), float32(math.Inf(-1))
	for _, x := range v {
		if x > a {
			a, b = x, a
		} else if x > b {
			b = x
		}
	}
	return a, b
}

func maxAbs(v []float32) float32 {
	var m float32
	for _, x := range v {
		m = max(m, float32(math.Abs(float64(x))))
	}
	return m
}

// TestExternalModel checks the engine against the reference on a model
// folder named by WEBDRAFT_TEST_MODEL (e.g. a Qwen3-1.7B-shaped checkpoint
// made by lab/h200/random_hf_checkpoint.py and converted to int4, on the GPU
// machine): several prompts, 8 greedy tokens each, batched together.
func TestExternalModel(t *testing.T) {
	dir := os.Getenv("WEBDRAFT_TEST_MODEL")
	if dir == "" {
		t.Skip("WEBDRAFT_TEST_MODEL is not set")
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e := newEngine(t, m, Options{KVBytes: 2 << 30, MaxSequences: 8})
	ref, err := reference.New(m.Config, m.Weights)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(11, 11))
	var entries []*engine.Entry
	var seqs []*reference.Sequence
	for _, n := range []int{5, 64, 300} {
		p := randomTokens(rng, n, m.Config.VocabSize)
		s, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release()
		entries = append(entries, &engine.Entry{Seq: s, Tokens: p})
		seqs = append(seqs, ref.NewSequence())
	}
	live := len(entries)
	compared := 0
	for step := 0; step < 8 && live > 0; step++ {
		inputs := make([]reference.Input, 0, len(entries))
		var active []*engine.Entry
		for i, en := range entries {
			if en.Tokens != nil {
				inputs = append(inputs, reference.Input{Seq: seqs[i], Tokens: en.Tokens})
				active = append(active, en)
			}
		}
		logits, err := ref.ForwardBatch(inputs)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Step(context.Background(), active); err != nil {
			t.Fatal(err)
		}
		for i, en := range active {
			want, _ := reference.Argmax(logits[i])
			if en.Next != want {
				top, second := topTwo(logits[i])
				if top-second >= 1e-3*maxAbs(logits[i]) {
					t.Fatalf("step %d: engine %d, reference %d (margin %.3g)", step, en.Next, want, top-second)
				}
				t.Logf("step %d: near tie (margin %.3g): this sequence is compared no further", step, top-second)
				en.Tokens, live = nil, live-1
				continue
			}
			compared++
			en.Tokens = []int{want}
		}
	}
	t.Logf("%s: %d greedy tokens identical to the reference", dir, compared)
}

// TestOddHeadDim: a head_dim the tiled prefill kernel cannot take (24)
// runs every row through decode attention, with the same results.
func TestOddHeadDim(t *testing.T) {
	cfg := synth.Shapes["tiny"]
	cfg.HiddenSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim = 96, 6, 2, 24
	runSynth(t, cfg, synth.Options{Seed: 9, Std: 0.3}, checkpoint.F32, "f32")
}

// TestWideHidden: a model of Qwen3-4B's 2,560 hidden inputs (few heads,
// two layers, a tiny vocabulary) runs the engine suite against the
// reference. Where qkv_fused_int4.wgsl does not take a one-row q|k|v
// projection of that many inputs, the plan's one-row passes take the
// q/k norms, RoPE and the cache append in attention_decode.wgsl
// (kernels.AttentionBlockDecode), which a small model's passes never do.
func TestWideHidden(t *testing.T) {
	cfg := synth.Shapes["tiny"]
	cfg.HiddenSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim = 2560, 4, 2, 64
	runSynth(t, cfg, synth.Options{Seed: 11, Std: 0.05}, checkpoint.Int4, "f16")
}

// runSynth runs the engine suite against the reference on a checkpoint
// synth writes at cfg, loaded at quant, with a cache of kv elements.
func runSynth(t *testing.T, cfg qwen3.Config, opts synth.Options, quant checkpoint.Quant, kv string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "synth")
	if err := synth.Write(dir, cfg, opts); err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{Quant: quant})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	enginetest.Run(t, newEngine(t, m, Options{KVBytes: 16 << 20, MaxSequences: 16, KV: kv}), m.Config, m.Weights)
}

// TestPartialHead: a head over part of the vocabulary (lm_head.token_ids),
// tied and untied, runs the engine suite against the reference: its tokens
// and log-probabilities come from those rows, every other token has
// probability zero.
func TestPartialHead(t *testing.T) {
	for _, tied := range []bool{true, false} {
		t.Run(fmt.Sprintf("tied=%v", tied), func(t *testing.T) {
			cfg := synth.Shapes["tiny"]
			cfg.TieWordEmbeddings = tied
			dir := filepath.Join(t.TempDir(), "partial")
			if err := synth.Write(dir, cfg, synth.Options{Seed: 12, Std: 0.3, HeadTokens: 100}); err != nil {
				t.Fatal(err)
			}
			m, err := checkpoint.Load(dir, checkpoint.LoadOptions{Quant: checkpoint.Int4})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if len(m.Weights.HeadTokens) != 100 {
				t.Fatalf("%d head tokens, want 100", len(m.Weights.HeadTokens))
			}
			enginetest.Run(t, newEngine(t, m, Options{KVBytes: 16 << 20, MaxSequences: 16, KV: "f32"}), m.Config, m.Weights)
		})
	}
}

// TestLostDevice: a pass on a lost device fails with engine.ErrFault
// (naming the loss), and so does every call after it; the engine's
// sequences can still be released and the engine closed, twice.
func TestLostDevice(t *testing.T) {
	m := load(t, "tied", checkpoint.Int4)
	e, err := New(gputest.Fresh(t), m.Config, m.Weights, Options{KVBytes: 4 << 20, MaxSequences: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: []int{1, 2, 3}}}); err != nil {
		t.Fatal(err)
	}
	if e.Fault() != nil || engine.Fault(e) != nil {
		t.Fatalf("a working engine reports a fault: %v", e.Fault())
	}
	e.LoseDevice("a fault drill")
	err = e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: []int{4}}})
	if !errors.Is(err, engine.ErrFault) || !errors.Is(err, gpu.ErrLost) || !strings.Contains(err.Error(), "a fault drill") {
		t.Fatalf("a step on a lost device: err = %v, want engine.ErrFault and gpu.ErrLost", err)
	}
	if seq.Len() != 3 {
		t.Errorf("the failed step left the sequence at %d positions, want 3", seq.Len())
	}
	if !errors.Is(engine.Fault(e), engine.ErrFault) {
		t.Errorf("engine.Fault = %v", engine.Fault(e))
	}
	for name, call := range map[string]func() error{
		"Step":   func() error { return e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: []int{4}}}) },
		"StepN":  func() error { _, err := e.StepN(ctx, []*engine.Entry{{Seq: seq, Tokens: []int{4}}}, 3); return err },
		"Verify": func() error { return e.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: []int{4}, Out: 1}}) },
		"NewSequence": func() error {
			_, err := e.NewSequence()
			return err
		},
	} {
		if err := call(); !errors.Is(err, engine.ErrFault) {
			t.Errorf("%s after the fault: err = %v, want engine.ErrFault", name, err)
		}
	}
	seq.Release()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// TestSmallBindings: on a device whose storage bindings are small — as an
// adapter may offer — the shipped pair's large tensors are bound in row
// blocks (the 151,936-row embedding, the target's tied head, the
// drafter's 32,768-row head), and both models draft what they draft on
// the adapter's own limits: the same tokens, the same log-probabilities
// of the top 20.
func TestSmallBindings(t *testing.T) {
	const limit = 4 << 20 // the embedding's 19.4 MB of codes in 5 blocks, the drafter's head in 2
	small, err := gpu.Open(gpu.Options{MaxStorageBufferBindingSize: limit})
	if errors.Is(err, gpu.ErrNoAdapter) {
		gputest.Device(t) // skips or fails as every GPU test does
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	if got := small.Limits().MaxStorageBufferBindingSize; got > limit {
		t.Skipf("the adapter granted %d-byte storage bindings, not %d", got, limit)
	}
	for _, dir := range []string{shipped.TargetDir, shipped.DrafterDir} {
		t.Run(dir, func(t *testing.T) {
			m := loadShipped(t, dir)
			embedBytes := uint64(m.Config.VocabSize) * uint64(m.Config.HiddenSize) / 2
			if embedBytes <= limit {
				t.Fatalf("the %d-byte embedding fits one %d-byte binding: nothing splits", embedBytes, limit)
			}
			draft := func(d *gpu.Device) []engine.Token {
				e, err := New(d, m.Config, m.Weights, Options{KVBytes: 2 << 20, MaxSequences: 2})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				s, err := e.NewSequence()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Release()
				got, err := e.StepN(context.Background(), []*engine.Entry{{Seq: s, Tokens: shippedPrompt, TopN: engine.MaxTopN}}, 8)
				if err != nil {
					t.Fatal(err)
				}
				return got[0]
			}
			want, got := draft(gputest.Device(t)), draft(small)
			if !slices.Equal(engine.IDs(got), engine.IDs(want)) {
				t.Fatalf("drafted %v in row blocks, %v unsplit", engine.IDs(got), engine.IDs(want))
			}
			for i := range want {
				for j, w := range want[i].Top {
					g := got[i].Top[j]
					if g.Token != w.Token || math.Abs(float64(g.Logprob-w.Logprob)) > 1e-4 {
						t.Fatalf("token %d, top %d: %+v in row blocks, %+v unsplit", i, j, g, w)
					}
				}
			}
			t.Logf("%d tokens %v, top 20 the same, on %d-byte bindings", len(got), engine.IDs(got), small.Limits().MaxStorageBufferBindingSize)
		})
	}
}

// TestShippedLogprobs: the shipped pair's greedy tokens carry the same
// log-probability through the argmax read-out (no top-N) as through the
// sampling one (top 1). The drafter's head scores 32,768 tokens, so whole
// chunks of its logits rows are −∞, which once made the former NaN.
func TestShippedLogprobs(t *testing.T) {
	d := gputest.Device(t)
	for _, dir := range []string{shipped.TargetDir, shipped.DrafterDir} {
		t.Run(dir, func(t *testing.T) {
			m := loadShipped(t, dir)
			e, err := New(d, m.Config, m.Weights, Options{KVBytes: 2 << 20, MaxSequences: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			draft := func(topN int) []engine.Token {
				s, err := e.NewSequence()
				if err != nil {
					t.Fatal(err)
				}
				defer s.Release()
				got, err := e.StepN(context.Background(), []*engine.Entry{{Seq: s, Tokens: shippedPrompt, TopN: topN}}, 6)
				if err != nil {
					t.Fatal(err)
				}
				return got[0]
			}
			argmax, sampled := draft(0), draft(1)
			if !slices.Equal(engine.IDs(argmax), engine.IDs(sampled)) {
				t.Fatalf("drafted %v through argmax, %v through sample", engine.IDs(argmax), engine.IDs(sampled))
			}
			for i, a := range argmax {
				if lp := float64(a.Logprob); math.IsNaN(lp) || lp > 0 || math.Abs(lp-float64(sampled[i].Logprob)) > 1e-4 {
					t.Errorf("token %d: log p %v through argmax, %v through sample", i, a.Logprob, sampled[i].Logprob)
				}
			}
		})
	}
}

// shippedPrompt is "def fibonacci(n):\n   " and more, in the shipped pair's
// tokens.
var shippedPrompt = []int{750, 75698, 1445, 982, 262, 220, 16, 17, 18, 19, 20}

// loadShipped loads a folder of the embedded pair, closed with the test.
func loadShipped(t *testing.T, dir string) *checkpoint.Model {
	t.Helper()
	m, err := checkpoint.LoadFS(shipped.FS(), dir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
