package cpu

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/tensor"
	"webdraft/weights"
)

// TestScreenedReadOut holds the embedded target's screened greedy
// read-out (the default) to the same engine's exact one (NoScreen):
// every row's argmax and top tokens the same, their log-probabilities and
// log-sum-exp within 2e-4 (the screened rest of the row enters the
// log-sum-exp only), over prompts of random tokens and the target's own
// greedy continuations (peaked rows), batches of verifications of 1–7
// rows with and without top tokens; and over a head whose argmax row is
// copied to lower rows, so that the largest logit ties exactly: the
// first of the tie, as the exact read-out takes it.
func TestScreenedReadOut(t *testing.T) {
	if !weights.Embedded() {
		t.Skip("no embedded weights")
	}
	m, err := checkpoint.LoadFS(weights.FS(), "target", checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	open := func(noScreen bool) *Engine {
		e, err := New(m.Config, m.Weights, Options{KVBytes: 64 << 20, NoScreen: noScreen, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	screened, exact := open(false), open(true)
	if !screened.screen {
		t.Skip("the machine runs no screening kernel (AVX-512 VNNI, GOEXPERIMENT=simd)")
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 11))
	prompts := make([][]int, 6)
	for i := range prompts {
		prompts[i] = make([]int, 8+rng.IntN(40))
		for j := range prompts[i] {
			prompts[i][j] = rng.IntN(5000)
		}
	}
	// Peaked rows: the target's own continuation of half of them.
	for i := range 3 {
		seq, err := exact.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		cont, err := engine.Draft(context.Background(), exact, seq, prompts[i], 24)
		seq.Release()
		if err != nil {
			t.Fatal(err)
		}
		prompts[i] = append(prompts[i], engine.IDs(cont)...)
	}
	sameReadOuts(t, screened, exact, prompts, rng)

	// Ties: the exact argmax of the first prompt's last row copied to
	// rows below it (and one above), read out with the row before.
	rows := verifyAll(t, exact, prompts[:1], []int{2}, 0)
	top := rows[0][1].Argmax
	head, ok := m.Weights.LMHead.(*tensor.Int4)
	if !ok || top < 4 {
		t.Skipf("the head is %T, its argmax row %d: no tie to make", m.Weights.LMHead, top)
	}
	tied := *head
	tied.QWeight, tied.Scales = append([]uint32(nil), head.QWeight...), append([]uint16(nil), head.Scales...)
	for _, r := range []int{top / 2, top - 1, min(top+1, tied.Rows-1)} {
		copyRow(&tied, r, top)
	}
	// Near ties: copies of the row a code step apart in one column each,
	// their exact logits apart by less than the screen's error, so that
	// the screened order among them need not be the exact one.
	var near []int
	for c := range 24 {
		r := tied.Rows - 1 - 5*c
		copyRow(&tied, r, top)
		col := rng.IntN(tied.Cols)
		word := &tied.QWeight[r*tied.Cols/8+col/8]
		shift := 4 * uint(col%8)
		code := *word >> shift & 0xF
		if code == 15 || code > 0 && c%2 == 1 {
			code--
		} else {
			code++
		}
		*word = *word&^(0xF<<shift) | code<<shift
		near = append(near, r)
	}
	w := *m.Weights
	w.LMHead = &tied // the embedding, tied or not, stays the original

	openTied := func(noScreen bool) *Engine {
		e, err := New(m.Config, &w, Options{KVBytes: 64 << 20, NoScreen: noScreen, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	ts, te := openTied(false), openTied(true)
	got, want := verifyAll(t, ts, prompts[:1], []int{2}, 5)[0][1], verifyAll(t, te, prompts[:1], []int{2}, 5)[0][1]
	if !ts.pass.screened {
		t.Fatal("a read-out of two greedy rows did not screen")
	}
	if want.Argmax != top/2 && !slices.Contains(near, want.Argmax) {
		t.Fatalf("the tied head's exact argmax %d, want the first of the tie, %d, or a near tie (rows %v)", want.Argmax, top/2, near)
	}
	if got.Argmax != want.Argmax || len(got.Top) != len(want.Top) {
		t.Fatalf("a tie: screened argmax %d, top %v; exact %d, %v", got.Argmax, got.Top, want.Argmax, want.Top)
	}
	for k := range want.Top {
		if got.Top[k].Token != want.Top[k].Token {
			t.Fatalf("ties and near ties (rows %v): screened top %v, exact %v", near, got.Top, want.Top)
		}
	}
}

// copyRow sets row dst of m to row src's codes and scales.
func copyRow(m *tensor.Int4, dst, src int) {
	words, groups := m.Cols/8, m.Cols/m.GroupSize
	copy(m.QWeight[dst*words:(dst+1)*words], m.QWeight[src*words:(src+1)*words])
	copy(m.Scales[dst*groups:(dst+1)*groups], m.Scales[src*groups:(src+1)*groups])
}

// sameReadOuts verifies every prompt's last 1–7 tokens as a batch on both
// engines, with and without top tokens, and compares the rows.
func sameReadOuts(t *testing.T, screened, exact *Engine, prompts [][]int, rng *rand.Rand) {
	t.Helper()
	for _, topN := range []int{0, 5} {
		outs := make([]int, len(prompts))
		for i := range outs {
			outs[i] = 1 + rng.IntN(7)
		}
		got, want := verifyAll(t, screened, prompts, outs, topN), verifyAll(t, exact, prompts, outs, topN)
		var worst float64
		for i := range want {
			for j, w := range want[i] {
				g := got[i][j]
				d := max(math.Abs(float64(g.ArgmaxLogprob-w.ArgmaxLogprob)), math.Abs(float64(g.LogSumExp-w.LogSumExp)))
				worst = max(worst, d)
				if g.Argmax != w.Argmax || d > 2e-3*max(1, math.Abs(float64(w.LogSumExp))) || len(g.Top) != len(w.Top) {
					t.Fatalf("top %d, prompt %d row %d: screened argmax %d (log p %v, lse %v), exact %d (%v, %v)",
						topN, i, j, g.Argmax, g.ArgmaxLogprob, g.LogSumExp, w.Argmax, w.ArgmaxLogprob, w.LogSumExp)
				}
				for k := range w.Top {
					if g.Top[k].Token != w.Top[k].Token || math.Abs(float64(g.Top[k].Logprob-w.Top[k].Logprob)) > 2e-3*max(1, math.Abs(float64(w.LogSumExp))) {
						t.Fatalf("top %d, prompt %d row %d: screened top %v, exact %v", topN, i, j, g.Top, w.Top)
					}
				}
			}
		}
		t.Logf("top %d: log-probabilities within %.2g of the exact read-out's", topN, worst)
	}
}

// verifyAll feeds each prompt to a fresh sequence of e in one Verify,
// reading out its last outs[i] rows with topN top tokens.
func verifyAll(t *testing.T, e *Engine, prompts [][]int, outs []int, topN int) [][]engine.VerifyRow {
	t.Helper()
	batch := make([]*engine.VerifyEntry, len(prompts))
	for i, p := range prompts {
		seq, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		defer seq.Release()
		batch[i] = &engine.VerifyEntry{Seq: seq, Tokens: p, Out: outs[i], TopN: topN}
	}
	if err := e.Verify(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	rows := make([][]engine.VerifyRow, len(batch))
	for i, v := range batch {
		rows[i] = v.Rows
	}
	return rows
}

// TestCutBelow: for screened logits within a bound of exact ones, placed
// so that the screened order among the largest is not the exact one,
// every one of the k largest exact logits is screened at or above the
// cut; and a cut is refused over too few logits or a NaN.
func TestCutBelow(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 12))
	for trial := range 2000 {
		n, k := 2+rng.IntN(40), 1+rng.IntN(5)
		bound := rng.Float64() * 0.5
		exact, screened := make([]float32, n), make([]float32, n)
		for i := range exact {
			exact[i] = float32(rng.NormFloat64())
			if i > 0 && rng.IntN(3) == 0 {
				exact[i] = exact[rng.IntN(i)] + float32(rng.NormFloat64()*bound) // near ties
			}
			// Each screened value anywhere within the bound, its ends included.
			d := bound * (2*rng.Float64() - 1)
			if rng.IntN(4) == 0 {
				d = bound * float64(1-2*rng.IntN(2))
			}
			screened[i] = float32(float64(exact[i]) + d)
			if math.Abs(float64(screened[i]-exact[i])) > bound { // f32 rounding past the bound
				screened[i] = exact[i]
			}
		}
		if k > n {
			k = n
		}
		at, ok := cutBelow(slices.Clone(screened), k, bound)
		if !ok {
			t.Fatalf("trial %d: no cut over %d logits", trial, n)
		}
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(exact[b], exact[a]) })
		for _, i := range order[:k] {
			if screened[i] < at {
				t.Fatalf("trial %d: exact top-%d logit %v screened at %v, below the cut %v (bound %v)", trial, k, exact[i], screened[i], at, bound)
			}
		}
	}
	if _, ok := cutBelow([]float32{1, 2}, 3, 0.1); ok {
		t.Error("a cut over fewer logits than asked for")
	}
	if _, ok := cutBelow([]float32{1, 2}, 1, math.NaN()); ok {
		t.Error("a cut at a NaN bound")
	}
}
