package enginetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/engine"
	"webdraft/qwen3"
	"webdraft/reference"
	"webdraft/sampling"
	"webdraft/treemask"
)

// runSampled checks sampled drafts, for engines that take them: a
// drafter's proposals are sampling.DrawDistinct over the reference's
// distribution at each row, with their log-probabilities and that
// distribution; a target's walk of a tree of them is sampling's rule over
// the reference's rows along each node's root path.
func runSampled(t *testing.T, e engine.Engine, c qwen3.Config, ref *reference.Model, prompt func(int) []int) {
	if !engine.SamplesDrafts(e) {
		t.Skip("the engine does not sample drafts")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(c.VocabSize), 31))
	params := sampling.Params{Temperature: 0.8, TopP: 0.9}
	newSeq := func() engine.Sequence {
		s, err := e.NewSequence()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Release)
		return s
	}
	// dist is the reference's distribution after tokens fed as a line,
	// and its raw logits.
	dist := func(tokens []int) ([]float64, []float32) {
		logits, err := ref.Forward(ref.NewSequence(), tokens)
		if err != nil {
			t.Fatal(err)
		}
		q, err := sampling.Dist(logits, params)
		if err != nil {
			t.Fatal(err)
		}
		return q, logits
	}
	uniforms := func(n int) []float32 {
		u := make([]float32, n)
		for i := range u {
			u[i] = rng.Float32()
		}
		return u
	}

	t.Run("proposals follow the distribution", func(t *testing.T) {
		context, fed := prompt(7), prompt(4)
		seq := newSeq()
		if err := e.Step(ctx, []*engine.Entry{{Seq: seq, Tokens: context}}); err != nil {
			t.Fatal(err)
		}
		v := &engine.VerifyEntry{Seq: seq, Tokens: fed, Out: 4, Sampling: params, Propose: [][]float32{uniforms(3), nil, uniforms(1), uniforms(5)}}
		if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
			t.Fatal(err)
		}
		for j, us := range v.Propose {
			r := v.Rows[j]
			if len(us) == 0 {
				if r.Drawn != nil || r.Q != nil {
					t.Errorf("row %d: drew %v unasked", j, r.Drawn)
				}
				continue
			}
			q, _ := dist(append(slices.Clone(context), fed[:j+1]...))
			want, err := sampling.DrawDistinct(q, us)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.Drawn, want) || len(r.DrawnLogprob) != len(r.Drawn) {
				t.Errorf("row %d: drew %v, the reference's distribution %v", j, r.Drawn, want)
				continue
			}
			for k, x := range r.Drawn {
				if !qClose(math.Exp(float64(r.DrawnLogprob[k])), q[x]) {
					t.Errorf("row %d: token %d has q %v, the reference %v", j, x, math.Exp(float64(r.DrawnLogprob[k])), q[x])
				}
			}
			got, err := hostDist(r.Q, c.VocabSize)
			switch {
			case err != nil:
				t.Errorf("row %d: %v", j, err)
			case got != nil:
				for x := range q {
					if !qClose(got[x], q[x]) {
						t.Errorf("row %d: Q(%d) = %v, the reference %v", j, x, got[x], q[x])
						break
					}
				}
			}
		}
	})

	t.Run("a tree walk is the rule", func(t *testing.T) {
		for trial := range 6 {
			context := prompt(5 + trial)
			drafter := newSeq()
			if err := e.Step(ctx, []*engine.Entry{{Seq: drafter, Tokens: context[:len(context)-1]}}); err != nil {
				t.Fatal(err)
			}
			// The root's three children, drawn by the engine.
			root := &engine.VerifyEntry{Seq: drafter, Tokens: context[len(context)-1:], Out: 1, Sampling: params, Propose: [][]float32{uniforms(3)}}
			if err := e.Verify(ctx, []*engine.VerifyEntry{root}); err != nil {
				t.Fatal(err)
			}
			kids := root.Rows[0].Drawn
			// Two children of the first, drawn from the reference's q.
			q1, _ := dist(append(slices.Clone(context), kids[0]))
			grand, err := sampling.DrawDistinct(q1, uniforms(2))
			if err != nil {
				t.Fatal(err)
			}
			base := len(context)
			tokens := append(slices.Clone(kids), grand...)
			// A nucleus may hold fewer tokens than were asked for: the
			// children are those drawn.
			var parents, rootKids, kidKids []int
			for k := range kids {
				parents, rootKids = append(parents, base-1), append(rootKids, 1+k)
			}
			for k := range grand {
				parents, kidKids = append(parents, base), append(kidKids, 1+len(kids)+k)
			}
			st := &engine.SampledTree{Nodes: make([]engine.SampledNode, len(tokens)+1)}
			st.Nodes[0] = engine.SampledNode{Children: rootKids, Q: root.Rows[0].Q, U: uniforms(len(kids))}
			st.Nodes[1] = engine.SampledNode{Children: kidKids, Q: &engine.HostDist{P: toF32(q1)}, U: uniforms(len(grand))}
			for j := range st.Nodes {
				st.Nodes[j].V = rng.Float32()
			}
			target := newSeq()
			if err := e.Step(ctx, []*engine.Entry{{Seq: target, Tokens: context[:len(context)-1]}}); err != nil {
				t.Fatal(err)
			}
			v := &engine.VerifyEntry{Seq: target, Tokens: append(context[len(context)-1:], tokens...), Out: len(tokens) + 1,
				Parents: append([]int{treemask.Line}, parents...), Sampling: params, Tree: st}
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
				t.Fatal(err)
			}
			// The oracle: sampling's walk over the reference's rows.
			nodes := make([]sampling.Node, len(st.Nodes))
			for j, n := range st.Nodes {
				line := slices.Clone(context)
				if j > 0 {
					line = append(line, rootPath(tokens, parents, base, j-1)...)
					nodes[j].Token = tokens[j-1]
				}
				nodes[j].P, _ = dist(line)
				nodes[j].Children, nodes[j].U, nodes[j].V = n.Children, n.U, n.V
				if n.Q != nil {
					// A distribution the engine keeps (no host copy) is
					// its own proposals' at the root: the reference's
					// distribution there.
					if nodes[j].Q, err = hostDist(n.Q, c.VocabSize); err != nil || nodes[j].Q == nil {
						nodes[j].Q = nodes[j].P
					}
				}
			}
			var ver sampling.Verifier
			path, bonus, err := ver.AcceptTree(nodes)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(v.Tree.Path, path) || v.Tree.Bonus.Token != bonus || len(v.Tree.Logprobs) != len(path) {
				t.Errorf("trial %d: path %v then %d, the rule over the reference %v then %d", trial, v.Tree.Path, v.Tree.Bonus.Token, path, bonus)
			}
		}
	})

	t.Run("bad sampled entries", func(t *testing.T) {
		seq := newSeq()
		q := &engine.HostDist{P: []float32{1}}
		for _, v := range []*engine.VerifyEntry{
			{Seq: seq, Tokens: prompt(2), Out: 2, Propose: [][]float32{{0.5}, nil}},                                                                                                // greedy
			{Seq: seq, Tokens: prompt(2), Out: 2, Sampling: params, Propose: [][]float32{{0.5}}},                                                                                   // rows
			{Seq: seq, Tokens: prompt(2), Out: 1, Sampling: params, Propose: [][]float32{{1.5}}},                                                                                   // uniform
			{Seq: seq, Tokens: prompt(2), Out: 2, Sampling: params, Tree: &engine.SampledTree{Nodes: make([]engine.SampledNode, 1)}},                                               // nodes
			{Seq: seq, Tokens: prompt(2), Out: 2, Sampling: params, Tree: &engine.SampledTree{Nodes: []engine.SampledNode{{Children: []int{1}, U: []float32{0.1}}, {}}}},           // no q
			{Seq: seq, Tokens: prompt(3), Out: 3, Sampling: params, Tree: &engine.SampledTree{Nodes: []engine.SampledNode{{Children: []int{2}, Q: q, U: []float32{0.1}}, {}, {}}}}, // not the child fed
		} {
			if err := e.Verify(ctx, []*engine.VerifyEntry{v}); err == nil {
				t.Errorf("%+v: accepted", v)
			}
			if seq.Len() != 0 {
				t.Fatalf("Len %d after a refused pass", seq.Len())
			}
		}
	})
}

// qClose reports whether an engine's probability under a drafter's
// distribution is the reference's: within 1e-3, and 1% of it — the
// logits' tolerance (logprobClose's, which an f16 KV cache widens) at
// the sampling temperature.
func qClose(got, want float64) bool {
	return math.Abs(got-want) <= 1e-3+1e-2*want
}

// hostDist is q over a vocabulary of n tokens on the host: a HostDist's,
// or one read back from the engine (a Dist with a Read method, as the
// WebGPU engine's); nil for one that does not read back; an error for no
// distribution at all.
func hostDist(q engine.Dist, n int) ([]float64, error) {
	switch q := q.(type) {
	case nil:
		return nil, errors.New("no distribution kept")
	case *engine.HostDist:
		return q.Dense(nil, n), nil
	case interface{ Read() ([]float32, error) }:
		p, err := q.Read()
		if err != nil {
			return nil, fmt.Errorf("reading the distribution back: %w", err)
		}
		out := make([]float64, n)
		for i := range min(n, len(p)) {
			out[i] = float64(p[i])
		}
		return out, nil
	}
	return nil, nil
}

func toF32(p []float64) []float32 {
	out := make([]float32, len(p))
	for i, v := range p {
		out[i] = float32(v)
	}
	return out
}
