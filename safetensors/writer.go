package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// Spec declares one tensor of a file being written.
type Spec struct {
	Name  string
	DType DType
	Shape []int
}

func (s Spec) bytes() int64 {
	n := int64(s.DType.Size())
	for _, d := range s.Shape {
		n *= int64(d)
	}
	return n
}

// Writer streams a safetensors file: the header, computed from the specs, is
// written first, then the tensors' data in spec order, so no tensor needs to
// be held whole in memory.
type Writer struct {
	w       io.Writer
	specs   []Spec
	cur     int   // index of the spec being written
	left    int64 // bytes still owed to specs[cur]
	written int64
}

// NewWriter writes the header for specs and metadata to w.
func NewWriter(w io.Writer, specs []Spec, metadata map[string]string) (*Writer, error) {
	header := make(map[string]any, len(specs)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, s := range specs {
		if s.DType.Size() == 0 {
			return nil, fmt.Errorf("safetensors: tensor %s: unknown dtype %q", s.Name, s.DType)
		}
		if _, dup := header[s.Name]; dup {
			return nil, fmt.Errorf("safetensors: tensor %s declared twice", s.Name)
		}
		header[s.Name] = headerEntry{DType: s.DType, Shape: s.Shape, DataOffsets: [2]int64{off, off + s.bytes()}}
		off += s.bytes()
	}
	js, err := json.Marshal(header)
	if err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	for len(js)%8 != 0 { // keep the data 8-byte aligned, as the reference writer does
		js = append(js, ' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	if _, err := w.Write(n[:]); err != nil {
		return nil, err
	}
	if _, err := w.Write(js); err != nil {
		return nil, err
	}
	wr := &Writer{w: w, specs: specs}
	if len(specs) > 0 {
		wr.left = specs[0].bytes()
	}
	wr.skipEmpty()
	return wr, nil
}

// Write appends tensor data; it may span tensors but not go past the last.
func (w *Writer) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		if w.cur >= len(w.specs) {
			return total, fmt.Errorf("safetensors: %d bytes written past the last tensor", len(p))
		}
		k := int(min(int64(len(p)), w.left))
		n, err := w.w.Write(p[:k])
		total += n
		w.left -= int64(n)
		w.written += int64(n)
		if err != nil {
			return total, err
		}
		p = p[k:]
		w.skipEmpty()
	}
	return total, nil
}

func (w *Writer) skipEmpty() {
	for w.cur < len(w.specs) && w.left == 0 {
		w.cur++
		if w.cur < len(w.specs) {
			w.left = w.specs[w.cur].bytes()
		}
	}
}

// Close checks that every declared tensor received all its bytes.
func (w *Writer) Close() error {
	if w.cur < len(w.specs) {
		return fmt.Errorf("safetensors: tensor %s is missing %d bytes", w.specs[w.cur].Name, w.left)
	}
	return nil
}
