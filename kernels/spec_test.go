package kernels

import (
	"slices"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
	"webdraft/treemask"
)

// specAcceptRef is spec_accept.wgsl in plain Go: state, ids and (where
// not nil) dids updated in place.
func specAcceptRef(state, drafts, verify, ids, dids []uint32, B, K, draftsAt, draftStride int) {
	for i := range B {
		row0 := i * (K + 1)
		n := 0
		for n < K && drafts[draftsAt+n*draftStride+i] == verify[row0+n] {
			n++
		}
		s := state[i*SpecStateWords:]
		s[0] += uint32(n + 1)
		s[1] = uint32(n)
		if dids != nil {
			dids[i], dids[B+i] = verify[row0+n], ids[row0]
			if n > 0 {
				dids[B+i] = drafts[draftsAt+(n-1)*draftStride+i]
			}
		}
		ids[row0] = verify[row0+n]
	}
}

// TestSpecAccept: random drafts that agree with the verified tokens for a
// random run of each sequence (none, some, all K), against the plain-Go
// rule, with and without a standalone drafter's ids; the words of ids it
// must not write keep their random values, and dids, without the
// drafter, all of its. Bad calls are refused.
func TestSpecAccept(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, tc := range []struct {
		B, K    int
		drafter bool
	}{{1, 1, false}, {1, 4, false}, {3, 6, false}, {70, 2, false}, {1, 1, true}, {3, 6, true}, {70, 2, true}} {
		B, K := tc.B, tc.K
		draftStride := B + r.IntN(5)
		draftsAt := r.IntN(9)
		verify := make([]uint32, B*(K+1))
		for i := range verify {
			verify[i] = uint32(r.IntN(50))
		}
		drafts := make([]uint32, draftsAt+K*draftStride)
		for i := range drafts {
			drafts[i] = uint32(r.IntN(50))
		}
		for i := range B {
			agree := r.IntN(K + 1)
			if i == 0 {
				agree = K
			}
			for c := range agree {
				drafts[draftsAt+c*draftStride+i] = verify[i*(K+1)+c]
			}
			if agree < K { // one disagreement, then random again
				drafts[draftsAt+agree*draftStride+i] = verify[i*(K+1)+agree] + 1
			}
		}
		state := make([]uint32, B*SpecStateWords)
		for i := range state {
			state[i] = uint32(r.IntN(1000))
		}
		ids := make([]uint32, B*(K+1)+4)
		for i := range ids {
			ids[i] = r.Uint32()
		}
		dids := make([]uint32, 2*B+4)
		for i := range dids {
			dids[i] = r.Uint32()
		}
		stateBuf, idsBuf, didsBuf := uploadU32(t, d, "state", state), uploadU32(t, d, "ids", ids), uploadU32(t, d, "dids", dids)
		draftsBuf, verifyBuf := uploadU32(t, d, "drafts", drafts), uploadU32(t, d, "verify", verify)
		run(t, d, "spec accept", func(b *gpu.Batch) error {
			return SpecAccept(b, stateBuf, draftsBuf, verifyBuf, idsBuf, didsBuf, tc.drafter, B, K, draftsAt, draftStride)
		})
		var wantDids []uint32
		if tc.drafter {
			wantDids = dids
		}
		specAcceptRef(state, drafts, verify, ids, wantDids, B, K, draftsAt, draftStride)
		for _, c := range []struct {
			name string
			buf  *gpu.Buffer
			want []uint32
		}{{"state", stateBuf, state}, {"ids", idsBuf, ids}, {"dids", didsBuf, dids}} {
			got, err := c.buf.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got[:len(c.want)], c.want) {
				t.Fatalf("B %d K %d drafter %v: %s = %v, want %v", B, K, tc.drafter, c.name, got[:len(c.want)], c.want)
			}
		}
	}
	small := uploadU32(t, d, "small", make([]uint32, 4))
	big := uploadU32(t, d, "big", make([]uint32, 64))
	b, err := d.NewBatch("spec accept refused")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Discard()
	for name, call := range map[string]func() error{
		"no sequences":       func() error { return SpecAccept(b, big, big, big, big, big, false, 0, 2, 0, 1) },
		"no drafts":          func() error { return SpecAccept(b, big, big, big, big, big, false, 1, 0, 0, 1) },
		"stride under B":     func() error { return SpecAccept(b, big, big, big, big, big, false, 2, 2, 0, 1) },
		"states past buffer": func() error { return SpecAccept(b, small, big, big, big, big, false, 2, 2, 0, 2) },
		"drafts past buffer": func() error { return SpecAccept(b, big, small, big, big, big, false, 1, 3, 2, 1) },
		"rows past ids":      func() error { return SpecAccept(b, big, big, big, small, big, false, 2, 2, 0, 2) },
		"no drafter ids":     func() error { return SpecAccept(b, big, big, big, big, nil, false, 2, 2, 0, 2) },
		"drafter ids past buffer": func() error {
			return SpecAccept(b, big, big, big, big, uploadU32(t, d, "tiny", make([]uint32, 2)), true, 2, 2, 0, 2)
		},
	} {
		if err := call(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSpecRows: the rows and pairs of the next chained step from random
// states of sequences in a paged cache (their blocks scattered over the
// pool), against PutRow's line rows and KVSeq.PoolRow; every output
// poisoned first, the words past B's left so.
func TestSpecRows(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	const blockSize, maxBlocks = 4, 32
	for _, tc := range []struct{ B, K int }{{1, 1}, {1, 4}, {3, 6}, {5, 15}} {
		B, K := tc.B, tc.K
		c, err := NewKVCache(d, KVShape{Layers: 1, KVHeads: 1, D: 4, BlockSize: blockSize, Blocks: (B + 2) * (maxBlocks + 1), Seqs: B + 2, MaxBlocks: maxBlocks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		var seqs []*KVSeq
		for range B + 2 { // two sequences not in the batch, their blocks among the batch's
			s, err := c.NewSeq()
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, s)
		}
		r.Shuffle(len(seqs), func(i, j int) { seqs[i], seqs[j] = seqs[j], seqs[i] })
		for round := range 3 { // grow in turns: blocks interleave
			for _, s := range seqs {
				need := len(s.blocks)*blockSize + 1 + r.IntN(blockSize*4)
				if round == 2 {
					need += 2*K + 2 // room for L − n − 1 ≥ 0 and L + K
				}
				if err := c.Reserve([]*KVSeq{s}, []int{need}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := c.SyncTables(seqs); err != nil {
			t.Fatal(err)
		}
		batch := seqs[:B]
		state := make([]uint32, B*SpecStateWords)
		headSlots := make([]int, B)
		for i, s := range batch {
			n := r.IntN(K + 1)
			L := n + 1 + r.IntN(len(s.blocks)*blockSize-K-n-1) // L − n − 1 ≥ 0, L + K mapped
			headSlots[i] = r.IntN(8)
			PutSpecState(state[i*SpecStateWords:], L, n, s.Slot(), headSlots[i])
		}
		const storeRow = 37
		rows := B * (K + 1)
		stateBuf := uploadU32(t, d, "state", state)
		out := SpecRowsOut{
			TargetRows: poisoned(t, d, "trows", (rows+1)*RowWords), TargetFeatures: poisoned(t, d, "tfeat", (rows+1)*GatherPairWords),
			HeadRows: poisoned(t, d, "hrows", (rows+1)*RowWords), HeadChain: poisoned(t, d, "hchain", (B+1)*RowWords),
		}
		save := poisoned(t, d, "hsave", (B+1)*GatherPairWords)
		out.HeadSave = save.All()
		run(t, d, "spec rows", func(b *gpu.Batch) error { return SpecRows(b, stateBuf, c, out, B, K, storeRow) })
		want := map[string][]uint32{
			"trows": make([]uint32, rows*RowWords), "tfeat": make([]uint32, rows*GatherPairWords),
			"hrows": make([]uint32, rows*RowWords), "hsave": make([]uint32, B*GatherPairWords), "hchain": make([]uint32, B*RowWords),
		}
		line := func(dst []uint32, seq, pos int) { PutRow(dst, seq, pos, treemask.LineRow(pos)) }
		for i, s := range batch {
			L, n := int(state[i*SpecStateWords]), int(state[i*SpecStateWords+1])
			for t0 := range K + 1 {
				row := i*(K+1) + t0
				line(want["trows"][row*RowWords:], s.Slot(), L+t0)
				pool, err := s.PoolRow(L + t0)
				if err != nil {
					t.Fatal(err)
				}
				want["tfeat"][2*row], want["tfeat"][2*row+1] = uint32(pool), uint32(row)
				line(want["hrows"][row*RowWords:], headSlots[i], L-n-1+t0)
			}
			want["hsave"][2*i], want["hsave"][2*i+1] = uint32(storeRow+headSlots[i]), uint32(i*(K+1)+n)
			line(want["hchain"][i*RowWords:], headSlots[i], L)
		}
		for name, buf := range map[string]*gpu.Buffer{"trows": out.TargetRows, "tfeat": out.TargetFeatures, "hrows": out.HeadRows, "hsave": save, "hchain": out.HeadChain} {
			got, err := buf.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			w := want[name]
			if !slices.Equal(got[:len(w)], w) {
				t.Fatalf("B %d K %d: %s = %v, want %v", B, K, name, got[:len(w)], w)
			}
			for j, v := range got[len(w):] {
				if v != gpu.NaN32 {
					t.Fatalf("B %d K %d: %s word %d past the rows written: %#x", B, K, name, len(w)+j, v)
				}
			}
		}
	}
}

// TestSpecDraftRows: a standalone drafter's first pass's rows (the bonus
// at L, row i; the token before it at L − 1, row B + i) with the target's
// K+1 rows from L, and its first chained row (L + 1), from random states,
// against PutRow's line rows; the rows past them, poisoned, left so, and
// the target's rows untouched for a chained row. Bad calls are refused.
func TestSpecDraftRows(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, tc := range []struct{ B, K int }{{1, 1}, {3, 4}, {70, 6}} {
		B, K := tc.B, tc.K
		state := make([]uint32, B*SpecStateWords)
		for i := range B {
			PutSpecState(state[i*SpecStateWords:], 1+r.IntN(5000), r.IntN(7), r.IntN(9), r.IntN(9))
		}
		stateBuf := uploadU32(t, d, "state", state)
		for _, first := range []bool{true, false} {
			n, tn := B, 0
			if first {
				n, tn = 2*B, B*(K+1)
			}
			rows := poisoned(t, d, "rows", (n+1)*RowWords)
			trows := poisoned(t, d, "trows", (B*(K+1)+1)*RowWords)
			run(t, d, "spec draft rows", func(b *gpu.Batch) error { return SpecDraftRows(b, stateBuf, rows, trows, B, K, first) })
			want, twant := make([]uint32, n*RowWords), make([]uint32, tn*RowWords)
			line := func(dst []uint32, seq, pos int) { PutRow(dst, seq, pos, treemask.LineRow(pos)) }
			for i := range B {
				L, tslot, slot := int(state[i*SpecStateWords]), int(state[i*SpecStateWords+2]), int(state[i*SpecStateWords+3])
				if first {
					line(want[i*RowWords:], slot, L)
					line(want[(B+i)*RowWords:], slot, L-1)
					for t0 := range K + 1 {
						line(twant[(i*(K+1)+t0)*RowWords:], tslot, L+t0)
					}
				} else {
					line(want[i*RowWords:], slot, L+1)
				}
			}
			for _, c := range []struct {
				name string
				buf  *gpu.Buffer
				want []uint32
			}{{"rows", rows, want}, {"target rows", trows, twant}} {
				got, err := c.buf.ReadU32()
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got[:len(c.want)], c.want) {
					t.Fatalf("B %d K %d first %v: %s %v, want %v", B, K, first, c.name, got[:len(c.want)], c.want)
				}
				for j, v := range got[len(c.want):] {
					if v != gpu.NaN32 {
						t.Fatalf("B %d K %d first %v: %s word %d past the rows: %#x", B, K, first, c.name, len(c.want)+j, v)
					}
				}
			}
		}
	}
	small := uploadU32(t, d, "small", make([]uint32, 2*RowWords))
	b, err := d.NewBatch("spec draft rows refused")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Discard()
	for name, call := range map[string]func() error{
		"no sequences": func() error { return SpecDraftRows(b, small, small, small, 0, 1, true) },
		"no drafts":    func() error { return SpecDraftRows(b, small, small, small, 1, 0, true) },
		"states past buffer": func() error {
			return SpecDraftRows(b, uploadU32(t, d, "s", make([]uint32, 4)), small, small, 2, 1, false)
		},
		"rows past buffer": func() error { return SpecDraftRows(b, small, small, small, 2, 1, true) },
		"target rows past": func() error { return SpecDraftRows(b, small, small, small, 1, 4, true) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSpecKeys: random states and a step's draws — greedy rows, uncoupled
// sampled rows and coupled ones holding their generation's seed words —
// keyed by position against sampling.Keys.At, the draft keys of coupled
// drafts with them; every other word (the draws' X and flags, the
// uncoupled rows, the draft keys' other words and regions, the words past
// the rows) keeps its random value. Bad calls are refused.
func TestSpecKeys(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, tc := range []struct {
		B, K  int
		draft bool
	}{{1, 1, true}, {1, 4, false}, {3, 6, true}, {70, 2, true}} {
		B, K := tc.B, tc.K
		rows := B * (K + 1)
		state := make([]uint32, B*SpecStateWords)
		for i := range state {
			state[i] = uint32(r.IntN(1 << 20))
		}
		seeds := make([]sampling.Keys, B)
		kinds := make([]int, B) // 0 greedy, 1 sampled uncoupled, 2 coupled
		draws := make([]uint32, (rows+2)*SampleDrawWords)
		for i := range draws {
			draws[i] = r.Uint32()
		}
		temps := make([]float32, SampleTempWords)
		for i := range B {
			seeds[i] = sampling.NewKeys(r.Uint64())
			kinds[i] = r.IntN(3)
			if i == 0 {
				kinds[i] = 2
			}
			p := sampling.Params{Temperature: 0.7}
			if kinds[i] == 0 {
				p.Temperature = 0
			}
			for c := range K + 1 {
				w := draws[(i*(K+1)+c)*SampleDrawWords:]
				dr := sampling.Draw{X: r.IntN(100), U: r.Float32(), V: r.Float32(), Coupled: kinds[i] == 2}
				PutSampleRow(w, temps, p, dr)
				SetSampleOutcome(w)
				if kinds[i] == 2 {
					PutSampleSeed(w, seeds[i])
				}
			}
		}
		dstride := B*ArgmaxCoupledWords + r.IntN(3)
		dkey0 := r.IntN(5)
		dkeys := make([]uint32, dkey0+K*dstride+3)
		for i := range dkeys {
			dkeys[i] = r.Uint32()
		}
		for c := range K {
			for i := range B {
				w := dkeys[dkey0+c*dstride+i*ArgmaxCoupledWords:]
				w[3] = 0
				if kinds[i] == 2 {
					w[3] = 1
				}
			}
		}
		stateBuf, drawsBuf, dkeysBuf := uploadU32(t, d, "state", state), uploadU32(t, d, "draws", draws), uploadU32(t, d, "dkeys", dkeys)
		var keysBuf *gpu.Buffer
		if tc.draft {
			keysBuf = dkeysBuf
		}
		run(t, d, "spec keys", func(b *gpu.Batch) error {
			return SpecKeys(b, stateBuf, drawsBuf.Slice(0, uint64(rows*SampleDrawWords)*4), keysBuf, B, K, dkey0, dstride)
		})
		wantDraws, wantKeys := slices.Clone(draws), slices.Clone(dkeys)
		for i := range B {
			if kinds[i] != 2 {
				continue
			}
			for c := range K + 1 {
				k0, k1 := seeds[i].At(int(state[i*SpecStateWords]) + c + 1).Key()
				w := wantDraws[(i*(K+1)+c)*SampleDrawWords:]
				w[1], w[2] = k0, k1
				if tc.draft && c < K {
					k := wantKeys[dkey0+c*dstride+i*ArgmaxCoupledWords:]
					k[0], k[1] = k0, k1
				}
			}
		}
		for _, c := range []struct {
			name string
			buf  *gpu.Buffer
			want []uint32
		}{{"draws", drawsBuf, wantDraws}, {"draft keys", dkeysBuf, wantKeys}} {
			got, err := c.buf.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got[:len(c.want)], c.want) {
				t.Fatalf("B %d K %d draft keys %v: %s = %v, want %v", B, K, tc.draft, c.name, got[:len(c.want)], c.want)
			}
		}
	}
	small := uploadU32(t, d, "small", make([]uint32, 4))
	big := uploadU32(t, d, "big", make([]uint32, 64))
	b, err := d.NewBatch("spec keys refused")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Discard()
	for name, call := range map[string]func() error{
		"no sequences":           func() error { return SpecKeys(b, big, big.All(), nil, 0, 2, 0, 4) },
		"no drafts":              func() error { return SpecKeys(b, big, big.All(), nil, 1, 0, 0, 4) },
		"states past buffer":     func() error { return SpecKeys(b, small, big.All(), nil, 2, 2, 0, 8) },
		"draws past binding":     func() error { return SpecKeys(b, big, small.All(), nil, 1, 2, 0, 4) },
		"draft keys past buffer": func() error { return SpecKeys(b, big, big.All(), small, 1, 2, 0, 4) },
		"draft stride under B":   func() error { return SpecKeys(b, big, big.All(), big, 2, 2, 0, 4) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
