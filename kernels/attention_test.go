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
		if err := s.Commit(n); err != nil {
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
		switch r.IntN(4) {
		case 1:
			tune.wg, tune.workgroups, tune.vb = 128, 4096, 16
		case 2:
			tune.wg, tune.workgroups, tune.vb = 256, 256, 4
		case 3:
			tune.workgroups, tune.maxChunk, tune.vb = 1, 1024, 1
		}
		tune.mergeDispatch = i%2 == 1
		name := fmt.Sprintf("kv%d_group%d_D%d_bs%d_T%d_lens%v_%+v", s.kvHeads, s.group, s.D, s.blockSize, T, lens, tune)
		t.Run(name, func(t *testing.T) { testAttentionDecode(t, d, r, s, lens, T, tune) })
	}
}

// testAttentionDecode runs T decode rows, each on a random slot at a random
// position of its history, against reference.Attention on that history.
func testAttentionDecode(t *testing.T, d *gpu.Device, r *rand.Rand, s attnShape, lens []int, T int, tune decodeTuning) {
	tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, lens, r.IntN(2) == 1)
	cfg := s.config()
	qDim := cfg.QDim()
	q := randVec(r, T*qDim, 1)
	seq, pos := make([]uint32, T), make([]uint32, T)
	want := make([]float32, T*qDim)
	maxLen := 0
	for row := range T {
		slot := r.IntN(len(lens))
		p := r.IntN(lens[slot])
		if row == 0 {
			p = lens[slot] - 1 // the longest context the slot has
		}
		seq[row], pos[row] = tc.slot(slot), uint32(p)
		maxLen = max(maxLen, p+1)
		kv := (p + 1) * cfg.KVDim()
		reference.Attention(want[row*qDim:(row+1)*qDim], q[row*qDim:(row+1)*qDim], tc.k[slot][:kv], tc.v[slot][:kv], p, treemask.LineRows(p, 1), cfg)
	}
	qb, sb, pb := upload(t, d, "q", q), uploadU32(t, d, "seq", seq), uploadU32(t, d, "pos", pos)
	scratch := tc.c.decodeScratch(T, cfg.NumAttentionHeads, maxLen, tune)
	poisonScratch(t, d, scratch)
	counts := poisonCountedScratch(t, d, T*tc.c.KVHeads, scratch)
	out := poisoned(t, d, "out", T*qDim)
	run(t, d, "decode", func(b *gpu.Batch) error {
		return attentionDecode(b, out, qb, tc.c, tc.layer, sb, pb, T, cfg.NumAttentionHeads, maxLen, tune)
	})
	t.Logf("%d splits, merged by the last %v, f16 cache %v", tc.c.decodeSplits(T, cfg.NumAttentionHeads, maxLen, tune),
		tc.c.lastSplitMerges(d, T, cfg.NumAttentionHeads, maxLen, tune), tc.c.F16)
	checkClose(t, "out", readF32(t, out, T*qDim), want, kvTol(tc.c))
	checkCountsZero(t, d, counts)
}

func TestAttentionPrefill(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for range 14 {
		s := randAttnShape(r)
		T := []int{1, 5, 16, 17, 64, 130}[r.IntN(6)]
		P := []int{0, r.IntN(200)}[r.IntN(2)]
		row0 := []int{0, 1 + r.IntN(7)}[r.IntN(2)] // the sequence's rows start here in the batch
		// The device's workgroup memory, or WebGPU's default 16 KiB: other
		// staging chunks (and value chunks the output registers loop over).
		memory := []int{int(d.Limits().MaxComputeWorkgroupStorageSize), 16 << 10}[r.IntN(2)]
		if r.IntN(4) == 0 { // a head_dim whose chunks are not halves (32 of 96 at 16 KiB)
			s.D = 96
		}
		t.Run(fmt.Sprintf("kv%d_group%d_D%d_bs%d_T%d_P%d_row%d_mem%d", s.kvHeads, s.group, s.D, s.blockSize, T, P, row0, memory), func(t *testing.T) {
			// Sequence 1 is the one attended to; sequence 0 holds other blocks.
			tc := newTestCache(t, d, r, s.kvHeads, s.D, s.blockSize, []int{1 + r.IntN(50), P + T}, r.IntN(2) == 1)
			tc.c.wgMemory = memory
			ch, _ := tc.c.prefillChunks()
			t.Logf("staging chunks DK = %d, DV = %d; f16 cache %v", ch.dk, ch.dv, tc.c.F16)
			cfg := s.config()
			qDim := cfg.QDim()
			q := randVec(r, (row0+T)*qDim, 1) // rows before row0 belong to other sequences
			pos := make([]uint32, row0+T)
			for i := range T {
				pos[row0+i] = uint32(P + i)
			}
			want := make([]float32, T*qDim)
			reference.Attention(want, q[row0*qDim:], tc.k[1], tc.v[1], P, treemask.LineRows(P, T), cfg)
			qb, pb := upload(t, d, "q", q), uploadU32(t, d, "pos", pos)
			out := poisoned(t, d, "out", len(q))
			run(t, d, "prefill", func(b *gpu.Batch) error {
				return AttentionPrefill(b, out, qb, tc.c, tc.layer, int(tc.slot(1)), pb, row0, T, cfg.NumAttentionHeads)
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
		sb, pb := uploadU32(t, d, "seq", []uint32{tc.slot(0), tc.slot(0)}), uploadU32(t, d, "pos", []uint32{199, 199})
		poisonScratch(t, d, tc.c.decodeScratch(T, 2, c.maxLen, tune))
		counts := poisonCountedScratch(t, d, T*tc.c.KVHeads, tc.c.decodeScratch(T, 2, c.maxLen, tune))
		out := poisoned(t, d, "out", T*cfg.QDim())
		if err := out.Fill(0); err != nil {
			t.Fatal(err)
		}
		run(t, d, "decode", func(b *gpu.Batch) error {
			return attentionDecode(b, out, qb, tc.c, tc.layer, sb, pb, T, 2, c.maxLen, tune)
		})
		for i, v := range readF32(t, out, T*cfg.QDim()) {
			if v == v {
				t.Fatalf("%+v: out[%d] = %v, want NaN", c, i, v)
			}
		}
		checkCountsZero(t, d, counts)
	}
}
