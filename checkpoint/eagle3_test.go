package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"webdraft/eagle3"
	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// eagle3Tiny is the tiny random head of testdata/eagle3 (make_head.py): the
// public layout, BF16, with its own embedding and a t2d; fc is 3·48 = 144
// wide, so int4 needs a group size dividing it (16).
const eagle3Tiny = "../testdata/eagle3/tiny"

func loadHead(t *testing.T, dir string, opts LoadOptions) *Eagle3 {
	t.Helper()
	h, err := LoadEagle3(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// headSlots lists a loaded head's tensors, its embedding included when it
// has one.
func headSlots(h *Eagle3) []qwen3.Slot {
	slots := h.Weights.Slots(&h.Config)
	if h.Weights.EmbedTokens != nil {
		slots = append(slots, qwen3.Slot{Name: eagle3.EmbedName, Matrix: &h.Weights.EmbedTokens})
	}
	return slots
}

// storedBytes is a matrix's held form, byte for byte, with its type and
// shape: two matrices with the same storedBytes hold the same bits.
func storedBytes(m tensor.Matrix) []byte {
	rows, cols := m.Shape()
	b := fmt.Appendf(nil, "%T %d×%d ", m, rows, cols)
	switch m := m.(type) {
	case *tensor.Int4:
		b = fmt.Appendf(b, "g%d ", m.GroupSize)
		b, _ = binary.Append(b, binary.LittleEndian, m.QWeight)
		b, _ = binary.Append(b, binary.LittleEndian, m.Scales)
	case *tensor.F16:
		b, _ = binary.Append(b, binary.LittleEndian, m.Data)
	case *tensor.F32:
		b, _ = binary.Append(b, binary.LittleEndian, m.Data)
	}
	return b
}

// sameHead reports how two loaded heads' weights differ, bit for bit, or "".
func sameHead(a, b *Eagle3) string {
	if !reflect.DeepEqual(a.Config, b.Config) {
		return fmt.Sprintf("configs %+v and %+v", a.Config, b.Config)
	}
	if !reflect.DeepEqual(a.Weights.TargetIDs, b.Weights.TargetIDs) {
		return "TargetIDs differ"
	}
	sa, sb := headSlots(a), headSlots(b)
	if len(sa) != len(sb) {
		return fmt.Sprintf("%d tensors against %d", len(sa), len(sb))
	}
	for i, s := range sa {
		if s.Vector != nil {
			va, vb := *s.Vector, *sb[i].Vector
			if len(va) != len(vb) {
				return s.Name + ": lengths differ"
			}
			for j := range va {
				if math.Float32bits(va[j]) != math.Float32bits(vb[j]) {
					return fmt.Sprintf("%s[%d]: %g against %g", s.Name, j, va[j], vb[j])
				}
			}
			continue
		}
		if !bytes.Equal(storedBytes(*s.Matrix), storedBytes(*sb[i].Matrix)) {
			return s.Name + " differs"
		}
	}
	return ""
}

// headLogits runs the reference head over a first pass of three rows of
// fixed features and one draft step, and returns every row's logits.
func headLogits(t *testing.T, h *Eagle3, targetEmbed tensor.Matrix) [][]float32 {
	t.Helper()
	head, err := reference.NewHead(h.Config, h.Weights, targetEmbed)
	if err != nil {
		t.Fatal(err)
	}
	c := h.Config
	feats := make([][]float32, 3)
	for i := range feats {
		feats[i] = make([]float32, 3*c.TargetHiddenSize)
		for j := range feats[i] {
			feats[i][j] = float32(math.Sin(float64(7*i+j)) * 2)
		}
	}
	seq := head.NewSequence()
	rows, err := head.Forward(seq, []int{1, c.VocabSize / 2, c.VocabSize - 1}, feats)
	if err != nil {
		t.Fatal(err)
	}
	last := rows[len(rows)-1]
	best, err := reference.Argmax(last.Logits)
	if err != nil {
		t.Fatal(err)
	}
	next, err := head.Forward(seq, []int{head.TargetToken(best)}, [][]float32{last.Hidden})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	for _, r := range append(rows, next...) {
		out = append(out, r.Logits)
	}
	return out
}

func sameBits(a, b [][]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return false
			}
		}
	}
	return true
}

// TestConvertEagle3 converts the tiny head to each format: the converted
// folder, loaded as stored, holds the bits LoadEagle3 makes of the public
// layout with the same format, so the reference head's logits are
// identical.
func TestConvertEagle3(t *testing.T) {
	for _, opts := range []ConvertOptions{{Quant: Int4, GroupSize: 16}, {Quant: Int4, GroupSize: 8}, {Quant: F16}, {Quant: F32}} {
		t.Run(fmt.Sprintf("%s-%d", opts.Quant, opts.GroupSize), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "head")
			var calls int
			opts.Progress = func(done, total int64) {
				calls++
				if done > total {
					t.Errorf("progress %d > %d", done, total)
				}
			}
			stats, err := ConvertEagle3(context.Background(), eagle3Tiny, out, opts)
			if err != nil {
				t.Fatal(err)
			}
			// 13 slots and the embedding; t2d dropped without a warning.
			if stats.Tensors != 14 || len(stats.Ignored) != 0 || stats.OutputBytes == 0 || stats.SourceBytes == 0 || calls == 0 {
				t.Errorf("stats %+v, %d progress calls", stats, calls)
			}
			in := loadHead(t, eagle3Tiny, LoadOptions{Quant: opts.Quant, GroupSize: opts.GroupSize})
			conv := loadHead(t, out, LoadOptions{})
			wantGroup := opts.GroupSize
			if opts.Quant != Int4 {
				wantGroup = 0
			}
			if in.Converted || !conv.Converted || conv.Quant != opts.Quant || conv.GroupSize != wantGroup {
				t.Errorf("Converted %v/%v, quant %s group %d", in.Converted, conv.Converted, conv.Quant, conv.GroupSize)
			}
			if d := sameHead(in, conv); d != "" {
				t.Fatalf("the converted head differs from the head converted on load: %s", d)
			}
			if !sameBits(headLogits(t, in, nil), headLogits(t, conv, nil)) {
				t.Error("the reference head's logits differ between the converted folder and the head converted on load")
			}
			// A converted folder keeps its format whatever the options ask,
			// as Load does.
			other := loadHead(t, out, LoadOptions{Quant: F32, GroupSize: 8})
			if other.Quant != opts.Quant || other.GroupSize != wantGroup {
				t.Errorf("loaded with other options: quant %s group %d, want the stored %s/%d", other.Quant, other.GroupSize, opts.Quant, wantGroup)
			}
			cfgIn, _ := os.ReadFile(filepath.Join(eagle3Tiny, "config.json"))
			cfgOut, _ := os.ReadFile(filepath.Join(out, "config.json"))
			if !bytes.Equal(cfgIn, cfgOut) {
				t.Error("config.json not copied byte for byte")
			}
			f, err := safetensors.Open(filepath.Join(out, safetensors.SingleFile))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Metadata["format"] != "webdraft" || f.Metadata["quant"] != string(opts.Quant) {
				t.Errorf("metadata %v", f.Metadata)
			}
			if _, ok := f.Tensor(eagle3.T2DName); ok {
				t.Error("t2d written")
			}
			if d, _ := f.Tensor(eagle3.D2TName); d.DType != safetensors.I64 {
				t.Errorf("d2t stored as %s", d.DType)
			}
			for _, n := range f.Names() {
				tn, _ := f.Tensor(n)
				if size := tn.DType.Size(); size > 1 && uintptrOf(tn.Data)%uintptr(size) != 0 {
					t.Errorf("%s (%s) is not aligned", n, tn.DType)
				}
			}
			if err := conv.Close(); err != nil || conv.Close() != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

// TestConvertEagle3Synth: a head written for a target (no embedding of its
// own, an F32 checkpoint, the default draft vocabulary) converts at the
// default int4 group of 32 to what LoadEagle3 makes of it by default.
func TestConvertEagle3Synth(t *testing.T) {
	target := synth.Shapes["tiny"]
	target.NumHiddenLayers = 8
	in := filepath.Join(t.TempDir(), "head")
	if err := synth.WriteEagle3(in, target, synth.Eagle3Options{Seed: 3, DType: safetensors.F32, Std: 0.1}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	stats, err := ConvertEagle3(context.Background(), in, out, ConvertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Tensors != 13 || len(stats.Ignored) != 0 {
		t.Errorf("stats %+v", stats)
	}
	a, b := loadHead(t, in, LoadOptions{}), loadHead(t, out, LoadOptions{})
	if b.Quant != Int4 || b.GroupSize != tensor.DefaultGroupSize || b.Weights.EmbedTokens != nil {
		t.Errorf("converted as %s/%d, embedding %v", b.Quant, b.GroupSize, b.Weights.EmbedTokens != nil)
	}
	if d := sameHead(a, b); d != "" {
		t.Fatal(d)
	}
	embed := synth.Int4Weights(target, 1, 0.02).EmbedTokens
	if !sameBits(headLogits(t, a, embed), headLogits(t, b, embed)) {
		t.Error("logits differ")
	}
}

// TestConvertEagle3Refusals: every refusal says why and leaves no
// model.safetensors (nor its temporary file) behind.
func TestConvertEagle3Refusals(t *testing.T) {
	head := copyDir(t, eagle3Tiny)
	qwen := writeTiny(t, synth.Options{Seed: 1})
	converted := filepath.Join(t.TempDir(), "converted")
	if _, err := ConvertEagle3(context.Background(), head, converted, ConvertOptions{Quant: F16}); err != nil {
		t.Fatal(err)
	}
	badShape := copyDir(t, eagle3Tiny)
	editConfig(t, badShape, func(m map[string]any) { m["intermediate_size"] = 96 })
	badD2T := copyDir(t, eagle3Tiny)
	editConfig(t, badD2T, func(m map[string]any) { m["draft_vocab_size"] = 39 })
	noHead := copyDir(t, eagle3Tiny)
	editHeader(t, filepath.Join(noHead, safetensors.SingleFile), func(h map[string]any) {
		h["lm_head.weigh_"] = h["lm_head.weight"]
		delete(h, "lm_head.weight")
	})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		in   string
		opts ConvertOptions
		want string
	}{
		{"same folder", nil, head, ConvertOptions{Quant: F32}, "is the input folder"},
		{"a Qwen3 model", nil, qwen, ConvertOptions{}, "LlamaForCausalLMEagle3"},
		{"already converted", nil, converted, ConvertOptions{Quant: F16}, "already a webdraft folder"},
		{"shape", nil, badShape, ConvertOptions{Quant: F32}, "has shape"},
		{"d2t", nil, badD2T, ConvertOptions{Quant: F32}, "d2t"},
		{"missing tensor", nil, noHead, ConvertOptions{Quant: F32}, "lm_head.weight is missing"},
		{"group size", nil, head, ConvertOptions{}, "group-size"},
		{"embedding-from", nil, head, ConvertOptions{Quant: F32, EmbeddingFrom: converted}, "--embedding-from"},
		{"head-tokens", nil, head, ConvertOptions{Quant: F32, HeadTokens: 20}, "--head-tokens"},
		{"cancelled", cancelled, head, ConvertOptions{Quant: F32}, "context canceled"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := c.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			out := filepath.Join(t.TempDir(), "out")
			if c.name == "same folder" {
				out = head
			}
			before := listDir(t, out)
			_, err := ConvertEagle3(ctx, c.in, out, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
			if after := listDir(t, out); !reflect.DeepEqual(before, after) {
				t.Errorf("the output folder went from %v to %v", before, after)
			}
		})
	}
}

// TestLoadEagle3Refusals: the loader tells a head from a model both ways,
// and refuses a converted head that names a shared embedding.
func TestLoadEagle3Refusals(t *testing.T) {
	out := filepath.Join(t.TempDir(), "head")
	if _, err := ConvertEagle3(context.Background(), eagle3Tiny, out, ConvertOptions{Quant: F32}); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(out, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "model_type") {
		t.Errorf("Load of a converted head: %v", err)
	}
	model := filepath.Join(t.TempDir(), "model")
	if _, err := Convert(context.Background(), writeTiny(t, synth.Options{Seed: 1}), model, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadEagle3(model, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "LlamaForCausalLMEagle3") {
		t.Errorf("LoadEagle3 of a converted model: %v", err)
	}
	editHeader(t, filepath.Join(out, safetensors.SingleFile), func(h map[string]any) {
		h["__metadata__"].(map[string]any)["shared_embedding"] = "../x"
	})
	if _, err := LoadEagle3(out, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "shared_embedding") {
		t.Errorf("a head naming a shared embedding: %v", err)
	}
}

// editHeader rewrites a safetensors file with its JSON header edited (data
// offsets count from the data's start, so they stay valid).
func editHeader(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var h map[string]any
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	edit(h)
	js, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(append(out, js...), b[8+n:]...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies a flat folder into a temporary one.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// listDir lists a folder's file names, or nil when it does not exist.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestLoadEagle3FS: a head read from a file system (the browser's fetched
// files) is the head read from its folder on disk, in the public layout
// and converted; a folder the file system lacks is an error.
func TestLoadEagle3FS(t *testing.T) {
	conv := filepath.Join(t.TempDir(), "conv")
	if _, err := ConvertEagle3(context.Background(), eagle3Tiny, conv, ConvertOptions{Quant: Int4, GroupSize: 16}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{eagle3Tiny, conv} {
		disk := loadHead(t, dir, LoadOptions{GroupSize: 16})
		fsHead, err := LoadEagle3FS(os.DirFS(filepath.Dir(dir)), filepath.Base(dir), LoadOptions{GroupSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fsHead.Close() })
		if d := sameHead(disk, fsHead); d != "" || disk.Converted != fsHead.Converted || disk.Quant != fsHead.Quant || !reflect.DeepEqual(disk.Config, fsHead.Config) {
			t.Errorf("%s: from a file system %s (converted %v/%v)", dir, d, disk.Converted, fsHead.Converted)
		}
	}
	if _, err := LoadEagle3FS(os.DirFS(t.TempDir()), "head", LoadOptions{}); err == nil {
		t.Error("a missing folder loaded")
	}
}
