package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/tensor"
	"webdraft/treemask"
)

// qkvRows is a batch of T rows for the qkv_rope_kv kernels: a 2-layer
// cache (f16 when half) of three sequences, their blocks from a shuffled
// pool, layer 1 poisoned; and rows of random sequences, each one's rows a
// run of slots from a random start, as a batch of decode and prefill rows
// has them — with tree, each row a token tree's node with probability ½,
// rotated at a random position up to its slot (a node's depth's), else a
// line token rotated at its slot.
type qkvRows struct {
	c                *KVCache
	heads, T         int
	seq, slot, pos   []uint32
	rowBuf           *gpu.Buffer
	qNorm, kNorm     []float32
	consts           *gpu.Buffer // UploadQKNormRope
	theta, eps       float64
	invFreq          []float32
	layer, maxBlocks int
}

func newQKVRows(t *testing.T, d *gpu.Device, r *rand.Rand, heads, kvHeads, D, bs, T int, half, tree bool) *qkvRows {
	t.Helper()
	const slots = 3
	q := &qkvRows{heads: heads, T: T, theta: 1000000, eps: 1e-6, layer: 1}
	q.maxBlocks = (2*bs + T + bs - 1) / bs // a start below 2·bs, then up to T positions
	c, err := NewKVCache(d, KVShape{Layers: 2, KVHeads: kvHeads, D: D, BlockSize: bs, Blocks: slots * q.maxBlocks, Seqs: slots, MaxBlocks: q.maxBlocks, F16: half})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Release)
	q.c = c
	r.Shuffle(len(c.free), func(i, j int) { c.free[i], c.free[j] = c.free[j], c.free[i] })
	seqs := make([]*KVSeq, slots)
	for i := range seqs {
		if seqs[i], err = c.NewSeq(); err != nil {
			t.Fatal(err)
		}
		if err := c.Reserve(seqs[i:i+1], []int{q.maxBlocks * bs}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SyncTables(seqs); err != nil {
		t.Fatal(err)
	}
	var next [slots]uint32
	for i := range next {
		next[i] = uint32(r.IntN(2 * bs))
	}
	var place []treemask.Row
	for range T {
		i := r.IntN(slots)
		row := treemask.LineRow(int(next[i]))
		if tree && r.IntN(2) == 0 {
			row = treemask.Row{Pos: r.IntN(int(next[i]) + 1), Base: int(next[i]), Mask: 1}
		}
		q.seq, q.slot, q.pos = append(q.seq, uint32(seqs[i].Slot())), append(q.slot, next[i]), append(q.pos, uint32(row.Pos))
		place = append(place, row)
		next[i]++
	}
	q.rowBuf = uploadRows(t, d, q.seq, q.slot, place)
	q.qNorm, q.kNorm = randVec(r, D, 0.5), randVec(r, D, 0.5)
	q.invFreq = (&qwen3.Config{HeadDim: D, RopeTheta: q.theta}).RopeInvFreq()
	if q.consts, err = UploadQKNormRope(d, "consts", q.qNorm, q.kNorm, q.invFreq, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.consts.Release)
	poison := uint32(gpu.NaN32)
	if half {
		poison = 0x7e007e00 // an f16 NaN in both halves
	}
	for _, buf := range []*gpu.Buffer{c.k[q.layer], c.v[q.layer]} {
		if err := buf.Fill(poison); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

// qkvWeight returns a random int4 q|k|v weight of N rows of K inputs in
// groups of G, and its upload, released with the test.
func qkvWeight(t *testing.T, d *gpu.Device, r *rand.Rand, N, K, G int) (tensor.Matrix, *Matrix) {
	t.Helper()
	m := randMatrix(t, r, Int4, N, K, G)
	w, err := UploadMatrix(d, "qkv_proj", m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Release)
	return m, w
}

// width is a q|k|v row's length.
func (q *qkvRows) width() int { return (q.heads + 2*q.c.KVHeads) * q.c.D }

// check compares the q written to qb and the keys and values in the cache
// with the reference's RMSNorm (where qkNorm) and Rope of the q|k|v rows
// qkv (T, width): each row rotated at its position, its key and value at
// its slot.
func (q *qkvRows) check(t *testing.T, qb *gpu.Buffer, qkv []float32, qkNorm bool) {
	t.Helper()
	T, heads, kvHeads, D, bs, width := q.T, q.heads, q.c.KVHeads, q.c.D, q.c.BlockSize, q.width()
	invFreq := q.invFreq
	wantQ := make([]float32, T*heads*D)
	wantK, wantV := make([]float32, T*kvHeads*D), make([]float32, T*kvHeads*D)
	for t := range T {
		row := qkv[t*width : (t+1)*width]
		copy(wantQ[t*heads*D:], row[:heads*D])
		copy(wantK[t*kvHeads*D:], row[heads*D:(heads+kvHeads)*D])
		copy(wantV[t*kvHeads*D:], row[(heads+kvHeads)*D:])
	}
	for _, c := range []struct{ v, w []float32 }{{wantQ, q.qNorm}, {wantK, q.kNorm}} {
		for i := 0; i < len(c.v); i += D {
			if qkNorm {
				reference.RMSNorm(c.v[i:i+D], c.v[i:i+D], c.w, q.eps)
			}
			reference.Rope(c.v[i:i+D], int(q.pos[i/(len(c.v)/T)]), invFreq)
		}
	}
	checkClose(t, "q", readF32(t, qb, T*heads*D), wantQ, tolF32)
	table, err := q.c.table.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	for name, cc := range map[string]struct {
		buf  *gpu.Buffer
		want []float32
	}{"k": {q.c.k[q.layer], wantK}, "v": {q.c.v[q.layer], wantV}} {
		layer := readCache(t, q.c, cc.buf)
		for t_ := range T {
			block := int(table[int(q.seq[t_])*q.maxBlocks+int(q.slot[t_])/bs])
			for h := range kvHeads {
				at := ((block*kvHeads+h)*bs + int(q.slot[t_])%bs) * D
				want := cc.want[(t_*kvHeads+h)*D : (t_*kvHeads+h+1)*D]
				if relErr(layer[at:at+D], want) > kvTol(q.c) {
					t.Fatalf("%s: row %d head %d: got %v…, want %v…", name, t_, h, layer[at:at+2], want[:2])
				}
			}
		}
	}
}

// qkvRopeKVRows records qkv_rope_kv.wgsl over the q|k|v rows in qkv (unsplit),
// with q/k norms: the second half of QKVProjRopeKV on its own.
func qkvRopeKVRows(b *gpu.Batch, q, qkv, consts *gpu.Buffer, c *KVCache, layer int, rows *gpu.Buffer, T, heads int, eps float64) error {
	return QKVRopeKV(b, q, qkv, consts, c, layer, rows, T, heads, eps, true)
}

// TestQKVRopeKV: q/k norms and RoPE from stacked projection rows, with the
// keys and values written to the cache, against the reference's RMSNorm
// and Rope — line rows, and token-tree rows whose position is not their
// slot; and RoPE alone (no q/k norms: a Llama layer's, an EAGLE-3 head's),
// against the reference's Rope.
func TestQKVRopeKV(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for i := range 8 {
		s := randAttnShape(r)
		s.D = []int{64, 128, 256}[r.IntN(3)]
		half, tree, qkNorm := i%2 == 1, i >= 2, i < 6
		heads, kvHeads, D, T := s.kvHeads*s.group, s.kvHeads, s.D, 3+r.IntN(58)
		t.Run(fmt.Sprintf("heads%d_kv%d_D%d_T%d_f16=%v_tree=%v_qknorm=%v", heads, kvHeads, D, T, half, tree, qkNorm), func(t *testing.T) {
			rows := newQKVRows(t, d, r, heads, kvHeads, D, s.blockSize, T, half, tree)
			qkv := randVec(r, T*rows.width(), 2)
			qb, qkvb := poisoned(t, d, "q", T*heads*D), upload(t, d, "qkv", qkv)
			run(t, d, "qkv_rope_kv", func(b *gpu.Batch) error {
				return QKVRopeKV(b, qb, qkvb, rows.consts, rows.c, rows.layer, rows.rowBuf, T, heads, rows.eps, qkNorm)
			})
			rows.check(t, qb, qkv, qkNorm)
		})
	}
}

// TestQKVProjRopeKV: the q|k|v projection of the normalized input followed
// by QKVRopeKV, against the reference's RMSNorm, int4 matmul, RMSNorm and
// Rope — unsplit (a matrix-vector kernel writes qkv), split along K (the
// skinny kernel and the GEMM, forced to split, leave partial sums that
// qkv_rope_kv.wgsl reduces), and split in a matrix of several row blocks
// (reduced into qkv block by block) — and against the two dispatches of
// MatMulNorm (with its reduce) then QKVRopeKV, which it must equal up to
// rounding.
func TestQKVProjRopeKV(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, c := range []struct {
		name      string
		T         int
		kernel    matMulKernel
		force     bool // a split-K target that makes the kernel split
		rowBlocks bool // a binding limit that cuts the matrix into row blocks
		partials  bool // qkv_rope_kv.wgsl must get the partials (else qkv)
	}{
		{"planned", 1, kernelPlanned, false, false, false},
		{"planned", 3, kernelPlanned, false, false, false},
		{"matvec-batch", 1, kernelMatVecBatch, true, false, true},
		{"matvec-batch", 3, kernelMatVecBatch, true, false, true},
		{"skinny", 9, kernelSkinny, true, false, true},
		{"gemm-4", 45, kernelGEMM4, true, false, true},
		{"gemm-2x8", 70, kernelGEMM2x8, true, false, true},
		{"skinny", 130, kernelSkinny, true, false, true}, // a prompt chunk, several row tiles
		{"skinny-row-blocks", 2, kernelSkinny, true, true, false},
	} {
		for _, half := range []bool{false, true} {
			kvHeads, group, D := []int{1, 2}[r.IntN(2)], []int{1, 2, 4}[r.IntN(3)], []int{64, 128}[r.IntN(2)]
			if c.rowBlocks { // rows enough for blocks of a multiple of 256 rows
				kvHeads, group, D = 2, 4, 128
			}
			heads, K := kvHeads*group, 128*(2+r.IntN(3))
			if c.kernel == kernelMatVecBatch { // slices of 32 · lanes inputs (up to 2,048): at least two
				K *= 16
			}
			name := fmt.Sprintf("%s/T%d_heads%d_kv%d_D%d_K%d_f16=%v", c.name, c.T, heads, kvHeads, D, K, half)
			t.Run(name, func(t *testing.T) {
				T := c.T
				rows := newQKVRows(t, d, r, heads, kvHeads, D, []int{16, 32}[r.IntN(2)], T, half, true)
				N := rows.width()
				m, w := qkvWeight(t, d, r, N, K, 32)
				choice, ok := choiceFor(d, c.kernel, w, T)
				if !ok {
					t.Skipf("this device does not take %v", c.kernel)
				}
				if c.force {
					choice.groups = 1 << 12 // more workgroups than any tiling here has tiles: as many splits as K allows
				}
				x, g := randVec(r, T*K, 3), randVec(r, K, 1)
				xn, qkv := make([]float32, T*K), make([]float32, T*N)
				for row := range T {
					reference.RMSNorm(xn[row*K:(row+1)*K], x[row*K:(row+1)*K], g, rows.eps)
				}
				reference.MatMul(qkv, xn, m, T)

				how := matMulInput{norm: upload(t, d, "input_layernorm", g), eps: rows.eps}
				maxBinding := d.Limits().MaxStorageBufferBindingSize
				if c.rowBlocks {
					w4, scales := w.rowBytes()
					maxBinding = uint64(N) * (w4 + scales) / 3
					blocks, err := w.rowBlocks(maxBinding, d.Limits().MinStorageBufferOffsetAlignment)
					if err != nil || len(blocks) < 2 || uint64(T*N*4) > maxBinding {
						t.Fatalf("a %d-byte binding limit: %d row blocks, %v", maxBinding, len(blocks), err)
					}
				}
				xb, qb, qkvb := upload(t, d, "x", x), poisoned(t, d, "q", T*heads*D), poisoned(t, d, "qkv", T*N)
				poisonScratch(t, d, K/16*T*(N+1)) // more than any split-K's partials (steps of 16 inputs at least)
				splits := 0
				run(t, d, "qkv_proj_rope_kv", func(b *gpu.Batch) error {
					var err error
					splits, err = qkvProjRopeKV(b, qb, qkvb, xb, w, rows.consts, rows.c, rows.layer, rows.rowBuf, T, heads, how, choice, maxBinding)
					return err
				})
				t.Logf("qkv_rope_kv.wgsl read %d splits", splits)
				if c.partials != (splits > 1) {
					t.Fatalf("qkv_rope_kv.wgsl read %d splits, want partials = %v", splits, c.partials)
				}
				rows.check(t, qb, qkv, true)

				// The two-dispatch path, into fresh buffers: the same q.
				fused := readF32(t, qb, T*heads*D)
				q2, qkv2 := poisoned(t, d, "q2", T*heads*D), poisoned(t, d, "qkv2", T*N)
				run(t, d, "matmul_norm+qkv_rope_kv", func(b *gpu.Batch) error {
					if _, err := matMulSplitK(b, qkv2, xb, w, T, how, choice, maxBinding, false); err != nil {
						return err
					}
					return qkvRopeKVRows(b, q2, qkv2, rows.consts, rows.c, rows.layer, rows.rowBuf, T, heads, rows.eps)
				})
				checkClose(t, "q against the two-dispatch path", fused, readF32(t, q2, T*heads*D), tolF32)
			})
		}
	}
}

// TestAttentionBlockDecode: one row's attention block through
// AttentionBlockDecode — the projection, qkv_rope_kv.wgsl, attention, its
// merge and o_proj; the plan taking the attention input in
// attention_decode.wgsl (INPUT); and that with o_proj merging the splits
// as it reads them (matvec_batch_int4.wgsl's MERGE) — adds the same to the
// residual stream and leaves the same cache, over caches alike from one
// seed; and a weight of the wrong height is refused.
func TestAttentionBlockDecode(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	p := planFor(d)
	saved := *p
	t.Cleanup(func() { *p = saved })
	p.qkvFused = nil // the projection apart, at any K
	for i, half := range []bool{false, true, true} {
		s := attnShape{kvHeads: 2, group: []int{1, 2, 4}[r.IntN(3)], D: []int{64, 128}[r.IntN(2)], blockSize: 16}
		n, K, seed := 1+r.IntN(300), 256, r.Uint64()
		if i == 2 { // Qwen3-8B's heads and input, a context of up to 1,024
			s, n, K = attnShape{kvHeads: 8, group: 4, D: 128, blockSize: 16}, 1+r.IntN(1024), 4096
		}
		t.Run(fmt.Sprintf("kv%d_group%d_D%d_K%d_n%d_f16=%v", s.kvHeads, s.group, s.D, K, n, half), func(t *testing.T) {
			cfg := s.config()
			heads, width := cfg.NumAttentionHeads, cfg.QDim()+2*cfg.KVDim()
			_, w := qkvWeight(t, d, r, width, K, 32)
			o, err := UploadMatrix(d, "o_proj", randMatrix(t, r, Int4, K, cfg.QDim(), 32))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(o.Release)
			p.matVecBatchMinK = cfg.QDim() // o_proj of one row on matvec_batch_int4.wgsl, which merges
			// on o_proj's layout or the merge's own
			p.mergeInOProjLayout = []matVecBatchLayout{{}, matVecBatchNarrow}[r.IntN(2)]
			x0, g := randVec(r, K, 3), upload(t, d, "input_layernorm", randVec(r, K, 1))
			consts, err := UploadQKNormRope(d, "consts", randVec(r, s.D, 0.5), randVec(r, s.D, 0.5), (&qwen3.Config{HeadDim: s.D, RopeTheta: 1e6}).RopeInvFreq(), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(consts.Release)
			var outs, keys, values [3][]float32
			var cache *KVCache
			for i, path := range []struct{ input, merge bool }{{false, false}, {true, false}, {true, true}} {
				p.attentionInput, p.mergeInOProjMaxK = path.input, 0
				if path.merge {
					p.mergeInOProjMaxK = cfg.QDim()
				}
				tc := newTestCache(t, d, rand.New(rand.NewPCG(seed, 1)), s.kvHeads, s.D, s.blockSize, []int{n}, half)
				cache = tc.c
				rb := uploadRows(t, d, []uint32{tc.slot(0)}, []uint32{uint32(n - 1)}, []treemask.Row{treemask.LineRow(n - 1)})
				x := upload(t, d, "x", x0)
				q, qkv, attn := poisoned(t, d, "q", cfg.QDim()), poisoned(t, d, "qkv", width), poisoned(t, d, "attn", cfg.QDim())
				run(t, d, "attention_block_decode", func(b *gpu.Batch) error {
					return AttentionBlockDecode(b, x, attn, q, qkv, g, w, o, consts, tc.c, tc.layer, rb, heads, n, 1e-6)
				})
				outs[i], keys[i], values[i] = readF32(t, x, K), readCache(t, tc.c, tc.c.k[tc.layer]), readCache(t, tc.c, tc.c.v[tc.layer])
				for k := range outs[i] { // what the block added
					outs[i][k] -= x0[k]
				}
				if wrote := !math.IsNaN(float64(readF32(t, q, 1)[0])); wrote == path.input { // INPUT leaves q as it was
					t.Fatalf("%+v: q written %v", path, wrote)
				}
				// The merge in o_proj leaves attn as it was where there is
				// a merge dispatch (more than one split) to save.
				shape := tc.c.DecodeShapeOf(d, 1, heads, n)
				want := path.merge && shape.splits > 1 && !shape.merge
				if merged := math.IsNaN(float64(readF32(t, attn, 1)[0])); merged != want {
					t.Fatalf("%+v, %d splits: attn left unwritten %v, want %v", path, shape.splits, merged, want)
				}
			}
			// The paths' f32 sums differ in order: a key may round to the
			// neighbouring f16, and o_proj sums 1,024 or more products of
			// the attention output.
			for i, name := range []string{"input", "merge in o_proj"} {
				checkClose(t, name+": x's sum", outs[i+1], outs[0], 4*kvTol(cache))
				checkClose(t, name+": keys", keys[i+1], keys[0], kvTol(cache))
				checkClose(t, name+": values", values[i+1], values[0], kvTol(cache))
			}
			wrong, err := UploadMatrix(d, "qkv_proj", randMatrix(t, r, Int4, width+s.D, K, 32))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(wrong.Release)
			tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, []int{n}, half)
			rb := uploadRows(t, d, []uint32{tc.slot(0)}, []uint32{uint32(n - 1)}, []treemask.Row{treemask.LineRow(n - 1)})
			p.attentionInput = true
			b, err := d.NewBatch("refused")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Discard()
			if err := AttentionBlockDecode(b, upload(t, d, "x", x0), poisoned(t, d, "attn", cfg.QDim()), poisoned(t, d, "q", cfg.QDim()), poisoned(t, d, "qkv", width), g, wrong, o, consts, tc.c, tc.layer, rb, heads, n, 1e-6); err == nil {
				t.Fatal("a q|k|v weight one head too tall: no error")
			}
		})
	}
}

// TestQKVFused: qkv_fused_int4.wgsl — input_layernorm, the int4 q|k|v
// projection, q/k norms, RoPE and the cache append in one dispatch —
// against the reference's RMSNorm, int4 matmul, RMSNorm and Rope, over
// head sizes that give each weight row several threads, one, or a thread
// two rows, f32 and f16 caches, line and tree rows; a weight or a device it
// cannot take, and consts without the input norm, are refused.
func TestQKVFused(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	// The shape's default layout, and layouts that stage a few columns at
	// a time (several chunks a row), give a weight row one lane or a
	// thread four rows.
	layouts := []qkvFusedLayout{{}, {}, {}, {staged: 256}, {lanes: 1, rt: 1}, {lanes: 4, rt: 4, staged: 512}}
	for i, layout := range layouts {
		kvHeads, group, D := []int{1, 2}[r.IntN(2)], []int{1, 2, 4}[r.IntN(3)], []int{64, 128, 256}[i%3]
		heads, K, G, T, half := kvHeads*group, 32*(1+r.IntN(64)), []int{32, 64}[r.IntN(2)], 1+r.IntN(8), i%2 == 1
		K = (K + G - 1) / G * G
		if layout.lanes == 1 {
			D = 64 // a thread a row: 64 threads
		}
		t.Run(fmt.Sprintf("T%d_heads%d_kv%d_D%d_K%d_G%d_f16=%v_%v", T, heads, kvHeads, D, K, G, half, layout), func(t *testing.T) {
			rows := newQKVRows(t, d, r, heads, kvHeads, D, []int{16, 32}[r.IntN(2)], T, half, true)
			N := rows.width()
			m, w := qkvWeight(t, d, r, N, K, G)
			if !fusesQKV(d, w, D, T, layout) {
				t.Skipf("this device does not take qkv_fused_int4.wgsl")
			}
			x, g := randVec(r, T*K, 3), randVec(r, K, 1)
			xn, qkv := make([]float32, T*K), make([]float32, T*N)
			for row := range T {
				reference.RMSNorm(xn[row*K:(row+1)*K], x[row*K:(row+1)*K], g, rows.eps)
			}
			reference.MatMul(qkv, xn, m, T)
			consts, err := UploadQKNormRope(d, "consts_with_norm", rows.qNorm, rows.kNorm, rows.invFreq, g)
			if err != nil {
				t.Fatal(err)
			}
			defer consts.Release()
			xb, qb, qkvb := upload(t, d, "x", x), poisoned(t, d, "q", T*heads*D), poisoned(t, d, "qkv", T*N)
			how := matMulInput{norm: upload(t, d, "input_layernorm", g), eps: rows.eps}
			run(t, d, "qkv_fused", func(b *gpu.Batch) error {
				_, err := qkvProjRopeKV(b, qb, qkvb, xb, w, consts, rows.c, rows.layer, rows.rowBuf, T, heads, how, matMulChoice{fusedQKV: true, qkvFused: layout}, d.Limits().MaxStorageBufferBindingSize)
				return err
			})
			rows.check(t, qb, qkv, true)
			if got := readF32(t, qkvb, T*N); !math.IsNaN(float64(got[0])) {
				t.Errorf("qkv written (%v): the fused kernel keeps its rows to itself", got[0])
			}

			b, err := d.NewBatch("refused")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Discard()
			if _, err := qkvProjRopeKV(b, qb, qkvb, xb, w, rows.consts, rows.c, rows.layer, rows.rowBuf, T, heads, how, matMulChoice{fusedQKV: true}, d.Limits().MaxStorageBufferBindingSize); err == nil {
				t.Error("consts without the input norm accepted")
			}
			f16, err := UploadMatrix(d, "qkv_f16", randMatrix(t, r, F16, N, K, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer f16.Release()
			if _, err := qkvProjRopeKV(b, qb, qkvb, xb, f16, consts, rows.c, rows.layer, rows.rowBuf, T, heads, how, matMulChoice{fusedQKV: true}, d.Limits().MaxStorageBufferBindingSize); err == nil {
				t.Error("an f16 weight accepted")
			}
			if b.Len() != 0 {
				t.Errorf("%d dispatches recorded by refused calls", b.Len())
			}
		})
	}
}

// TestQKVProjRopeKVNormed: the attention input over rows already
// normalized (an EAGLE-3 head's), with and without q/k norms, against the
// reference's int4 matmul, RMSNorm and Rope — in one dispatch where the
// plan fuses the shape (qkv_fused_int4.wgsl without its input norm), in
// two where it does not.
func TestQKVProjRopeKVNormed(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for i, c := range []struct{ K, T int }{{512, 1}, {512, 2}, {256, 5}, {512, 4}, {4096, 1}} {
		qkNorm := i%2 == 1
		kvHeads, group, D := []int{1, 2}[r.IntN(2)], []int{1, 2}[r.IntN(2)], []int{64, 128}[r.IntN(2)]
		heads, half := kvHeads*group, r.IntN(2) == 1
		t.Run(fmt.Sprintf("K%d_T%d_heads%d_kv%d_D%d_qknorm=%v", c.K, c.T, heads, kvHeads, D, qkNorm), func(t *testing.T) {
			K, T := c.K, c.T
			rows := newQKVRows(t, d, r, heads, kvHeads, D, 16, T, half, true)
			N := rows.width()
			m, w := qkvWeight(t, d, r, N, K, 32)
			x, qkv := randVec(r, T*K, 1), make([]float32, T*N)
			reference.MatMul(qkv, x, m, T)
			xb, qb, qkvb := upload(t, d, "x", x), poisoned(t, d, "q", T*heads*D), poisoned(t, d, "qkv", T*N)
			dispatches := 0
			run(t, d, "qkv_proj_rope_kv_normed", func(b *gpu.Batch) error {
				err := QKVProjRopeKVNormed(b, qb, qkvb, xb, w, rows.consts, rows.c, rows.layer, rows.rowBuf, T, heads, rows.eps, qkNorm)
				dispatches = b.Len()
				return err
			})
			rows.check(t, qb, qkv, qkNorm)
			want := 2
			if plannedFusedQKV(d, w, D, T) {
				want = 1
			}
			if dispatches != want {
				t.Errorf("%d dispatches, want %d", dispatches, want)
			}
		})
	}
}

// TestQKVProjRopeKVRejectsBadInput: wrong sizes and counts are errors,
// found before anything is recorded.
func TestQKVProjRopeKVRejectsBadInput(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	const heads, kvHeads, D, K, T = 4, 2, 64, 64, 2
	rows := newQKVRows(t, d, r, heads, kvHeads, D, 16, T, false, false)
	N := rows.width()
	w, err := UploadMatrix(d, "qkv_proj", randMatrix(t, r, Int4, N, K, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	narrow, err := UploadMatrix(d, "narrow", randMatrix(t, r, Int4, N-D, K, 32))
	if err != nil {
		t.Fatal(err)
	}
	defer narrow.Release()
	type args struct {
		q, qkv, x, g, consts, rows *gpu.Buffer
		w                          *Matrix
		c                          *KVCache
		layer, T, heads            int
	}
	good := args{
		q: poisoned(t, d, "q", T*heads*D), qkv: poisoned(t, d, "qkv", T*N), x: poisoned(t, d, "x", T*K),
		g: poisoned(t, d, "input_layernorm", K), consts: rows.consts, rows: rows.rowBuf,
		w: w, c: rows.c, layer: 1, T: T, heads: heads,
	}
	small := poisoned(t, d, "small", 1)
	for _, bad := range []struct {
		name  string
		edit  func(a *args)
		plain bool // qkv_rope_kv.wgsl alone rather than QKVProjRopeKV
	}{
		{"T=0", func(a *args) { a.T = 0 }, false},
		{"short q", func(a *args) { a.q = small }, false},
		{"short qkv", func(a *args) { a.qkv = small }, false},
		{"short x", func(a *args) { a.x = small }, false},
		{"short input_layernorm", func(a *args) { a.g = small }, false},
		{"nil input_layernorm", func(a *args) { a.g = nil }, false},
		{"nil matrix", func(a *args) { a.w = nil }, false},
		{"narrow matrix", func(a *args) { a.w = narrow }, false},
		{"short consts", func(a *args) { a.consts = small }, false},
		{"short rows", func(a *args) { a.rows = small }, false},
		{"nil rows", func(a *args) { a.rows = nil }, true},
		{"layer 2 of 2", func(a *args) { a.layer = 2 }, false},
		{"nil cache", func(a *args) { a.c = nil }, false},
		{"3 heads for 2 kv heads", func(a *args) { a.heads = 3 }, false},
		{"T=0", func(a *args) { a.T = 0 }, true},
		{"short qkv", func(a *args) { a.qkv = small }, true},
	} {
		a := good
		bad.edit(&a)
		name := "QKVProjRopeKV/" + bad.name
		if bad.plain {
			name = "QKVRopeKV/" + bad.name
		}
		b, err := d.NewBatch(name)
		if err != nil {
			t.Fatal(err)
		}
		if bad.plain {
			err = qkvRopeKVRows(b, a.q, a.qkv, a.consts, a.c, a.layer, a.rows, a.T, a.heads, 1e-6)
		} else {
			err = QKVProjRopeKV(b, a.q, a.qkv, a.x, a.g, a.w, a.consts, a.c, a.layer, a.rows, a.T, a.heads, 1e-6)
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if b.Len() != 0 {
			t.Errorf("%s: %d dispatches recorded before the error", name, b.Len())
		}
		b.Discard()
	}
}
