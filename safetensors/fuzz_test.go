package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"unsafe"
)

// FuzzParse feeds Parse arbitrary bytes (header length, JSON header,
// offsets, dtypes, data). Parse must never panic, and a file it accepts
// must be what its header says:
//   - every tensor's Data lies within the file's data section (after the
//     8-byte length and the header), its capacity ends with it (an append
//     cannot write into a neighbour), its length is NumElements × the
//     dtype's size, and no two tensors share a byte;
//   - Names is sorted and each name is a tensor;
//   - Parse gives the same answer twice (the header is a JSON object: Go's
//     map order must not decide);
//   - the writer agrees with the reader: writing the parsed tensors and
//     metadata with NewWriter and parsing that gives them back, byte for
//     byte.
//
// The seeds are testdata/fuzz/FuzzParse and the files below. Bounded run
// (Taskfile's fuzz task):
//
//	go test ./safetensors -run '^$' -fuzz '^FuzzParse$' -fuzztime 10s
func FuzzParse(f *testing.F) {
	var buf bytes.Buffer
	for _, c := range []struct {
		specs []Spec
		meta  map[string]string
	}{
		{testSpecs, map[string]string{"format": "webdraft", "format_version": "1"}},
		{testSpecs[:1], nil},
		{[]Spec{{"empty", I64, []int{0, 3}}, {"scalar", F64, nil}, {"m", BOOL, []int{3}}, {"n", U8, []int{2}}, {"o", I8, []int{1}}, {"p", I32, []int{1}}}, nil},
		{nil, map[string]string{"format": "pt"}},
	} {
		buf.Reset()
		w, err := NewWriter(&buf, c.specs, c.meta)
		if err != nil {
			f.Fatal(err)
		}
		for i, s := range c.specs {
			if _, err := w.Write(bytes.Repeat([]byte{byte(i + 1)}, int(s.bytes()))); err != nil {
				f.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			f.Fatal(err)
		}
		f.Add(slices.Clone(buf.Bytes()))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz.safetensors", data)
		if _, again := Parse("fuzz.safetensors", data); (err == nil) != (again == nil) {
			t.Fatalf("Parse is not deterministic: %v, then %v", err, again)
		}
		if err != nil {
			return
		}
		checkFile(t, file, data)
		// The writer agrees: the parsed tensors, written again, parse the same.
		names := file.Names()
		specs := make([]Spec, len(names))
		for i, n := range names {
			tn, _ := file.Tensor(n)
			specs[i] = Spec{n, tn.DType, tn.Shape}
		}
		var out bytes.Buffer
		w, err := NewWriter(&out, specs, file.Metadata)
		if err != nil {
			t.Fatalf("NewWriter refuses what Parse accepted: %v", err)
		}
		for _, n := range names {
			tn, _ := file.Tensor(n)
			if _, err := w.Write(tn.Data); err != nil {
				t.Fatalf("writing %s: %v", n, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		again, err := Parse("again.safetensors", out.Bytes())
		if err != nil {
			t.Fatalf("Parse refuses what NewWriter wrote from a parsed file: %v", err)
		}
		checkFile(t, again, out.Bytes())
		if !slices.Equal(again.Names(), names) {
			t.Fatalf("names %q, written again %q", names, again.Names())
		}
		if len(file.Metadata) != 0 || len(again.Metadata) != 0 { // {} is written as no metadata
			if !maps.Equal(file.Metadata, again.Metadata) {
				t.Fatalf("metadata %q, written again %q", file.Metadata, again.Metadata)
			}
		}
		for _, n := range names {
			a, _ := file.Tensor(n)
			b, _ := again.Tensor(n)
			if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("tensor %q: %s %v, written again %s %v", n, a.DType, a.Shape, b.DType, b.Shape)
			}
		}
	})
}

// checkFile checks that f's tensors lie within data's data section, are
// the size their shape says and do not overlap.
func checkFile(t *testing.T, f *File, data []byte) {
	t.Helper()
	start := 8 + int(binary.LittleEndian.Uint64(data))
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	names := f.Names()
	if !sort.StringsAreSorted(names) {
		t.Fatalf("Names not sorted: %q", names)
	}
	type span struct {
		begin, end int
		name       string
	}
	var spans []span
	for _, n := range names {
		tn, ok := f.Tensor(n)
		if !ok || tn.Name != n {
			t.Fatalf("Names lists %q but Tensor gives %+v, %v", n, tn, ok)
		}
		size := tn.DType.Size()
		if size == 0 {
			t.Fatalf("tensor %q: unknown dtype %q accepted", n, tn.DType)
		}
		for _, d := range tn.Shape {
			if d < 0 {
				t.Fatalf("tensor %q: shape %v accepted", n, tn.Shape)
			}
		}
		if want := tn.NumElements() * size; len(tn.Data) != want {
			t.Fatalf("tensor %q: %d bytes for shape %v of %s (want %d)", n, len(tn.Data), tn.Shape, tn.DType, want)
		}
		if cap(tn.Data) != len(tn.Data) {
			t.Fatalf("tensor %q: cap %d past its %d bytes", n, cap(tn.Data), len(tn.Data))
		}
		if len(tn.Data) == 0 {
			continue
		}
		off := int(uintptr(unsafe.Pointer(unsafe.SliceData(tn.Data))) - base)
		if off < start || off+len(tn.Data) > len(data) {
			t.Fatalf("tensor %q: bytes [%d, %d) outside the data section [%d, %d)", n, off, off+len(tn.Data), start, len(data))
		}
		spans = append(spans, span{off, off + len(tn.Data), n})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			t.Fatalf("tensors %q and %q share bytes", spans[i-1].name, spans[i].name)
		}
	}
}

// TestParseEmptyTensorAtAnOffset is FuzzParse's first find (its seed
// testdata/fuzz/FuzzParse/zero-size-tensors-at-one-offset): a tensor of no
// elements at the offset where another begins — as NewWriter lays one out
// — was refused as overlapping, or not, depending on Go's map order.
func TestParseEmptyTensorAtAnOffset(t *testing.T) {
	var h strings.Builder
	h.WriteString(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`)
	for i := range 8 {
		fmt.Fprintf(&h, `,"e%d":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}`, i)
	}
	h.WriteString("}")
	data := binary.LittleEndian.AppendUint64(nil, uint64(h.Len()))
	data = append(append(data, h.String()...), make([]byte, 8)...)
	for range 64 { // each parse ranges over the header in a new order
		f, err := Parse("empty.safetensors", data)
		if err != nil {
			t.Fatal(err)
		}
		checkFile(t, f, data)
	}
}
