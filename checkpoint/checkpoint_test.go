package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"webdraft/internal/synth"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// writeTiny writes a random tiny HF checkpoint and returns its folder.
func writeTiny(t *testing.T, opts synth.Options) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hf")
	if err := synth.Write(dir, synth.Shapes["tiny"], opts); err != nil {
		t.Fatal(err)
	}
	return dir
}

func load(t *testing.T, dir string, q Quant) *Model {
	t.Helper()
	m, err := Load(dir, LoadOptions{Quant: q})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// dense returns every matrix and vector of m as f32, by checkpoint name.
func dense(m *Model) map[string][]float32 {
	out := map[string][]float32{}
	for _, s := range m.Weights.Slots(&m.Config) {
		if s.Vector != nil {
			out[s.Name] = append([]float32(nil), (*s.Vector)...)
			continue
		}
		rows, cols := (*s.Matrix).Shape()
		v := make([]float32, rows*cols)
		for r := range rows {
			(*s.Matrix).Row(r, v[r*cols:(r+1)*cols])
		}
		out[s.Name] = v
	}
	return out
}

func TestLoadAndConvertAgree(t *testing.T) {
	hf := writeTiny(t, synth.Options{Seed: 1})
	for _, q := range []Quant{Int4, F16, F32} {
		t.Run(string(q), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			var calls int
			stats, err := Convert(context.Background(), hf, out, ConvertOptions{Quant: q, Progress: func(done, total int64) {
				calls++
				if done > total {
					t.Errorf("progress %d > %d", done, total)
				}
			}})
			if err != nil {
				t.Fatal(err)
			}
			if calls == 0 || stats.Tensors == 0 || stats.OutputBytes == 0 {
				t.Errorf("stats %+v, %d progress calls", stats, calls)
			}
			inMem, onDisk := load(t, hf, q), load(t, out, q)
			if inMem.Converted || !onDisk.Converted || onDisk.Quant != q {
				t.Errorf("Converted %v/%v quant %s", inMem.Converted, onDisk.Converted, onDisk.Quant)
			}
			if !reflect.DeepEqual(dense(inMem), dense(onDisk)) {
				t.Error("weights quantized on load differ from the converted folder's")
			}
			if _, err := os.Stat(filepath.Join(out, "config.json")); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestConvertedInt4IsZeroCopyAligned(t *testing.T) {
	hf := writeTiny(t, synth.Options{Seed: 2})
	out := filepath.Join(t.TempDir(), "out")
	if _, err := Convert(context.Background(), hf, out, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(out, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata["format"] != "webdraft" || f.Metadata["format_version"] != "1" || f.Metadata["quant"] != "int4" || f.Metadata["group_size"] != "32" {
		t.Errorf("metadata %v", f.Metadata)
	}
	for _, n := range f.Names() {
		tn, _ := f.Tensor(n)
		if tn.DType.Size() == 4 && len(tn.Data) > 0 {
			if addr := uintptrOf(tn.Data); addr%4 != 0 {
				t.Errorf("%s is not 4-byte aligned", n)
			}
		}
	}
	q, _ := f.Tensor("model.layers.0.mlp.down_proj.weight.qweight")
	s, _ := f.Tensor("model.layers.0.mlp.down_proj.weight.scales")
	if !reflect.DeepEqual(q.Shape, []int{64, 96 / 8}) || q.DType != safetensors.U32 ||
		!reflect.DeepEqual(s.Shape, []int{64, 96 / 32}) || s.DType != safetensors.F16 {
		t.Errorf("down_proj stored as %v %s / %v %s", q.Shape, q.DType, s.Shape, s.DType)
	}
}

func TestLoadShardedAndDTypes(t *testing.T) {
	want := dense(load(t, writeTiny(t, synth.Options{Seed: 3}), F32))
	for name, opts := range map[string]synth.Options{
		"sharded": {Seed: 3, Shards: 3},
		"4.x json": {Seed: 3, Tweak: func(m map[string]any) {
			m["rope_theta"] = 10000.0
			delete(m, "rope_parameters")
			m["torch_dtype"] = m["dtype"]
			delete(m, "dtype")
		}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := dense(load(t, writeTiny(t, opts), F32)); !reflect.DeepEqual(got, want) {
				t.Error("weights differ from the single-file checkpoint's")
			}
		})
	}
	for _, dt := range []safetensors.DType{safetensors.F16, safetensors.F32} {
		m := load(t, writeTiny(t, synth.Options{Seed: 3, DType: dt}), Int4)
		if _, ok := m.Weights.LMHead.(*tensor.Int4); !ok {
			t.Errorf("%s: head is %T", dt, m.Weights.LMHead)
		}
	}
}

func TestTiedHeadIsEmbedding(t *testing.T) {
	tied := synth.Shapes["tiny"]
	tied.TieWordEmbeddings = true
	dir := filepath.Join(t.TempDir(), "tied")
	if err := synth.Write(dir, tied, synth.Options{Seed: 4}); err != nil {
		t.Fatal(err)
	}
	m := load(t, dir, Int4)
	if m.Weights.LMHead != m.Weights.EmbedTokens {
		t.Error("tied head is not the quantized embedding")
	}
}

func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name    string
		breakIt func(t *testing.T, dir string)
		want    []string
	}{
		{"truncated", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors")
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-100); err != nil {
				t.Fatal(err)
			}
		}, []string{"model.safetensors", "truncated"}},
		{"bad header", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model.safetensors")
			b, _ := os.ReadFile(p)
			binary.LittleEndian.PutUint64(b, 1<<40)
			os.WriteFile(p, b, 0o644)
		}, []string{"model.safetensors", "header length"}},
		{"misshapen", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["intermediate_size"] = 128 })
		}, []string{"model.layers.0.mlp.gate_proj.weight", "shape"}},
		{"missing tensor", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["num_hidden_layers"] = 3 })
		}, []string{"model.layers.2.input_layernorm.weight", "missing"}},
		{"unsupported config", func(t *testing.T, dir string) {
			editConfig(t, dir, func(m map[string]any) { m["attention_bias"] = true })
		}, []string{"config.json", "attention_bias"}},
		{"no config", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "config.json")) }, []string{"config.json"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeTiny(t, synth.Options{Seed: 5})
			c.breakIt(t, dir)
			_, err := Load(dir, LoadOptions{})
			if err == nil {
				t.Fatal("loaded a broken checkpoint")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, err := Convert(context.Background(), dir, filepath.Join(t.TempDir(), "o"), ConvertOptions{}); err == nil {
				t.Error("converted a broken checkpoint")
			}
		})
	}
	t.Run("group size", func(t *testing.T) {
		_, err := Load(writeTiny(t, synth.Options{Seed: 5}), LoadOptions{GroupSize: 64})
		if err == nil || !strings.Contains(err.Error(), "multiple of the group size") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestConvertedFolderChecks(t *testing.T) {
	hf := writeTiny(t, synth.Options{Seed: 6})
	out := filepath.Join(t.TempDir(), "out")
	if _, err := Convert(context.Background(), hf, out, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Convert(context.Background(), out, filepath.Join(t.TempDir(), "again"), ConvertOptions{}); err == nil || !strings.Contains(err.Error(), "already a webdraft folder") {
		t.Errorf("reconverting: %v", err)
	}
	if _, err := Convert(context.Background(), hf, hf, ConvertOptions{}); err == nil {
		t.Error("converted a folder into itself")
	}
	// A folder from a future webdraft is refused.
	p := filepath.Join(out, "model.safetensors")
	b, _ := os.ReadFile(p)
	b2 := []byte(strings.Replace(string(b), `"format_version":"1"`, `"format_version":"9"`, 1))
	if string(b2) == string(b) {
		t.Fatal("format_version not found in the header")
	}
	os.WriteFile(p, b2, 0o644)
	if _, err := Load(out, LoadOptions{}); err == nil || !strings.Contains(err.Error(), "format version") {
		t.Errorf("err = %v", err)
	}
}

func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// TestConvertMatchesTorch: `webdraft convert` of an HF-built checkpoint gives
// the bit-exact words and scales of the independent PyTorch implementation of
// §2 (testdata/golden/make_golden.py).
func TestConvertMatchesTorch(t *testing.T) {
	golden := filepath.Join("..", "testdata", "golden", "tied")
	out := filepath.Join(t.TempDir(), "out")
	if _, err := Convert(context.Background(), golden, out, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := safetensors.Open(filepath.Join(out, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want, err := safetensors.Open(filepath.Join(golden, "int4_expected.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	for _, name := range want.Names() {
		w, _ := want.Tensor(name)
		g, ok := got.Tensor(name)
		if !ok {
			t.Errorf("converted folder lacks %s", name)
			continue
		}
		// qweight is stored by torch as I32: the same bits as our U32.
		if !reflect.DeepEqual(g.Shape, w.Shape) || string(g.Data) != string(w.Data) {
			t.Errorf("%s differs from PyTorch's", name)
		}
	}
	if n := len(want.Names()); n != 2*(1+2*7) {
		t.Errorf("%d expected tensors, want 30", n)
	}
}
