package webgpu

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
)

// fusedCase is a batch of speculative steps for DraftVerify: generation i
// has context ctx[i], of which the drafter's cache holds all but dPend[i]
// tokens and the target's all but tPend[i]; it verifies take[i] of the n
// drafted tokens, sampled where sampled[i].
type fusedCase struct {
	ctx          [][]int
	dPend, tPend []int
	take         []int
	sampled      []bool
	draws        [][]sampling.Draw
}

func (p *sampledPair) fusedCase(n int) *fusedCase {
	fc := &fusedCase{
		ctx:   [][]int{p.tokens(5), p.tokens(9), p.tokens(14)},
		dPend: []int{1, 2, 1}, tPend: []int{1, 1, 3},
		take: []int{n, n - 2, n - 1}, sampled: []bool{false, false, true},
	}
	for i := range fc.ctx {
		var d []sampling.Draw
		if fc.sampled[i] {
			d = make([]sampling.Draw, fc.take[i]+1)
			for j := range d {
				d[j] = sampling.Draw{X: sampling.NoProposal, U: p.rng.Float32(), V: p.rng.Float32()}
			}
		}
		fc.draws = append(fc.draws, d)
	}
	return fc
}

// steps are fc's steps on fresh sequences of the pair.
func (p *sampledPair) steps(fc *fusedCase) []engine.ChainStep {
	steps := make([]engine.ChainStep, len(fc.ctx))
	for i, c := range fc.ctx {
		v := &engine.VerifyEntry{
			Seq: p.seq(p.target, c[:len(c)-fc.tPend[i]]), Tokens: slices.Clone(c[len(c)-fc.tPend[i]:]),
			Out: fc.take[i] + 1, Draws: slices.Clone(fc.draws[i]),
		}
		if fc.sampled[i] {
			v.Sampling = p.params
		}
		steps[i] = engine.ChainStep{
			Draft:  &engine.Entry{Seq: p.seq(p.drafter, c[:len(c)-fc.dPend[i]]), Tokens: c[len(c)-fc.dPend[i]:]},
			Verify: v, Take: fc.take[i],
		}
	}
	return steps
}

// separately runs steps as StepN and then Verify.
func (p *sampledPair) separately(steps []engine.ChainStep, n int) [][]engine.Token {
	p.t.Helper()
	ctx := context.Background()
	batch := make([]*engine.Entry, len(steps))
	verify := make([]*engine.VerifyEntry, len(steps))
	for i, s := range steps {
		batch[i], verify[i] = s.Draft, s.Verify
	}
	out, err := p.drafter.StepN(ctx, batch, n)
	if err != nil {
		p.t.Fatal(err)
	}
	for i, s := range steps {
		engine.AppendDraft(s.Verify, out[i][:s.Take])
	}
	if err := p.target.Verify(ctx, verify); err != nil {
		p.t.Fatal(err)
	}
	return out
}

// sameSteps fails t where a fused step's drafts, verification or caches
// differ from the same step run separately.
func sameSteps(t *testing.T, label string, got, want [][]engine.Token, gs, ws []engine.ChainStep) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: drafts %v, separately %v", label, got, want)
	}
	for i := range gs {
		g, w := gs[i].Verify, ws[i].Verify
		if !slices.Equal(g.Tokens, w.Tokens) || !reflect.DeepEqual(g.Draws, w.Draws) {
			t.Errorf("%s: step %d verified tokens %v draws %v, separately %v %v", label, i, g.Tokens, g.Draws, w.Tokens, w.Draws)
		}
		if !reflect.DeepEqual(g.Rows, w.Rows) {
			t.Errorf("%s: step %d rows %+v, separately %+v", label, i, g.Rows, w.Rows)
		}
		if gd, wd := gs[i].Draft, ws[i].Draft; gd.Next != wd.Next || gd.Seq.Len() != wd.Seq.Len() || g.Seq.Len() != w.Seq.Len() {
			t.Errorf("%s: step %d: drafter Next %d Len %d, target Len %d; separately %d %d %d", label, i, gd.Next, gd.Seq.Len(), g.Seq.Len(), wd.Next, wd.Seq.Len(), w.Seq.Len())
		}
	}
}

// TestDraftVerify: a fused step — the drafter's chain and the target's
// verification in one submission, the drafted tokens gathered on the
// device — drafts, verifies and leaves both caches exactly as StepN and
// Verify do: entries whose drafter and target feed one or several pending
// tokens, verifying all or part of the chain, greedy and sampled; then a
// second step on from the accepted tokens; and with passes too small to
// fuse (MaxRows 6), through the same call.
func TestDraftVerify(t *testing.T) {
	ctx := context.Background()
	dev := gputest.Device(t)
	for _, opts := range []Options{{}, {MaxRows: 6}} {
		p := newSampledPair(t, NewGroup(dev), opts)
		if !p.drafter.Fuses(p.target) || p.drafter.Fuses(p.drafter) {
			t.Fatal("Fuses: want the group's target, not the drafter itself")
		}
		const n = 4
		fc := p.fusedCase(n)
		gs, ws := p.steps(fc), p.steps(fc)
		got, err := engine.DraftVerify(ctx, p.drafter, p.target, gs, n)
		if err != nil {
			t.Fatal(err)
		}
		want := p.separately(ws, n)
		label := "fused"
		if opts.MaxRows > 0 {
			label = "unfused (MaxRows 6)"
		}
		sameSteps(t, label, got, want, gs, ws)

		// The next step: the first generation keeps all its drafted tokens
		// (its drafter then feeds the last of them and the target's token
		// after them), the others one, as greedy acceptance would.
		for _, run := range []struct {
			steps  []engine.ChainStep
			drafts [][]engine.Token
		}{{gs, got}, {ws, want}} {
			for i := range run.steps {
				s := &run.steps[i]
				a := 1
				if i == 0 {
					a = s.Take
				}
				v := s.Verify
				kept := len(fc.ctx[i]) + a
				bonus := v.Rows[a].Argmax
				v.Seq.Truncate(kept)
				s.Draft.Tokens = []int{bonus}
				if s.Draft.Seq.Len() < kept {
					s.Draft.Tokens = []int{run.drafts[i][a-1].ID, bonus}
				}
				s.Draft.Seq.Truncate(min(s.Draft.Seq.Len(), kept))
				v.Tokens, v.Out, s.Take = []int{bonus}, 3, 2
				if v.Draws != nil {
					v.Draws = slices.Clone(fc.draws[i][:3])
				}
			}
		}
		got, err = engine.DraftVerify(ctx, p.drafter, p.target, gs, 3)
		if err != nil {
			t.Fatal(err)
		}
		sameSteps(t, label+", second step", got, p.separately(ws, 3), gs, ws)
	}
}

// TestDraftVerifyRefused: a step the target refuses (a token past the
// vocabulary) or that asks for what a chain cannot give fails the call and
// leaves every cache as it was.
func TestDraftVerifyRefused(t *testing.T) {
	ctx := context.Background()
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{})
	fc := p.fusedCase(3)
	for _, bad := range []struct {
		name  string
		spoil func(s []engine.ChainStep)
	}{
		{"a token past the vocabulary", func(s []engine.ChainStep) { s[1].Verify.Tokens[0] = p.target.cfg.VocabSize }},
		{"more taken than drafted", func(s []engine.ChainStep) { s[0].Take, s[0].Verify.Out = 4, 5 }},
		{"a read-out that is not the draft's", func(s []engine.ChainStep) { s[2].Verify.Out = 2 }},
		{"tree nodes", func(s []engine.ChainStep) { s[0].Verify.Parents = []int{-1} }},
		{"a drafter token past its vocabulary", func(s []engine.ChainStep) { s[2].Draft.Tokens = []int{-1} }},
	} {
		steps := p.steps(fc)
		bad.spoil(steps)
		var lens []int
		for _, s := range steps {
			lens = append(lens, s.Draft.Seq.Len(), s.Verify.Seq.Len())
		}
		if _, err := engine.DraftVerify(ctx, p.drafter, p.target, steps, 3); err == nil {
			t.Errorf("%s: accepted", bad.name)
		}
		for i, s := range steps {
			if s.Draft.Seq.Len() != lens[2*i] || s.Verify.Seq.Len() != lens[2*i+1] {
				t.Errorf("%s: step %d's caches changed", bad.name, i)
			}
		}
	}
	if err := p.drafter.Fault(); err != nil {
		t.Errorf("a refused step broke the group: %v", err)
	}
}
