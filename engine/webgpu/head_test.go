package webgpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/enginetest"
	"webdraft/gpu/gputest"
	"webdraft/reference"
)

// headOracle computes what a head sequence holds from scratch with
// reference.Head: token i ≥ 1 of text is a row over the target's features
// at position i−1 where the target holds it, else over the row before's
// output.
type headOracle struct {
	t    *testing.T
	ref  *reference.Model
	head *reference.Head
	// tol bounds the relative error of the logits and the output before
	// norm, lpTol the absolute error of log-probabilities.
	tol, lpTol float64
}

// rows returns the rows of a head sequence of text whose target holds
// targetText.
func (o *headOracle) rows(text, targetText []int) []reference.HeadRow {
	o.t.Helper()
	return enginetest.HeadRows(o.t, o.ref, o.head, text, targetText)
}

// headTol is how far a head step's logits and output before norm may be
// from the reference's, relatively (f32 math over one layer and fc, sums
// in another order); headLogprobTol the absolute tolerance of its
// log-probabilities. An f16 KV cache widens both to f16 storage's
// (headTolF16).
const (
	headTol        = 1e-4
	headLogprobTol = 1e-4
	headTolF16     = 2e-3
)

// logits reads back the read-out logits of entry i of h's last step, and
// the output before norm the head keeps for seq.
func (h *Head) lastLogits(t *testing.T, i int) []float32 {
	t.Helper()
	Vd := uint64(h.cfg.DraftVocabSize)
	raw, err := h.act.logits.Read(uint64(i)*Vd*4, Vd*4)
	if err != nil {
		t.Fatal(err)
	}
	return f32s(raw)
}

func (h *Head) keptOutput(t *testing.T, seq engine.Sequence) []float32 {
	t.Helper()
	H := uint64(h.cfg.HiddenSize)
	row := uint64(h.act.R + seq.(*headSequence).kv.Slot())
	raw, err := h.act.hid.Read(row*H*4, H*4)
	if err != nil {
		t.Fatal(err)
	}
	return f32s(raw)
}

func f32s(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i, w := range u32s(raw) {
		out[i] = math.Float32frombits(w)
	}
	return out
}

// check holds a head step's read-out — its entry, the pass's logits for
// entry i and the sequence's kept output — to the oracle's last row: the
// logits and the output within o.tol, Next the reference's argmax (or a
// near tie: logits within 1e-3 of the largest |logit|, as the engine
// suite holds greedy tokens), Logprob and each of Top within o.lpTol of
// the reference's, Top in the reference's order but for near ties.
func (o *headOracle) check(what string, h *Head, en *engine.Entry, i int, text, targetText []int) {
	o.t.Helper()
	rows := o.rows(text, targetText)
	want := rows[len(rows)-1]
	tol, lpTol := o.tol, o.lpTol
	el, eh := enginetest.RelErr(h.lastLogits(o.t, i), want.Logits), enginetest.RelErr(h.keptOutput(o.t, en.Seq), want.Hidden)
	o.t.Logf("%s: logits %.2g, output before norm %.2g from the reference's", what, el, eh)
	if el > tol {
		o.t.Errorf("%s: logits %.2g from the reference's", what, el)
	}
	if eh > tol {
		o.t.Errorf("%s: the output before norm %.2g from the reference's", what, eh)
	}
	enginetest.CheckHeadRead(o.t, what, o.head, want, en.Next, en.Logprob, en.Top, en.TopN, lpTol)
}

// headRig is a tiny target keeping the features of eagle3.DefaultAux's
// layers, a random head over it on the device and the oracle.
type headRig struct {
	target *Engine
	head   *Head
	oracle *headOracle
	cfg    eagle3.Config
	w      *eagle3.Weights
}

func newHeadRig(t *testing.T, int4 bool, opts HeadOptions) *headRig {
	t.Helper()
	c := enginetest.TinyHeadConfig()
	target, ref, m := tinyTarget(t, NewGroup(gputest.Device(t)), enginetest.HeadLayers, eagle3.DefaultAux(enginetest.HeadLayers))
	w := enginetest.RandomHead(c, 11, false)
	if int4 {
		w = enginetest.QuantizeHead(t, c, w)
	}
	if opts.KVBytes == 0 {
		opts.KVBytes, opts.MaxSequences, opts.KV = 1<<20, 8, "f32"
	}
	h, err := NewHead(target, c, w, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	rh, err := reference.NewHead(c, w, m.Weights.EmbedTokens)
	if err != nil {
		t.Fatal(err)
	}
	o := &headOracle{t: t, ref: ref, head: rh, tol: headTol, lpTol: headLogprobTol}
	if h.kv.F16 {
		o.tol, o.lpTol = headTolF16, headTolF16
	}
	return &headRig{target: target, head: h, oracle: o, cfg: c, w: w}
}

// TestHead holds webgpu.Head to reference.Head (int4 weights, f32 KV
// cache): a prompt over the target's features, draft steps past the
// target (the head's own output), a rollback (Truncate drops the drafted
// rows) and a re-feed over the target's features, a feed whose rows read
// the target's features then the head's own output within the step
// (stages), engine.StepN, and the same text fed token by token; every
// step's logits and output before norm within headTol of the
// reference's, Next the reference's, Logprob and Top within
// headLogprobTol.
func TestHead(t *testing.T) {
	testHead(t, newHeadRig(t, true, HeadOptions{}))
}

// TestHeadF32: the same over a head of f32 weights, on an f16 KV cache
// (the f16 keys and values widen the tolerance).
func TestHeadF32(t *testing.T) {
	testHead(t, newHeadRig(t, false, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, KV: "f16"}))
}

// TestHeadPasses: the same with passes of five rows, so that a prompt's
// rows take several passes of one stage.
func TestHeadPasses(t *testing.T) {
	testHead(t, newHeadRig(t, true, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, MaxRows: 5, KV: "f32"}))
}

func testHead(t *testing.T, rig *headRig) {
	ctx := context.Background()
	h, target, o := rig.head, rig.target, rig.oracle
	check := func(what string, en *engine.Entry, text, ttext []int) {
		t.Helper()
		o.check(what, h, en, 0, text, ttext)
	}
	tseq := enginetest.NewSequence(t, target)
	defer tseq.Release()
	hseq := enginetest.NewSequence(t, h)
	defer hseq.Release()
	prompt := []int{3, 17, 5, 9, 30, 200}
	ttext := slices.Clone(prompt)
	next := enginetest.TargetStep(t, target, tseq, prompt...)
	text := append(slices.Clone(prompt), next)

	// The prompt and the target's token: rows 0 … 5 over the target's
	// features.
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: text, TopN: 5}
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	check("prompt", en, text, ttext)
	// Two draft steps past the target: rows 6 and 7 over the head's output.
	for k := range 2 {
		text = append(text, en.Next)
		en.Tokens = []int{en.Next}
		if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("draft step %d", k+1), en, text, ttext)
	}
	if hseq.Len() != 9 {
		t.Fatalf("the head holds %d tokens, want 9", hseq.Len())
	}
	// The target takes its token and the first draft, then another token:
	// the head keeps the rows over the target's features (7 tokens) and
	// computes the first draft's row again from the target's.
	d1 := text[7]
	ttext = append(ttext, text[6], d1)
	b := enginetest.TargetStep(t, target, tseq, text[6], d1)
	hseq.Truncate(9)
	if hseq.Len() != 7 {
		t.Fatalf("Truncate(9) kept %d tokens, want 7 (the rows over the target's features and one)", hseq.Len())
	}
	text = append(text[:7], d1, b)
	en.Tokens = []int{d1, b}
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	check("re-fed over the target's features", en, text, ttext)
	// The target holds b's position; a feed of three: one row over the
	// target's features, two over the head's output within the step.
	ttext = append(ttext, b)
	enginetest.TargetStep(t, target, tseq, b)
	three := []int{en.Next, 60, 61}
	text = append(text, three...)
	en.Tokens = three
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	check("a feed over the target's features then the head's output", en, text, ttext)
	// engine.StepN: drafts as Steps do.
	toks, err := engine.StepN(ctx, h, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{en.Next}}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, en.Next)
	for _, tk := range toks[0][:2] {
		text = append(text, tk.ID)
	}
	check("StepN", &engine.Entry{Seq: hseq, Next: toks[0][2].ID, Logprob: toks[0][2].Logprob}, text, ttext)

	// The same text token by token on another sequence: every row.
	one := enginetest.NewSequence(t, h)
	defer one.Release()
	if err := h.Step(ctx, []*engine.Entry{{Seq: one, Target: tseq, Tokens: text[:2]}}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i < len(text); i++ {
		en := &engine.Entry{Seq: one, Target: tseq, Tokens: text[i : i+1], TopN: 3}
		if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		check(fmt.Sprintf("token by token, token %d", i), en, text[:i+1], ttext)
	}
}

// TestHeadLongPrompt: a prompt of 100 rows over the target's features in
// passes of 80 rows, beside an entry of 2 rows: the first pass holds the
// short entry's rows (decode attention) and 78 of the long one's (prefill
// tiles, where the device's prefill kernel takes head_dim 32), the second
// the long one's last 22 (decode attention); then draft steps past the
// target.
func TestHeadLongPrompt(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, MaxRows: 80, KV: "f32"})
	ctx := context.Background()
	h, target, o := rig.head, rig.target, rig.oracle
	rng := rand.New(rand.NewPCG(5, 5))
	long := make([]int, 100)
	for i := range long {
		long[i] = rng.IntN(256)
	}
	var tseqs, hseqs []engine.Sequence
	var texts, ttexts [][]int
	for _, p := range [][]int{{4, 8, 15}, long} {
		tseq := enginetest.NewSequence(t, target)
		defer tseq.Release()
		hseq := enginetest.NewSequence(t, h)
		defer hseq.Release()
		next := enginetest.TargetStep(t, target, tseq, p...)
		tseqs, hseqs = append(tseqs, tseq), append(hseqs, hseq)
		texts, ttexts = append(texts, append(slices.Clone(p), next)), append(ttexts, p)
	}
	batch := []*engine.Entry{
		{Seq: hseqs[0], Target: tseqs[0], Tokens: texts[0][:3], TopN: 2},
		{Seq: hseqs[1], Target: tseqs[1], Tokens: texts[1], TopN: 2},
	}
	texts[0] = texts[0][:3]
	ps := h.passes(mustFeeds(t, h, batch))
	if len(ps) != 2 || ps[0].rows != 80 || ps[1].rows != 22 || ps[1].decode != 22 {
		t.Fatalf("passes %+v: want 80 rows, then 22 in decode attention", ps)
	}
	if h.kv.PrefillSupported() && ps[0].decode != 2 {
		t.Errorf("the first pass's decode rows: %d, want the short entry's 2", ps[0].decode)
	} else if !h.kv.PrefillSupported() {
		t.Log("the device's prefill kernel does not take head_dim 32: every row through decode attention")
	}
	if err := h.Step(ctx, batch); err != nil {
		t.Fatal(err)
	}
	o.check("a short prompt", h, batch[0], 0, texts[0], ttexts[0])
	o.check("a long prompt beside it", h, batch[1], 1, texts[1], ttexts[1])
	for k := range 2 {
		for i, en := range batch {
			texts[i] = append(texts[i], en.Next)
			en.Tokens = []int{en.Next}
		}
		if err := h.Step(ctx, batch); err != nil {
			t.Fatal(err)
		}
		for i, en := range batch {
			o.check(fmt.Sprintf("entry %d's draft step %d", i, k+1), h, en, i, texts[i], ttexts[i])
		}
	}
}

// mustFeeds plans a batch as Step would.
func mustFeeds(t *testing.T, h *Head, batch []*engine.Entry) []headFeed {
	t.Helper()
	f, err := h.stepFeeds(batch)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestHeadBatch: enginetest.HeadBatch, a batch against its entries alone.
func TestHeadBatch(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadBatch(t, rig.head, rig.target, headLogprobTol)
}

// TestHeadTruncate: enginetest.HeadTruncate, Truncate's and KeepPath's
// rules for a head.
func TestHeadTruncate(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadTruncate(t, rig.head, rig.target)
}

// TestHeadTargetTree: a Target sequence holding a token tree past its line
// gives the head its line's features only: the rows past the line read the
// head's own output, as over the same line without the tree. Once the
// target keeps a path of its tree (KeepPath, the moves made on the device
// by the head's step, before any pass of the target's), the head reads
// the features of the path as the line's.
func TestHeadTargetTree(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	ctx := context.Background()
	h, target, o := rig.head, rig.target, rig.oracle
	line := []int{1, 2, 3}
	var next []int
	var tseqs []engine.Sequence
	for _, tree := range []bool{false, true} {
		tseq := enginetest.NewSequence(t, target)
		enginetest.TargetStep(t, target, tseq, line...)
		if tree {
			// Roots 4 and 5; 6 under 5.
			v := &engine.VerifyEntry{Seq: tseq, Tokens: []int{4, 5, 6}, Parents: []int{2, 2, 4}, Out: 3}
			if err := target.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
		}
		hseq := enginetest.NewSequence(t, h)
		en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: []int{1, 2, 3, 4, 5}}
		if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
			t.Fatal(err)
		}
		next = append(next, en.Next)
		if s := hseq.(*headSequence); s.targetRows != 3 {
			t.Errorf("tree %v: %d rows over the target's features, want 3", tree, s.targetRows)
		}
		tseqs = append(tseqs, tseq)
	}
	if next[0] != next[1] {
		t.Errorf("over a target with a tree the head drafts %d, over its line %d", next[1], next[0])
	}
	// Keep 5, 6 (slots 4 and 5): moved to positions 3 and 4.
	tseq := tseqs[1]
	if err := tseq.KeepPath([]int{4, 5}); err != nil {
		t.Fatal(err)
	}
	hseq := enginetest.NewSequence(t, h)
	text := []int{1, 2, 3, 5, 6, 7}
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: text, TopN: 4}
	if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	o.check("over a kept path", h, en, 0, text, text[:5])
}

// TestHeadRefusals: NewHead refuses a head that does not fit its target, a
// target without the head's features, and incomplete weights; Step
// refuses an entry without its Target or with another engine's, tree
// nodes (the head drafts its trees through Verify: DraftsTrees), token 0
// alone, a row over features the target does not hold.
func TestHeadRefusals(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	c, w, target := rig.cfg, rig.w, rig.target
	bad := func(name string, want string, tc eagle3.Config, tw *eagle3.Weights, te *Engine) {
		t.Helper()
		_, err := NewHead(te, tc, tw, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: NewHead: %v, want an error naming %q", name, err, want)
		}
	}
	wide := c
	wide.TargetHiddenSize = 128
	bad("another target width", "target_hidden_size", wide, w, target)
	vocab := c
	vocab.VocabSize = 300
	bad("another vocabulary", "vocabulary", vocab, w, target)
	aux := c
	aux.AuxLayers = []int{1, 2, 3}
	bad("other layers", "FeatureLayers", aux, w, target)
	g := target.g
	plain, _, _ := tinyTarget(t, g, enginetest.HeadLayers, nil)
	bad("a target without features", "FeatureLayers", c, w, plain)
	shuffled, _, _ := tinyTarget(t, g, enginetest.HeadLayers, []int{5, 4, 2})
	bad("the features in another order", "FeatureLayers", c, w, shuffled)
	noFC := *w
	noFC.FC = nil
	bad("no fc", "fc.weight", c, &noFC, target)
	ids := *w
	ids.TargetIDs = ids.TargetIDs[1:]
	bad("a short d2t", "target ids", c, &ids, target)
	if _, err := NewHead(target, c, w, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, KV: "f8"}); err == nil {
		t.Error("a KV cache of f8: accepted")
	}
	// Unsized, the head's cache holds the target's positions (and less
	// than a block more): no more memory than the target's sequences use.
	sized, err := NewHead(target, c, w, HeadOptions{MaxSequences: 8})
	if err != nil {
		t.Fatalf("NewHead with its cache sized by the target's: %v", err)
	}
	if n, tn := sized.KVCapacity(), target.KVCapacity(); n < tn || n >= tn+16 {
		t.Errorf("KVCapacity() = %d with the default size, want the target's %d rounded up to a block of 16", n, tn)
	}
	if err := sized.Close(); err != nil {
		t.Fatal(err)
	}

	h := rig.head
	other := enginetest.NewSequence(t, plain)
	enginetest.TargetStep(t, plain, other, 1, 2, 3)
	enginetest.HeadStepRefusals(t, h, target, other, "webgpu head: ")
	if !engine.DraftsTrees(h) {
		t.Error("the head drafts no token trees")
	}
	hc := h.Config()
	if hc.NumHiddenLayers != 1 || hc.VocabSize != 256 || hc.MaxPositionEmbeddings != target.Config().MaxPositionEmbeddings || hc.HiddenSize != c.HiddenSize {
		t.Errorf("Config() = %+v", hc)
	}
	if info := h.Info(); info.Backend != "webgpu" || !strings.Contains(info.Adapter, "EAGLE-3") {
		t.Errorf("Info() = %+v", info)
	}
	blocks := (1 << 20) / (16 * 2 * c.NumKeyValueHeads * c.HeadDim * 4)
	if n := h.KVCapacity(); n != (blocks-8)*16 {
		t.Errorf("KVCapacity() = %d, want %d", n, (blocks-8)*16)
	}
	if engine.Fault(h) != nil || engine.KVBlockSize(h) != 16 {
		t.Errorf("Fault %v, KV block size %d", engine.Fault(h), engine.KVBlockSize(h))
	}
	// Closed: the head refuses every call; a second Close does nothing.
	seq := enginetest.NewSequence(t, h)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	tseq := enginetest.NewSequence(t, target)
	enginetest.TargetStep(t, target, tseq, 1, 2, 3)
	if err := h.Step(context.Background(), []*engine.Entry{{Seq: seq, Target: tseq, Tokens: []int{1, 2, 3, 4}}}); err == nil {
		t.Error("a step of a closed head: accepted")
	}
	if _, err := h.NewSequence(); err == nil {
		t.Error("a sequence of a closed head: accepted")
	}
	if err := h.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if info := h.Info(); info.Backend != "webgpu" || h.KVCapacity() != (blocks-8)*16 {
		t.Errorf("after Close: Info() = %+v, KVCapacity() = %d", info, h.KVCapacity())
	}
}

// TestHeadOwnEmbedding: a head with an embedding of its own embeds with it,
// not the target's.
func TestHeadOwnEmbedding(t *testing.T) {
	c := enginetest.TinyHeadConfig()
	target, ref, m := tinyTarget(t, NewGroup(gputest.Device(t)), enginetest.HeadLayers, eagle3.DefaultAux(enginetest.HeadLayers))
	w := enginetest.QuantizeHead(t, c, enginetest.RandomHead(c, 5, true))
	h, err := NewHead(target, c, w, HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, KV: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	rh, err := reference.NewHead(c, w, m.Weights.EmbedTokens)
	if err != nil {
		t.Fatal(err)
	}
	o := &headOracle{t: t, ref: ref, head: rh, tol: headTol, lpTol: headLogprobTol}
	tseq := enginetest.NewSequence(t, target)
	text := []int{4, 8, 15, 16, 23}
	enginetest.TargetStep(t, target, tseq, text...)
	hseq := enginetest.NewSequence(t, h)
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: append(slices.Clone(text), 42)}
	if err := h.Step(context.Background(), []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	o.check("own embedding", h, en, 0, en.Tokens, text)
}

// TestHeadPropose: the head samples its drafts on the device
// (enginetest.HeadProposals): scattered over the vocabulary, drawn by
// propose.wgsl, q kept in the group's Q store.
func TestHeadPropose(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	enginetest.HeadProposals(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head)
}
