package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/tensor"
	"webdraft/treemask"
)

// testCache is a KV cache filled from the host with random histories, and
// the same histories on the host.
type testCache struct {
	c     *KVCache
	seqs  []*KVSeq
	layer int
	k, v  [][]float32 // per sequence: (len, kv_heads*D)
}

// newTestCache makes a 2-layer cache (f16 when half) with a sequence per
// entry of lens, whose blocks come from a shuffled pool, and writes random
// keys and values for positions 0 … lens[s]-1 of every sequence into layer
// 1. The host copies hold what the cache holds: for an f16 cache, the
// values rounded to f16.
func newTestCache(t *testing.T, d *gpu.Device, r *rand.Rand, kvHeads, D, blockSize int, lens []int, half bool) *testCache {
	t.Helper()
	maxBlocks, total := 0, 0
	for _, n := range lens {
		nb := (n + blockSize - 1) / blockSize
		maxBlocks, total = max(maxBlocks, nb), total+nb
	}
	pool := total + 3 // some blocks no sequence maps
	c, err := NewKVCache(d, KVShape{Layers: 2, KVHeads: kvHeads, D: D, BlockSize: blockSize, Blocks: pool, Seqs: len(lens), MaxBlocks: maxBlocks, F16: half})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Release)
	r.Shuffle(len(c.free), func(i, j int) { c.free[i], c.free[j] = c.free[j], c.free[i] })
	tc := &testCache{c: c, layer: 1}
	width := kvHeads * D
	// The layer's host images: kv head h of position j of a sequence at
	// ((block·kvHeads + h)·BS + j%BS)·D, block = the sequence's entry j/BS.
	kImg, vImg := make([]float32, pool*width*blockSize), make([]float32, pool*width*blockSize)
	for _, n := range lens {
		s, err := c.NewSeq()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Reserve([]*KVSeq{s}, []int{n}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(n, nil); err != nil {
			t.Fatal(err)
		}
		tc.seqs = append(tc.seqs, s)
		ks, vs := randVec(r, n*width, 1), randVec(r, n*width, 1)
		if half { // the host copies rounded as the cache rounds them
			for _, h := range [][]float32{ks, vs} {
				for i, x := range h {
					h[i] = tensor.F16ToF32(tensor.F32ToF16(x))
				}
			}
		}
		tc.k, tc.v = append(tc.k, ks), append(tc.v, vs)
		for j := range n {
			block := int(s.blocks[j/blockSize])
			for h := range kvHeads {
				at := ((block*kvHeads+h)*blockSize + j%blockSize) * D
				copy(kImg[at:at+D], ks[(j*kvHeads+h)*D:(j*kvHeads+h+1)*D])
				copy(vImg[at:at+D], vs[(j*kvHeads+h)*D:(j*kvHeads+h+1)*D])
			}
		}
	}
	if err := c.SyncTables(tc.seqs); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		buf *gpu.Buffer
		img []float32
	}{{c.k[tc.layer], kImg}, {c.v[tc.layer], vImg}} {
		if err := w.buf.WriteU32(0, cacheWords(c, w.img)); err != nil {
			t.Fatal(err)
		}
	}
	return tc
}

// slot is sequence i's table row, as the seq buffers hold it.
func (tc *testCache) slot(i int) uint32 { return uint32(tc.seqs[i].Slot()) }

// cacheWords encodes a layer's host image as the cache stores it: f32
// bits, or for an f16 cache two halves per word, the even element in the
// low half.
func cacheWords(c *KVCache, img []float32) []uint32 {
	if !c.F16 {
		words := make([]uint32, len(img))
		for i, x := range img {
			words[i] = math.Float32bits(x)
		}
		return words
	}
	words := make([]uint32, len(img)/2)
	for i := range words {
		words[i] = uint32(tensor.F32ToF16(img[2*i])) | uint32(tensor.F32ToF16(img[2*i+1]))<<16
	}
	return words
}

// readCache reads one layer of a cache buffer as f32 values.
func readCache(t *testing.T, c *KVCache, buf *gpu.Buffer) []float32 {
	t.Helper()
	words, err := buf.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	if !c.F16 {
		return fromBits(words)
	}
	out := make([]float32, 2*len(words))
	for i, w := range words {
		out[2*i], out[2*i+1] = tensor.F16ToF32(uint16(w)), tensor.F16ToF32(uint16(w>>16))
	}
	return out
}

func fromBits(words []uint32) []float32 {
	out := make([]float32, len(words))
	for i, w := range words {
		out[i] = math.Float32frombits(w)
	}
	return out
}

// kvTol is the tolerance of attention over a cache. newTestCache's host
// copies equal what the cache holds, so only the f32 math differs; an f16
// cache keeps the f16-storage tolerance (docs/reference.md, "Tolerances"), which also covers
// a kernel's pack2x16float rounding differently from tensor.F32ToF16.
func kvTol(c *KVCache) float64 {
	if c.F16 {
		return tolF16
	}
	return tolF32
}

// attnShape is one random attention case.
type attnShape struct{ kvHeads, group, D, blockSize int }

func randAttnShape(r *rand.Rand) attnShape {
	return attnShape{
		kvHeads:   []int{1, 2, 4}[r.IntN(3)],
		group:     []int{1, 2, 4, 8}[r.IntN(4)],
		D:         []int{64, 128}[r.IntN(2)],
		blockSize: []int{16, 32}[r.IntN(2)],
	}
}

func (s attnShape) config() *qwen3.Config {
	return &qwen3.Config{HeadDim: s.D, NumAttentionHeads: s.kvHeads * s.group, NumKeyValueHeads: s.kvHeads}
}

func TestAttentionDecode(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for i := range 10 {
		s := randAttnShape(r)
		slots := 1 + r.IntN(4)
		lens := make([]int, slots)
		for j := range lens {
			lens[j] = 1 + r.IntN(300)
		}
		if i == 0 { // one long context: 256-position splits
			s, lens = attnShape{kvHeads: 1, group: 2, D: 64, blockSize: 16}, []int{1500}
		}
		if i == 1 { // D/8 lanes a value vector that do not divide the workgroup
			s.D = 40
		}
		if i == 2 { // the largest group: its workgroup memory bounds the chunk
			s.kvHeads, s.group = 1, 8
		}
		T := []int{1, 1, 3, 8}[r.IntN(4)]
		if i%4 == 0 { // rows enough for the last split to merge
			T = 3
		}
		// The plan's tuning, or one BenchmarkAttentionDecode tries; the
		// splits merged by the last of them (on Vulkan) or by a dispatch.
		tune := measuredH200.decode
		switch r.IntN(5) {
		case 4: // splits of 16 positions: more splits than threads score keys
			tune.workgroups, tune.minChunk = 1<<20, 16
		case 1:
			tune.wg, tune.workgroups, tune.vb = 128, 4096, 16
		case 2:
			tune.wg, tune.workgroups, tune.vb = 256, 256, 4
		case 3:
			tune.workgroups, tune.maxChunk, tune.vb = 1, 1024, 1
		}
		tune.mergeDispatch = i%2 == 1
		tree := i%3 != 0 // rows of token trees, else of lines
		name := fmt.Sprintf("kv%d_group%d_D%d_bs%d_T%d_lens%v_tree=%v_%+v", s.kvHeads, s.group, s.D, s.blockSize, T, lens, tree, tune)
		t.Run(name, func(t *testing.T) {
			place := func(p int) treemask.Row {
				if tree && r.IntN(4) > 0 {
					return randTreeRow(r, p)
				}
				return treemask.LineRow(p)
			}
			testAttentionDecode(t, d, r, s, lens, T, tune, place)
		})
	}
}

// TestAttentionDecodeInput: attention_decode.wgsl's INPUT — each row's
// q/k norms and RoPE, and the append of its key and value, from its q|k|v
// row as the projection left it — against the reference's RMSNorm, Rope
// and Attention, with the cache the append leaves checked at every row's
// slot: one row or two of distinct sequences, line rows and token-tree
// nodes (rotated below their slot), f32 and f16 caches, the splits merged
// by a dispatch, by the last of them, or one split.
func TestAttentionDecodeInput(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	tunings := []decodeTuning{
		measuredH200.decode, // one row: merged by a dispatch
		{wg: 64, workgroups: 1 << 20, maxChunk: 64, vb: 8, mergeMinRows: 1}, // merged by the last split
		{wg: 128, workgroups: 1, maxChunk: 1024, vb: 16},                    // one split
	}
	for i := range 8 {
		s := randAttnShape(r)
		T, tune, half, tree := 1+i%2, tunings[i%len(tunings)], r.IntN(2) == 1, i%3 == 2
		lens := []int{1 + r.IntN(400), 1 + r.IntN(400)}
		if tune.workgroups == 1 {
			lens = []int{1 + r.IntN(tune.maxChunk), 1 + r.IntN(tune.maxChunk)}
		}
		name := fmt.Sprintf("kv%d_group%d_D%d_bs%d_T%d_lens%v_f16=%v_tree=%v_%+v", s.kvHeads, s.group, s.D, s.blockSize, T, lens, half, tree, tune)
		t.Run(name, func(t *testing.T) {
			tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, lens, half)
			cfg := s.config()
			heads, kvDim, D := cfg.NumAttentionHeads, cfg.KVDim(), s.D
			qDim, width := cfg.QDim(), cfg.QDim()+2*cfg.KVDim()
			qkv := randVec(r, T*width, 2)
			qNorm, kNorm := randVec(r, D, 0.5), randVec(r, D, 0.5)
			invFreq := (&qwen3.Config{HeadDim: D, RopeTheta: 1e6}).RopeInvFreq()
			const eps = 1e-6
			consts, err := UploadQKNormRope(d, "consts", qNorm, kNorm, invFreq, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(consts.Release)
			// Row t takes the last slot of sequence t; the host's copies get
			// its key and value, then each row's attention.
			seq, slots, rows := make([]uint32, T), make([]uint32, T), make([]treemask.Row, T)
			q, want := make([]float32, T*qDim), make([]float32, T*qDim)
			maxLen := 0
			for row := range T {
				p := lens[row] - 1
				seq[row], slots[row], rows[row] = tc.slot(row), uint32(p), treemask.LineRow(p)
				if tree {
					rows[row] = randTreeRow(r, p)
				}
				maxLen = max(maxLen, p+1)
				in := qkv[row*width : (row+1)*width]
				copy(q[row*qDim:], in[:qDim])
				k, v := tc.k[row][p*kvDim:(p+1)*kvDim], tc.v[row][p*kvDim:(p+1)*kvDim]
				copy(k, in[qDim:qDim+kvDim])
				copy(v, in[qDim+kvDim:])
				for _, x := range []struct{ v, w []float32 }{{q[row*qDim : (row+1)*qDim], qNorm}, {k, kNorm}} {
					for h := 0; h < len(x.v); h += D {
						reference.RMSNorm(x.v[h:h+D], x.v[h:h+D], x.w, eps)
						reference.Rope(x.v[h:h+D], rows[row].Pos, invFreq)
					}
				}
				reference.Attention(want[row*qDim:(row+1)*qDim], q[row*qDim:(row+1)*qDim], tc.k[row][:(p+1)*kvDim], tc.v[row][:(p+1)*kvDim], p, rows[row:row+1], cfg)
			}
			qkvb, rb := upload(t, d, "qkv", qkv), uploadRows(t, d, seq, slots, rows)
			scratch := tc.c.decodeScratch(T, heads, maxLen, tune)
			poisonScratch(t, d, scratch)
			counts := poisonCountedScratch(t, d, T*tc.c.KVHeads, scratch)
			out := poisoned(t, d, "out", T*qDim)
			run(t, d, "decode", func(b *gpu.Batch) error {
				return attentionDecode(b, out, qkvb, tc.c, tc.layer, rb, T, heads, maxLen, tune, &decodeInput{consts: consts, eps: eps})
			})
			t.Logf("%d splits, merged by the last %v", tc.c.decodeSplits(T, heads, maxLen, tune), tc.c.lastSplitMerges(d, T, heads, maxLen, tune))
			checkClose(t, "out", readF32(t, out, T*qDim), want, kvTol(tc.c))
			checkCountsZero(t, d, counts)
			table, err := tc.c.table.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			for name, kv := range map[string]struct {
				buf  *gpu.Buffer
				host [][]float32
			}{"k": {tc.c.k[tc.layer], tc.k}, "v": {tc.c.v[tc.layer], tc.v}} {
				layer := readCache(t, tc.c, kv.buf)
				for row := range T {
					p := int(slots[row])
					block := int(table[int(seq[row])*tc.c.MaxBlocks+p/s.blockSize])
					for h := range s.kvHeads {
						at := ((block*s.kvHeads+h)*s.blockSize + p%s.blockSize) * D
						if want := kv.host[row][(p*s.kvHeads+h)*D : (p*s.kvHeads+h+1)*D]; relErr(layer[at:at+D], want) > kvTol(tc.c) {
							t.Fatalf("%s: row %d head %d: got %v…, want %v…", name, row, h, layer[at:at+2], want[:2])
						}
					}
				}
			}
		})
	}
}

// randTreeRow places a row at slot p as a random token-tree node: its base
// at most 63 slots below, its mask its own bit and a random subset of the
// slots between — any such subset is the ancestors of a node of some tree.
func randTreeRow(r *rand.Rand, p int) treemask.Row {
	k := r.IntN(min(p, treemask.MaxNodes-1) + 1)
	return treemask.Row{Pos: p - k, Base: p - k, Mask: r.Uint64()&(1<<uint(k)-1) | 1<<uint(k)}
}

// testAttentionDecode runs T decode rows, each on a random sequence at a
// random slot of its history, placed there by place(slot) (causal, or a
// token-tree node's mask), against reference.Attention on that history.
func testAttentionDecode(t *testing.T, d *gpu.Device, r *rand.Rand, s attnShape, lens []int, T int, tune decodeTuning, place func(slot int) treemask.Row) {
	tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, lens, r.IntN(2) == 1)
	cfg := s.config()
	qDim := cfg.QDim()
	q := randVec(r, T*qDim, 1)
	seq, slots, rows := make([]uint32, T), make([]uint32, T), make([]treemask.Row, T)
	want := make([]float32, T*qDim)
	maxLen := 0
	for row := range T {
		i := r.IntN(len(lens))
		p := r.IntN(lens[i])
		if row == 0 {
			p = lens[i] - 1 // the longest context the sequence has
		}
		seq[row], slots[row], rows[row] = tc.slot(i), uint32(p), place(p)
		maxLen = max(maxLen, p+1)
		kv := (p + 1) * cfg.KVDim()
		reference.Attention(want[row*qDim:(row+1)*qDim], q[row*qDim:(row+1)*qDim], tc.k[i][:kv], tc.v[i][:kv], p, rows[row:row+1], cfg)
	}
	qb, rb := upload(t, d, "q", q), uploadRows(t, d, seq, slots, rows)
	scratch := tc.c.decodeScratch(T, cfg.NumAttentionHeads, maxLen, tune)
	poisonScratch(t, d, scratch)
	counts := poisonCountedScratch(t, d, T*tc.c.KVHeads, scratch)
	out := poisoned(t, d, "out", T*qDim)
	run(t, d, "decode", func(b *gpu.Batch) error {
		return attentionDecode(b, out, qb, tc.c, tc.layer, rb, T, cfg.NumAttentionHeads, maxLen, tune, nil)
	})
	t.Logf("%d splits, merged by the last %v, f16 cache %v", tc.c.decodeSplits(T, cfg.NumAttentionHeads, maxLen, tune),
		tc.c.lastSplitMerges(d, T, cfg.NumAttentionHeads, maxLen, tune), tc.c.F16)
	checkClose(t, "out", readF32(t, out, T*qDim), want, kvTol(tc.c))
	checkCountsZero(t, d, counts)
}

func TestAttentionPrefill(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for i := range 14 {
		s := randAttnShape(r)
		T := []int{1, 5, 16, 17, 64, 130}[r.IntN(6)]
		P := []int{0, r.IntN(200)}[r.IntN(2)]
		tree := i%2 == 1                           // the last (up to 64) rows a random token tree's nodes
		row0 := []int{0, 1 + r.IntN(7)}[r.IntN(2)] // the sequence's rows start here in the batch
		// The device's workgroup memory, or WebGPU's default 16 KiB: other
		// staging chunks (and value chunks the output registers loop over).
		memory := []int{int(d.Limits().MaxComputeWorkgroupStorageSize), 16 << 10}[r.IntN(2)]
		if r.IntN(4) == 0 { // a head_dim whose chunks are not halves (32 of 96 at 16 KiB)
			s.D = 96
		}
		t.Run(fmt.Sprintf("kv%d_group%d_D%d_bs%d_T%d_P%d_row%d_mem%d_tree=%v", s.kvHeads, s.group, s.D, s.blockSize, T, P, row0, memory, tree), func(t *testing.T) {
			// Sequence 1 is the one attended to; sequence 0 holds other blocks.
			tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, []int{1 + r.IntN(50), P + T}, r.IntN(2) == 1)
			tc.c.wgMemory = memory
			ch, _ := tc.c.prefillChunks()
			t.Logf("staging chunks DK = %d, DV = %d; f16 cache %v", ch.dk, ch.dv, tc.c.F16)
			cfg := s.config()
			qDim := cfg.QDim()
			q := randVec(r, (row0+T)*qDim, 1) // rows before row0 belong to other sequences
			place := treemask.LineRows(P, T)
			if tree {
				place = randTree(t, r, P, T)
			}
			seq, slots := make([]uint32, row0+T), make([]uint32, row0+T)
			rows := make([]treemask.Row, row0+T)
			for i := range T {
				seq[row0+i], slots[row0+i], rows[row0+i] = tc.slot(1), uint32(P+i), place[i]
			}
			want := make([]float32, T*qDim)
			reference.Attention(want, q[row0*qDim:], tc.k[1], tc.v[1], P, place, cfg)
			qb, rb := upload(t, d, "q", q), uploadRows(t, d, seq, slots, rows)
			out := poisoned(t, d, "out", len(q))
			run(t, d, "prefill", func(b *gpu.Batch) error {
				return AttentionPrefill(b, out, qb, tc.c, tc.layer, int(tc.slot(1)), rb, row0, T, cfg.NumAttentionHeads)
			})
			got := readF32(t, out, len(q))
			checkClose(t, "out", got[row0*qDim:], want, kvTol(tc.c))
			for i, v := range got[:row0*qDim] {
				if v == v {
					t.Fatalf("out[%d] = %v: a row before row0 was written", i, v)
				}
			}
		})
	}
}

// randTree places T tokens fed at slot P as treemask.Tree.Plan does: line
// tokens first (at least one where P = 0, since a tree follows a line
// slot), then up to 64 nodes of a random tree, each the child of a random
// earlier node or a root.
func randTree(t *testing.T, r *rand.Rand, P, T int) []treemask.Row {
	t.Helper()
	line := max(T-treemask.MaxNodes, 0)
	line += r.IntN(T - line + 1)
	if P+line == 0 {
		line = 1
	}
	parents := make([]int, T)
	for i := range parents {
		switch s := P + i; {
		case i < line:
			parents[i] = treemask.Line
		default:
			parents[i] = P + line - 1 + r.IntN(s-(P+line)+1) // the line's last slot (a root) … s − 1
		}
	}
	var tree treemask.Tree
	rows, err := tree.Plan(P, parents)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestAttentionHiddenKeys: rows that see none of some splits' keys (decode:
// merged by a dispatch, by the last split, or one split) or of a prefill's
// first tiles get no NaN from exp(−inf − (−inf)) and equal the reference.
// Such rows do not see their own slot — no tree's node does that, but the
// kernels' mask allows it, and it is the way to hide a whole split of 64
// keys or more behind the row's 64-slot mask.
func TestAttentionHiddenKeys(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	s := attnShape{kvHeads: 2, group: 2, D: 64, blockSize: 16}
	cfg := s.config()
	qDim := cfg.QDim()
	for _, half := range []bool{false, true} {
		for _, tune := range []decodeTuning{
			{wg: 64, workgroups: 1 << 20, maxChunk: 64, vb: 8, mergeMinRows: 1},                      // 64-key splits merged by the last
			{wg: 64, workgroups: 1 << 20, maxChunk: 64, vb: 8, mergeMinRows: 1, mergeDispatch: true}, // … by a dispatch
			{wg: 64, workgroups: 1, maxChunk: 1024, vb: 8},                                           // one split
			measuredBrowserGPU.decode, // one split, 128 threads, 16 values a load
		} {
			t.Run(fmt.Sprintf("decode/f16=%v/%+v", half, tune), func(t *testing.T) {
				// Rows at slot 399 of a 400-slot sequence see the slots below
				// base (0 … 63, or fewer) and some of the 64 after: every
				// split past slot 128 is hidden whole.
				const T, n = 3, 400
				tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, []int{n}, half)
				q := randVec(r, T*qDim, 1)
				seq, slots, rows := make([]uint32, T), make([]uint32, T), make([]treemask.Row, T)
				want := make([]float32, T*qDim)
				for i := range T {
					seq[i], slots[i] = tc.slot(0), n-1
					rows[i] = treemask.Row{Base: 64 - 20*i, Mask: r.Uint64() | 1}
					reference.Attention(want[i*qDim:(i+1)*qDim], q[i*qDim:(i+1)*qDim], tc.k[0], tc.v[0], n-1, rows[i:i+1], cfg)
				}
				qb, rb := upload(t, d, "q", q), uploadRows(t, d, seq, slots, rows)
				scratch := tc.c.decodeScratch(T, cfg.NumAttentionHeads, n, tune)
				poisonScratch(t, d, scratch)
				counts := poisonCountedScratch(t, d, T*tc.c.KVHeads, scratch)
				out := poisoned(t, d, "out", T*qDim)
				run(t, d, "decode", func(b *gpu.Batch) error {
					return attentionDecode(b, out, qb, tc.c, tc.layer, rb, T, cfg.NumAttentionHeads, n, tune, nil)
				})
				t.Logf("%d splits, merged by the last %v", tc.c.decodeSplits(T, cfg.NumAttentionHeads, n, tune), tc.c.lastSplitMerges(d, T, cfg.NumAttentionHeads, n, tune))
				checkClose(t, "out", readF32(t, out, T*qDim), want, kvTol(tc.c))
				checkCountsZero(t, d, counts)
			})
		}
		t.Run(fmt.Sprintf("prefill/f16=%v", half), func(t *testing.T) {
			// Rows at slots 40 … 49, base 0, seeing only slots from 32 on:
			// the first 32-key tile is hidden from all of them.
			const P, T = 40, 10
			tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, []int{P + T}, half)
			q := randVec(r, T*qDim, 1)
			seq, slots, rows := make([]uint32, T), make([]uint32, T), make([]treemask.Row, T)
			for i := range T {
				seq[i], slots[i] = tc.slot(0), uint32(P+i)
				rows[i] = treemask.Row{Mask: (r.Uint64() | 1<<uint(P+i)) &^ (1<<32 - 1) & (1<<uint(P+i+1) - 1)}
			}
			want := make([]float32, T*qDim)
			reference.Attention(want, q, tc.k[0], tc.v[0], P, rows, cfg)
			qb, rb := upload(t, d, "q", q), uploadRows(t, d, seq, slots, rows)
			out := poisoned(t, d, "out", T*qDim)
			run(t, d, "prefill", func(b *gpu.Batch) error {
				return AttentionPrefill(b, out, qb, tc.c, tc.layer, int(tc.slot(0)), rb, 0, T, cfg.NumAttentionHeads)
			})
			checkClose(t, "out", readF32(t, out, T*qDim), want, kvTol(tc.c))
		})
	}
}

// TestAttentionDecodeShortMaxLen checks that a row whose context exceeds
// the maxLen it was recorded with comes out NaN rather than truncated: one
// split, or two merged by the last (where the device allows) or by a
// dispatch.
func TestAttentionDecodeShortMaxLen(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	s := attnShape{kvHeads: 1, group: 2, D: 64, blockSize: 16}
	for _, c := range []struct {
		maxLen        int
		mergeDispatch bool
	}{{64, false}, {128, false}, {128, true}} {
		// Two rows (a merge by the last split needs the plan's mergeMinRows),
		// both of sequence 0 at position 199.
		const T = 2
		tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, []int{200}, false)
		tune := measuredH200.decode
		tune.mergeDispatch = c.mergeDispatch
		cfg := s.config()
		qb := upload(t, d, "q", randVec(r, T*cfg.QDim(), 1))
		rb := uploadRows(t, d, []uint32{tc.slot(0), tc.slot(0)}, []uint32{199, 199}, lineRows([]uint32{199, 199}))
		poisonScratch(t, d, tc.c.decodeScratch(T, 2, c.maxLen, tune))
		counts := poisonCountedScratch(t, d, T*tc.c.KVHeads, tc.c.decodeScratch(T, 2, c.maxLen, tune))
		out := poisoned(t, d, "out", T*cfg.QDim())
		if err := out.Fill(0); err != nil {
			t.Fatal(err)
		}
		run(t, d, "decode", func(b *gpu.Batch) error {
			return attentionDecode(b, out, qb, tc.c, tc.layer, rb, T, 2, c.maxLen, tune, nil)
		})
		for i, v := range readF32(t, out, T*cfg.QDim()) {
			if v == v {
				t.Fatalf("%+v: out[%d] = %v, want NaN", c, i, v)
			}
		}
		checkCountsZero(t, d, counts)
	}
}

// TestDecodeChunkDirect: with the H200's tuning a single row of a small
// model (two kv heads) whose context one split covers takes that split
// (no merge dispatch); two rows (merged by the last split), a longer
// context and a model with more kv heads split as before.
func TestDecodeChunkDirect(t *testing.T) {
	tune := measuredH200.decode
	for _, tc := range []struct {
		kvHeads, T, maxLen, splits int
	}{
		{2, 1, 200, 1}, {2, 1, 256, 1}, {2, 1, 64, 1},
		{2, 2, 200, 4}, {2, 1, 300, 5}, {8, 1, 200, 4}, {8, 1, 1024, 16},
	} {
		c := &KVCache{KVShape: KVShape{KVHeads: tc.kvHeads, D: 64}, wgMemory: 48 << 10}
		if got := c.decodeSplits(tc.T, 2*tc.kvHeads, tc.maxLen, tune); got != tc.splits {
			t.Errorf("%d kv heads, %d rows, %d positions: %d splits, want %d", tc.kvHeads, tc.T, tc.maxLen, got, tc.splits)
		}
	}
}

// TestPrepareAttention: after PrepareAttention, decode attention at any
// rows and context length within its bounds, and prefill attention,
// build no pipeline (on a device of the test's own, so that no other test
// built them), and what it built is what those calls use: several split
// lengths, direct and merged.
func TestPrepareAttention(t *testing.T) {
	d := gputest.Fresh(t)
	r := newRand(t)
	const kvHeads, heads, D, bs, maxT, maxLen = 2, 4, 64, 16, 8, 1024
	c, err := NewKVCache(d, KVShape{Layers: 1, KVHeads: kvHeads, D: D, BlockSize: bs, Blocks: maxLen / bs, Seqs: maxT, MaxBlocks: maxLen / bs, F16: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if err := c.PrepareAttention(d, heads, maxT, maxLen); err != nil {
		t.Fatal(err)
	}
	prepared := d.PipelineNames()
	decodes := 0
	for _, name := range prepared {
		if strings.HasPrefix(name, attnDecode.Module) {
			decodes++
		}
	}
	if decodes < 2 {
		t.Fatalf("prepared %d decode attention pipelines (%v), want the split lengths and merges of 1–%d rows over 1–%d positions", decodes, prepared, maxT, maxLen)
	}
	q, out := poisoned(t, d, "q", maxT*heads*D), poisoned(t, d, "out", maxT*heads*D)
	rows := upload(t, d, "rows", make([]float32, maxT*RowWords))
	calls := [][2]int{{1, 1}, {maxT, maxLen}, {1, maxLen}, {maxT, 1}, {2, 257}, {1, 256}, {1, 257}}
	for range 40 {
		calls = append(calls, [2]int{1 + r.IntN(maxT), 1 + r.IntN(maxLen)})
	}
	for _, call := range calls {
		b, err := d.NewBatch("decode")
		if err != nil {
			t.Fatal(err)
		}
		err = AttentionDecode(b, out, q, c, 0, rows, call[0], heads, call[1])
		if err == nil {
			err = AttentionPrefill(b, out, q, c, 0, 0, rows, 0, call[0], heads)
		}
		b.Discard()
		if err != nil {
			t.Fatalf("%d rows, %d positions: %v", call[0], call[1], err)
		}
		if built := gputest.BuiltSince(d, prepared); len(built) > 0 {
			t.Fatalf("%d rows, %d positions built pipelines PrepareAttention had not: %v", call[0], call[1], built)
		}
	}
}
