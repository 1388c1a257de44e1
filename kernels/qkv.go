package kernels

import (
	"fmt"
	"reflect"

	"webdraft/gpu"
	"webdraft/shaders"
)

var qkvRopeKV = gpu.Kernel{
	Module: "qkv_rope_kv.wgsl", Source: shaders.QKVRopeKV, Entry: "main", Params: reflect.TypeFor[qkvRopeKVParams](),
	// part (the q|k|v rows or their partial sums), consts, rows, table, q, kcache, vcache
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite},
}

var qkvFused = gpu.Kernel{
	Module: "qkv_fused_int4.wgsl", Source: shaders.QKVFusedInt4, Entry: "main", Params: reflect.TypeFor[qkvFusedParams](),
	// x, qweight, scales, consts, rows, table, q, kcache, vcache
	Storage: []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite, gpu.ReadWrite, gpu.ReadWrite},
}

// qkvFusedParams are qkv_fused_int4.wgsl's params.
type qkvFusedParams struct {
	T, N, K, G        uint32
	Kps, Magic        uint32
	Heads, KVHeads, D uint32
	BS, MaxBlocks     uint32
	Eps               float32
	QKNorm            uint32
	_, _, _           uint32
}

// The constants qkv_fused_int4.wgsl is specialized by.
var qkvFusedConsts = []string{"LANES", "ROWS", "RT", "WG", "TT", "KC", "NORM"}

// qkvFusedLayout is qkv_fused_int4.wgsl's tiling of a head vector's D
// weight rows (one workgroup): lanes threads share rt neighbouring rows;
// staged input values at a time over its activation rows (0:
// matVecBatchStaged); wg bounds the threads (0: the device's limit). The
// zero layout is the default for the shape (qkvFusedLayout.of).
type qkvFusedLayout struct {
	lanes, rt, staged, wg int
}

func (l qkvFusedLayout) String() string {
	return fmt.Sprintf("qkv-fused-%dx%d/staged=%d/wg=%d", l.lanes, l.rt, l.staged, l.wg)
}

// of returns the layout for head vectors of D rows of K inputs on a device
// with limits lim: l's lanes and rt where set, else rt = D/32 rows a
// thread (1 to 4: 32 row groups a head vector) and K/128 lanes a row (4
// to 16, no more than the row's vec4s of codes) — on the H200 the fastest
// at the shapes measured (kernels/plan.go) —, lanes halved, then rows a
// thread doubled, until the workgroup has at most l.wg threads (unset:
// the device's most); ok is false where no layout fits.
func (l qkvFusedLayout) of(D, K int, lim gpu.Limits) (qkvFusedLayout, bool) {
	maxWG := min(int(lim.MaxComputeInvocationsPerWorkgroup), int(lim.MaxComputeWorkgroupSizeX))
	if l.wg > 0 {
		maxWG = min(maxWG, l.wg)
	}
	if l.lanes == 0 {
		l.rt = min(max(D/32, 1), 4)
		for D%l.rt != 0 {
			l.rt /= 2
		}
		l.lanes = 16
		for l.lanes > 4 && l.lanes > K/128 || l.lanes > 1 && l.lanes > K/32 {
			l.lanes /= 2
		}
		for D/l.rt*l.lanes > maxWG {
			if l.lanes > 1 {
				l.lanes /= 2
			} else if l.rt < 4 && D%(2*l.rt) == 0 {
				l.rt *= 2
			} else {
				return l, false
			}
		}
	}
	l.rt = max(l.rt, 1)
	if l.staged == 0 {
		l.staged = matVecBatchStaged
	}
	l.wg = D / l.rt * l.lanes
	ok := l.lanes >= 1 && l.lanes&(l.lanes-1) == 0 && D%l.rt == 0 && l.wg <= maxWG && l.wg >= D/2 && D <= 1024
	return l, ok
}

// chunk returns the input columns the layout stages at a time for tt rows
// of K inputs, D rows a head vector: its staged values over the rows, no
// more than 8 vec4s of codes a thread nor a row (rounded to a vec4 of
// codes a lane), fewer where the device's workgroup memory would not hold
// the kernel's arrays — 0 where even one vec4 a lane does not fit.
func (l qkvFusedLayout) chunk(D, K int, tt uint32, limit uint32) uint32 {
	step := uint32(32 * l.lanes)
	kc := max(step, uint32(l.staged)/tt/step*step)
	// At most 8 vec4s of weights a thread a chunk (as
	// matvec_batch_int4.wgsl's layouts hold), and no more than the row.
	kc = min(kc, max(step, step*8/uint32(l.rt)), uint32(alignUp(uint64(K), uint64(step))))
	shared := func(kc uint32) uint32 {
		wg, d := uint32(l.wg), uint32(D)
		return 4 * (tt*kc + tt*d*uint32(l.lanes) + tt*wg/uint32(l.lanes) + tt + wg + d)
	}
	for kc > step && shared(kc) > limit {
		kc = max(step, kc/2/step*step)
	}
	if shared(kc) > limit {
		return 0
	}
	return kc
}

// qkvFusedMaxTT is the most activation rows a workgroup of
// qkv_fused_int4.wgsl holds (TT): more rows take more row blocks.
const qkvFusedMaxTT = 4

// qkvRopeKVParams are qkv_rope_kv.wgsl's params.
type qkvRopeKVParams struct {
	T, Heads, KVHeads, D     uint32
	Eps                      float32
	BS, MaxBlocks, Splits, K uint32
	NormEps                  float32
	QKNorm                   uint32
	_                        uint32
}

// qkNormRopeWG and qkNormRopePairs (WG and PAIRS in qkv_rope_kv.wgsl) bound
// head_dim: D/2 ≤ WG·PAIRS.
const (
	qkNormRopeWG    = 64
	qkNormRopePairs = 2
)

// UploadQKNormRope uploads what QKVProjRopeKV needs of one layer besides the
// activations and the weight: q_norm (D), k_norm (D), RoPE's inverse
// frequencies invFreq (D/2, qwen3.Config.RopeInvFreq) and, where the layer
// has one, input_layernorm's weight (K; nil for none: QKVRopeKV alone), in
// one buffer.
func UploadQKNormRope(d *gpu.Device, name string, qNorm, kNorm, invFreq, inputNorm []float32) (*gpu.Buffer, error) {
	D := len(qNorm)
	if D == 0 || D%2 != 0 || len(kNorm) != D || len(invFreq) != D/2 || D/2 > qkNormRopeWG*qkNormRopePairs {
		return nil, fmt.Errorf("kernels: %s: q_norm %d, k_norm %d and %d inverse frequencies: want an even head_dim ≤ %d, and half as many frequencies", name, D, len(kNorm), len(invFreq), 2*qkNormRopeWG*qkNormRopePairs)
	}
	consts := append(append(append(make([]float32, 0, qkNormRopeLen(D)+len(inputNorm)), qNorm...), kNorm...), invFreq...)
	return d.UploadF32(name, append(consts, inputNorm...))
}

// qkNormRopeLen is the number of values UploadQKNormRope puts before the
// input norm for head_dim D: q_norm, k_norm and D/2 inverse frequencies.
func qkNormRopeLen(D int) int { return 2*D + D/2 }

// QKVProjRopeKV records a decoder layer's attention input: the q|k|v
// projection of the normalized hidden states, then, in one dispatch
// (qkv_rope_kv.wgsl), Qwen3's per-head q_norm/k_norm and RoPE (each row at
// its position) and the write of the keys and values to layer's cache, at
// each row's slot:
//
//	qkv = qkv_proj(input_layernorm(x))    (as MatMulNorm)
//	q   = rope(q_norm(q)); cache ← rope(k_norm(k)), v
//
//	x         (T, K) f32 hidden states, not normalized
//	inputNorm (K) f32 input_layernorm weight
//	w         ((heads + 2·kv_heads)·D, K) q_proj | k_proj | v_proj stacked
//	qkv       (T, (heads + 2·kv_heads)·D) f32 scratch rows
//	consts    from UploadQKNormRope
//	rows      (T, RowWords) u32 (PutRow): each row's sequence (KVSeq.Slot),
//	          cache slot and position — the slot for a line token, its
//	          parent's position plus one for a token-tree node; every
//	          slot's block must be in its sequence's table
//	q         (T, heads, D) f32, written: rope(q_norm(q))
//
// It equals RMSNorm (over head_dim, with q_norm or k_norm) then RoPE on
// each query and key head, followed by writing the keys and values to the
// rows' cache slots; eps is all three RMSNorms'. When the
// projection splits along K, qkv_rope_kv.wgsl sums the partial sums itself
// (and applies the input RMSNorm), one dispatch fewer than a reduce first,
// and qkv is left unwritten.
func QKVProjRopeKV(b *gpu.Batch, q, qkv, x, inputNorm *gpu.Buffer, w *Matrix, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads int, eps float64) error {
	if w == nil {
		return fmt.Errorf("kernels: qkv_proj_rope_kv: nil matrix")
	}
	d := b.Device()
	l := d.Limits()
	choice := w.planned(d, T)
	if c != nil && plannedFusedQKV(d, w, c.D, T) && consts != nil && consts.Size() >= uint64(qkNormRopeLen(c.D)+w.K)*4 {
		choice.fusedQKV = true
	}
	_, err := qkvProjRopeKV(b, q, qkv, x, w, consts, c, layer, rows, T, heads, matMulInput{norm: inputNorm, eps: eps}, choice, l.MaxStorageBufferBindingSize)
	return err
}

// qkvProjRopeKV is QKVProjRopeKV with the input RMSNorm (in.norm, in.eps,
// which is also q_norm's and k_norm's epsilon), the projection's choice and
// the binding limit given, as tests force them; it returns the splits the
// projection took (1: none).
func qkvProjRopeKV(b *gpu.Batch, q, qkv, x *gpu.Buffer, w *Matrix, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads int, in matMulInput, choice matMulChoice, maxBinding uint64) (int, error) {
	op := "qkv_proj_rope_kv"
	if in.norm == nil {
		return 0, fmt.Errorf("kernels: %s: nil input_layernorm weight", op)
	}
	if w == nil {
		return 0, fmt.Errorf("kernels: %s: nil matrix", op)
	}
	// Everything checked before anything is recorded.
	if err := checkQKVProj(op, q, qkv, consts, w, c, layer, rows, T, heads); err != nil {
		return 0, err
	}
	if choice.fusedQKV {
		return 1, recordQKVFused(b, op, q, x, w, consts, c, layer, rows, T, heads, in.eps, choice.qkvFused, true, true)
	}
	split, err := matMulSplitK(b, qkv, x, w, T, in, choice, maxBinding, true)
	if err != nil {
		return 0, err // it names the matrix
	}
	if err := recordQKVRopeKV(b, op, q, qkv, split, consts, c, layer, rows, T, heads, w.K, in.eps, true); err != nil {
		return 0, err
	}
	return max(split.splits, 1), nil
}

// AttentionBlockDecode records a decoder layer's attention block for one
// row (T = 1, rows as AttentionDecode's) on its residual stream x:
//
//	x += o_proj(attention(q, k, v)),  q | k | v = qkv_proj(input_layernorm(x))
//
// — QKVProjRopeKV, AttentionDecode of its queries into attn, and MatMul of
// attn by o adding into x. Where the plan takes one row's attention input
// in attention_decode.wgsl (plan.attentionInput) and neither
// qkv_fused_int4.wgsl (below plan.attentionInputMinK inputs) nor a split
// projection does, it records the projection into qkv, then
// attention_decode.wgsl with the q/k norms, RoPE and the cache append
// itself (its INPUT): one dispatch fewer, the same cache and output. Where
// the plan merges attention's splits in o_proj (plan.mergeInOProjMaxK) and
// o_proj takes matvec_batch_int4.wgsl, o_proj merges them as it reads them
// (its MERGE, on the plan's layout for it) instead of attention_merge.wgsl
// in a dispatch before it, and attn is left unwritten. q is written only on
// the first path; q, qkv and attn are scratch.
func AttentionBlockDecode(b *gpu.Batch, x, attn, q, qkv, inputNorm *gpu.Buffer, w, o *Matrix, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, heads, maxLen int, eps float64) error {
	const op, T = "attention_block_decode", 1
	if w == nil || o == nil {
		return fmt.Errorf("kernels: %s: nil matrix", op)
	}
	d := b.Device()
	p := planFor(d)
	oChoice := o.planned(d, T)
	if c != nil && o.K != heads*c.D {
		return fmt.Errorf("kernels: %s: o_proj of %d inputs after %d heads of %d", op, o.K, heads, c.D)
	}
	if err := need(op, "x", x, o.N); err != nil {
		return err
	}
	left, err := qkvAttention(b, attn, q, qkv, x, inputNorm, w, consts, c, layer, rows, heads, maxLen, eps)
	if err != nil {
		return err
	}
	if left != nil && !p.mergesInOProj(o, oChoice) {
		if err := left.record(b, attn); err != nil {
			return err
		}
		left = nil
	}
	if left == nil {
		return MatMul(b, x, attn, o, T, true)
	}
	if l := p.mergeInOProjLayout; l.valid() && l.fits(o, T, d.Limits()) {
		oChoice.matVecBatch = l
	}
	_, err = matMulSplitK(b, x, nil, o, T, matMulInput{accumulate: true, merge: left}, oChoice, d.Limits().MaxStorageBufferBindingSize, false)
	return err
}

// qkvAttention records AttentionBlockDecode's attention into attn and
// returns its splits where they are left to merge (nil: attn written).
func qkvAttention(b *gpu.Batch, attn, q, qkv, x, inputNorm *gpu.Buffer, w *Matrix, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, heads, maxLen int, eps float64) (*decodeSplits, error) {
	const op, T = "attention_block_decode", 1
	d := b.Device()
	p := planFor(d)
	tune := p.decode
	if c == nil || !p.attentionInput || p.fusesBeforeInput(w.K) && plannedFusedQKV(d, w, c.D, T) ||
		!c.decodeInputFits(heads, c.decodeShape(d, T, heads, maxLen, tune), tune) {
		if err := QKVProjRopeKV(b, q, qkv, x, inputNorm, w, consts, c, layer, rows, T, heads, eps); err != nil {
			return nil, err
		}
		return attentionSplits(b, attn, q, c, layer, rows, T, heads, maxLen, tune, nil)
	}
	if inputNorm == nil {
		return nil, fmt.Errorf("kernels: %s: nil input_layernorm weight", op)
	}
	if err := checkQKVProj(op, q, qkv, consts, w, c, layer, rows, T, heads); err != nil {
		return nil, err
	}
	split, err := matMulSplitK(b, qkv, x, w, T, matMulInput{norm: inputNorm, eps: eps}, w.planned(d, T), d.Limits().MaxStorageBufferBindingSize, true)
	if err != nil {
		return nil, err // it names the matrix
	}
	if split.splits > 1 { // partials: qkv_rope_kv.wgsl sums them
		if err := recordQKVRopeKV(b, op, q, qkv, split, consts, c, layer, rows, T, heads, w.K, eps, true); err != nil {
			return nil, err
		}
		return attentionSplits(b, attn, q, c, layer, rows, T, heads, maxLen, tune, nil)
	}
	return attentionSplits(b, attn, qkv, c, layer, rows, T, heads, maxLen, tune, &decodeInput{consts: consts, eps: eps})
}

// fusesQKV reports whether qkv_fused_int4.wgsl can take the q|k|v
// projection of w over T rows on d at layout l (its zero: the shape's
// default): an int4 weight in groups of a multiple of 32, head vectors of
// an even size its workgroups hold, the staged input within the
// workgroup memory, and nine storage buffers; consts (UploadQKNormRope's)
// must hold the input norm too, which the caller checks.
func fusesQKV(d *gpu.Device, w *Matrix, D, T int, l qkvFusedLayout) bool {
	wb, _ := w.rowBytes()
	lim := d.Limits()
	l, ok := l.of(D, w.K, lim)
	return ok && w.Format == Int4 && w.K%32 == 0 && w.G%32 == 0 && D%2 == 0 && T >= 1 &&
		l.chunk(D, w.K, matVecTT(min(T, qkvFusedMaxTT)), lim.MaxComputeWorkgroupStorageSize) > 0 &&
		uint64(w.N)*wb <= lim.MaxStorageBufferBindingSize && lim.MaxStorageBuffersPerShaderStage >= uint32(len(qkvFused.Storage))
}

// plannedFusedQKV reports whether the q|k|v projection of w over T rows,
// head vectors of D, takes qkv_fused_int4.wgsl on d: the plan's bounds
// take the shape and the kernel fits it at the shape's default layout.
func plannedFusedQKV(d *gpu.Device, w *Matrix, D, T int) bool {
	return planFor(d).fusesQKV(w.K, T) && fusesQKV(d, w, D, T, qkvFusedLayout{})
}

// recordQKVFused records qkv_fused_int4.wgsl at layout l (its zero: the
// shape's default): QKVProjRopeKV in one dispatch, the input norm's weight
// read from consts after the rest — or, without norm, QKVProjRopeKVNormed's
// rows as they come, consts ending at the inverse frequencies; q_norm and
// k_norm where qkNorm.
func recordQKVFused(b *gpu.Batch, op string, q, x *gpu.Buffer, w *Matrix, consts *gpu.Buffer, c *KVCache, layer int, rowBuf *gpu.Buffer, T, heads int, eps float64, l qkvFusedLayout, norm, qkNorm bool) error {
	D, K := c.D, w.K
	d := b.Device()
	if !fusesQKV(d, w, D, T, l) {
		return fmt.Errorf("kernels: %s: qkv_fused_int4.wgsl cannot take %s (%d×%d, group %d) at head_dim %d on this device", op, w.Name, w.N, K, w.G, D)
	}
	n, what := qkNormRopeLen(D)+K, "consts (with input_layernorm's weight)"
	if !norm {
		n, what = qkNormRopeLen(D), "consts"
	}
	for _, c := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"x", x, T * K}, {what, consts, n}} {
		if err := need(op, c.name, c.buf, c.n); err != nil {
			return err
		}
	}
	l, _ = l.of(D, K, d.Limits())
	tt := matVecTT(min(T, qkvFusedMaxTT))
	kc := l.chunk(D, K, tt, d.Limits().MaxComputeWorkgroupStorageSize)
	vals := [7]uint32{uint32(l.lanes), uint32(D), uint32(l.rt), uint32(l.wg), tt, kc, wgslBool(norm)}
	p, err := c.pipeline(d, qkvFused, kernelShape{fused: vals}, true, func() gpu.Consts {
		consts := gpu.Consts{}
		for i, name := range qkvFusedConsts {
			consts[name] = vals[i]
		}
		return consts
	})
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	f := func(buf *gpu.Buffer, n int) gpu.Binding { return buf.Slice(0, uint64(n)*4) }
	kc4, vc := c.layer(layer)
	weights, scales := w.bindRows(rowBlock{0, w.N})
	binds := []gpu.Binding{f(x, T*K), weights, scales, f(consts, n),
		f(rowBuf, T*RowWords), c.table.All(), f(q, T*heads*D), kc4, vc}
	params := &qkvFusedParams{T: uint32(T), N: uint32(w.N), K: uint32(K), G: uint32(w.G), Kps: uint32(K), Magic: codesMagic,
		Heads: uint32(heads), KVHeads: uint32(c.KVHeads), D: uint32(D),
		BS: uint32(c.BlockSize), MaxBlocks: uint32(c.MaxBlocks), Eps: float32(eps), QKNorm: wgslBool(qkNorm)}
	if err := gpu.Dispatch(b, p, params, binds, uint32(heads+2*c.KVHeads), uint32(divCeil(T, int(tt))), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}

// QKVProjRopeKVNormed records the attention input of a Llama-style layer
// over rows x already normalized (an EAGLE-3 head's midlayer, whose two
// halves have norms of their own): qkv = x · wᵀ, then QKVRopeKV's work,
// with q_norm and k_norm where qkNorm — in one dispatch
// (qkv_fused_int4.wgsl) where the plan fuses a projection of that shape,
// else the matmul into the scratch rows qkv, then qkv_rope_kv.wgsl. consts
// is UploadQKNormRope's, without an input norm.
func QKVProjRopeKVNormed(b *gpu.Batch, q, qkv, x *gpu.Buffer, w *Matrix, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads int, eps float64, qkNorm bool) error {
	op := "qkv_proj_rope_kv"
	if w == nil {
		return fmt.Errorf("kernels: %s: nil matrix", op)
	}
	if err := checkQKVProj(op, q, qkv, consts, w, c, layer, rows, T, heads); err != nil {
		return err
	}
	d := b.Device()
	if plannedFusedQKV(d, w, c.D, T) {
		return recordQKVFused(b, op, q, x, w, consts, c, layer, rows, T, heads, eps, qkvFusedLayout{}, false, qkNorm)
	}
	if err := MatMul(b, qkv, x, w, T, false); err != nil {
		return err
	}
	return recordQKVRopeKV(b, op, q, qkv, splitK{}, consts, c, layer, rows, T, heads, 0, eps, qkNorm)
}

// QKVRopeKV records qkv_rope_kv.wgsl alone over q|k|v rows already
// projected (qkv, QKVProjRopeKV's layout: (T, (heads + 2·kv_heads)·D)):
// each query and key head rotated at its row's position — after Qwen3's
// q_norm and k_norm (consts', epsilon eps) when qkNorm, as they come
// otherwise, a Llama layer's attention input (an EAGLE-3 head's midlayer)
// — the queries into q and the keys and values into layer's cache at the
// rows' slots. consts is UploadQKNormRope's; without qkNorm its norms are
// not read.
func QKVRopeKV(b *gpu.Batch, q, qkv, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads int, eps float64, qkNorm bool) error {
	op := "qkv_rope_kv"
	if err := checkQKVRopeKV(op, q, qkv, consts, c, layer, rows, T, heads); err != nil {
		return err
	}
	return recordQKVRopeKV(b, op, q, qkv, splitK{}, consts, c, layer, rows, T, heads, 0, eps, qkNorm)
}

// checkQKVProj checks the arguments of a q|k|v projection followed by
// qkv_rope_kv.wgsl's work (checkQKVRopeKV), and that w stacks q_proj,
// k_proj and v_proj: heads + 2·kv_heads head vectors of c's head_dim.
func checkQKVProj(op string, q, qkv, consts *gpu.Buffer, w *Matrix, c *KVCache, layer int, rows *gpu.Buffer, T, heads int) error {
	if err := checkQKVRopeKV(op, q, qkv, consts, c, layer, rows, T, heads); err != nil {
		return err
	}
	if width := (heads + 2*c.KVHeads) * c.D; w.N != width {
		return fmt.Errorf("kernels: %s: %s has %d rows, want (%d + 2·%d)·%d = %d", op, w.Name, w.N, heads, c.KVHeads, c.D, width)
	}
	return nil
}

// checkQKVRopeKV checks qkv_rope_kv.wgsl's arguments.
func checkQKVRopeKV(op string, q, qkv, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads int) error {
	if err := c.checkRows(op, layer, T, rows); err != nil {
		return err
	}
	if err := c.checkHeads(op, heads); err != nil {
		return err
	}
	D := c.D
	if D%2 != 0 || D/2 > qkNormRopeWG*qkNormRopePairs {
		return fmt.Errorf("kernels: %s: head_dim %d (even, at most %d)", op, D, 2*qkNormRopeWG*qkNormRopePairs)
	}
	width := (heads + 2*c.KVHeads) * D
	for _, n := range []struct {
		name string
		buf  *gpu.Buffer
		n    int
	}{{"qkv", qkv, T * width}, {"consts", consts, qkNormRopeLen(D)}, {"q", q, T * heads * D}} {
		if err := need(op, n.name, n.buf, n.n); err != nil {
			return err
		}
	}
	return nil
}

// recordQKVRopeKV records qkv_rope_kv.wgsl over the rows in qkv, or over
// the partials in split when it has more than one split (K inputs a row,
// RMSNorm epsilon eps), with q_norm and k_norm when qkNorm; the arguments
// are checked.
func recordQKVRopeKV(b *gpu.Batch, op string, q, qkv *gpu.Buffer, split splitK, consts *gpu.Buffer, c *KVCache, layer int, rowBuf *gpu.Buffer, T, heads, K int, eps float64, qkNorm bool) error {
	sb := splitBlockLog(split.splits)
	p, err := c.pipeline(b.Device(), qkvRopeKV, kernelShape{sb: sb}, true, func() gpu.Consts { return reduceConsts[sb] })
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	D := c.D
	width := (heads + 2*c.KVHeads) * D
	f := func(buf *gpu.Buffer, n int) gpu.Binding { return buf.Slice(0, uint64(n)*4) }
	rows, splits := f(qkv, T*width), 1
	if split.splits > 1 {
		rows, splits = split.part, split.splits
	}
	kc, vc := c.layer(layer)
	binds := []gpu.Binding{rows, f(consts, qkNormRopeLen(D)), f(rowBuf, T*RowWords), c.table.All(), f(q, T*heads*D), kc, vc}
	params := &qkvRopeKVParams{T: uint32(T), Heads: uint32(heads), KVHeads: uint32(c.KVHeads), D: uint32(D), Eps: float32(eps),
		BS: uint32(c.BlockSize), MaxBlocks: uint32(c.MaxBlocks), Splits: uint32(splits), K: uint32(K), NormEps: float32(eps), QKNorm: wgslBool(qkNorm)}
	if err := gpu.Dispatch(b, p, params, binds, uint32(heads+2*c.KVHeads), uint32(T), 1); err != nil {
		return fmt.Errorf("kernels: %s: %w", op, err)
	}
	return nil
}
