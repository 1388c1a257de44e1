package enginetest

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/tensor"
)

// HeadLayers is the depth of the tiny target the engines' EAGLE-3 head
// tests use: eagle3.DefaultAux(8) is layers 2, 4 and 5.
const HeadLayers = 8

// TinyHeadConfig is a head that fits that tiny target (synth's "tiny": 64
// wide, 256 tokens, 128 positions), reading eagle3.DefaultAux's layers.
func TinyHeadConfig() eagle3.Config {
	return eagle3.Config{
		HiddenSize: 64, IntermediateSize: 128, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 128, VocabSize: 256, DraftVocabSize: 100,
		TargetHiddenSize: 64,
	}
}

// RandomHead returns random f32 weights for c: matrices of small normal
// values (std scale/√cols), norms near one, the draft vocabulary a sorted
// random subset of the target's, and an embedding of its own with
// ownEmbed.
func RandomHead(c eagle3.Config, seed uint64, ownEmbed bool) *eagle3.Weights {
	rng := rand.New(rand.NewPCG(seed, 3))
	w := &eagle3.Weights{}
	matrix := func(rows, cols int, scale float64) *tensor.F32 {
		m := &tensor.F32{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
		for i := range m.Data {
			m.Data[i] = float32(rng.NormFloat64() * scale / math.Sqrt(float64(cols)))
		}
		return m
	}
	for _, s := range w.Slots(&c) {
		if s.Vector != nil {
			v := make([]float32, s.Shape[0])
			for i := range v {
				v[i] = float32(1 + 0.1*rng.NormFloat64())
			}
			*s.Vector = v
			continue
		}
		*s.Matrix = matrix(s.Shape[0], s.Shape[1], 1)
	}
	w.LMHead = matrix(c.DraftVocabSize, c.HiddenSize, 4) // logits of a few units
	if ownEmbed {
		w.EmbedTokens = matrix(c.VocabSize, c.HiddenSize, 8)
	}
	for _, tok := range rng.Perm(c.VocabSize)[:c.DraftVocabSize] {
		w.TargetIDs = append(w.TargetIDs, int32(tok))
	}
	slices.Sort(w.TargetIDs)
	return w
}

// QuantizeHead returns w with every matrix quantized to int4 (groups of
// 32 columns).
func QuantizeHead(t *testing.T, c eagle3.Config, w *eagle3.Weights) *eagle3.Weights {
	t.Helper()
	q := *w
	for _, s := range q.Slots(&c) {
		if s.Matrix == nil {
			continue
		}
		m := (*s.Matrix).(*tensor.F32)
		qm, err := tensor.QuantizeInt4(m.Data, m.Rows, m.Cols, tensor.DefaultGroupSize)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		*s.Matrix = qm
	}
	return &q
}

// HeadRows computes from scratch, with reference.Head, the rows of a head
// sequence of text whose target holds targetText: token i ≥ 1 of text is
// a row over the target's features at position i−1 where the target holds
// it, else over the row before's output.
func HeadRows(t *testing.T, ref *reference.Model, head *reference.Head, text, targetText []int) []reference.HeadRow {
	t.Helper()
	var feats [][]float32
	if len(targetText) > 0 {
		feats = Features(t, ref, targetText, head.Config().Aux(ref.Config().NumHiddenLayers))
	}
	seq := head.NewSequence()
	var rows []reference.HeadRow
	for i := 1; i < len(text); i++ {
		j := i - 1
		var hidden []float32
		if j < len(feats) {
			hidden = feats[j]
		} else {
			hidden = rows[j-1].Hidden
		}
		r, err := head.Forward(seq, []int{text[i]}, [][]float32{hidden})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r[0])
	}
	return rows
}

// Features is the reference's features over tokens for the given layers,
// in their order: per position, the residual stream entering each.
func Features(t *testing.T, ref *reference.Model, tokens []int, layers []int) [][]float32 {
	t.Helper()
	asc := slices.Sorted(slices.Values(layers))
	_, feats, err := ref.ForwardFeatures([]reference.Input{{Seq: ref.NewSequence(), Tokens: tokens}}, []int{1}, asc)
	if err != nil {
		t.Fatal(err)
	}
	H := ref.Config().HiddenSize
	out := make([][]float32, len(tokens))
	for i, f := range feats[0] {
		for _, l := range layers {
			a := slices.Index(asc, l)
			out[i] = append(out[i], f[a*H:(a+1)*H]...)
		}
	}
	return out
}

// RelErr is max|a−b| / max|b|; a NaN in a makes it +Inf.
func RelErr(a, b []float32) float64 {
	var d, m float64
	for i := range b {
		if math.IsNaN(float64(a[i])) {
			return math.Inf(1)
		}
		d = max(d, math.Abs(float64(a[i]-b[i])))
		m = max(m, math.Abs(float64(b[i])))
	}
	return d / m
}

// LogSumExp is log Σ exp(x).
func LogSumExp(x []float32) float32 {
	m := slices.Max(x)
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v - m))
	}
	return m + float32(math.Log(s))
}

// NewSequence is a new sequence of e; the test stops if e refuses one.
func NewSequence(t testing.TB, e engine.Engine) engine.Sequence {
	t.Helper()
	seq, err := e.NewSequence()
	if err != nil {
		t.Fatalf("NewSequence: %v", err)
	}
	return seq
}

// TargetStep feeds tokens to the target's sequence seq and returns its
// greedy next token.
func TargetStep(t *testing.T, e engine.Engine, seq engine.Sequence, tokens ...int) int {
	t.Helper()
	en := &engine.Entry{Seq: seq, Tokens: tokens}
	if err := e.Step(context.Background(), []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	return en.Next
}

// HeadStepRefusals checks the draft steps an EAGLE-3 head h drafting for
// target refuses, with an error that begins with prefix and no token fed:
// an entry without its Target, with other (a sequence of another engine)
// or a released sequence as its Target, with a target's sequence as its
// own, with tree nodes, with token 0 alone or a token outside the
// vocabulary, and one over features the target does not hold; a batch
// that repeats a sequence changes neither entry, and rows past the
// target's end read the rows before them (accepted). Verify without a
// Target is refused, and engine.ReadsTarget(h) is target.
func HeadStepRefusals(t *testing.T, h, target engine.Engine, other engine.Sequence, prefix string) {
	t.Helper()
	ctx := context.Background()
	tseq := NewSequence(t, target)
	defer tseq.Release()
	TargetStep(t, target, tseq, 1, 2, 3)
	gone := NewSequence(t, target)
	gone.Release()
	empty := NewSequence(t, target)
	defer empty.Release()
	for _, tc := range []struct {
		name string
		en   func(seq engine.Sequence) *engine.Entry
	}{
		{"no Target", func(s engine.Sequence) *engine.Entry { return &engine.Entry{Seq: s, Tokens: []int{1, 2}} }},
		{"another engine's Target", func(s engine.Sequence) *engine.Entry {
			return &engine.Entry{Seq: s, Target: other, Tokens: []int{1, 2}}
		}},
		{"a released Target", func(s engine.Sequence) *engine.Entry {
			return &engine.Entry{Seq: s, Target: gone, Tokens: []int{1, 2}}
		}},
		{"a target's sequence as the head's", func(s engine.Sequence) *engine.Entry {
			return &engine.Entry{Seq: tseq, Target: tseq, Tokens: []int{1, 2}}
		}},
		{"tree nodes", func(s engine.Sequence) *engine.Entry {
			return &engine.Entry{Seq: s, Target: tseq, Tokens: []int{1, 2}, Parents: []int{-1, 0}}
		}},
		{"token 0 alone", func(s engine.Sequence) *engine.Entry { return &engine.Entry{Seq: s, Target: tseq, Tokens: []int{1}} }},
		{"a token outside the vocabulary", func(s engine.Sequence) *engine.Entry {
			return &engine.Entry{Seq: s, Target: tseq, Tokens: []int{1, h.Config().VocabSize}}
		}},
		{"a row over features the target does not hold (position 0)", func(s engine.Sequence) *engine.Entry {
			return &engine.Entry{Seq: s, Target: empty, Tokens: []int{1, 2}}
		}},
	} {
		seq := NewSequence(t, h)
		if err := h.Step(ctx, []*engine.Entry{tc.en(seq)}); err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else if seq.Len() != 0 {
			t.Errorf("%s: refused, but the sequence holds %d tokens", tc.name, seq.Len())
		} else if !strings.HasPrefix(err.Error(), prefix) {
			t.Errorf("%s: %v: want an error beginning %q", tc.name, err, prefix)
		}
		seq.Release()
	}
	// Two feeds past the target's end in one step: the second reads the
	// first's output (stages) — accepted; a batch whose second entry is
	// refused changes neither.
	seq := NewSequence(t, h)
	defer seq.Release()
	ok := &engine.Entry{Seq: seq, Target: tseq, Tokens: []int{1, 2, 3, 4, 5}}
	bad := &engine.Entry{Seq: seq, Target: tseq, Tokens: []int{1, 2}}
	if err := h.Step(ctx, []*engine.Entry{ok, bad}); err == nil {
		t.Error("a batch repeating a sequence: accepted")
	}
	if seq.Len() != 0 {
		t.Errorf("a refused batch changed a sequence: %d tokens", seq.Len())
	}
	if err := h.Step(ctx, []*engine.Entry{ok}); err != nil {
		t.Errorf("rows 3 and 4 past a target of 3: %v", err)
	}
	if err := h.Verify(ctx, []*engine.VerifyEntry{{Seq: seq, Tokens: []int{1, 2}, Out: 1}}); err == nil {
		t.Error("Verify without a Target: accepted")
	}
	if engine.ReadsTarget(h) != target {
		t.Error("ReadsTarget(head) is not its target")
	}
}

// HeadTruncate checks an EAGLE-3 head h drafting for target (engine.Head's
// rules): Truncate keeps at most the rows over the target's features and
// one token, whatever n; a draft step whose row before is gone is refused
// and changes nothing; KeepPath on a line takes only the empty path; a
// released sequence is refused.
func HeadTruncate(t *testing.T, h, target engine.Engine) {
	t.Helper()
	ctx := context.Background()
	tseq := NewSequence(t, target)
	next := TargetStep(t, target, tseq, 1, 2, 3, 4)
	hseq := NewSequence(t, h)
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: []int{1, 2, 3, 4, next}}
	if _, err := engine.StepN(ctx, h, []*engine.Entry{en}, 3); err != nil {
		t.Fatal(err)
	}
	if hseq.Len() != 7 {
		t.Fatalf("the head holds %d tokens, want 7", hseq.Len())
	}
	hseq.Truncate(100)
	if hseq.Len() != 5 {
		t.Errorf("Truncate(100) kept %d tokens, want 5 (4 rows over the target's features and one)", hseq.Len())
	}
	hseq.Truncate(3)
	if hseq.Len() != 3 {
		t.Errorf("Truncate(3) kept %d tokens, want 3", hseq.Len())
	}
	// Token 3's row (row 2) reads the target's features at position 2: it
	// is computed again. Token 5 then reads row 3's output, the last.
	if err := h.Step(ctx, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{4, next, 9}}}); err != nil {
		t.Fatal(err)
	}
	hseq.Truncate(5)
	if err := h.Step(ctx, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{9}}}); err == nil {
		t.Error("a draft step over a row Truncate dropped: accepted")
	}
	if hseq.Len() != 5 {
		t.Errorf("a refused step changed the sequence: %d tokens, want 5", hseq.Len())
	}
	if err := hseq.KeepPath(nil); err != nil {
		t.Errorf("KeepPath(nil): %v", err)
	}
	if err := hseq.KeepPath([]int{4}); err == nil {
		t.Error("KeepPath of a node: accepted")
	}
	hseq.Release()
	if err := h.Step(ctx, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{9}}}); err == nil {
		t.Error("a released sequence: accepted")
	}
}

// HeadBatch checks that entries a head h steps in one batch equal each
// stepped alone — a prompt beside a draft step past the target, a feed of
// several stages beside one of one —: the same Next and top tokens, their
// log-probabilities within tol.
func HeadBatch(t *testing.T, h, target engine.Engine, tol float64) {
	t.Helper()
	ctx := context.Background()
	prompts := [][]int{{3, 17, 5, 9, 30, 200}, {8, 1, 250, 4}}
	type side struct{ tseq, alone, batched engine.Sequence }
	var sides []side
	for _, p := range prompts {
		tseq := NewSequence(t, target)
		TargetStep(t, target, tseq, p...)
		a := NewSequence(t, h)
		b := NewSequence(t, h)
		sides = append(sides, side{tseq, a, b})
	}
	feeds := [][][]int{
		{prompts[0], prompts[1][:2]},
		{{7}, prompts[1][2:]},
		{{9, 10, 11}, {12}},
		{{13}, {14, 15}},
	}
	for k, f := range feeds {
		var alone, batch []*engine.Entry
		for i, s := range sides {
			en := &engine.Entry{Seq: s.alone, Target: s.tseq, Tokens: f[i], TopN: 3}
			if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
				t.Fatalf("step %d, entry %d alone: %v", k, i, err)
			}
			alone = append(alone, en)
			batch = append(batch, &engine.Entry{Seq: s.batched, Target: s.tseq, Tokens: f[i], TopN: 3})
		}
		if err := h.Step(ctx, batch); err != nil {
			t.Fatalf("step %d batched: %v", k, err)
		}
		for i, s := range sides {
			a, b := alone[i], batch[i]
			same := b.Next == a.Next && math.Abs(float64(b.Logprob-a.Logprob)) <= tol && len(a.Top) == len(b.Top)
			for j := range a.Top {
				same = same && a.Top[j].Token == b.Top[j].Token && math.Abs(float64(a.Top[j].Logprob-b.Top[j].Logprob)) <= tol
			}
			if !same {
				t.Errorf("step %d, entry %d: batched %d (%g) %v, alone %d (%g) %v", k, i, b.Next, b.Logprob, b.Top, a.Next, a.Logprob, a.Top)
			}
			if s.alone.Len() != s.batched.Len() {
				t.Errorf("step %d, entry %d: %d tokens batched, %d alone", k, i, s.batched.Len(), s.alone.Len())
			}
		}
	}
}

// CheckHeadRead holds a head's read-out of a row — its argmax next, the
// log-probability and the top tokens (topN asked) — to the reference's
// row want: next the reference's argmax (or a near tie: logits within
// 1e-3 of the largest |logit|, as the engine suite holds greedy tokens),
// logprob and each of top within tol of the reference's, top in the
// reference's order but for near ties.
func CheckHeadRead(t *testing.T, what string, rh *reference.Head, want reference.HeadRow, next int, logprob float32, top []sampling.TokenLogprob, topN int, tol float64) {
	t.Helper()
	best, err := reference.Argmax(want.Logits)
	if err != nil {
		t.Fatal(err)
	}
	lse := LogSumExp(want.Logits)
	draft := map[int]int{} // target token → draft token
	for d := range want.Logits {
		draft[rh.TargetToken(d)] = d
	}
	scale := 0.0
	for _, l := range want.Logits {
		scale = max(scale, math.Abs(float64(l)))
	}
	if tok := rh.TargetToken(best); next != tok {
		d, ok := draft[next]
		if !ok || math.Abs(float64(want.Logits[d]-want.Logits[best])) > 1e-3*scale {
			t.Errorf("%s: Next %d, the reference's %d", what, next, tok)
		}
	}
	if lp := want.Logits[best] - lse; math.Abs(float64(logprob-lp)) > tol {
		t.Errorf("%s: Logprob %g, the reference's %g", what, logprob, lp)
	}
	if len(top) != min(topN, len(want.Logits)) {
		t.Fatalf("%s: %d top tokens, want %d", what, len(top), topN)
	}
	order := make([]int, len(want.Logits))
	for d := range order {
		order[d] = d
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case want.Logits[a] > want.Logits[b]:
			return -1
		case want.Logits[a] < want.Logits[b]:
			return 1
		}
		return 0
	})
	for k, tl := range top {
		d, ok := draft[tl.Token]
		if !ok {
			t.Errorf("%s: top %d is token %d, not of the draft vocabulary", what, k, tl.Token)
			continue
		}
		// The token's own log-probability, and its rank's (a near tie may
		// swap two tokens).
		mine, rank := want.Logits[d]-lse, want.Logits[order[k]]-lse
		if math.Abs(float64(tl.Logprob-mine)) > tol || math.Abs(float64(mine-rank)) > tol {
			t.Errorf("%s: top %d is %+v, the reference's token %d (%g)", what, k, tl, rh.TargetToken(order[k]), rank)
		}
	}
}
