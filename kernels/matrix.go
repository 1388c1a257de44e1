package kernels

import (
	"fmt"

	"webdraft/gpu"
	"webdraft/tensor"
)

// Format is how a Matrix stores its weights.
type Format int

const (
	Int4 Format = iota // docs/reference.md, "The int4 scheme": u32 words of 4-bit codes + f16 scales
	F16                // dense IEEE half
	F32                // dense f32
)

func (f Format) String() string {
	switch f {
	case Int4:
		return "int4"
	case F16:
		return "f16"
	case F32:
		return "f32"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Matrix is a weight matrix W (N, K) on the GPU, uploaded unchanged from
// package tensor: one row per output feature.
type Matrix struct {
	Name   string
	Format Format
	N, K   int
	G      int         // int4 group size; 0 for dense formats
	W      *gpu.Buffer // int4: (N, K/8) u32 words; f16: (N, K) halves; f32: (N, K)
	Scales *gpu.Buffer // int4: (N, K/G) f16 scales; nil for dense formats

	pipes gpu.PipelineMemo[matMulPipelineKey] // the matmul pipelines asked for with this matrix
	picks map[int]matMulChoice                // the device plan's choices by activation rows (planned)
	op    string                              // "matmul NAME", for errors (opName)
}

// opName is the matmul's name in errors, made once: every matmul recorded
// passes it along.
func (w *Matrix) opName() string {
	if w.op == "" {
		w.op = "matmul " + w.Name
	}
	return w.op
}

// planned returns the device plan's choice for T activation rows of w,
// remembered by T: a forward pass asks for the same few every step, and
// working one out walks the plan's kernels and layouts (a microsecond or
// more of a browser's host time a matmul). w lives on d, so the plan and
// the limits behind a choice never change.
func (w *Matrix) planned(d *gpu.Device, T int) matMulChoice {
	if c, ok := w.picks[T]; ok {
		return c
	}
	c := planFor(d).pick(w, T, d.Limits())
	if w.picks == nil {
		w.picks = map[int]matMulChoice{}
	}
	w.picks[T] = c
	return c
}

// UploadMatrix uploads m (a *tensor.Int4, *tensor.F16 or *tensor.F32). K
// must be a multiple of 8 (every kernel reads eight columns at a time).
func UploadMatrix(d *gpu.Device, name string, m tensor.Matrix) (*Matrix, error) {
	n, k := m.Shape()
	if n <= 0 || k <= 0 || k%8 != 0 {
		return nil, fmt.Errorf("kernels: matrix %s: shape (%d, %d): need positive sizes and a multiple of 8 input features", name, n, k)
	}
	out := &Matrix{Name: name, N: n, K: k}
	var err error
	switch m := m.(type) {
	case *tensor.Int4:
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("kernels: matrix %s: %w", name, err)
		}
		out.Format, out.G = Int4, m.GroupSize
		if out.W, err = d.UploadU32(name+".qweight", m.QWeight); err != nil {
			return nil, err
		}
		if out.Scales, err = d.UploadU16(name+".scales", m.Scales); err != nil {
			out.Release()
			return nil, err
		}
	case *tensor.F16:
		if len(m.Data) != n*k {
			return nil, fmt.Errorf("kernels: matrix %s: %d halves for shape (%d, %d)", name, len(m.Data), n, k)
		}
		out.Format = F16
		out.W, err = d.UploadU16(name, m.Data)
	case *tensor.F32:
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("kernels: matrix %s: %w", name, err)
		}
		out.Format = F32
		out.W, err = d.UploadF32(name, m.Data)
	default:
		return nil, fmt.Errorf("kernels: matrix %s: unsupported type %T", name, m)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// UploadStacked uploads matrices of one format and input width as one
// matrix whose rows are theirs in order — e.g. gate_proj over up_proj, so
// that one MatMul writes both (T, 2I) for MatMulSwiGLU, a dispatch fewer
// per layer. Rows are independent in every format, so stacking is a
// concatenation.
func UploadStacked(d *gpu.Device, name string, ms ...tensor.Matrix) (*Matrix, error) {
	if len(ms) == 0 {
		return nil, fmt.Errorf("kernels: matrix %s: nothing to stack", name)
	}
	var stacked tensor.Matrix
	switch first := ms[0].(type) {
	case *tensor.Int4:
		s := &tensor.Int4{Cols: first.Cols, GroupSize: first.GroupSize}
		for i, m := range ms {
			m, ok := m.(*tensor.Int4)
			if !ok || m.Cols != s.Cols || m.GroupSize != s.GroupSize {
				return nil, fmt.Errorf("kernels: matrix %s: part %d (%T) does not match part 0 (int4, %d columns, group %d)", name, i, ms[i], s.Cols, s.GroupSize)
			}
			s.Rows += m.Rows
			s.QWeight = append(s.QWeight, m.QWeight...)
			s.Scales = append(s.Scales, m.Scales...)
		}
		stacked = s
	case *tensor.F16:
		s := &tensor.F16{Cols: first.Cols}
		for i, m := range ms {
			m, ok := m.(*tensor.F16)
			if !ok || m.Cols != s.Cols {
				return nil, fmt.Errorf("kernels: matrix %s: part %d (%T) does not match part 0 (f16, %d columns)", name, i, ms[i], s.Cols)
			}
			s.Rows += m.Rows
			s.Data = append(s.Data, m.Data...)
		}
		stacked = s
	case *tensor.F32:
		s := &tensor.F32{Cols: first.Cols}
		for i, m := range ms {
			m, ok := m.(*tensor.F32)
			if !ok || m.Cols != s.Cols {
				return nil, fmt.Errorf("kernels: matrix %s: part %d (%T) does not match part 0 (f32, %d columns)", name, i, ms[i], s.Cols)
			}
			s.Rows += m.Rows
			s.Data = append(s.Data, m.Data...)
		}
		stacked = s
	default:
		return nil, fmt.Errorf("kernels: matrix %s: unsupported type %T", name, first)
	}
	return UploadMatrix(d, name, stacked)
}

// Release frees the matrix's buffers.
func (m *Matrix) Release() {
	for _, b := range []*gpu.Buffer{m.W, m.Scales} {
		if b != nil {
			b.Release()
		}
	}
}

// rowBytes returns the bytes one row of W and one row of scales take.
func (m *Matrix) rowBytes() (w, scales uint64) {
	switch m.Format {
	case Int4:
		return uint64(m.K / 2), uint64(m.K / m.G * 2)
	case F16:
		return uint64(m.K * 2), 0
	}
	return uint64(m.K * 4), 0
}

// rowBlock is rows [n0, n0+n) of a matrix, bound on their own.
type rowBlock struct{ n0, n int }

// rowBlocks splits the rows of m into blocks whose bindings each fit in
// maxBinding bytes. Every block but the last has a multiple of align rows,
// so that its offsets into W, the scales and an f32 output row (4 bytes a
// column) are all multiples of align bytes.
func (m *Matrix) rowBlocks(maxBinding uint64, align uint32) ([]rowBlock, error) {
	wb, _ := m.rowBytes()
	per := maxBinding / wb / uint64(align) * uint64(align)
	if per == 0 {
		return nil, fmt.Errorf("kernels: matrix %s: %d-byte rows cannot be bound %d at a time in %d bytes", m.Name, wb, align, maxBinding)
	}
	var blocks []rowBlock
	for n0 := 0; n0 < m.N; n0 += int(per) {
		blocks = append(blocks, rowBlock{n0, min(int(per), m.N-n0)})
	}
	return blocks, nil
}

// bindRows binds W and, for int4, the scales (else a zero Binding) for
// rows [n0, n0+n).
func (m *Matrix) bindRows(b rowBlock) (weights, scales gpu.Binding) {
	wb, sb := m.rowBytes()
	weights = m.W.Slice(uint64(b.n0)*wb, alignUp(uint64(b.n)*wb, 4))
	if m.Format == Int4 {
		off := uint64(b.n0) * sb
		scales = m.Scales.Slice(off, min(alignUp(uint64(b.n)*sb, 4), m.Scales.Size()-off))
	}
	return weights, scales
}

// wgslBool is a boolean's value as a WGSL u32 (a constant or a param).
func wgslBool(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

func divCeil(n, d int) uint32 { return uint32((n + d - 1) / d) }

// need reports whether buf holds at least n f32 (or u32) values.
func need(op, name string, buf *gpu.Buffer, n int) error {
	if buf == nil {
		return fmt.Errorf("kernels: %s: %s is nil", op, name)
	}
	if want := uint64(n) * 4; buf.Size() < want {
		return fmt.Errorf("kernels: %s: %s (%q) has %d bytes, need %d", op, name, buf.Label(), buf.Size(), want)
	}
	return nil
}

// needRange checks that r, a range of a buffer, holds n 4-byte words, and
// that, where it is a range of other, it lies past other's first words
// words: two writable bindings of one buffer must not overlap.
func needRange(op, name string, r gpu.Binding, n int, other *gpu.Buffer, words int) error {
	if r.Buf == nil {
		return fmt.Errorf("kernels: %s: %s is nil", op, name)
	}
	want := uint64(n) * 4
	if r.Size < want || r.Offset+want > r.Buf.Size() {
		return fmt.Errorf("kernels: %s: %s (%d bytes at %d of %q) holds fewer than %d bytes", op, name, r.Size, r.Offset, r.Buf.Label(), want)
	}
	if r.Buf == other && r.Offset < uint64(words)*4 {
		return fmt.Errorf("kernels: %s: %s (at byte %d of %q) overlaps its first %d words, written too", op, name, r.Offset, r.Buf.Label(), words)
	}
	return nil
}

// pass is one dispatch of an operation recorded by dispatchPasses: its
// kernel and its workgroup grid (x, y, 1).
type pass struct {
	kernel gpu.Kernel
	x, y   int
}

// dispatchPasses records an operation's passes one after the other, all
// over the same params and bindings (a partial pass and the merge that
// reads what it wrote).
func dispatchPasses[P any](b *gpu.Batch, op string, params *P, binds []gpu.Binding, passes ...pass) error {
	d := b.Device()
	for _, ps := range passes {
		p, err := d.Pipeline(ps.kernel, nil)
		if err != nil {
			return err
		}
		if err := gpu.Dispatch(b, p, params, binds, uint32(ps.x), uint32(ps.y), 1); err != nil {
			return fmt.Errorf("kernels: %s: %w", op, err)
		}
	}
	return nil
}
