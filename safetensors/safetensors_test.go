package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// build writes a file with the given tensors (data filled with their index).
func build(t *testing.T, specs []Spec, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, specs, meta)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range specs {
		if _, err := w.Write(bytes.Repeat([]byte{byte(i + 1)}, int(s.bytes()))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var testSpecs = []Spec{
	{"a.weight", F32, []int{2, 3}},
	{"b.qweight", U32, []int{4, 1}},
	{"b.scales", F16, []int{4, 1}},
	{"c", BF16, []int{5}},
}

func TestRoundTrip(t *testing.T) {
	data := build(t, testSpecs, map[string]string{"format": "webdraft"})
	if hl := binary.LittleEndian.Uint64(data); (8+hl)%8 != 0 {
		t.Errorf("data section starts at %d, not 8-aligned", 8+hl)
	}
	f, err := Parse("mem", data)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "webdraft" {
		t.Errorf("metadata = %v", f.Metadata)
	}
	if got := strings.Join(f.Names(), ","); got != "a.weight,b.qweight,b.scales,c" {
		t.Errorf("names = %s", got)
	}
	for i, s := range testSpecs {
		tn, ok := f.Tensor(s.Name)
		if !ok || tn.DType != s.DType || len(tn.Data) != int(s.bytes()) || tn.Data[0] != byte(i+1) {
			t.Errorf("tensor %s = %+v", s.Name, tn)
		}
	}
	if got := Uint32s(mustTensor(t, f, "b.qweight").Data); len(got) != 4 || got[0] != 0x02020202 {
		t.Errorf("Uint32s = %#x", got)
	}
}

func mustTensor(t *testing.T, f *File, name string) Tensor {
	tn, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	return tn
}

func TestParseRejects(t *testing.T) {
	good := build(t, testSpecs, nil)
	header := func(h string) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
		return append(append(b, h...), make([]byte, 64)...)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated data", good[:len(good)-3], "truncated"},
		{"truncated header", good[:20], "header length"},
		{"not json", header("{nope"), "bad header"},
		{"unknown dtype", header(`{"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}}`), "unknown dtype"},
		{"size mismatch", header(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`), "do not hold"},
		{"past end", header(`{"x":{"dtype":"F32","shape":[32],"data_offsets":[0,128]}}`), "truncated"},
		{"overlap", header(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`), "overlap"},
		{"negative shape", header(`{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`), "bad shape"},
		{"bad metadata", header(`{"__metadata__":{"a":1}}`), "__metadata__"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("f.safetensors", c.data)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "f.safetensors") {
				t.Fatalf("err = %v, want one naming the file and %q", err, c.want)
			}
		})
	}
}

func TestWriterChecksLength(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testSpecs[:1], nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("Close accepted a short tensor")
	}
	if _, err := w.Write(make([]byte, 100)); err == nil {
		t.Error("Write accepted bytes past the last tensor")
	}
	if _, err := NewWriter(&buf, []Spec{testSpecs[0], testSpecs[0]}, nil); err == nil {
		t.Error("duplicate tensor accepted")
	}
}

func TestOpenFolderSharded(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("s1.safetensors", build(t, testSpecs[:2], nil))
	write("s2.safetensors", build(t, testSpecs[2:], nil))
	index := map[string]any{"weight_map": map[string]string{
		"a.weight": "s1.safetensors", "b.qweight": "s1.safetensors", "b.scales": "s2.safetensors", "c": "s2.safetensors"}}
	js, _ := json.Marshal(index)
	write(IndexFile, js)

	f, err := OpenFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := len(f.Names()); got != 4 {
		t.Errorf("%d tensors, want 4", got)
	}
	if tn, ok := f.Tensor("c"); !ok || tn.Data[0] != 2 {
		t.Errorf("tensor c = %+v", tn)
	}
	if !strings.HasSuffix(f.FileOf("b.scales"), "s2.safetensors") {
		t.Errorf("FileOf = %s", f.FileOf("b.scales"))
	}

	// The same folder read through an fs.FS.
	fsys := fstest.MapFS{}
	for _, n := range []string{"s1.safetensors", "s2.safetensors", IndexFile} {
		b, _ := os.ReadFile(filepath.Join(dir, n))
		fsys["m/"+n] = &fstest.MapFile{Data: b}
	}
	g, err := OpenFolderFS(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(g.Names()); got != 4 {
		t.Errorf("FS: %d tensors, want 4", got)
	}

	// A shard that does not hold what the index says.
	index["weight_map"].(map[string]string)["c"] = "s1.safetensors"
	js, _ = json.Marshal(index)
	write(IndexFile, js)
	if _, err := OpenFolder(dir); err == nil || !strings.Contains(err.Error(), "does not hold") {
		t.Errorf("err = %v", err)
	}
	// A missing shard.
	os.Remove(filepath.Join(dir, "s2.safetensors"))
	index["weight_map"].(map[string]string)["c"] = "s2.safetensors"
	js, _ = json.Marshal(index)
	write(IndexFile, js)
	if _, err := OpenFolder(dir); err == nil || !strings.Contains(err.Error(), "s2.safetensors") {
		t.Errorf("err = %v", err)
	}
}

func TestOpenFolderEmpty(t *testing.T) {
	if _, err := OpenFolder(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no model.safetensors") {
		t.Errorf("err = %v", err)
	}
}
