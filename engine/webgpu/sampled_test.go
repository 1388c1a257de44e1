package webgpu

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
	"webdraft/treemask"
)

// sampledPair is a drafter and a target in one Group (the golden models,
// int4 drafting for f32), and what a test draws its tokens and uniforms
// from.
type sampledPair struct {
	t               *testing.T
	drafter, target *Engine
	rng             *rand.Rand
	params          sampling.Params
}

func newSampledPair(t *testing.T, g *Group, opts Options) *sampledPair {
	t.Helper()
	dm, tm := load(t, "untied", checkpoint.Int4), load(t, "untied", checkpoint.F32)
	if opts.KVBytes == 0 {
		opts.KVBytes, opts.MaxSequences = 16<<20, 32
	}
	p := &sampledPair{t: t, rng: rand.New(rand.NewPCG(7, 9)), params: sampling.Params{Temperature: 0.9, TopP: 0.95}}
	var err error
	if p.drafter, err = g.New(dm.Config, dm.Weights, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.drafter.Close() })
	if p.target, err = g.New(tm.Config, tm.Weights, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.target.Close() })
	return p
}

func (p *sampledPair) tokens(n int) []int { return randomTokens(p.rng, n, p.target.cfg.VocabSize) }

func (p *sampledPair) uniforms(n int) []float32 {
	u := make([]float32, n)
	for i := range u {
		u[i] = p.rng.Float32()
	}
	return u
}

// seq is a new sequence of e that has been fed tokens.
func (p *sampledPair) seq(e *Engine, tokens []int) engine.Sequence {
	p.t.Helper()
	s, err := e.NewSequence()
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(s.Release)
	if len(tokens) > 0 {
		if err := e.Step(context.Background(), []*engine.Entry{{Seq: s, Tokens: tokens}}); err != nil {
			p.t.Fatal(err)
		}
	}
	return s
}

// sampledTree is a two-level tree the drafter drew after context: up to
// three children of the root, up to two of the first child; its tokens
// and parents as the target's entry feeds them after the context's last
// token (at slot base − 1).
type sampledTree struct {
	context, tokens, parents []int
	tree                     *engine.SampledTree
}

func (p *sampledPair) draw(prompt []int) *sampledTree {
	p.t.Helper()
	ctx := context.Background()
	d := p.seq(p.drafter, prompt[:len(prompt)-1])
	root := &engine.VerifyEntry{Seq: d, Tokens: prompt[len(prompt)-1:], Out: 1, Sampling: p.params, Propose: [][]float32{p.uniforms(3)}}
	if err := p.drafter.Verify(ctx, []*engine.VerifyEntry{root}); err != nil {
		p.t.Fatal(err)
	}
	kids := root.Rows[0].Drawn
	base := len(prompt)
	level := &engine.VerifyEntry{Seq: d, Tokens: kids, Out: len(kids), Sampling: p.params, Propose: make([][]float32, len(kids))}
	level.Propose[0] = p.uniforms(2)
	for range kids {
		level.Parents = append(level.Parents, base-1)
	}
	if err := p.drafter.Verify(ctx, []*engine.VerifyEntry{level}); err != nil {
		p.t.Fatal(err)
	}
	grand := level.Rows[0].Drawn
	st := &sampledTree{context: prompt, tokens: append(slices.Clone(kids), grand...), tree: &engine.SampledTree{Nodes: make([]engine.SampledNode, 1+len(kids)+len(grand))}}
	st.tree.Nodes[0].Q, st.tree.Nodes[1].Q = root.Rows[0].Q, level.Rows[0].Q
	for k := range kids {
		st.parents = append(st.parents, base-1)
		st.tree.Nodes[0].Children = append(st.tree.Nodes[0].Children, 1+k)
	}
	for k := range grand {
		st.parents = append(st.parents, base)
		st.tree.Nodes[1].Children = append(st.tree.Nodes[1].Children, 1+len(kids)+k)
	}
	for j := range st.tree.Nodes {
		st.tree.Nodes[j].U = p.uniforms(len(st.tree.Nodes[j].Children))
		st.tree.Nodes[j].V = p.rng.Float32()
	}
	return st
}

// entry is the target's entry verifying st on a sequence that holds all
// of its context but the last token.
func (p *sampledPair) entry(st *sampledTree) *engine.VerifyEntry {
	tr := *st.tree
	return &engine.VerifyEntry{
		Seq: p.seq(p.target, st.context[:len(st.context)-1]), Tokens: append(st.context[len(st.context)-1:], st.tokens...),
		Parents: append([]int{treemask.Line}, st.parents...), Out: len(st.tokens) + 1, Sampling: p.params, Tree: &tr,
	}
}

// TestSampledBatch: sampled drafts share passes with other entries — a
// drafter's proposals beside greedy rows and point-mass draws, a target's
// trees (one of the drafter's distributions, one of a host's) beside
// them too — and each reads out what it reads out alone: the same tokens
// drawn, the same walks.
func TestSampledBatch(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{})
	ctx := context.Background()
	a, b := p.draw(p.tokens(9)), p.draw(p.tokens(4))
	host, err := b.tree.Nodes[0].Q.(*DeviceDist).Read()
	if err != nil {
		t.Fatal(err)
	}
	b.tree.Nodes[0].Q = &engine.HostDist{P: host}
	line, context, fed := p.tokens(6), p.tokens(5), p.tokens(3)
	others := func(e *Engine) []*engine.VerifyEntry {
		draws := []sampling.Draw{{X: line[2], U: 0.3, V: 0.6}, {X: sampling.NoProposal, U: 0.1, V: 0.2}}
		return []*engine.VerifyEntry{
			{Seq: p.seq(e, nil), Tokens: line[:3], Out: 2},
			{Seq: p.seq(e, nil), Tokens: line, Out: 2, Sampling: p.params, Draws: draws, TopN: 3},
		}
	}
	prop := func() *engine.VerifyEntry {
		return &engine.VerifyEntry{Seq: p.seq(p.drafter, context), Tokens: fed, Out: 3, Sampling: p.params,
			Propose: [][]float32{{0.1, 0.5}, nil, {0.9}}, TopN: 2}
	}

	// Alone.
	wantA, wantB := p.entry(a), p.entry(b)
	for _, v := range []*engine.VerifyEntry{wantA, wantB} {
		if err := p.target.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
			t.Fatal(err)
		}
	}
	wantP := prop()
	if err := p.drafter.Verify(ctx, []*engine.VerifyEntry{wantP}); err != nil {
		t.Fatal(err)
	}
	wantOthers := others(p.target)
	if err := p.target.Verify(ctx, wantOthers); err != nil {
		t.Fatal(err)
	}
	// Together: the trees with the other entries, the proposals with
	// them on the drafter. The trees' distributions were taken before the
	// proposals of the alone run: they stay valid (no verification since
	// has made the ring take their slots again).
	gotA, gotB := p.entry(a), p.entry(b)
	gotOthers := others(p.target)
	if err := p.target.Verify(ctx, append([]*engine.VerifyEntry{gotOthers[0], gotA}, gotOthers[1], gotB)); err != nil {
		t.Fatal(err)
	}
	gotP := prop()
	if err := p.drafter.Verify(ctx, append(others(p.drafter), gotP)); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct{ got, want *engine.VerifyEntry }{{gotA, wantA}, {gotB, wantB}} {
		g, w := c.got.Tree, c.want.Tree
		if !slices.Equal(g.Path, w.Path) || g.Bonus.Token != w.Bonus.Token || len(g.Logprobs) != len(g.Path) {
			t.Errorf("tree %d: path %v then %d in a batch, %v then %d alone", i, g.Path, g.Bonus.Token, w.Path, w.Bonus.Token)
		}
		t.Logf("tree %d: %d nodes, path %v, bonus %+v", i, len(c.got.Tree.Nodes), g.Path, g.Bonus)
	}
	for j := range gotP.Rows {
		g, w := gotP.Rows[j], wantP.Rows[j]
		if !slices.Equal(g.Drawn, w.Drawn) || (g.Q == nil) != (w.Q == nil) || len(g.Top) != 2 {
			t.Errorf("proposing row %d: drew %v (q %v, top %v) in a batch, %v alone", j, g.Drawn, g.Q, g.Top, w.Drawn)
		}
	}
	for i := range gotOthers {
		for j := range gotOthers[i].Rows {
			g, w := gotOthers[i].Rows[j], wantOthers[i].Rows[j]
			if g.Argmax != w.Argmax || g.Sample != w.Sample || g.Accept != w.Accept || g.Drawn != nil || g.Q != nil {
				t.Errorf("entry %d row %d: %+v in a batch, %+v alone", i, j, g, w)
			}
		}
	}
}

// TestQStoreRing: the Q store grows rather than take again a slot taken
// since the last verification that read it, keeping what its slots hold;
// once a verification has read it, the ring takes the old slots again and
// their distributions are refused as stale, by Verify and by Read.
func TestQStoreRing(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{})
	ctx := context.Background()
	propose := func(n int) []*DeviceDist {
		t.Helper()
		v := &engine.VerifyEntry{Seq: p.seq(p.drafter, p.tokens(2)), Tokens: p.tokens(n), Out: n, Sampling: p.params, Propose: make([][]float32, n)}
		for j := range n {
			v.Propose[j] = p.uniforms(1)
		}
		if err := p.drafter.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
			t.Fatal(err)
		}
		var out []*DeviceDist
		for _, r := range v.Rows {
			out = append(out, r.Q.(*DeviceDist))
		}
		return out
	}
	read := func(d *DeviceDist) []float32 {
		t.Helper()
		q, err := d.Read()
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	first := propose(qStoreFirstSlots - 2)
	before := read(first[0])
	second := propose(6) // past the first size: the store grows
	if s := &p.drafter.g.q; len(s.stamp) <= qStoreFirstSlots {
		t.Fatalf("%d slots hold %d unverified distributions", len(s.stamp), len(first)+len(second))
	}
	if got := read(first[0]); !slices.Equal(got, before) {
		t.Errorf("growing the store changed a slot's q")
	}
	var sum float64
	for _, x := range read(second[5]) {
		sum += float64(x)
	}
	if sum < 0.999 || sum > 1.001 {
		t.Errorf("a q sums to %v", sum)
	}

	// A verification reads the store: its slots are the ring's again.
	st := p.draw(p.tokens(5))
	if err := p.target.Verify(ctx, []*engine.VerifyEntry{p.entry(st)}); err != nil {
		t.Fatal(err)
	}
	slots := len(p.drafter.g.q.stamp)
	for range slots / 8 {
		propose(8)
	}
	if n := len(p.drafter.g.q.stamp); n != slots {
		t.Errorf("the store grew from %d slots to %d after a verification freed them", slots, n)
	}
	if _, err := first[0].Read(); !errors.Is(err, ErrStaleDist) {
		t.Errorf("reading a distribution whose slot was taken again: %v, want ErrStaleDist", err)
	}
	stale := p.entry(st)
	if err := p.target.Verify(ctx, []*engine.VerifyEntry{stale}); !errors.Is(err, ErrStaleDist) {
		t.Errorf("verifying a stale distribution: %v, want ErrStaleDist", err)
	}
	if stale.Seq.Len() != len(st.context)-1 || p.target.Fault() != nil {
		t.Errorf("a refused verification left %d positions (fault %v)", stale.Seq.Len(), p.target.Fault())
	}
}

// TestForeignDist: a target refuses, before any work, a distribution
// kept by a drafter of another group — on the same device or on another
// — and works on afterwards; a tree wider than a pass is refused too.
func TestForeignDist(t *testing.T) {
	p := newSampledPair(t, NewGroup(gputest.Device(t)), Options{MaxRows: 6})
	ctx := context.Background()
	for _, c := range []struct {
		name string
		dev  *gpu.Device
	}{{"same device", gputest.Device(t)}, {"another device", gputest.Fresh(t)}} {
		t.Run(c.name, func(t *testing.T) {
			other := newSampledPair(t, NewGroup(c.dev), Options{})
			st := other.draw(p.tokens(6))
			v := p.entry(st)
			err := p.target.Verify(ctx, []*engine.VerifyEntry{v})
			if err == nil || !strings.Contains(err.Error(), "another engine group's Q store") || errors.Is(err, engine.ErrFault) {
				t.Errorf("a distribution of another group: err = %v", err)
			}
			if v.Seq.Len() != len(st.context)-1 || p.target.Fault() != nil {
				t.Errorf("the refused pass left %d positions (fault %v)", v.Seq.Len(), p.target.Fault())
			}
		})
	}
	st := p.draw(p.tokens(6))
	v := p.entry(st)
	if err := p.target.Verify(ctx, []*engine.VerifyEntry{v}); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
	wide := &engine.SampledTree{Nodes: make([]engine.SampledNode, 7)}
	for j := range 6 {
		wide.Nodes[j] = engine.SampledNode{Children: []int{j + 1}, Q: &engine.HostDist{P: []float32{1}}, U: []float32{0.5}}
	}
	long := &engine.VerifyEntry{Seq: p.seq(p.target, nil), Tokens: p.tokens(7), Out: 7, Sampling: p.params, Tree: wide}
	if err := p.target.Verify(ctx, []*engine.VerifyEntry{long}); err == nil || !strings.Contains(err.Error(), "at most 6") {
		t.Errorf("a chain of 7 nodes with 6-row passes: err = %v", err)
	}
}

// TestGroupFault: a fault of one engine of a group breaks the others (the
// device is theirs too), and closing the group and its engines closes the
// device it opened.
func TestGroupFault(t *testing.T) {
	m := load(t, "tied", checkpoint.Int4)
	gputest.Device(t) // skips or fails as every GPU test does
	g, err := OpenGroup(gpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := g.New(m.Config, m.Weights, Options{KVBytes: 4 << 20, MaxSequences: 4})
	if err != nil {
		t.Fatal(err)
	}
	b, err := g.New(m.Config, m.Weights, Options{KVBytes: 4 << 20, MaxSequences: 4})
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if _, err := g.New(m.Config, m.Weights, Options{}); err == nil {
		t.Error("a closed group made an engine")
	}
	sa, err := a.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	a.LoseDevice("a fault drill")
	if err := a.Step(context.Background(), []*engine.Entry{{Seq: sa, Tokens: []int{1, 2}}}); !errors.Is(err, engine.ErrFault) {
		t.Fatalf("a step on a lost device: %v", err)
	}
	if !errors.Is(engine.Fault(b), engine.ErrFault) {
		t.Errorf("the other engine of the group: fault %v, want the group's", engine.Fault(b))
	}
	if _, err := b.NewSequence(); !errors.Is(err, engine.ErrFault) {
		t.Errorf("the other engine's NewSequence: %v", err)
	}
	sa.Release()
	a.Close()
	if g.dev == nil {
		t.Error("the device closed with an engine of its group still open")
	}
	b.Close()
	if g.dev != nil {
		t.Error("the device is still open after its group and engines closed")
	}
}

// TestSampledSmallPasses: a tree verified behind a prompt's tokens, in a
// batch larger than a pass, is walked whole in one pass — its rows wait
// for a pass with room for all of them — and walks as in one large pass.
func TestSampledSmallPasses(t *testing.T) {
	g := NewGroup(gputest.Device(t))
	p := newSampledPair(t, g, Options{})
	m := load(t, "untied", checkpoint.F32)
	small, err := g.New(m.Config, m.Weights, Options{KVBytes: 16 << 20, MaxSequences: 8, MaxRows: 6})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { small.Close() })
	st := p.draw(p.tokens(12))
	line := p.tokens(4)
	walk := func(e *Engine) *engine.SampledTree {
		t.Helper()
		const pending = 4 // the context's last tokens, fed with the tree
		tr := *st.tree
		v := &engine.VerifyEntry{
			Seq: p.seq(e, st.context[:len(st.context)-pending]), Tokens: append(slices.Clone(st.context[len(st.context)-pending:]), st.tokens...),
			Out: len(st.tokens) + 1, Sampling: p.params, Tree: &tr,
		}
		for range pending {
			v.Parents = append(v.Parents, treemask.Line)
		}
		v.Parents = append(v.Parents, st.parents...)
		if err := e.Verify(context.Background(), []*engine.VerifyEntry{{Seq: p.seq(e, nil), Tokens: line, Out: 1}, v}); err != nil {
			t.Fatal(err)
		}
		return v.Tree
	}
	got, want := walk(small), walk(p.target)
	if !slices.Equal(got.Path, want.Path) || got.Bonus.Token != want.Bonus.Token {
		t.Errorf("path %v then %d in 6-row passes, %v then %d in one", got.Path, got.Bonus.Token, want.Path, want.Bonus.Token)
	}
}

// TestQStoreFull: proposals past what one storage binding of the Q store
// holds, none verified, are refused (ErrQStoreFull) before any work, and
// the drafter works on.
func TestQStoreFull(t *testing.T) {
	const limit = 256 << 10 // 64 slots of 1,024 tokens
	small, err := gpu.Open(gpu.Options{MaxStorageBufferBindingSize: limit})
	if errors.Is(err, gpu.ErrNoAdapter) {
		gputest.Device(t) // skips or fails as every GPU test does
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	if got := small.Limits().MaxStorageBufferBindingSize; got > limit {
		t.Skipf("the adapter granted %d-byte storage bindings, not %d", got, limit)
	}
	p := newSampledPair(t, NewGroup(small), Options{KVBytes: 1 << 20, MaxSequences: 4})
	propose := func(n int) (engine.Sequence, error) {
		s := p.seq(p.drafter, p.tokens(2))
		v := &engine.VerifyEntry{Seq: s, Tokens: p.tokens(n), Out: n, Sampling: p.params, Propose: make([][]float32, n)}
		for j := range n {
			v.Propose[j] = p.uniforms(1)
		}
		return s, p.drafter.Verify(context.Background(), []*engine.VerifyEntry{v})
	}
	if _, err := propose(40); err != nil {
		t.Fatal(err)
	}
	s, err := propose(40)
	if !errors.Is(err, ErrQStoreFull) || errors.Is(err, engine.ErrFault) {
		t.Fatalf("80 distributions unverified in a store of 64 slots: %v, want ErrQStoreFull", err)
	}
	t.Log(err)
	if s.Len() != 2 {
		t.Errorf("the refused pass left %d positions", s.Len())
	}
	if _, err := propose(20); err != nil {
		t.Errorf("proposals the store holds, after a refusal: %v", err)
	}
}
