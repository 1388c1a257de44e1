package cpu

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/cpu/ops"
	"webdraft/engine/enginetest"
	"webdraft/reference"
	"webdraft/tensor"
)

// headOracle computes what a head sequence holds from scratch with
// reference.Head: token i ≥ 1 of text is a row over the target's features
// at position i−1 where the target holds it (feats), else over the row
// before's output.
type headOracle struct {
	t    *testing.T
	ref  *reference.Model
	head *reference.Head
}

// rows returns the rows of a head sequence of text whose target holds
// targetText.
func (o *headOracle) rows(text, targetText []int) []reference.HeadRow {
	o.t.Helper()
	return enginetest.HeadRows(o.t, o.ref, o.head, text, targetText)
}

// check holds a head step's read-out — its entry, the pass's logits for
// entry i and the sequence's last output — to the oracle's last row: the
// logits and the output within tol, the read-out as
// enginetest.CheckHeadRead holds it (log-probabilities within 1e-4).
func (o *headOracle) check(what string, h *Head, en *engine.Entry, i int, text, targetText []int, tol float64) {
	o.t.Helper()
	rows := o.rows(text, targetText)
	want := rows[len(rows)-1]
	Vd := h.cfg.DraftVocabSize
	if e := enginetest.RelErr(en.Seq.(*headSequence).out, want.Hidden); e > tol {
		o.t.Errorf("%s: the output before norm %.2g from the reference's", what, e)
	}
	if e := enginetest.RelErr(h.pass.logits[i*Vd:(i+1)*Vd], want.Logits); e > tol {
		o.t.Errorf("%s: logits %.2g from the reference's", what, e)
	}
	enginetest.CheckHeadRead(o.t, what, o.head, want, en.Next, en.Logprob, en.Top, en.TopN, 1e-4)
}

// headRig is a tiny target with the features of eagle3.DefaultAux's layers,
// a random head over it on the CPU and the oracle.
type headRig struct {
	target *Engine
	head   *Head
	oracle *headOracle
	cfg    eagle3.Config
	w      *eagle3.Weights
}

func newHeadRig(t *testing.T, int4 bool) *headRig {
	t.Helper()
	c := enginetest.TinyHeadConfig()
	target, ref, _, tw := tinyTarget(t, enginetest.HeadLayers, eagle3.DefaultAux(enginetest.HeadLayers))
	w := enginetest.RandomHead(c, 11, false)
	if int4 {
		w = enginetest.QuantizeHead(t, c, w)
	}
	h, err := NewHead(target, c, w, HeadOptions{KVBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rh, err := reference.NewHead(c, w, tw.EmbedTokens)
	if err != nil {
		t.Fatal(err)
	}
	return &headRig{target: target, head: h, oracle: &headOracle{t: t, ref: ref, head: rh}, cfg: c, w: w}
}

// TestHead holds cpu.Head to reference.Head (f32): a prompt over the
// target's features, draft steps past the target (the head's own output),
// a rollback (Truncate drops the drafted rows) and a re-feed over the
// target's features, a feed whose rows read the target's features then the
// head's own output within the step (stages), and the same text fed token
// by token; every step's logits, output before norm, Next, Logprob and Top
// within 1e-4 of the reference's.
func TestHead(t *testing.T) {
	testHead(t, newHeadRig(t, false), 1e-4)
}

// TestHeadInt4: the same over a head quantized to int4, the reference
// running the same int4 weights, on both kernels.
func TestHeadInt4(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("fixed=%v", fixed), func(t *testing.T) {
			defer ops.SetFixed(ops.SetFixed(fixed))
			rig := newHeadRig(t, true)
			if _, ok := rig.w.QProj.(*tensor.Int4); !ok || !rig.head.q.InPlace() {
				t.Fatalf("the head's q_proj is %T, in place %v: want int4 on the int4 kernels", rig.w.QProj, rig.head.q.InPlace())
			}
			testHead(t, rig, 1e-4)
		})
	}
}

func testHead(t *testing.T, rig *headRig, tol float64) {
	ctx := context.Background()
	h, target, o := rig.head, rig.target, rig.oracle
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
	o.check("prompt", h, en, 0, text, ttext, tol)
	// Two draft steps past the target: rows 6 and 7 over the head's output.
	for k := range 2 {
		text = append(text, en.Next)
		en.Tokens = []int{en.Next}
		if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
			t.Fatal(err)
		}
		o.check(fmt.Sprintf("draft step %d", k+1), h, en, 0, text, ttext, tol)
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
	o.check("re-fed over the target's features", h, en, 0, text, ttext, tol)
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
	o.check("a feed over the target's features then the head's output", h, en, 0, text, ttext, tol)
	// engine.StepN: drafts as Steps do.
	toks, err := engine.StepN(ctx, h, []*engine.Entry{{Seq: hseq, Target: tseq, Tokens: []int{en.Next}}}, 3)
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, en.Next)
	for _, tk := range toks[0][:2] {
		text = append(text, tk.ID)
	}
	o.check("StepN", h, &engine.Entry{Seq: hseq, Next: toks[0][2].ID, Logprob: toks[0][2].Logprob}, 0, text, ttext, tol)

	// The same text token by token on another sequence: every row.
	one := enginetest.NewSequence(t, h)
	defer one.Release()
	if err := h.Step(ctx, []*engine.Entry{{Seq: one, Target: tseq, Tokens: text[:2]}}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i < len(text); i++ {
		en := &engine.Entry{Seq: one, Target: tseq, Tokens: text[i : i+1]}
		if err := h.Step(ctx, []*engine.Entry{en}); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		o.check(fmt.Sprintf("token by token, token %d", i), h, en, 0, text[:i+1], ttext, tol)
	}
}

// TestHeadBatch: enginetest.HeadBatch, a batch against its entries alone.
func TestHeadBatch(t *testing.T) {
	rig := newHeadRig(t, false)
	enginetest.HeadBatch(t, rig.head, rig.target, 1e-5)
}

// TestHeadTruncate: enginetest.HeadTruncate, Truncate's and KeepPath's
// rules for a head.
func TestHeadTruncate(t *testing.T) {
	rig := newHeadRig(t, false)
	enginetest.HeadTruncate(t, rig.head, rig.target)
}

// TestHeadTargetTree: a Target sequence holding a token tree past its line
// gives the head its line's features only: the rows past the line read the
// head's own output, as over the same line without the tree.
func TestHeadTargetTree(t *testing.T) {
	rig := newHeadRig(t, false)
	ctx := context.Background()
	h, target := rig.head, rig.target
	line := []int{1, 2, 3}
	var next []int
	for _, tree := range []bool{false, true} {
		tseq := enginetest.NewSequence(t, target)
		enginetest.TargetStep(t, target, tseq, line...)
		if tree {
			v := &engine.VerifyEntry{Seq: tseq, Tokens: []int{4, 5}, Parents: []int{2, 2}, Out: 2}
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
	}
	if next[0] != next[1] {
		t.Errorf("over a target with a tree the head drafts %d, over its line %d", next[1], next[0])
	}
}

// TestHeadRefusals: NewHead refuses a head that does not fit its target, a
// target without the head's features, and incomplete weights; Step
// refuses an entry without its Target or with another engine's, tree
// nodes, token 0 alone, a row over features the target does not hold.
func TestHeadRefusals(t *testing.T) {
	rig := newHeadRig(t, false)
	c, w, target := rig.cfg, rig.w, rig.target
	bad := func(name string, want string, tc eagle3.Config, tw *eagle3.Weights, te *Engine) {
		t.Helper()
		_, err := NewHead(te, tc, tw, HeadOptions{})
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
	plain, _, _, _ := tinyTarget(t, enginetest.HeadLayers, nil)
	bad("a target without features", "FeatureLayers", c, w, plain)
	shuffled, _, _, _ := tinyTarget(t, enginetest.HeadLayers, []int{5, 4, 2})
	bad("the features in another order", "FeatureLayers", c, w, shuffled)
	noFC := *w
	noFC.FC = nil
	bad("no fc", "fc.weight", c, &noFC, target)
	ids := *w
	ids.TargetIDs = ids.TargetIDs[1:]
	bad("a short d2t", "target ids", c, &ids, target)

	h := rig.head
	other := enginetest.NewSequence(t, plain)
	enginetest.TargetStep(t, plain, other, 1, 2, 3)
	enginetest.HeadStepRefusals(t, h, target, other, "cpu head: ")
	hc := h.Config()
	if hc.NumHiddenLayers != 1 || hc.VocabSize != 256 || hc.MaxPositionEmbeddings != target.Config().MaxPositionEmbeddings || hc.HiddenSize != c.HiddenSize {
		t.Errorf("Config() = %+v", hc)
	}
	if info := h.Info(); info.Backend != "cpu" || !strings.Contains(info.Adapter, "EAGLE-3") {
		t.Errorf("Info() = %+v", info)
	}
	if n := h.KVCapacity(); n != (1<<20)/(2*c.NumKeyValueHeads*c.HeadDim*4) {
		t.Errorf("KVCapacity() = %d", n)
	}
}

// TestHeadOwnEmbedding: a head with an embedding of its own embeds with it,
// not the target's.
func TestHeadOwnEmbedding(t *testing.T) {
	c := enginetest.TinyHeadConfig()
	target, ref, _, tw := tinyTarget(t, enginetest.HeadLayers, eagle3.DefaultAux(enginetest.HeadLayers))
	w := enginetest.RandomHead(c, 5, true)
	h, err := NewHead(target, c, w, HeadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, tn := h.KVCapacity(), target.KVCapacity(); n != tn {
		t.Errorf("KVCapacity() = %d unsized, want the target's %d", n, tn)
	}
	rh, err := reference.NewHead(c, w, tw.EmbedTokens)
	if err != nil {
		t.Fatal(err)
	}
	o := &headOracle{t: t, ref: ref, head: rh}
	tseq := enginetest.NewSequence(t, target)
	text := []int{4, 8, 15, 16, 23}
	enginetest.TargetStep(t, target, tseq, text...)
	hseq := enginetest.NewSequence(t, h)
	en := &engine.Entry{Seq: hseq, Target: tseq, Tokens: append(slices.Clone(text), 42)}
	if err := h.Step(context.Background(), []*engine.Entry{en}); err != nil {
		t.Fatal(err)
	}
	o.check("own embedding", h, en, 0, en.Tokens, text, 1e-4)
}

// TestHeadPropose: the head samples its drafts (enginetest.HeadProposals).
func TestHeadPropose(t *testing.T) {
	rig := newHeadRig(t, true)
	enginetest.HeadProposals(t, rig.head, rig.target, rig.oracle.ref, rig.oracle.head)
}
