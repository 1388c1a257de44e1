package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

func TestEmbed(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16, F32} {
		for range 3 {
			V, H, T := 1+r.IntN(500), 32*(1+r.IntN(16)), []int{1, 7, 64}[r.IntN(3)]
			t.Run(fmt.Sprintf("%v/V%d_H%d_T%d", f, V, H, T), func(t *testing.T) {
				m := randMatrix(t, r, f, V, H, 32)
				ids := make([]uint32, T)
				want := make([]float32, T*H)
				for i := range ids {
					ids[i] = uint32(r.IntN(V))
					m.Row(int(ids[i]), want[i*H:(i+1)*H])
				}
				e, err := UploadMatrix(d, "embed", m)
				if err != nil {
					t.Fatal(err)
				}
				defer e.Release()
				idb := uploadU32(t, d, "ids", ids)
				out := poisoned(t, d, "out", T*H)
				run(t, d, "embed", func(b *gpu.Batch) error { return Embed(b, out, idb.All(), e, T) })
				if got := readF32(t, out, T*H); relErr(got, want) != 0 {
					t.Errorf("gather differs from the table rows (relative error %g)", relErr(got, want))
				}
			})
		}
	}
}

// TestEmbedRowBlocks: a table bound in several blocks of rows (as Qwen3's
// vocabulary is on adapters with small bindings) gathers the same rows, and
// a bad id still gives exactly one NaN row.
func TestEmbedRowBlocks(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16, F32} {
		V, H, T := 300+r.IntN(200), 64, 40
		m := randMatrix(t, r, f, V, H, 32)
		ids := make([]uint32, T)
		want := make([]float32, T*H)
		for i := range ids {
			ids[i] = uint32(r.IntN(V))
			m.Row(int(ids[i]), want[i*H:(i+1)*H])
		}
		ids[T-1] = uint32(V) // a bad id
		e, err := UploadMatrix(d, "embed", m)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release()
		wb, _ := e.rowBytes()
		maxBinding := 100 * wb // blocks of 96 (lavapipe) to 64 (256-byte alignment) rows
		blocks, err := e.rowBlocks(maxBinding, d.Limits().MinStorageBufferOffsetAlignment)
		if err != nil || len(blocks) < 3 {
			t.Fatalf("%v: %d blocks (%v): the test needs several", f, len(blocks), err)
		}
		idb := uploadU32(t, d, "ids", ids)
		out := poisoned(t, d, "out", T*H)
		if err := out.Fill(0); err != nil { // zeros, so the NaN row must be written
			t.Fatal(err)
		}
		run(t, d, "embed", func(b *gpu.Batch) error { return embed(b, out, idb.All(), e, T, maxBinding) })
		got := readF32(t, out, T*H)
		if e := relErr(got[:(T-1)*H], want[:(T-1)*H]); e != 0 {
			t.Errorf("%v, %d blocks: gather differs from the table rows (relative error %g)", f, len(blocks), e)
		}
		for i, v := range got[(T-1)*H:] {
			if !math.IsNaN(float64(v)) {
				t.Errorf("%v: the bad id's row holds %v at %d", f, v, i)
				break
			}
		}
	}
}

func TestEmbedBadIDIsNaN(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16, F32} {
		e, err := UploadMatrix(d, "embed", randMatrix(t, r, f, 10, 32, 32))
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release()
		ids := uploadU32(t, d, "ids", []uint32{3, 10})
		out := poisoned(t, d, "out", 64)
		if err := out.Fill(0); err != nil {
			t.Fatal(err)
		}
		run(t, d, "embed", func(b *gpu.Batch) error { return Embed(b, out, ids.All(), e, 2) })
		got := readF32(t, out, 64)
		for i, v := range got {
			if isNaN := math.IsNaN(float64(v)); isNaN != (i >= 32) {
				t.Errorf("%v: out[%d] = %v: want NaN exactly in the row of the bad id", f, i, v)
				break
			}
		}
	}
}

func TestRMSNorm(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	type shape struct{ R, n int }
	var shapes []shape
	for range 4 {
		shapes = append(shapes,
			shape{R: []int{1, 5, 64}[r.IntN(3)], n: 8 * (1 + r.IntN(512))},              // hidden rows
			shape{R: (1 + r.IntN(64)) * (1 + r.IntN(16)), n: []int{64, 128}[r.IntN(2)]}, // head rows
		)
	}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("R%d_n%d", s.R, s.n), func(t *testing.T) {
			x := randVec(r, s.R*s.n, 3)
			w := randVec(r, s.n, 0.2)
			for i := range w {
				w[i]++
			}
			const eps = 1e-6
			want := make([]float32, len(x))
			for i := 0; i < len(x); i += s.n {
				reference.RMSNorm(want[i:i+s.n], x[i:i+s.n], w, eps)
			}
			xb, wb := upload(t, d, "x", x), upload(t, d, "w", w)
			out := poisoned(t, d, "out", len(x))
			run(t, d, "rmsnorm", func(b *gpu.Batch) error { return RMSNorm(b, out, xb, wb, s.R, s.n, eps) })
			checkClose(t, "out", readF32(t, out, len(x)), want, tolF32)
		})
	}
}

// TestRMSNormRows: rows picked out of a larger x by index (repeated, out
// of order), each the reference's RMSNorm of its row.
func TestRMSNormRows(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for range 3 {
		xRows, R, n := 1+r.IntN(40), []int{1, 4, 17}[r.IntN(3)], 32*(1+r.IntN(64))
		t.Run(fmt.Sprintf("R%d_of%d_n%d", R, xRows, n), func(t *testing.T) {
			const eps = 1e-6
			x, w := randVec(r, xRows*n, 3), randVec(r, n, 0.2)
			for i := range w {
				w[i]++
			}
			rows := make([]uint32, R)
			want := make([]float32, R*n)
			for i := range rows {
				rows[i] = uint32(r.IntN(xRows))
				reference.RMSNorm(want[i*n:(i+1)*n], x[int(rows[i])*n:int(rows[i]+1)*n], w, eps)
			}
			xb, wb, rb := upload(t, d, "x", x), upload(t, d, "w", w), uploadU32(t, d, "rows", rows)
			out := poisoned(t, d, "out", R*n)
			run(t, d, "rmsnorm rows", func(b *gpu.Batch) error { return RMSNormRows(b, out, xb, rb, wb, R, xRows, n, eps) })
			checkClose(t, "out", readF32(t, out, R*n), want, tolF32)
			b, err := d.NewBatch("refused")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Discard()
			if err := RMSNormRows(b, xb, xb, rb, wb, R, xRows, n, eps); err == nil {
				t.Error("out = x accepted")
			}
			if err := RMSNormRows(b, out, xb, rb, wb, R, xRows+1, n, eps); err == nil {
				t.Error("an x shorter than its rows accepted")
			}
		})
	}
}

// TestRMSNormCols: two calls write the halves of 2n-wide rows — each
// half the reference's RMSNorm of its own input with its own weight, as
// an EAGLE-3 head's [input_layernorm(e); hidden_norm(h)] — and RMSNormPair
// writes both in one dispatch; a third writes columns in the middle of
// wider rows, leaving the rest of each row poisoned; bad layouts are
// refused.
func TestRMSNormCols(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for range 3 {
		R, n := []int{1, 3, 17}[r.IntN(3)], 32*(1+r.IntN(40))
		t.Run(fmt.Sprintf("R%d_n%d", R, n), func(t *testing.T) {
			const eps = 1e-6
			a, h := randVec(r, R*n, 3), randVec(r, R*n, 0.5)
			wa, wh := randVec(r, n, 0.2), randVec(r, n, 0.2)
			for i := range wa {
				wa[i]++
				wh[i]++
			}
			want := make([]float32, R*2*n)
			for row := range R {
				reference.RMSNorm(want[row*2*n:row*2*n+n], a[row*n:(row+1)*n], wa, eps)
				reference.RMSNorm(want[row*2*n+n:(row+1)*2*n], h[row*n:(row+1)*n], wh, eps)
			}
			ab, hb, wab, whb := upload(t, d, "a", a), upload(t, d, "h", h), upload(t, d, "wa", wa), upload(t, d, "wh", wh)
			out := poisoned(t, d, "in", R*2*n)
			run(t, d, "rmsnorm halves", func(b *gpu.Batch) error {
				if err := RMSNormCols(b, out, 2*n, 0, ab, wab, R, n, eps); err != nil {
					return err
				}
				return RMSNormCols(b, out, 2*n, n, hb, whb, R, n, eps)
			})
			checkClose(t, "both halves", readF32(t, out, R*2*n), want, tolF32)
			pair := poisoned(t, d, "pair", R*2*n)
			run(t, d, "rmsnorm pair", func(b *gpu.Batch) error { return RMSNormPair(b, pair, 2*n, 0, ab, wab, hb, whb, R, n, eps) })
			checkClose(t, "both halves in one dispatch", readF32(t, pair, R*2*n), want, tolF32)

			// Columns 8 … 8+n−1 of rows of n+24: the rest stays NaN.
			ldo := n + 24
			mid := poisoned(t, d, "mid", R*ldo)
			run(t, d, "rmsnorm middle", func(b *gpu.Batch) error { return RMSNormCols(b, mid, ldo, 8, ab, wab, R, n, eps) })
			got := readF32(t, mid, R*ldo)
			for row := range R {
				checkClose(t, fmt.Sprintf("row %d", row), got[row*ldo+8:row*ldo+8+n], want[row*2*n:row*2*n+n], tolF32)
				for i, v := range got[row*ldo : (row+1)*ldo] {
					if (i < 8 || i >= 8+n) && !math.IsNaN(float64(v)) {
						t.Fatalf("row %d column %d written: %v", row, i, v)
					}
				}
			}
			b, err := d.NewBatch("refused")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Discard()
			for name, call := range map[string]func() error{
				"columns past the row": func() error { return RMSNormCols(b, out, 2*n, n+1, hb, whb, R, n, eps) },
				"a short out":          func() error { return RMSNormCols(b, mid, 2*n, n, hb, whb, R, n, eps) }, // n ≥ 32: 2n > n+24
				"out is x":             func() error { return RMSNormCols(b, ab, n, 0, ab, wab, R, n, eps) },
				"a pair past the row":  func() error { return RMSNormPair(b, out, 2*n, 1, ab, wab, hb, whb, R, n, eps) },
				"a pair into x2":       func() error { return RMSNormPair(b, hb, n, 0, ab, wab, hb, whb, R, n/2, eps) },
			} {
				if err := call(); err == nil {
					t.Errorf("%s: accepted", name)
				}
			}
			if b.Len() != 0 {
				t.Errorf("%d dispatches recorded by refused calls", b.Len())
			}
		})
	}
}

// TestEmbedRMSNormPair: an EAGLE-3 head's whole input — the embedding
// table's rows by id and the hidden rows, each half normalized by its own
// weight — equals the reference's, in one dispatch over an int4 table
// (read in place) and in two over a dense one (gathered into the scratch
// first); the ids a range of a buffer past its start; a bad id gives its
// row's first half NaN and the second half its value; bad calls are
// refused.
func TestEmbedRMSNormPair(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16} {
		for range 2 {
			V, R, n := 1+r.IntN(300), []int{1, 3, 17}[r.IntN(3)], 32*(1+r.IntN(40))
			t.Run(fmt.Sprintf("%v/V%d_R%d_n%d", f, V, R, n), func(t *testing.T) {
				const eps = 1e-6
				m := randMatrix(t, r, f, V, n, 32)
				e, err := UploadMatrix(d, "embed", m)
				if err != nil {
					t.Fatal(err)
				}
				defer e.Release()
				h := randVec(r, R*n, 0.5)
				wa, wh := randVec(r, n, 0.2), randVec(r, n, 0.2)
				for i := range wa {
					wa[i]++
					wh[i]++
				}
				ids := make([]uint32, R)
				want := make([]float32, R*2*n)
				row := make([]float32, n)
				for i := range ids {
					ids[i] = uint32(r.IntN(V))
					if i == R-1 && R > 1 {
						ids[i] = uint32(V + r.IntN(3)) // a bad id
					}
					if int(ids[i]) < V {
						m.Row(int(ids[i]), row)
						reference.RMSNorm(want[i*2*n:i*2*n+n], row, wa, eps)
					} else {
						for j := range n {
							want[i*2*n+j] = float32(math.NaN())
						}
					}
					reference.RMSNorm(want[i*2*n+n:(i+1)*2*n], h[i*n:(i+1)*n], wh, eps)
				}
				align := int(d.Limits().MinStorageBufferOffsetAlignment) / 4
				idb := uploadU32(t, d, "ids", append(make([]uint32, align), ids...))
				hb, wab, whb := upload(t, d, "h", h), upload(t, d, "wa", wa), upload(t, d, "wh", wh)
				emb, out := poisoned(t, d, "emb", R*n), poisoned(t, d, "in", R*2*n)
				b, err := d.NewBatch("embed rmsnorm pair")
				if err != nil {
					t.Fatal(err)
				}
				if err := EmbedRMSNormPair(b, out, 2*n, 0, idb.Slice(uint64(align)*4, uint64(R)*4), e, wab, hb, whb, emb, R, n, eps); err != nil {
					b.Discard()
					t.Fatal(err)
				}
				if want := map[Format]int{Int4: 1, F16: 2}[f]; b.Len() != want {
					t.Errorf("%d dispatches, want %d", b.Len(), want)
				}
				if err := b.Submit(); err != nil {
					t.Fatal(err)
				}
				got := readF32(t, out, R*2*n)
				for i, id := range ids {
					g, w := got[i*2*n:(i+1)*2*n], want[i*2*n:(i+1)*2*n]
					if int(id) >= V {
						for j, v := range g[:n] {
							if !math.IsNaN(float64(v)) {
								t.Fatalf("row %d (bad id %d): column %d is %v, want NaN", i, id, j, v)
							}
						}
						g, w = g[n:], w[n:]
					}
					checkClose(t, fmt.Sprintf("row %d", i), g, w, tolF32)
				}

				refused, err := d.NewBatch("refused")
				if err != nil {
					t.Fatal(err)
				}
				defer refused.Discard()
				for name, call := range map[string]func() error{
					"out is x2": func() error { return EmbedRMSNormPair(refused, hb, n, 0, idb.All(), e, wab, hb, whb, emb, R, n/2, eps) },
					"a narrower table": func() error {
						return EmbedRMSNormPair(refused, out, 2*n, 0, idb.All(), e, wab, hb, whb, emb, R, n-8, eps)
					},
					"too few ids": func() error {
						return EmbedRMSNormPair(refused, out, 2*n, 0, idb.Slice(0, 4), e, wab, hb, whb, emb, 2, n, eps)
					},
					"no emb to gather": func() error {
						if f == Int4 {
							return errors.New("int4: emb unused")
						}
						return EmbedRMSNormPair(refused, out, 2*n, 0, idb.All(), e, wab, hb, whb, nil, R, n, eps)
					},
				} {
					if err := call(); err == nil {
						t.Errorf("%s: accepted", name)
					}
				}
				if refused.Len() != 0 {
					t.Errorf("%d dispatches recorded by refused calls", refused.Len())
				}
			})
		}
	}
}

func TestArgmax(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for tc, V := range []int{1, 1 + r.IntN(5000), 151936} {
		T := []int{5, 6, 17}[r.IntN(3)] // every kind of row below
		t.Run(fmt.Sprintf("T%d_V%d", T, V), func(t *testing.T) {
			logits := randVec(r, T*V, 5)
			for row := range T {
				l := logits[row*V : (row+1)*V]
				switch row % 5 {
				case 1: // a tie for the maximum: the first index must win
					i, j := r.IntN(V), r.IntN(V)
					l[i], l[j] = 100, 100
				case 2:
					if V > 1 {
						l[r.IntN(V)] = float32(math.NaN())
					}
				case 3: // all equal, across every chunk: index 0
					for i := range l {
						l[i] = -2
					}
				case 4:
					partialHead(r, l)
				}
			}
			lb := upload(t, d, "logits", logits)
			lse0 := T + r.IntN(3) // the log-sum-exps after the log-probabilities, maybe further
			// The log-probabilities in a buffer of their own, or in ids'
			// after the ids (the engine's read-out: one buffer, one read),
			// the ids then a range past its start (a chain's step).
			ids, lpBuf, idsAt, lpAt := poisoned(t, d, "ids", T), poisoned(t, d, "lp", lse0+T), 0, 0
			if shared := tc%2 == 1; shared {
				align := int(d.Limits().MinStorageBufferOffsetAlignment) / 4
				idsAt = align
				lpAt = idsAt + (T+align-1)/align*align
				ids = poisoned(t, d, "ids_lp", lpAt+lse0+T)
				lpBuf = ids
			}
			lp := lpBuf.Slice(uint64(lpAt)*4, uint64(lse0+T)*4)
			poisonScratch(t, d, T*64)
			run(t, d, "argmax", func(b *gpu.Batch) error {
				return Argmax(b, ids.Slice(uint64(idsAt)*4, uint64(T)*4), lp, lb, T, V, lse0)
			})
			got, err := ids.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			got = got[idsAt:]
			gotLP := readF32(t, lpBuf, lpAt+lse0+T)[lpAt:]
			for row := range T {
				checkArgmaxRow(t, row, logits[row*V:(row+1)*V], got[row], gotLP[row], gotLP[lse0+row])
			}
		})
	}
}

// checkArgmaxRow holds one row's read-out — its id, log-probability and
// log-sum-exp — to sampling.Choose's greedy choice over logits; a row
// with a NaN must read ArgmaxNaN.
func checkArgmaxRow(t *testing.T, row int, logits []float32, id uint32, lp, lse float32) {
	t.Helper()
	want, err := sampling.Choose(logits, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
	if err != nil {
		if id != ArgmaxNaN {
			t.Errorf("row %d: id %#x for a NaN row", row, id)
		}
		return
	}
	if id != uint32(want.Argmax) {
		t.Errorf("row %d: id %d, want %d", row, id, want.Argmax)
	}
	if !(math.Abs(float64(lp-want.ArgmaxLogprob)) <= 1e-4*max(1, math.Abs(float64(want.ArgmaxLogprob)))) { // a NaN fails
		t.Errorf("row %d: log p %v, want %v", row, lp, want.ArgmaxLogprob)
	}
	if !(math.Abs(float64(lse-want.LogSumExp)) <= 1e-4*max(1, math.Abs(float64(want.LogSumExp)))) {
		t.Errorf("row %d: log-sum-exp %v, want %v", row, lse, want.LogSumExp)
	}
}

// extremeHash is one of samplingtest.ExtremeHashes.
func extremeHash(r *rand.Rand) uint32 {
	return samplingtest.ExtremeHashes[r.IntN(len(samplingtest.ExtremeHashes))]
}

// checkCoupledRow holds a coupled row's read-out to sampling.CoupledChoice
// over the whole vocabulary's row: a token whose scaled logit and noise
// lie within samplingtest.NoiseSlack of the largest, its log-probability
// and the log-sum-exp; a row with a NaN must read ArgmaxNaN.
func checkCoupledRow(t *testing.T, row int, logits []float32, T float32, d sampling.Draw, id uint32, lp, lse float32) {
	t.Helper()
	want, err := sampling.CoupledChoice(logits, nil, T, d)
	if err != nil {
		if id != ArgmaxNaN {
			t.Errorf("row %d: id %#x for a NaN row", row, id)
		}
		return
	}
	if int(id) >= len(logits) {
		t.Fatalf("row %d: coupled id %d outside the vocabulary", row, id)
	}
	k0, k1 := d.Key()
	noisy := func(i int) float64 { return float64(logits[i]/T) + float64(sampling.Gumbel(k0, k1, i)) }
	if best := noisy(want); noisy(int(id)) < best-samplingtest.NoiseSlack*max(1, math.Abs(best)) {
		t.Errorf("row %d: coupled id %d (%v), want %d (%v)", row, id, noisy(int(id)), want, best)
	}
	ref, _ := sampling.Choose(logits, sampling.Params{}, sampling.Draw{X: sampling.NoProposal})
	if !(math.Abs(float64(lse-ref.LogSumExp)) <= 1e-4*max(1, math.Abs(float64(ref.LogSumExp)))) {
		t.Errorf("row %d: log-sum-exp %v, want %v", row, lse, ref.LogSumExp)
	}
	if w := logits[id] - ref.LogSumExp; !(math.Abs(float64(lp-w)) <= 1e-4*max(1, math.Abs(float64(w)))) {
		t.Errorf("row %d: log p %v, want %v", row, lp, w)
	}
}

// TestArgmaxOf: a head over part of the vocabulary, its tokens in no
// order, chooses what Argmax over the whole row (its logits placed, the
// rest −∞) chooses: ties go to the lower token, not the lower logit index;
// coupled rows (ArgmaxOfCoupled) what sampling.CoupledChoice chooses over
// that row, their noise keyed by the tokens; a third of the runs score the
// whole vocabulary in order through ArgmaxCoupled.
func TestArgmaxOf(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, V := range []int{1, 1 + r.IntN(9000), 32768} {
		vocab, T := V+r.IntN(3*V+5), []int{1, 4, 6}[r.IntN(3)]
		whole := r.IntN(3) == 0 // a head over the whole vocabulary: ArgmaxCoupled, no tokens bound
		if whole {
			vocab = V
		}
		t.Run(fmt.Sprintf("T%d_V%d_of%d", T, V, vocab), func(t *testing.T) {
			tokens := r.Perm(vocab)[:V]
			if whole {
				for i := range tokens {
					tokens[i] = i
				}
			}
			logits := randVec(r, T*V, 5)
			for row := range T {
				l := logits[row*V : (row+1)*V]
				switch row % 4 {
				case 1: // a tie: the lower token wins, wherever its logit sits
					i, j := r.IntN(V), r.IntN(V)
					l[i], l[j] = 100, 100
				case 2:
					l[r.IntN(V)] = float32(math.NaN())
				case 3:
					for i := range l {
						l[i] = -2
					}
				}
			}
			tok := make([]uint32, V)
			for i, id := range tokens {
				tok[i] = uint32(id)
			}
			lb, tb := upload(t, d, "head_logits", logits), uploadU32(t, d, "tokens", tok)
			lse0 := T + r.IntN(3)
			ids, lp := poisoned(t, d, "ids", T), poisoned(t, d, "lp", lse0+T)
			// Half the runs couple some rows (ArgmaxOfCoupled).
			coupled := make([]sampling.Draw, T)
			temps := make([]float32, T)
			var keys gpu.Binding
			if r.IntN(2) == 0 {
				kw := make([]uint32, T*ArgmaxCoupledWords)
				for row := range T {
					temps[row] = []float32{0, 0.5, 1, 1.5}[r.IntN(4)]
					coupled[row] = sampling.Draw{U: r.Float32(), V: r.Float32(), Coupled: row%4 != 1}
					if r.IntN(2) == 0 { // a token's noise at an end of its range
						coupled[row] = samplingtest.DrawHashing(r, tokens[r.IntN(V)], extremeHash(r), sampling.NoProposal)
						coupled[row].Coupled = row%4 != 1
					}
					PutCoupledKey(kw[row*ArgmaxCoupledWords:], temps[row], coupled[row])
				}
				keys = uploadU32(t, d, "keys", kw).All()
			}
			poisonScratch(t, d, T*64)
			run(t, d, "argmax of", func(b *gpu.Batch) error {
				if whole {
					return ArgmaxCoupled(b, ids.All(), lp.All(), lb, keys, T, V, lse0)
				}
				return ArgmaxOfCoupled(b, ids.All(), lp.All(), lb, tb, keys, T, V, lse0)
			})
			got, err := ids.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			gotLP := readF32(t, lp, lse0+T)
			full := make([]float32, vocab)
			for row := range T {
				for i := range full {
					full[i] = float32(math.Inf(-1))
				}
				for i, id := range tokens {
					full[id] = logits[row*V+i]
				}
				if keys.Buf != nil && coupled[row].Coupled && temps[row] > 0 {
					checkCoupledRow(t, row, full, temps[row], coupled[row], got[row], gotLP[row], gotLP[lse0+row])
					continue
				}
				checkArgmaxRow(t, row, full, got[row], gotLP[row], gotLP[lse0+row])
			}
		})
	}
}

// TestSample holds sample.wgsl to package sampling on fresh random rows:
// greedy, at a temperature, in a nucleus, coupled or not, with and without a proposal,
// with ties, a NaN, a vocabulary-sized row and one of more chunks than a
// workgroup has threads. Peaked rows find their nucleus in the chunks'
// lists, flat ones (a vocabulary's at a high temperature) need the whole
// row: both must happen. Lavapipe ends an invocation's loops after 65,535
// iterations in all, fewer than 33 bisection passes over a row of more
// than 256 chunks take, so there only the peaked rows have a nucleus.
func TestSample(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, V := range []int{1, 2 + r.IntN(300), 1 + r.IntN(5000), 151936, 256*sampleChunk + 1 + r.IntN(5000)} {
		rows := 6 + r.IntN(6)
		topN := min(V, r.IntN(21))
		t.Run(fmt.Sprintf("rows%d_V%d_top%d", rows, V, topN), func(t *testing.T) {
			logits := randVec(r, rows*V, 3)
			params := make([]sampling.Params, rows)
			draws := make([]sampling.Draw, rows)
			outcome := make([]bool, rows) // ids and lps take what the row sampled
			dw, tw := make([]uint32, rows*SampleDrawWords), make([]float32, rows*SampleTempWords)
			for row := range rows {
				l := logits[row*V : (row+1)*V]
				switch row % 6 {
				case 1: // a tie for the maximum, and a second tie below it
					l[r.IntN(V)], l[r.IntN(V)], l[r.IntN(V)], l[r.IntN(V)] = 9, 9, 8, 8
				case 2:
					l[r.IntN(V)] = float32(math.NaN())
				case 3: // a peaked row: the nucleus is a few tokens
					l[r.IntN(V)] = 30
				case 4:
					partialHead(r, l)
				}
				params[row] = sampling.Params{Temperature: []float32{0, 0.3, 1, 1.7}[r.IntN(4)], TopP: []float32{1, 0.9, 0.5, 0.05, 0}[r.IntN(5)]}
				switch row % 6 {
				case 0: // flat: a nucleus of most of the row
					params[row] = sampling.Params{Temperature: 1.7, TopP: 0.9}
				case 3: // peaked: a nucleus of one token
					params[row] = sampling.Params{Temperature: 1, TopP: 0.5}
				case 5: // the argmax proposed at a low temperature: often accepted
					params[row].Temperature = 0.3
				}
				if V > 256*sampleChunk && d.Info().Software() && row%6 != 3 {
					params[row].TopP = 1
				}
				draws[row] = sampling.Draw{X: r.IntN(V), U: r.Float32(), V: r.Float32(), Coupled: r.IntN(3) == 0}
				if draws[row].Coupled && r.IntN(2) == 0 { // a token's noise at an end of its range
					draws[row] = samplingtest.DrawHashing(r, r.IntN(V), extremeHash(r), draws[row].X)
				}
				if row%6 == 4 {
					draws[row].X = sampling.NoProposal
				}
				if row%6 == 5 { // the proposal is the argmax: the usual case
					draws[row].X = slices.Index(l, slices.Max(l))
				}
				if draws[row].Coupled && row%6 == 5 && !params[row].Greedy() { // a coupled drafter's proposal: often accepted
					if x, err := sampling.CoupledChoice(l, nil, params[row].Temperature, draws[row]); err == nil {
						draws[row].X = x
					}
				}
				PutSampleRow(dw[row*SampleDrawWords:], tw[row*SampleTempWords:], params[row], draws[row])
				if outcome[row] = row%6 == 5 || r.IntN(2) == 0; outcome[row] {
					SetSampleOutcome(dw[row*SampleDrawWords:])
				}
			}
			lb := upload(t, d, "logits", logits)
			db, tb := uploadU32(t, d, "draws", dw), upload(t, d, "temps", tw)
			out, top := poisoned(t, d, "out", rows*SampleWords), poisoned(t, d, "top", rows*max(topN, 1)*2)
			ids, lps := poisoned(t, d, "ids", rows), poisoned(t, d, "lps", rows)
			run(t, d, "sample", func(b *gpu.Batch) error { return Sample(b, out, top, ids, lps.All(), lb, db, tb, rows, V, topN) })
			gotIDs, err := ids.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			gotLPs := readF32(t, lps, rows)
			ow, err := out.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			tw2, err := top.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			for row := range rows {
				l := logits[row*V : (row+1)*V]
				got, gerr := SampleRow(ow[row*SampleWords:])
				want, werr := sampling.Choose(l, params[row], draws[row])
				if werr != nil || gerr != nil {
					if !errors.Is(gerr, sampling.ErrNaN) || !errors.Is(werr, sampling.ErrNaN) || gotIDs[row] != ArgmaxNaN {
						t.Errorf("row %d: %v (id %#x), want %v", row, gerr, gotIDs[row], werr)
					}
					continue
				}
				close := func(name string, g, w float32) {
					if g != w && !(math.Abs(float64(g-w)) <= 1e-4*max(1, math.Abs(float64(w)))) { // a NaN fails
						t.Errorf("row %d: %s %v, want %v", row, name, g, w)
					}
				}
				wantID, wantLP := got.Argmax, got.ArgmaxLogprob
				switch {
				case !outcome[row] || params[row].Greedy():
				case got.Accept:
					wantID, wantLP = draws[row].X, got.XLogprob
				default:
					wantID, wantLP = got.Sample, got.SampleLogprob
				}
				if gotIDs[row] != uint32(wantID) || gotLPs[row] != wantLP {
					t.Errorf("row %d (outcome %v): ids/lps %d %v, out says %d %v", row, outcome[row], gotIDs[row], gotLPs[row], wantID, wantLP)
				}
				if !params[row].Greedy() && draws[row].X != sampling.NoProposal && got.Sample == draws[row].X && !got.Accept && !draws[row].Coupled {
					t.Errorf("row %d: drew the proposal %d without accepting it", row, got.Sample)
				}
				if wide := ow[row*SampleWords+2]&sampleWide != 0; V > 8*sampleChunk && (row%6 == 0 && params[row].TopP < 1 && !wide || row%6 == 3 && wide) {
					t.Errorf("row %d (%+v): the whole row read for its nucleus: %v", row, params[row], wide)
				}
				close("logsumexp", got.LogSumExp, want.LogSumExp)
				close("log p(argmax)", got.ArgmaxLogprob, want.ArgmaxLogprob)
				if err := samplingtest.Check(l, params[row], draws[row], got); err != nil {
					t.Errorf("row %d (%+v, %+v): %v", row, params[row], draws[row], err)
				}
				if !params[row].Greedy() {
					if !nucleusEdge(l, params[row], got.Threshold, want.Threshold) {
						t.Errorf("row %d: threshold %v, want %v", row, got.Threshold, want.Threshold)
					}
					if draws[row].X != sampling.NoProposal {
						close("log p(X)", got.XLogprob, l[draws[row].X]-want.LogSumExp)
					}
					if got.Sample >= 0 && got.Sample < V {
						close("log p(sample)", got.SampleLogprob, l[got.Sample]-want.LogSumExp)
					}
				} else if got.Sample != want.Argmax {
					t.Errorf("row %d: greedy sample %d, want the argmax %d", row, got.Sample, want.Argmax)
				}
				wantTop := sampling.Top(l, topN, want.LogSumExp)
				for i, g := range SampleTop(tw2[row*max(topN, 1)*2:], topN) {
					if g.Token != wantTop[i].Token {
						t.Errorf("row %d: top %d is %d, want %d", row, i, g.Token, wantTop[i].Token)
						break
					}
					close("top log p", g.Logprob, wantTop[i].Logprob)
				}
			}
		})
	}
}

// partialHead makes l a row of a head over part of the vocabulary: −∞ but
// at a few tokens, so that most chunks of a long row hold nothing else.
func partialHead(r *rand.Rand, l []float32) {
	keep := map[int]float32{}
	for range 1 + r.IntN(40) {
		i := r.IntN(len(l))
		keep[i] = l[i]
	}
	for i := range l {
		l[i] = float32(math.Inf(-1))
	}
	for i, v := range keep {
		l[i] = v
	}
}

// nucleusEdge reports whether got is want's nucleus threshold: within
// 1e-4 of it (a GPU's exponentials), or an edge samplingtest.NucleusEdge
// allows.
func nucleusEdge(l []float32, p sampling.Params, got, want float32) bool {
	return math.Abs(float64(got-want)) <= 1e-4*max(1, math.Abs(float64(want))) || samplingtest.NucleusEdge(l, p, got, want)
}

// TestMLPFused runs Qwen3's MLP block the fused way — one matmul over
// gate_proj stacked on up_proj, then down_proj of silu(gate) · up added
// into the residual — in one batch, against the reference's three matmuls.
func TestMLPFused(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, f := range []Format{Int4, F16, F32} {
		T, H, I := []int{1, 6, 64}[r.IntN(3)], 32*(1+r.IntN(8)), 32*(1+r.IntN(24))
		t.Run(fmt.Sprintf("%v/T%d_H%d_I%d", f, T, H, I), func(t *testing.T) {
			gate, up, down := randMatrix(t, r, f, I, H, 32), randMatrix(t, r, f, I, H, 32), randMatrix(t, r, f, H, I, 32)
			h, x := randVec(r, T*H, 1), randVec(r, T*H, 1)
			g, u, want := make([]float32, T*I), make([]float32, T*I), make([]float32, T*H)
			reference.MatMul(g, h, gate, T)
			reference.MatMul(u, h, up, T)
			for i := range g {
				g[i] = reference.SiLU(g[i]) * u[i]
			}
			reference.MatMul(want, g, down, T)
			reference.Add(want, x)

			gateUp, err := UploadStacked(d, "gate_up", gate, up)
			if err != nil {
				t.Fatal(err)
			}
			defer gateUp.Release()
			downW, err := UploadMatrix(d, "down", down)
			if err != nil {
				t.Fatal(err)
			}
			defer downW.Release()
			hb, xb := upload(t, d, "h", h), upload(t, d, "x", x)
			gu := poisoned(t, d, "gate_up_out", T*2*I)
			run(t, d, "mlp", func(b *gpu.Batch) error {
				if err := MatMul(b, gu, hb, gateUp, T, false); err != nil {
					return err
				}
				return MatMulSwiGLU(b, xb, gu, downW, T, true)
			})
			checkClose(t, "hidden", readF32(t, xb, T*H), want, tolF32)
		})
	}
}

func TestCopy(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, words := range []int{1, 255, 256, 257, 300001} {
		src := make([]uint32, 4*words)
		for i := range src {
			src[i] = r.Uint32()
		}
		sb := uploadU32(t, d, "src", src)
		dst, err := d.NewBuffer("dst", uint64(len(src))*4)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Release()
		if err := dst.Fill(0xdeadbeef); err != nil {
			t.Fatal(err)
		}
		run(t, d, "copy", func(b *gpu.Batch) error { return Copy(b, dst, sb, uint64(len(src))*4) })
		got, err := dst.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, src) {
			t.Fatalf("%d words: copy differs", words)
		}
	}
}

// TestCopyTo: a copy into a later part of a buffer leaves the rest alone.
func TestCopyTo(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	src := []uint32{r.Uint32(), r.Uint32(), r.Uint32(), r.Uint32()}
	sb := uploadU32(t, d, "src", src)
	at := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	dst, err := d.NewBuffer("dst", at+64)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Release()
	if err := dst.Fill(0xdeadbeef); err != nil {
		t.Fatal(err)
	}
	run(t, d, "copy", func(b *gpu.Batch) error { return CopyTo(b, dst, at, sb, 16) })
	got, err := dst.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range got {
		want := uint32(0xdeadbeef)
		if k := i - int(at/4); k >= 0 && k < 4 {
			want = src[k]
		}
		if w != want {
			t.Fatalf("word %d: %#x, want %#x", i, w, want)
		}
	}
	run(t, d, "copy", func(b *gpu.Batch) error {
		if err := CopyTo(b, dst, at+64-8, sb, 16); err == nil {
			t.Error("a copy past the end was accepted")
		}
		return nil
	})
}

// TestCopyRange: a copy from a later part of a buffer takes that part.
func TestCopyRange(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	at := uint64(d.Limits().MinStorageBufferOffsetAlignment)
	src := make([]uint32, (at+32)/4)
	for i := range src {
		src[i] = r.Uint32()
	}
	sb := uploadU32(t, d, "src", src)
	dst := poisoned(t, d, "dst", 12)
	run(t, d, "copy", func(b *gpu.Batch) error { return CopyRange(b, dst, 0, sb.Slice(at, 32)) })
	got, err := dst.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	if want := src[at/4:]; !slices.Equal(got[:8], want) || got[8] != gpu.NaN32 {
		t.Fatalf("copied %#x, want %#x and the rest untouched (%#x)", got[:8], want, got[8:])
	}
	run(t, d, "copy", func(b *gpu.Batch) error {
		if err := CopyRange(b, dst, 0, gpu.Binding{Buf: sb, Offset: at, Size: 64}); err == nil {
			t.Error("a copy from past the source's end was accepted")
		}
		return nil
	})
}

// TestScatter: each row's values land at their columns, the rest of the
// wide rows untouched.
func TestScatter(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, c := range []struct{ T, N, V int }{{1, 1, 1}, {1, 300, 1000}, {3, 257, 257}, {5, 4096, 9000}} {
		cols := r.Perm(c.V)[:c.N]
		in := make([]float32, c.T*c.N)
		for i := range in {
			in[i] = float32(r.NormFloat64())
		}
		colsU := make([]uint32, c.N)
		for j, col := range cols {
			colsU[j] = uint32(col)
		}
		inB, colsB := upload(t, d, "in", in), uploadU32(t, d, "cols", colsU)
		out := poisoned(t, d, "out", c.T*c.V)
		run(t, d, "scatter", func(b *gpu.Batch) error { return Scatter(b, out, inB, colsB, c.T, c.N, c.V) })
		got, err := out.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		want := make([]uint32, c.T*c.V)
		for i := range want {
			want[i] = gpu.NaN32
		}
		for row := range c.T {
			for j, col := range cols {
				want[row*c.V+col] = math.Float32bits(in[row*c.N+j])
			}
		}
		if !slices.Equal(got[:c.T*c.V], want) {
			t.Fatalf("%+v: scatter differs", c)
		}
	}
	run(t, d, "scatter", func(b *gpu.Batch) error {
		x := upload(t, d, "x", make([]float32, 8))
		if err := Scatter(b, x, x, x, 1, 9, 8); err == nil {
			t.Error("a scatter of more values than columns was accepted")
		}
		return nil
	})
}

// TestGather: each pair's source word lands at its destination word, and
// every other destination word keeps its poison.
func TestGather(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, n := range []int{1, 63, 64, 65, 300} {
		src := make([]uint32, 2*n+7)
		for i := range src {
			src[i] = r.Uint32()
		}
		const poison = 0xdeadbeef
		want := make([]uint32, 3*n+5)
		for i := range want {
			want[i] = poison
		}
		pairs := make([]uint32, 0, GatherPairWords*n)
		for i, to := range r.Perm(len(want))[:n] {
			from := r.IntN(len(src))
			if i == 0 {
				to, from = len(want)-1, len(src)-1 // the last words of both
			}
			if want[to] != poison {
				continue
			}
			pairs = append(pairs, uint32(to), uint32(from))
			want[to] = src[from]
		}
		sb, pb := uploadU32(t, d, "src", src), uploadU32(t, d, "pairs", pairs)
		dst, err := d.NewBuffer("dst", uint64(len(want))*4)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Release()
		if err := dst.Fill(poison); err != nil {
			t.Fatal(err)
		}
		run(t, d, "gather", func(b *gpu.Batch) error { return Gather(b, dst, sb, pb, len(pairs)/GatherPairWords) })
		got, err := dst.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%d pairs: gather differs", len(pairs)/GatherPairWords)
		}
		run(t, d, "gather", func(b *gpu.Batch) error {
			if err := Gather(b, dst, sb, pb, len(pairs)/GatherPairWords+1); err == nil {
				t.Error("more pairs than the buffer holds were accepted")
			}
			return nil
		})
	}
}

// TestGatherRows: each pair's source row lands at its destination row,
// word for word, every other destination word keeping its poison — rows
// of one word to some thousands (a hidden state's), pairs bound at an
// offset of their buffer, a grid folded into two dimensions, into one
// buffer or two at once (GatherRowsTwice); and a bad call is refused
// before anything is recorded.
func TestGatherRows(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	align := int(d.Limits().MinStorageBufferOffsetAlignment)
	for _, c := range []struct{ n, words int }{{1, 1}, {65, 1}, {3, 64}, {7, 100}, {40, 2048}, {2100, 2048}} { // the last: more than 65,535 workgroups
		for _, twice := range []bool{false, true} {
			t.Run(fmt.Sprintf("n%d_words%d_twice%v", c.n, c.words, twice), func(t *testing.T) {
				srcRows := c.n + 3
				src := make([]uint32, srcRows*c.words)
				for i := range src {
					src[i] = r.Uint32()
				}
				dests := 1
				if twice {
					dests = 2
				}
				type dest struct {
					buf  *gpu.Buffer
					bind gpu.Binding
					want []uint32
				}
				var to []dest
				const poison = 0xdeadbeef
				for k := range dests {
					dstRows := 2*c.n + 1 + k
					want := make([]uint32, dstRows*c.words)
					for i := range want {
						want[i] = poison
					}
					// The pairs after a run of unread words, at an aligned offset.
					lead := align / 4
					pairs := make([]uint32, lead, lead+GatherPairWords*c.n)
					// Distinct destinations (two pairs writing one row would race),
					// the first the last row, read from the last source row.
					tos := append([]int{dstRows - 1}, r.Perm(dstRows - 1)[:c.n-1]...)
					for i, to := range tos {
						from := r.IntN(srcRows)
						if i == 0 {
							from = srcRows - 1
						}
						pairs = append(pairs, uint32(to), uint32(from))
						copy(want[to*c.words:(to+1)*c.words], src[from*c.words:(from+1)*c.words])
					}
					pb := uploadU32(t, d, "pairs", pairs)
					dst, err := d.NewBuffer("dst", uint64(len(want))*4)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(dst.Release)
					if err := dst.Fill(poison); err != nil {
						t.Fatal(err)
					}
					to = append(to, dest{dst, pb.Slice(uint64(align), uint64(c.n*GatherPairWords)*4), want})
				}
				sb := uploadU32(t, d, "src", src)
				gather := func(b *gpu.Batch, n, words int, src *gpu.Buffer, pairs gpu.Binding) error {
					if twice {
						return GatherRowsTwice(b, to[0].buf, to[1].buf, src, pairs, to[1].bind, n, words)
					}
					return GatherRows(b, to[0].buf, src, pairs, n, words)
				}
				run(t, d, "gather rows", func(b *gpu.Batch) error { return gather(b, c.n, c.words, sb, to[0].bind) })
				for k, g := range to {
					got, err := g.buf.ReadU32()
					if err != nil {
						t.Fatal(err)
					}
					for i := range g.want {
						if got[i] != g.want[i] {
							t.Fatalf("destination %d: word %d (row %d) = %#x, want %#x", k, i, i/c.words, got[i], g.want[i])
						}
					}
				}
				b, err := d.NewBatch("gather rows refused")
				if err != nil {
					t.Fatal(err)
				}
				defer b.Discard()
				bind := to[0].bind
				calls := map[string]func() error{
					"more pairs than bound": func() error { return gather(b, c.n+1, c.words, sb, bind) },
					"rows of 0 words":       func() error { return gather(b, c.n, 0, sb, bind) },
					"one buffer":            func() error { return gather(b, c.n, c.words, to[0].buf, bind) },
					"no pairs":              func() error { return gather(b, c.n, c.words, sb, gpu.Binding{}) },
				}
				if twice {
					calls["into one buffer twice"] = func() error {
						return GatherRowsTwice(b, to[0].buf, to[0].buf, sb, bind, to[1].bind, c.n, c.words)
					}
					calls["no second pairs"] = func() error {
						return GatherRowsTwice(b, to[0].buf, to[1].buf, sb, bind, gpu.Binding{}, c.n, c.words)
					}
					calls["from the second destination"] = func() error {
						return GatherRowsTwice(b, to[0].buf, to[1].buf, to[1].buf, bind, to[1].bind, c.n, c.words)
					}
				}
				for name, call := range calls {
					if err := call(); err == nil {
						t.Errorf("%s: accepted", name)
					}
				}
				if b.Len() != 0 {
					t.Errorf("%d dispatches recorded by refused calls", b.Len())
				}
			})
		}
	}
}

// TestAdvanceRows: the first T rows of a rows buffer move one position on
// — slot, position and base, from random values — their sequence and mask
// kept; the rows after them (random words standing in for any) untouched;
// called twice, twice on. Bad calls are refused.
func TestAdvanceRows(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, T := range []int{1, 5, 64, 65, 300} {
		words := make([]uint32, (T+3)*RowWords) // 3 rows past T
		for i := range words {
			words[i] = r.Uint32() >> 1 // no wrap-around at +2
		}
		buf := uploadU32(t, d, "rows", words)
		run(t, d, "advance rows", func(b *gpu.Batch) error {
			if err := AdvanceRows(b, buf, T); err != nil {
				return err
			}
			return AdvanceRows(b, buf, T)
		})
		got, err := buf.ReadU32()
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(words)
		for row := range T {
			for _, w := range []int{1, 2, 3} { // slot, pos, base (prelude.wgsl's Row)
				want[row*RowWords+w] += 2
			}
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("T %d: word %d (row %d, field %d) = %d, want %d", T, i, i/RowWords, i%RowWords, got[i], want[i])
			}
		}
	}
	buf := uploadU32(t, d, "rows", make([]uint32, 2*RowWords))
	b, err := d.NewBatch("advance rows refused")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Discard()
	for _, T := range []int{0, -1, 3} {
		if err := AdvanceRows(b, buf, T); err == nil {
			t.Errorf("%d rows of a 2-row buffer: accepted", T)
		}
	}
}
