package reference

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"

	"webdraft/checkpoint"
	"webdraft/internal/synth"
	"webdraft/safetensors"
)

const eagle3Tiny = "../testdata/eagle3/tiny"

// TestEagle3HeadMatchesPyTorch runs the tiny random EAGLE-3 head of
// testdata/eagle3 (its BF16 checkpoint in the public layout, loaded as f32)
// and compares every row's draft-vocabulary logits and output before norm
// with PyTorch's forward of the same head (make_head.py): a first pass of
// five rows over the target's features (fc, 3·Ht wide), then two draft
// steps that each feed back the last row's output with its best token,
// mapped to the target's vocabulary by d2t.
func TestEagle3HeadMatchesPyTorch(t *testing.T) {
	h, m, want := loadTinyHead(t, checkpoint.LoadOptions{Quant: checkpoint.F32})
	H, Ht := m.Config.HiddenSize, m.Config.TargetHiddenSize
	seq := h.NewSequence()
	ids := ints(want.i64["ids0"])
	feats := make([][]float32, len(ids))
	for i := range feats {
		feats[i] = want.f32["features0"][i*3*Ht : (i+1)*3*Ht]
	}
	rows, err := h.Forward(seq, ids, feats)
	if err != nil {
		t.Fatal(err)
	}
	Vd := m.Config.DraftVocabSize
	for step := 0; ; step++ {
		name := func(s string) string { return fmt.Sprintf("%s%d", s, step) }
		for i, r := range rows {
			if e := relErr(r.Logits, want.f32[name("logits")][i*Vd:(i+1)*Vd]); e > 1e-5 {
				t.Errorf("step %d, row %d: logits differ from PyTorch's by %.2g of their largest", step, i, e)
			}
			if e := relErr(r.Hidden, want.f32[name("hidden")][i*H:(i+1)*H]); e > 1e-5 {
				t.Errorf("step %d, row %d: the output before norm differs from PyTorch's by %.2g", step, i, e)
			}
		}
		if step == 2 {
			break
		}
		last := rows[len(rows)-1]
		best, err := Argmax(last.Logits)
		if err != nil {
			t.Fatal(err)
		}
		tok := h.TargetToken(best)
		if w := int(want.i64[fmt.Sprintf("ids%d", step+1)][0]); tok != w {
			t.Fatalf("step %d: the draft's token is %d in the target's vocabulary, PyTorch's %d", step+1, tok, w)
		}
		if rows, err = h.Forward(seq, []int{tok}, [][]float32{last.Hidden}); err != nil {
			t.Fatal(err)
		}
	}
	if seq.Len() != 7 {
		t.Errorf("the head's cache holds %d positions, want 7", seq.Len())
	}
}

// TestEagle3HeadInt4 loads the same head quantized to int4 and drafts from
// it: the path a served head takes.
func TestEagle3HeadInt4(t *testing.T) {
	h, m, want := loadTinyHead(t, checkpoint.LoadOptions{Quant: checkpoint.Int4, GroupSize: 16})
	Ht := m.Config.TargetHiddenSize
	rows, err := h.Forward(h.NewSequence(), []int{int(want.i64["ids0"][0])}, [][]float32{want.f32["features0"][:3*Ht]})
	if err != nil {
		t.Fatal(err)
	}
	// Random weights at 16-column groups lose about a tenth; a broken
	// quantization or layout loses everything.
	if e := relErr(rows[0].Logits, want.f32["logits0"][:m.Config.DraftVocabSize]); e > 0.25 {
		t.Errorf("int4 logits differ from PyTorch's (BF16) by %.2g of their largest", e)
	}
}

// loadTinyHead loads testdata/eagle3's head as opts say, with PyTorch's
// inputs and outputs for it.
func loadTinyHead(t *testing.T, opts checkpoint.LoadOptions) (*Head, *checkpoint.Eagle3, expected) {
	t.Helper()
	m, err := checkpoint.LoadEagle3(eagle3Tiny, opts)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHead(m.Config, m.Weights, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h, m, readExpected(t, filepath.Join(eagle3Tiny, "expected.safetensors"))
}

type expected struct {
	f32 map[string][]float32
	i64 map[string][]int64
}

func readExpected(t *testing.T, path string) expected {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	e := expected{f32: map[string][]float32{}, i64: map[string][]int64{}}
	for _, n := range f.Names() {
		ts, _ := f.Tensor(n)
		switch ts.DType {
		case safetensors.F32:
			e.f32[n] = append([]float32(nil), safetensors.Float32s(ts.Data)...)
		case safetensors.I64:
			for i := 0; i < len(ts.Data); i += 8 {
				e.i64[n] = append(e.i64[n], int64(binary.LittleEndian.Uint64(ts.Data[i:])))
			}
		}
	}
	return e
}

func ints(v []int64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// TestForwardFeatures: the features an EAGLE-3 head reads are the residual
// stream entering the chosen layers — the embedding itself before layer 0 —,
// the same whether a prompt is fed at once or token by token, beside
// logits equal to ForwardRows'.
func TestForwardFeatures(t *testing.T) {
	cfg := synth.Shapes["tiny"]
	cfg.NumHiddenLayers = 4
	dir := filepath.Join(t.TempDir(), "hf")
	if err := synth.Write(dir, cfg, synth.Options{Seed: 7, Std: 0.2}); err != nil {
		t.Fatal(err)
	}
	m := loadModel(t, dir, checkpoint.F32)
	H, L := cfg.HiddenSize, cfg.NumHiddenLayers
	aux := []int{0, L / 2, L - 1}
	tokens := []int{3, 17, 5, 9, 30}
	whole := m.NewSequence()
	logits, feats, err := m.ForwardFeatures([]Input{{Seq: whole, Tokens: tokens}}, []int{len(tokens)}, aux)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := m.ForwardRows([]Input{{Seq: m.NewSequence(), Tokens: tokens}}, []int{len(tokens)})
	if err != nil {
		t.Fatal(err)
	}
	one := m.NewSequence()
	embed := make([]float32, H)
	for i, tok := range tokens {
		if e := relErr(logits[0][i], plain[0][i]); e != 0 {
			t.Errorf("row %d: logits differ from ForwardRows' by %.2g", i, e)
		}
		m.w.EmbedTokens.Row(tok, embed)
		if e := relErr(feats[0][i][:H], embed); e != 0 {
			t.Errorf("row %d: the feature before layer 0 is not the token's embedding (%.2g)", i, e)
		}
		_, step, err := m.ForwardFeatures([]Input{{Seq: one, Tokens: []int{tok}}}, []int{1}, aux)
		if err != nil {
			t.Fatal(err)
		}
		if len(step[0][0]) != 3*H {
			t.Fatalf("a feature row is %d wide, want %d", len(step[0][0]), 3*H)
		}
		if e := relErr(step[0][0], feats[0][i]); e > 1e-5 {
			t.Errorf("row %d: fed alone its features differ by %.2g from the prompt's at once", i, e)
		}
	}
	for _, bad := range [][]int{nil, {1, 1, 2}, {-1, 0, 1}, {0, 1, L}} {
		if _, _, err := m.ForwardFeatures([]Input{{Seq: m.NewSequence(), Tokens: tokens}}, []int{1}, bad); err == nil {
			t.Errorf("feature layers %v accepted", bad)
		}
	}
}
