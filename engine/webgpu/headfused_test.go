package webgpu

import (
	"context"
	"math"
	"reflect"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/engine/enginetest"
)

// headTwins are a generation's sequences twice over: the target's and the
// head's for a fused call (F) and the same for the calls it stands for
// (S). text is the context so far; the targets' caches hold all of it but
// the last token, each head sequence what it holds.
type headTwins struct {
	text           []int
	tF, tS, hF, hS engine.Sequence
}

// newHeadTwins opens a generation's twin sequences — the drafter's, h a
// head or any drafter, start empty —, feeds prompt to both targets and
// appends the target's greedy token after it to the text.
func newHeadTwins(t *testing.T, h engine.Engine, target *Engine, prompt []int) headTwins {
	t.Helper()
	g := headTwins{text: slices.Clone(prompt)}
	for _, s := range []*engine.Sequence{&g.tF, &g.tS, &g.hF, &g.hS} {
		var err error
		if s == &g.hF || s == &g.hS {
			*s, err = h.NewSequence()
		} else {
			*s, err = target.NewSequence()
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup((*s).Release)
	}
	next := enginetest.TargetStep(t, target, g.tF, g.text...)
	if again := enginetest.TargetStep(t, target, g.tS, g.text...); again != next {
		t.Fatalf("the target's token after the prompt: %d, then %d", next, again)
	}
	g.text = append(g.text, next)
	return g
}

// headFusedGen is one generation of TestHeadDraftVerify: DraftVerify on
// the F sequences, StepN then Verify on the S ones.
type headFusedGen struct {
	headTwins
	take       int
	fusedDraft []engine.Token
}

// TestHeadDraftVerify: a head's fused step — its chain and the target's
// verification in one submission, the drafted tokens in the target's
// vocabulary gathered on the device — drafts, verifies and leaves both
// caches as StepN and Verify do: two generations, verifying all or part
// of the chain; then two more steps from what acceptance keeps (the head's
// next rows over the features the verification wrote, all of a verified
// draft or one token of it). Also a batch where an entry asks for top
// tokens (its drafts chained as draft tokens and mapped to the target's
// for the gather), and passes of one row, where the batch does not chain
// and the call runs StepN's steps one by one.
func TestHeadDraftVerify(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    HeadOptions
		chained bool
		topN    int // the second generation's
	}{
		{"fused", HeadOptions{}, true, 0},
		{"fused, top tokens", HeadOptions{}, true, 3},
		{"a row a pass", HeadOptions{KVBytes: 1 << 20, MaxSequences: 8, MaxRows: 1, KV: "f32"}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newHeadRig(t, true, tc.opts)
			h, target := rig.head, rig.target
			if !h.Fuses(target) {
				t.Fatal("Fuses: want the head's own target")
			}
			ctx := context.Background()
			const n = 4
			gens := []*headFusedGen{
				{headTwins: newHeadTwins(t, h, target, []int{3, 17, 5, 9, 30, 200}), take: n},
				{headTwins: newHeadTwins(t, h, target, []int{8, 1, 250, 4}), take: n - 2},
			}
			for round := range 3 {
				var fused, separate []engine.ChainStep
				for i, g := range gens {
					topN := 0
					if i == 1 {
						topN = tc.topN
					}
					for _, s := range []struct {
						steps  *[]engine.ChainStep
						tq, hq engine.Sequence
					}{{&fused, g.tF, g.hF}, {&separate, g.tS, g.hS}} {
						*s.steps = append(*s.steps, engine.ChainStep{
							Draft:  &engine.Entry{Seq: s.hq, Target: s.tq, Tokens: slices.Clone(g.text[s.hq.Len():]), TopN: topN},
							Verify: &engine.VerifyEntry{Seq: s.tq, Tokens: slices.Clone(g.text[s.tq.Len():]), Out: g.take + 1},
							Take:   g.take,
						})
					}
				}
				h.g.mu.Lock()
				feeds, err := h.stepFeeds(entries(fused))
				h.g.mu.Unlock()
				if err != nil {
					t.Fatal(err)
				}
				if got := h.chains(feeds); got != tc.chained {
					t.Fatalf("round %d: chains %v, want %v", round, got, tc.chained)
				}
				got, err := engine.DraftVerify(ctx, h, target, fused, n)
				if err != nil {
					t.Fatalf("round %d: DraftVerify: %v", round, err)
				}
				want, err := h.StepN(ctx, entries(separate), n)
				if err != nil {
					t.Fatalf("round %d: StepN: %v", round, err)
				}
				verify := make([]*engine.VerifyEntry, len(separate))
				for i, s := range separate {
					engine.AppendDraft(s.Verify, want[i][:s.Take])
					verify[i] = s.Verify
				}
				if err := target.Verify(ctx, verify); err != nil {
					t.Fatalf("round %d: Verify: %v", round, err)
				}
				sameTokens(t, "round "+string(rune('1'+round)), got, want)
				for i, g := range gens {
					fv, sv := fused[i].Verify, separate[i].Verify
					if !slices.Equal(fv.Tokens, sv.Tokens) {
						t.Errorf("round %d, generation %d: verified %v, separately %v", round, i, fv.Tokens, sv.Tokens)
					}
					if !reflect.DeepEqual(fv.Rows, sv.Rows) {
						t.Errorf("round %d, generation %d: rows %+v, separately %+v", round, i, fv.Rows, sv.Rows)
					}
					fd, sd := fused[i].Draft, separate[i].Draft
					if fd.Next != sd.Next || math.Abs(float64(fd.Logprob-sd.Logprob)) > headLogprobTol || g.hF.Len() != g.hS.Len() || g.tF.Len() != g.tS.Len() {
						t.Errorf("round %d, generation %d: head Next %d Len %d, target Len %d; separately %d %d %d",
							round, i, fd.Next, g.hF.Len(), g.tF.Len(), sd.Next, g.hS.Len(), g.tS.Len())
					}
					g.fusedDraft = got[i]
				}
				if t.Failed() {
					return
				}
				// The first generation keeps every drafted token it
				// verified, the second one (a random head's drafts are
				// seldom the target's), then the target's token after them,
				// as greedy acceptance would; both caches cut back to the text.
				for i, g := range gens {
					rows := fused[i].Verify.Rows
					a := 1
					if i == 0 {
						a = g.take
					}
					for _, d := range g.fusedDraft[:a] {
						g.text = append(g.text, d.ID)
					}
					g.text = append(g.text, rows[a].Argmax)
					for _, s := range []engine.Sequence{g.tF, g.tS, g.hF, g.hS} {
						s.Truncate(min(s.Len(), len(g.text)-1))
					}
					g.take = max(1, g.take-1+i)
				}
			}
		})
	}
}

// entries is the steps' head entries.
func entries(steps []engine.ChainStep) []*engine.Entry {
	out := make([]*engine.Entry, len(steps))
	for i, s := range steps {
		out[i] = s.Draft
	}
	return out
}

// TestHeadDraftVerifyRefused: a step the target refuses (a token past the
// vocabulary), a head entry with no Target sequence, or one past the
// context fails the call and leaves every cache as it was; the group
// still works after.
func TestHeadDraftVerifyRefused(t *testing.T) {
	rig := newHeadRig(t, true, HeadOptions{})
	h, target := rig.head, rig.target
	ctx := context.Background()
	text := []int{3, 17, 5, 9, 30, 200}
	tseq := enginetest.NewSequence(t, target)
	defer tseq.Release()
	text = append(text, enginetest.TargetStep(t, target, tseq, text...))
	hseq := enginetest.NewSequence(t, h)
	defer hseq.Release()
	fresh := func() []engine.ChainStep {
		return []engine.ChainStep{{
			Draft:  &engine.Entry{Seq: hseq, Target: tseq, Tokens: slices.Clone(text[hseq.Len():])},
			Verify: &engine.VerifyEntry{Seq: tseq, Tokens: slices.Clone(text[tseq.Len():]), Out: 4},
			Take:   3,
		}}
	}
	for _, bad := range []struct {
		name  string
		n     int
		spoil func(s []engine.ChainStep)
	}{
		{"a token past the vocabulary", 3, func(s []engine.ChainStep) { s[0].Verify.Tokens[0] = target.cfg.VocabSize }},
		{"no Target sequence", 3, func(s []engine.ChainStep) { s[0].Draft.Target = nil }},
		{"past the context", h.Config().MaxPositionEmbeddings, func(s []engine.ChainStep) {}},
	} {
		steps := fresh()
		bad.spoil(steps)
		hl, tl := hseq.Len(), tseq.Len()
		if out, err := engine.DraftVerify(ctx, h, target, steps, bad.n); err == nil || out != nil {
			t.Errorf("%s: accepted", bad.name)
		}
		if hseq.Len() != hl || tseq.Len() != tl || len(steps[0].Verify.Tokens) != 1 {
			t.Errorf("%s: the head holds %d tokens, the target %d, the verify entry %v; want %d, %d and one", bad.name, hseq.Len(), tseq.Len(), steps[0].Verify.Tokens, hl, tl)
		}
	}
	if err := h.Fault(); err != nil {
		t.Fatalf("a refused step broke the group: %v", err)
	}
	if _, err := engine.DraftVerify(ctx, h, target, fresh(), 3); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
}
