package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"testing/fstest"

	"webdraft/internal/synth"
	"webdraft/qwen3"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// fuzzShape is the smallest Qwen3 the formats allow (int4 groups of 8).
var fuzzShape = qwen3.Config{VocabSize: 16, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 1,
	NumAttentionHeads: 1, NumKeyValueHeads: 1, HeadDim: 8, RMSNormEps: 1e-6, RopeTheta: 10000,
	MaxPositionEmbeddings: 16, TieWordEmbeddings: true}

// A model folder's load may allocate this much a byte of its files (an
// f32 copy of bf16 weights is 2×, a tied head gathered from them another
// copy), and this much besides.
const (
	fuzzAllocPerByte = 16
	fuzzAllocSlack   = 1 << 20
)

// fuzzFolder is the file system FuzzLoadFS loads m from: m's config.json
// and model.safetensors, and e/model.safetensors, the folder a converted m
// may share its embedding with (shared_embedding "../e").
func fuzzFolder(config, weights, shared []byte) fstest.MapFS {
	return fstest.MapFS{
		"m/config.json":       {Data: config},
		"m/model.safetensors": {Data: weights},
		"e/model.safetensors": {Data: shared},
	}
}

// fuzzOptions picks the load options from one byte.
func fuzzOptions(o uint8) LoadOptions {
	return LoadOptions{Quant: []Quant{"", Int4, F16, F32}[o%4], GroupSize: []int{0, 8, 16, 24}[o/4%4]}
}

// FuzzLoadFS is the converter's reader on a fuzzed folder: LoadFS of a
// config.json, a model.safetensors and the model.safetensors of a folder
// sharing its embedding, with fuzzed load options. It must never panic,
// and a model it accepts must be whole:
//   - every tensor of the weight tree is there with the shape the config
//     implies, each matrix's storage exactly its rows × columns in its
//     format (int4: a group size dividing the width, Cols/8 words and
//     Cols/GroupSize scales a row), and every row reads;
//   - the head scores HeadRows tokens, each in the vocabulary, none twice;
//   - an HF checkpoint loaded as f32 holds its source values exactly, and
//     as f16 their rounding;
//   - Close succeeds;
//   - whether it succeeds or not, it allocates no more than
//     fuzzAllocPerByte a byte of its files (and fuzzAllocSlack): what a
//     config.json claims costs nothing before the weights bear it out.
//
// Seeds: testdata/fuzz/FuzzLoadFS and tiny synthetic checkpoints written
// below — HF folders (bf16, f32, untied, a ranked head) and their
// conversions (int4, f16, f32; a drafter sharing its target's embedding).
// Bounded run (Taskfile's fuzz task):
//
//	go test ./checkpoint -run '^$' -fuzz '^FuzzLoadFS$' -fuzztime 10s
func FuzzLoadFS(f *testing.F) {
	root := f.TempDir()
	read := func(dir, name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			f.Fatal(err)
		}
		return data
	}
	write := func(name string, cfg qwen3.Config, opts synth.Options) string {
		dir := filepath.Join(root, name)
		if err := synth.Write(dir, cfg, opts); err != nil {
			f.Fatal(err)
		}
		return dir
	}
	convert := func(in, name string, opts ConvertOptions) string {
		out := filepath.Join(root, name)
		if _, err := Convert(context.Background(), in, out, opts); err != nil {
			f.Fatal(err)
		}
		return out
	}
	add := func(dir, shared string, opts uint8) {
		var sharedData []byte
		if shared != "" {
			sharedData = read(shared, safetensors.SingleFile)
		}
		f.Add(read(dir, "config.json"), read(dir, safetensors.SingleFile), sharedData, opts)
	}
	untied := fuzzShape
	untied.TieWordEmbeddings = false
	hf := write("hf", fuzzShape, synth.Options{Seed: 1})
	add(hf, "", 1|1<<2) // int4, groups of 8
	add(hf, "", 2)      // f16
	add(hf, "", 3)      // f32
	add(write("hf-f32-untied", untied, synth.Options{Seed: 2, DType: safetensors.F32}), "", 3)
	ranked := write("hf-ranked", fuzzShape, synth.Options{Seed: 3, DType: safetensors.F16, HeadTokens: 5})
	add(ranked, "", 3)
	for _, q := range []Quant{Int4, F16, F32} {
		add(convert(hf, "conv-"+string(q), ConvertOptions{Quant: q, GroupSize: 8}), "", 0)
	}
	// A drafter sharing its target's embedding: e is the target, m the drafter.
	e := convert(hf, "e", ConvertOptions{GroupSize: 8})
	drafterHF := write("drafter-hf", fuzzShape, synth.Options{Seed: 1, HeadTokens: 6})
	add(convert(drafterHF, "m", ConvertOptions{GroupSize: 8, EmbeddingFrom: e, HeadTokens: 4}), e, 0)

	f.Fuzz(func(t *testing.T, config, weights, shared []byte, o uint8) {
		loadAndCheck(t, config, weights, shared, o)
	})
}

// loadAndCheck loads m of fuzzFolder(config, weights, shared) with
// fuzzOptions(o) and checks the model (FuzzLoadFS has the list).
func loadAndCheck(t *testing.T, config, weights, shared []byte, o uint8) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	m, err := LoadFS(fuzzFolder(config, weights, shared), "m", fuzzOptions(o))
	runtime.ReadMemStats(&after)
	in := len(config) + len(weights) + len(shared)
	if used := after.TotalAlloc - before.TotalAlloc; used > uint64(fuzzAllocPerByte*in+fuzzAllocSlack) {
		t.Fatalf("LoadFS of %d bytes allocated %d MB (%v)", in, used>>20, err)
	}
	if err != nil {
		return
	}
	checkModel(t, m)
	if !m.Converted {
		checkSourceValues(t, m, weights)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// FuzzLoadFSConfig is FuzzLoadFS with the config's sizes fuzzed as
// numbers (a byte mutator seldom grows a JSON number) over real weights:
// an HF checkpoint with a ranked head, or its int4 conversion. The checks
// are FuzzLoadFS's; the one that matters most here is the allocation
// bound — a config that claims a million layers or a billion tokens must
// be refused for the tensors it lacks before anything is sized by it.
//
//	go test ./checkpoint -run '^$' -fuzz '^FuzzLoadFSConfig$' -fuzztime 10s
func FuzzLoadFSConfig(f *testing.F) {
	root := f.TempDir()
	hf, conv := filepath.Join(root, "hf"), filepath.Join(root, "conv")
	if err := synth.Write(hf, fuzzShape, synth.Options{Seed: 1, HeadTokens: 5}); err != nil {
		f.Fatal(err)
	}
	if _, err := Convert(context.Background(), hf, conv, ConvertOptions{GroupSize: 8}); err != nil {
		f.Fatal(err)
	}
	var weights [2][]byte
	for i, dir := range []string{hf, conv} {
		data, err := os.ReadFile(filepath.Join(dir, safetensors.SingleFile))
		if err != nil {
			f.Fatal(err)
		}
		weights[i] = data
	}
	c := fuzzShape
	for _, converted := range []bool{false, true} {
		f.Add(int64(c.VocabSize), int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumHiddenLayers), int64(c.NumAttentionHeads),
			int64(c.NumKeyValueHeads), int64(c.HeadDim), int64(c.MaxPositionEmbeddings), c.TieWordEmbeddings, uint8(3), converted)
	}
	f.Fuzz(func(t *testing.T, vocab, hidden, inter, layers, heads, kvHeads, headDim, positions int64, tie bool, o uint8, converted bool) {
		config, err := json.Marshal(map[string]any{
			"model_type": "qwen3", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
			"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kvHeads, "head_dim": headDim,
			"max_position_embeddings": positions, "tie_word_embeddings": tie,
		})
		if err != nil {
			t.Fatal(err)
		}
		w := weights[0]
		if converted {
			w = weights[1]
		}
		loadAndCheck(t, config, w, nil, o)
	})
}

// checkModel checks that m's weight tree is whole and consistent with its
// config.
func checkModel(t *testing.T, m *Model) {
	t.Helper()
	c, w := &m.Config, m.Weights
	if err := c.Validate(); err != nil {
		t.Fatalf("loaded with a config Validate refuses: %v", err)
	}
	if w == nil || len(w.Layers) != c.NumHiddenLayers {
		t.Fatalf("weights %v for %d layers", w, c.NumHiddenLayers)
	}
	if w.HeadTokens != nil {
		if err := qwen3.CheckHeadTokens(w.HeadTokens, c.VocabSize); err != nil {
			t.Fatalf("loaded a bad head: %v", err)
		}
	}
	slots := w.Slots(c) // an untied head among them
	if c.TieWordEmbeddings {
		slots = append(slots, qwen3.Slot{Name: "lm_head (tied)", Shape: []int{w.HeadRows(c), c.HiddenSize}, Matrix: &w.LMHead})
	}
	for _, s := range slots {
		if s.Vector != nil {
			if len(*s.Vector) != s.Shape[0] {
				t.Fatalf("%s: %d values, want %d", s.Name, len(*s.Vector), s.Shape[0])
			}
			continue
		}
		mat := *s.Matrix
		if mat == nil {
			t.Fatalf("%s: missing", s.Name)
		}
		rows, cols := mat.Shape()
		if rows != s.Shape[0] || cols != s.Shape[1] {
			t.Fatalf("%s: shape (%d, %d), want %v", s.Name, rows, cols, s.Shape)
		}
		switch mm := mat.(type) {
		case *tensor.Int4:
			if err := tensor.CheckInt4Shape(rows, cols, mm.GroupSize); err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			if len(mm.QWeight) != rows*cols/8 || len(mm.Scales) != rows*cols/mm.GroupSize {
				t.Fatalf("%s: int4 (%d, %d) group %d holds %d words and %d scales", s.Name, rows, cols, mm.GroupSize, len(mm.QWeight), len(mm.Scales))
			}
		case *tensor.F16:
			if len(mm.Data) != rows*cols {
				t.Fatalf("%s: f16 (%d, %d) holds %d values", s.Name, rows, cols, len(mm.Data))
			}
		case *tensor.F32:
			if len(mm.Data) != rows*cols {
				t.Fatalf("%s: f32 (%d, %d) holds %d values", s.Name, rows, cols, len(mm.Data))
			}
		}
		row := make([]float32, cols)
		for r := range rows {
			mat.Row(r, row)
		}
	}
}

// checkSourceValues checks an HF checkpoint loaded as f32 or f16 against
// its source tensors (in weights, the one file of the folder).
func checkSourceValues(t *testing.T, m *Model, weights []byte) {
	t.Helper()
	if m.Quant != F32 && m.Quant != F16 {
		return
	}
	file, err := safetensors.Parse("m/model.safetensors", weights)
	if err != nil {
		t.Fatalf("LoadFS accepted a file Parse refuses: %v", err)
	}
	for _, s := range m.Weights.Slots(&m.Config) {
		src, ok := file.Tensor(s.Name)
		if !ok {
			t.Fatalf("%s: loaded without a source tensor", s.Name)
		}
		var got []float32
		if s.Vector != nil {
			got = *s.Vector
		} else {
			rows, cols := (*s.Matrix).Shape()
			got = make([]float32, rows*cols)
			for r := range rows {
				(*s.Matrix).Row(r, got[r*cols:(r+1)*cols])
			}
		}
		size := src.DType.Size()
		if len(got)*size != len(src.Data) {
			t.Fatalf("%s: %d values from %d bytes of %s", s.Name, len(got), len(src.Data), src.DType)
		}
		for i := range got {
			b := src.Data[i*size:]
			var want float32
			switch src.DType {
			case safetensors.BF16:
				want = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
			case safetensors.F16:
				want = tensor.F16ToF32(binary.LittleEndian.Uint16(b))
			case safetensors.F32:
				want = math.Float32frombits(binary.LittleEndian.Uint32(b))
			default:
				t.Fatalf("%s: loaded from %s", s.Name, src.DType)
			}
			if m.Quant == F16 && s.Matrix != nil {
				want = tensor.F16ToF32(tensor.F32ToF16(want))
			}
			if got[i] != want && !(got[i] != got[i] && want != want) {
				t.Fatalf("%s[%d] = %v, source %v (%s, loaded as %s)", s.Name, i, got[i], want, src.DType, m.Quant)
			}
		}
	}
}
