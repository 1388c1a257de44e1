package synth_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"webdraft/checkpoint"
	"webdraft/eagle3"
	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/safetensors"
)

// TestWriteEagle3 writes heads for a tiny target: LoadEagle3 reads each
// with the sizes asked for, it fits the target, and the reference head
// drafts from it.
func TestWriteEagle3(t *testing.T) {
	target := synth.Shapes["tiny"]
	target.NumHiddenLayers = 8 // the default aux layers 2, 4 and 5
	targetEmbed := synth.Int4Weights(target, 1, 0.02).EmbedTokens
	for _, c := range []struct {
		name string
		opts synth.Eagle3Options
		aux  []int
	}{
		{"default", synth.Eagle3Options{Seed: 1}, nil},
		{"f32, aux layers, embedding", synth.Eagle3Options{Seed: 2, DType: safetensors.F32, AuxLayerIDs: []int{6, 0, 3}, Embedding: true}, []int{1, 4, 7}},
		{"sizes", synth.Eagle3Options{Seed: 3, DType: safetensors.F16, DraftVocabSize: 32, IntermediateSize: 64, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 16}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "head")
			if err := synth.WriteEagle3(dir, target, c.opts); err != nil {
				t.Fatal(err)
			}
			h, err := checkpoint.LoadEagle3(dir, checkpoint.LoadOptions{Quant: checkpoint.F32})
			if err != nil {
				t.Fatal(err)
			}
			cfg := h.Config
			if err := cfg.Check(target); err != nil {
				t.Fatal(err)
			}
			or := func(v, def int) int {
				if v != 0 {
					return v
				}
				return def
			}
			want := eagle3.Config{
				HiddenSize: target.HiddenSize, IntermediateSize: or(c.opts.IntermediateSize, target.IntermediateSize),
				NumAttentionHeads: or(c.opts.NumAttentionHeads, target.NumAttentionHeads), NumKeyValueHeads: or(c.opts.NumKeyValueHeads, target.NumKeyValueHeads),
				HeadDim: or(c.opts.HeadDim, target.HeadDim), RMSNormEps: target.RMSNormEps, RopeTheta: target.RopeTheta,
				MaxPositionEmbeddings: target.MaxPositionEmbeddings, VocabSize: target.VocabSize,
				DraftVocabSize: or(c.opts.DraftVocabSize, target.VocabSize), TargetHiddenSize: target.HiddenSize, AuxLayers: c.aux,
			}
			if !reflect.DeepEqual(cfg, want) {
				t.Errorf("config %+v, want %+v", cfg, want)
			}
			if (h.Weights.EmbedTokens != nil) != c.opts.Embedding {
				t.Errorf("embedding %v, want %v", h.Weights.EmbedTokens != nil, c.opts.Embedding)
			}
			checkT2D(t, dir, h.Weights.TargetIDs, target.VocabSize)

			head, err := reference.NewHead(cfg, h.Weights, targetEmbed)
			if err != nil {
				t.Fatal(err)
			}
			feats := make([][]float32, 2)
			for i := range feats {
				feats[i] = make([]float32, 3*cfg.TargetHiddenSize)
				for j := range feats[i] {
					feats[i][j] = float32(math.Cos(float64(3*i + j)))
				}
			}
			seq := head.NewSequence()
			rows, err := head.Forward(seq, []int{5, 9}, feats)
			if err != nil {
				t.Fatal(err)
			}
			last := rows[len(rows)-1]
			if rows, err = head.Forward(seq, []int{7}, [][]float32{last.Hidden}); err != nil {
				t.Fatal(err)
			}
			for _, v := range rows[0].Logits {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("logit %g", v)
				}
			}
			if len(rows[0].Logits) != cfg.DraftVocabSize || seq.Len() != 3 {
				t.Errorf("%d logits, %d positions", len(rows[0].Logits), seq.Len())
			}
		})
	}
}

// checkT2D: t2d marks exactly the draft vocabulary's target tokens.
func checkT2D(t *testing.T, dir string, ids []int32, vocab int) {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(dir, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t2d, ok := f.Tensor(eagle3.T2DName)
	if !ok || t2d.DType != safetensors.BOOL || !reflect.DeepEqual(t2d.Shape, []int{vocab}) {
		t.Fatalf("t2d %s %v (present %v)", t2d.DType, t2d.Shape, ok)
	}
	want := make([]byte, vocab)
	for _, id := range ids {
		want[id] = 1
	}
	if !bytes.Equal(t2d.Data, want) {
		t.Error("t2d does not mark d2t's tokens")
	}
}

// TestWriteEagle3Defaults: the draft vocabulary is at most 32768 tokens,
// the same seed writes the same files and another seed other ones, and
// bad options are refused.
func TestWriteEagle3Defaults(t *testing.T) {
	target := qwen3.Config{VocabSize: 40000, HiddenSize: 16, IntermediateSize: 32, NumHiddenLayers: 6,
		NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 8, RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 64}
	write := func(seed uint64) (string, []byte) {
		dir := filepath.Join(t.TempDir(), "head")
		if err := synth.WriteEagle3(dir, target, synth.Eagle3Options{Seed: seed}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, safetensors.SingleFile))
		if err != nil {
			t.Fatal(err)
		}
		return dir, b
	}
	dir, a := write(4)
	_, b := write(4)
	_, c := write(5)
	if !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Errorf("same seed equal: %v, other seed equal: %v", bytes.Equal(a, b), bytes.Equal(a, c))
	}
	h, err := checkpoint.LoadEagle3(dir, checkpoint.LoadOptions{Quant: checkpoint.F16})
	if err != nil {
		t.Fatal(err)
	}
	if h.Config.DraftVocabSize != synth.DefaultDraftVocab {
		t.Errorf("draft_vocab_size %d, want %d", h.Config.DraftVocabSize, synth.DefaultDraftVocab)
	}
	for _, opts := range []synth.Eagle3Options{
		{DType: safetensors.I32},
		{DraftVocabSize: 40001},
		{AuxLayerIDs: []int{1, 2}},
		{NumKeyValueHeads: 3},
	} {
		if err := synth.WriteEagle3(filepath.Join(t.TempDir(), "bad"), target, opts); err == nil {
			t.Errorf("%+v accepted", opts)
		}
	}
}

// TestEagle3Int4Weights: the in-memory int4 head is whole for its config.
func TestEagle3Int4Weights(t *testing.T) {
	for _, shape := range []string{"tiny", "qwen3-0.6b"} {
		cfg := synth.Eagle3Config(synth.Shapes[shape], synth.Eagle3Options{})
		w := synth.Eagle3Int4Weights(cfg, 1, 0.02)
		if err := w.Validate(&cfg); err != nil {
			t.Errorf("%s: %v", shape, err)
		}
		if w.EmbedTokens != nil {
			t.Errorf("%s: an embedding of the head's own; want the target's", shape)
		}
	}
}
