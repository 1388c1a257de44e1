// Package safetensors reads and writes the safetensors format of Hugging Face
// (an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data).
//
// Files are memory-mapped where the platform allows; every header is checked
// against the file's real size so that a truncated or corrupted file is an
// error naming the file and the tensor, never silent zeros.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"unsafe"
)

// DType is a safetensors element type.
type DType string

const (
	BF16 DType = "BF16"
	F16  DType = "F16"
	F32  DType = "F32"
	F64  DType = "F64"
	I32  DType = "I32"
	U32  DType = "U32"
	I64  DType = "I64"
	U8   DType = "U8"
	I8   DType = "I8"
	BOOL DType = "BOOL"
)

// Size returns the element size in bytes, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case BF16, F16:
		return 2
	case F32, I32, U32:
		return 4
	case F64, I64:
		return 8
	case U8, I8, BOOL:
		return 1
	}
	return 0
}

// maxHeaderSize bounds the JSON header (the reference implementation uses 100 MB).
const maxHeaderSize = 100 << 20

// Tensor is one tensor of a file: its data aliases the file's bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte // little-endian elements, len = product(Shape) * DType.Size()
}

// NumElements is the product of the shape.
func (t Tensor) NumElements() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is a parsed safetensors file.
type File struct {
	Path     string
	Metadata map[string]string
	tensors  map[string]Tensor
	data     []byte
	release  func() error
}

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// Parse reads a safetensors file held in memory. path only names it in errors.
func Parse(path string, data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("%s: %d bytes is too short for a safetensors header (truncated?)", path, len(data))
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > maxHeaderSize || n > uint64(len(data)-8) {
		return nil, fmt.Errorf("%s: header length %d does not fit in a file of %d bytes (truncated or not safetensors)", path, n, len(data))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("%s: bad header: %w", path, err)
	}
	f := &File{Path: path, tensors: make(map[string]Tensor, len(raw)), data: data}
	body := data[8+n:]
	type span struct {
		begin, end int64
		name       string
	}
	var spans []span
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &f.Metadata); err != nil {
				return nil, fmt.Errorf("%s: bad __metadata__ (want string values): %w", path, err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: bad header entry: %w", path, name, err)
		}
		size := e.DType.Size()
		if size == 0 {
			return nil, fmt.Errorf("%s: tensor %s: unknown dtype %q", path, name, e.DType)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && elems > math.MaxInt64/int64(d)/int64(size)) {
				return nil, fmt.Errorf("%s: tensor %s: bad shape %v", path, name, e.Shape)
			}
			elems *= int64(d)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end-begin != elems*int64(size) {
			return nil, fmt.Errorf("%s: tensor %s: data offsets [%d, %d) do not hold %v %s", path, name, begin, end, e.Shape, e.DType)
		}
		if end > int64(len(body)) {
			return nil, fmt.Errorf("%s: tensor %s: needs bytes [%d, %d) of data but the file holds %d (truncated)", path, name, begin, end, len(body))
		}
		f.tensors[name] = Tensor{Name: name, DType: e.DType, Shape: e.Shape, Data: body[begin:end:end]}
		if end > begin { // an empty tensor holds no bytes: it overlaps nothing
			spans = append(spans, span{begin, end, name})
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, fmt.Errorf("%s: tensors %s and %s overlap", path, spans[i-1].name, spans[i].name)
		}
	}
	return f, nil
}

// Open maps (or, where mapping is unavailable, reads) the file at path.
func Open(path string) (*File, error) {
	data, release, err := mapFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(path, data)
	if err != nil {
		release()
		return nil, err
	}
	f.release = release
	return f, nil
}

// Close releases the mapping; tensors' data must not be used afterwards.
func (f *File) Close() error {
	if f.release == nil {
		return nil
	}
	err := f.release()
	f.release = nil
	return err
}

// Names lists the tensors in name order.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.tensors))
	for n := range f.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (Tensor, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Uint16s views little-endian 2-byte elements as []uint16, without a copy
// where the host allows it.
func Uint16s(b []byte) []uint16 {
	n := len(b) / 2
	if n == 0 {
		return nil
	}
	if littleEndianHost && uintptr(unsafe.Pointer(&b[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// Uint32s views little-endian 4-byte elements as []uint32, without a copy
// where the host allows it.
func Uint32s(b []byte) []uint32 {
	n := len(b) / 4
	if n == 0 {
		return nil
	}
	if littleEndianHost && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), n)
	}
	out := make([]uint32, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// Float32s views little-endian f32 elements as []float32, without a copy
// where the host allows it.
func Float32s(b []byte) []float32 {
	u := Uint32s(b)
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&u[0])), len(u))
}

var littleEndianHost = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Int32s views little-endian i32 elements as []int32, without a copy where
// the host allows it.
func Int32s(b []byte) []int32 {
	u := Uint32s(b)
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&u[0])), len(u))
}
