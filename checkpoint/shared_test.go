package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"webdraft/internal/synth"
	"webdraft/safetensors"
)

// pairHF writes the HF checkpoints of a tied target and a drafter of the
// same hidden size trained on its frozen embedding (synth: one seed, one
// embedding), the drafter with a ranked head of 100 tokens.
func pairHF(t *testing.T, drafterSeed uint64) (target, drafter string) {
	t.Helper()
	cfg := synth.Shapes["tiny"]
	cfg.TieWordEmbeddings = true
	root := t.TempDir()
	target, drafter = filepath.Join(root, "target-hf"), filepath.Join(root, "drafter-hf")
	if err := synth.Write(target, cfg, synth.Options{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	cfg.NumHiddenLayers = 1
	if err := synth.Write(drafter, cfg, synth.Options{Seed: drafterSeed, HeadTokens: 100}); err != nil {
		t.Fatal(err)
	}
	return target, drafter
}

// without rewrites an HF folder's model.safetensors without one tensor (as
// the training recipe exports a drafter: no copy of the shared embedding).
func without(t *testing.T, dir, name string) { rewrite(t, dir, name, nil) }

// rewrite rewrites a folder's model.safetensors without the tensor drop,
// its metadata edited by edit when set.
func rewrite(t *testing.T, dir, drop string, edit func(map[string]string)) {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(dir, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	var specs []safetensors.Spec
	var data []byte
	meta := f.Metadata
	if edit != nil {
		edit(meta)
	}
	for _, n := range f.Names() {
		if n == drop {
			continue
		}
		tt, _ := f.Tensor(n)
		specs = append(specs, safetensors.Spec{Name: n, DType: tt.DType, Shape: tt.Shape})
		data = append(data, tt.Data...)
	}
	f.Close()
	out, err := os.Create(filepath.Join(dir, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	w, err := safetensors.NewWriter(out, specs, meta)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSharedEmbeddingAndPartialHead(t *testing.T) {
	targetHF, drafterHF := pairHF(t, 1)
	root := t.TempDir()
	target, drafter := filepath.Join(root, "target"), filepath.Join(root, "drafter")
	ctx := context.Background()
	if _, err := Convert(ctx, targetHF, target, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	ref, err := Load(drafterHF, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, ranked := dense(ref), slices.Clone(ref.Weights.HeadTokens)
	ref.Close()
	if len(ranked) != 100 {
		t.Fatalf("the HF drafter has %d head tokens, want 100", len(ranked))
	}
	for _, keepOwn := range []bool{true, false} {
		if !keepOwn { // as the training recipe exports it
			without(t, drafterHF, embedName)
		}
		stats, err := Convert(ctx, drafterHF, drafter, ConvertOptions{EmbeddingFrom: target, HeadTokens: 40})
		if err != nil {
			t.Fatalf("own embedding %v: %v", keepOwn, err)
		}
		if len(stats.Ignored) != 0 {
			t.Errorf("ignored %v", stats.Ignored)
		}
		f, err := safetensors.OpenFolder(drafter)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := f.Tensor(embedName + qweightSuffix); ok {
			t.Error("the drafter stores its own embedding")
		}
		if got := f.Metadata()[metaSharedEmbedding]; got != "../target" {
			t.Errorf("shared_embedding %q, want ../target", got)
		}
		f.Close()

		for _, how := range []string{"disk", "fs"} {
			d := load(t, drafter, Int4)
			if how == "fs" {
				if d, err = LoadFS(os.DirFS(root), "drafter", LoadOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			tg := load(t, target, Int4)
			if d.SharedEmbedding != "../target" {
				t.Errorf("%s: SharedEmbedding %q", how, d.SharedEmbedding)
			}
			if !reflect.DeepEqual(d.Weights.EmbedTokens, tg.Weights.EmbedTokens) {
				t.Errorf("%s: the drafter's embedding is not the target's", how)
			}
			if !slices.Equal(d.Weights.HeadTokens, ranked[:40]) {
				t.Errorf("%s: head tokens %v, want the first 40 of %v", how, d.Weights.HeadTokens, ranked)
			}
			// The head is the embedding's rows at those tokens.
			H := d.Config.HiddenSize
			row, emb := make([]float32, H), make([]float32, H)
			for j, tok := range d.Weights.HeadTokens {
				d.Weights.LMHead.Row(j, row)
				d.Weights.EmbedTokens.Row(int(tok), emb)
				if !slices.Equal(row, emb) {
					t.Fatalf("%s: head row %d is not embedding row %d", how, j, tok)
				}
			}
			got := dense(d)
			for name, v := range got {
				if strings.HasPrefix(name, "model.layers.") && !slices.Equal(v, want[name]) {
					t.Errorf("%s: %s differs from the HF drafter's", how, name)
				}
			}
			if how == "fs" {
				d.Close()
			}
		}
	}

	// A drafter moved away from its target says what its path is relative to.
	moved := filepath.Join(root, "elsewhere", "drafter")
	if err := os.MkdirAll(filepath.Dir(moved), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(moved, os.DirFS(drafter)); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(moved, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "../target (a path from this folder") {
		t.Errorf("a drafter moved from its target: %v", err)
	}

	// The errors: a head longer than the ranked list, a drafter not trained
	// on this embedding, a target converted again since.
	if _, err := Convert(ctx, drafterHF, filepath.Join(root, "x"), ConvertOptions{EmbeddingFrom: target, HeadTokens: 101}); err == nil || !strings.Contains(err.Error(), "only 100") {
		t.Errorf("--head-tokens 101 of 100: %v", err)
	}
	_, other := pairHF(t, 2)
	if _, err := Convert(ctx, other, filepath.Join(root, "y"), ConvertOptions{EmbeddingFrom: target}); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("a drafter with another embedding: %v", err)
	}
	// f32 layers over the target's int4 embedding (the unquantized drafter).
	f32 := filepath.Join(root, "drafter-f32")
	if _, err := Convert(ctx, drafterHF, f32, ConvertOptions{EmbeddingFrom: target, Quant: F32}); err != nil {
		t.Fatal(err)
	}
	if d := load(t, f32, F32); !reflect.DeepEqual(d.Weights.EmbedTokens, load(t, target, Int4).Weights.EmbedTokens) || d.Quant != F32 {
		t.Errorf("an f32 drafter over an int4 embedding: quant %s, embedding %T", d.Quant, d.Weights.EmbedTokens)
	}
	cfg := synth.Shapes["tiny"]
	cfg.TieWordEmbeddings = true
	otherTarget := filepath.Join(root, "other-target-hf")
	if err := synth.Write(otherTarget, cfg, synth.Options{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(target); err != nil {
		t.Fatal(err)
	}
	if _, err := Convert(ctx, otherTarget, target, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(drafter, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("a drafter whose target changed: %v", err)
	}

	// A shared folder whose group size does not fit the embedding (its
	// bytes, and so the hash, unchanged) is refused, not read past its
	// scales.
	if _, err := Convert(ctx, drafterHF, filepath.Join(root, "d2"), ConvertOptions{EmbeddingFrom: target}); err != nil {
		t.Fatal(err)
	}
	rewrite(t, target, "", func(m map[string]string) { m[metaGroupSize] = "128" })
	if _, err := Load(filepath.Join(root, "d2"), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "embedding shared") {
		t.Errorf("a shared embedding of group size 128 over hidden 64: %v", err)
	}
}
