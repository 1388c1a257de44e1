package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var rmsNorm = gpu.Kernel{
	Module: "rmsnorm.wgsl", Source: shaders.RMSNorm, Entry: "main", Params: reflect.TypeFor[rmsNormParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, // x, weight, out
}

var rmsNormGathered = gpu.Kernel{
	Module: "rmsnorm.wgsl", Source: shaders.RMSNorm, Entry: "gathered", Params: reflect.TypeFor[rmsNormParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly}, // x, weight, out, rows
}

var rmsNormPair = gpu.Kernel{
	Module: "rmsnorm.wgsl", Source: shaders.RMSNorm, Entry: "pair", Params: reflect.TypeFor[rmsNormParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly}, // x, weight, out, x2, weight2
}

var rmsNormPairEmbed = gpu.Kernel{
	Module: "rmsnorm.wgsl", Source: shaders.RMSNorm, Entry: "pair_embed", Params: reflect.TypeFor[rmsNormParams](),
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly}, // ids, weight, out, x2, weight2, qweight, scales
}

// rmsNormParams are rmsnorm.wgsl's params.
type rmsNormParams struct {
	R, N      uint32
	Eps       float32
	Ldo, Col0 uint32
	V, G      uint32 // pair_embed's table: rows, int4 group size
	_         uint32
}

// RMSNorm records out[r] = rmsnorm(x[r]) · weight for R rows of n values
// (Qwen3RMSNorm, f32 math):
//
//	x      (R, n) f32
//	weight (n) f32
//	out    (R, n) f32, a different buffer from x
//
// Hidden norms are R = T, n = H (the engine uses it for the final norm
// before the head; the layers' norms happen inside MatMulNorm and the q/k
// norms inside QKVRopeKV); per-head rows would be R = T·heads, n = D.
func RMSNorm(b *gpu.Batch, out, x, weight *gpu.Buffer, R, n int, eps float64) error {
	return RMSNormCols(b, out, n, 0, x, weight, R, n, eps)
}

// RMSNormCols records RMSNorm into columns col0 … col0+n−1 of out's rows
// of ldo values, the other columns left as they are:
//
//	x      (R, n) f32
//	weight (n) f32
//	out    (R, ldo) f32, a different buffer from x;
//	       out[r·ldo + col0 + i] = rmsnorm(x[r])[i] · weight[i]
//
// Two calls write the halves of an EAGLE-3 head's 2H-wide input,
// [input_layernorm(embedding); hidden_norm(hidden)] (ldo = 2H, col0 = 0
// and H), for one projection over both.
func RMSNormCols(b *gpu.Batch, out *gpu.Buffer, ldo, col0 int, x, weight *gpu.Buffer, R, n int, eps float64) error {
	op := "rmsnorm"
	if R <= 0 || n <= 0 || col0 < 0 || ldo < col0+n {
		return fmt.Errorf("kernels: %s: shape (%d, %d) into columns %d… of rows of %d", op, R, n, col0, ldo)
	}
	outLen := (R-1)*ldo + col0 + n
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"x", x, R * n}, {"weight", weight, n}, {"out", out, outLen}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	if x == out {
		return fmt.Errorf("kernels: %s: out is x (%q)", op, x.Label())
	}
	binds := []gpu.Binding{x.Slice(0, uint64(R*n)*4), weight.Slice(0, uint64(n)*4), out.Slice(0, uint64(outLen)*4)}
	return recordRMSNorm(b, op, rmsNorm, binds, R, 1, n, eps, ldo, col0, nil)
}

// RMSNormPair records both halves of an EAGLE-3 head's 2n-wide input in
// one dispatch — RMSNormCols of x by weight into columns col0 … col0+n−1
// and of x2 by weight2 into columns col0+n … col0+2n−1 of out's rows of
// ldo values:
//
//	x, x2           (R, n) f32, each a different buffer from out
//	weight, weight2 (n) f32
//	out             (R, ldo) f32
func RMSNormPair(b *gpu.Batch, out *gpu.Buffer, ldo, col0 int, x, weight, x2, weight2 *gpu.Buffer, R, n int, eps float64) error {
	op := "rmsnorm_pair"
	outLen, err := checkPair(op, out, ldo, col0, R, n, sized{"x", x, R * n}, sized{"weight", weight, n}, sized{"x2", x2, R * n}, sized{"weight2", weight2, n})
	if err != nil {
		return err
	}
	if x == out || x2 == out {
		return fmt.Errorf("kernels: %s: out is an input (%q)", op, out.Label())
	}
	binds := []gpu.Binding{x.Slice(0, uint64(R*n)*4), weight.Slice(0, uint64(n)*4), out.Slice(0, uint64(outLen)*4),
		x2.Slice(0, uint64(R*n)*4), weight2.Slice(0, uint64(n)*4)}
	return recordRMSNorm(b, op, rmsNormPair, binds, R, 2, n, eps, ldo, col0, nil)
}

// EmbedRMSNormPair records an EAGLE-3 head's whole 2n-wide input —
// RMSNormPair over the embedding table's rows ids[r] and x2's rows:
// out[r] = [rmsnorm(E[ids[r]]) · weight; rmsnorm(x2[r]) · weight2] in
// columns col0 … col0+2n−1 of out's rows of ldo values:
//
//	ids             (R) u32 token ids; an id outside [0, V) gives the
//	                first half NaN
//	e               (V, n) the embedding table, any Format
//	x2              (R, n) f32
//	weight, weight2 (n) f32
//	emb             (R, n) f32 scratch, or nil where the table is int4 and
//	                one binding holds it
//	out             (R, ldo) f32, a different buffer from x2 and emb
//
// An int4 table that one binding holds is read in place, dequantized
// (rmsnorm.wgsl's pair_embed: one dispatch); another is gathered into emb
// first (Embed, then RMSNormPair).
func EmbedRMSNormPair(b *gpu.Batch, out *gpu.Buffer, ldo, col0 int, ids gpu.Binding, e *Matrix, weight, x2, weight2, emb *gpu.Buffer, R, n int, eps float64) error {
	op := "embed_rmsnorm_pair"
	if e == nil || e.K != n {
		return fmt.Errorf("kernels: %s: the table is nil or not %d wide", op, n)
	}
	if !embedsInPlace(b.Device(), e) {
		if emb == nil {
			return fmt.Errorf("kernels: %s: table %s is gathered first, and emb is nil", op, e.Name)
		}
		if err := Embed(b, emb, ids, e, R); err != nil {
			return err
		}
		return RMSNormPair(b, out, ldo, col0, emb, weight, x2, weight2, R, n, eps)
	}
	outLen, err := checkPair(op, out, ldo, col0, R, n, sized{"weight", weight, n}, sized{"x2", x2, R * n}, sized{"weight2", weight2, n})
	if err != nil {
		return err
	}
	if err := needRange(op, "ids", ids, R, nil, 0); err != nil {
		return err
	}
	if x2 == out {
		return fmt.Errorf("kernels: %s: out is an input (%q)", op, out.Label())
	}
	table, scales := e.bindRows(rowBlock{0, e.N})
	binds := []gpu.Binding{ids.Buf.Slice(ids.Offset, uint64(R)*4), weight.Slice(0, uint64(n)*4), out.Slice(0, uint64(outLen)*4),
		x2.Slice(0, uint64(R*n)*4), weight2.Slice(0, uint64(n)*4), table, scales}
	return recordRMSNorm(b, op, rmsNormPairEmbed, binds, R, 2, n, eps, ldo, col0, e)
}

// sized is a buffer of a call and the values it must hold, by name.
type sized struct {
	name string
	buf  *gpu.Buffer
	n    int
}

// checkPair checks a call shaped as RMSNormPair — R rows of two n-wide
// halves into columns col0 … col0+2n−1 of out's rows of ldo values — and
// that each of in and out holds its values; it returns out's length.
func checkPair(op string, out *gpu.Buffer, ldo, col0, R, n int, in ...sized) (int, error) {
	if R <= 0 || n <= 0 || col0 < 0 || ldo < col0+2*n {
		return 0, fmt.Errorf("kernels: %s: two shapes (%d, %d) into columns %d… of rows of %d", op, R, n, col0, ldo)
	}
	outLen := (R-1)*ldo + col0 + 2*n
	for _, c := range append(in, sized{"out", out, outLen}) {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return 0, err
		}
	}
	return outLen, nil
}

// embedsInPlace reports whether rmsnorm.wgsl's pair_embed reads table e
// where it lies: int4 in groups of a multiple of 8 columns, within one
// binding.
func embedsInPlace(d *gpu.Device, e *Matrix) bool {
	if e.Format != Int4 || e.G%8 != 0 || e.K%e.G != 0 {
		return false
	}
	wb, _ := e.rowBytes()
	return uint64(e.N)*wb <= d.Limits().MaxStorageBufferBindingSize
}

// RMSNormRows records out[r] = rmsnorm(x[rows[r]]) · weight for R rows
// picked out of x's xRows rows of n values, by index on the device (a
// pass's read-out rows):
//
//	x      (xRows, n) f32
//	rows   (R) u32, each < xRows (a larger one reads another row, or
//	       zeros: WebGPU bounds every access)
//	weight (n) f32
//	out    (R, n) f32, a different buffer from x
func RMSNormRows(b *gpu.Batch, out, x, rows, weight *gpu.Buffer, R, xRows, n int, eps float64) error {
	op := "rmsnorm_rows"
	if R <= 0 || n <= 0 || xRows <= 0 {
		return fmt.Errorf("kernels: %s: %d rows of (%d, %d)", op, R, xRows, n)
	}
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"x", x, xRows * n}, {"rows", rows, R}, {"weight", weight, n}, {"out", out, R * n}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	if x == out {
		return fmt.Errorf("kernels: %s: out is x (%q)", op, x.Label())
	}
	binds := []gpu.Binding{x.Slice(0, uint64(xRows*n)*4), weight.Slice(0, uint64(n)*4), out.Slice(0, uint64(R*n)*4), rows.Slice(0, uint64(R)*4)}
	return recordRMSNorm(b, op, rmsNormGathered, binds, R, 1, n, eps, n, 0, nil)
}

// recordRMSNorm dispatches one of rmsnorm.wgsl's entries over (R, y)
// workgroups — R rows of n values, y = 2 for pair's halves — the
// arguments checked; table is pair_embed's (else nil).
func recordRMSNorm(b *gpu.Batch, op string, k gpu.Kernel, binds []gpu.Binding, R, y, n int, eps float64, ldo, col0 int, table *Matrix) error {
	wg := uint32(256) // hidden rows; a head row (D = 128) keeps 64 threads busy
	if n <= 256 {
		wg = 64
	}
	p, err := b.Device().Pipeline(k, gpu.Consts{"WG": wg})
	if err != nil {
		return err
	}
	params := &rmsNormParams{R: uint32(R), N: uint32(n), Eps: float32(eps), Ldo: uint32(ldo), Col0: uint32(col0)}
	if table != nil {
		params.V, params.G = uint32(table.N), uint32(table.G)
	}
	if err := gpu.Dispatch(b, p, params, binds, uint32(R), uint32(y), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
