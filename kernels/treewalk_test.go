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
	"webdraft/sampling"
	"webdraft/sampling/samplingtest"
)

// walkShape returns a random tree's children, node by node (breadth
// first, so each child comes after its parent): a chain of 1 … maxChain
// nodes, or a tree of 2 … maxKids children a node, depth at most
// maxDepth, at most 40 nodes.
func walkShape(r *rand.Rand, chain bool, maxChain, maxKids, maxDepth int) [][]int {
	if chain {
		n := 1 + r.IntN(maxChain)
		kids := make([][]int, n)
		for j := range n - 1 {
			kids[j] = []int{j + 1}
		}
		return kids
	}
	kids, depth := [][]int{nil}, []int{0}
	for j := 0; j < len(kids); j++ {
		if depth[j] >= maxDepth || j > 0 && r.IntN(3) == 0 {
			continue
		}
		for range 2 + r.IntN(maxKids-1) {
			if len(kids) == 40 {
				break
			}
			kids[j] = append(kids[j], len(kids))
			kids, depth = append(kids, nil), append(depth, depth[j]+1)
		}
	}
	return kids
}

// walkTree is one tree of a TreeWalk test and its oracle's nodes (P
// filled once Sample has read the target's rows out).
type walkTree struct {
	kind  string
	p     sampling.Params
	row0  int
	nodes []sampling.Node
	slots []int // each node's Q-store slot (−1: a leaf)
}

// walkMatch reports whether the oracle (sampling.Verifier.AcceptTree)
// walks nodes to path and bonus, or does with one of the uniforms moved by
// up to boundary (edge; relative for a u, which multiplies q(x)): an
// acceptance flips once as its u moves, and the bonus moves through the
// tokens in order as its v does, so the ends of the move tell.
func walkMatch(t *testing.T, nodes []sampling.Node, path []int, bonus int) (match, edge bool) {
	t.Helper()
	var ver sampling.Verifier
	walk := func(nodes []sampling.Node) ([]int, int) {
		p, b, err := ver.AcceptTree(nodes)
		if err != nil {
			t.Fatal(err)
		}
		return p, b
	}
	same := func(nodes []sampling.Node) bool {
		p, b := walk(nodes)
		return slices.Equal(p, path) && b == bonus
	}
	if same(nodes) {
		return true, false
	}
	moved := slices.Clone(nodes)
	for j, n := range nodes {
		for _, delta := range []float32{-boundary, boundary} {
			for k, u := range n.U { // an acceptance compares u·q(x) with p(x): a relative move
				moved[j].U = nudged(n.U, k, u*delta)
				if same(moved) {
					return true, true
				}
			}
			moved[j].U = n.U
		}
		var ends [2]int
		for e, delta := range []float32{-boundary, boundary} {
			moved[j].V = nudged([]float32{n.V}, 0, delta)[0]
			p, b := walk(moved)
			if !slices.Equal(p, path) {
				ends[e] = -1
			} else {
				ends[e] = b
			}
		}
		moved[j].V = n.V
		if ends[0] >= 0 && ends[1] >= 0 && ends[0] <= bonus && bonus <= ends[1] && n.P[bonus] > 0 {
			return true, true
		}
	}
	return false, false
}

// TestTreeWalk holds tree_walk.wgsl to sampling.Verifier.AcceptTree on
// fresh random trees — chains of 1–8 nodes and trees of 2–4 children a
// node, depth ≤ 4 — whose children were drawn from q by DrawDistinct:
// drafters near the target (its logits, perturbed), poor ones (logits of
// their own), perfect ones (the target's logits), over the whole
// vocabulary or a part of it; temperatures 0.7 and 1.3, top_p 1, 0.9 and
// 0.5; the root's first child's uniform just past its acceptance ratio,
// one side or the other. The path and the bonus must be the oracle's (a
// uniform within 1e-5 of a boundary may fall either way), their log p
// within 1e-4; a tree
// with a NaN on its walk and a malformed one are reported as such. One
// dispatch walks all the trees. At 151,936 tokens the trees are small, so
// that lavapipe's 65,535 loop iterations an invocation hold.
func TestTreeWalk(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, c := range []struct {
		V, trees, maxChain, maxKids, maxDepth int
	}{{1000 + r.IntN(4001), 16, 8, 4, 4}, {151936, 4, 3, 3, 1}} {
		t.Run(fmt.Sprintf("V%d", c.V), func(t *testing.T) {
			V := c.V
			var trees []walkTree
			var target []float32
			var params []sampling.Params
			var vs []float32 // each row's node's V, for Sample's draw
			var qrows []float32
			probes := 0 // roots whose first uniform sits by its acceptance
			for i := range c.trees {
				drafter := []string{"near", "poor", "perfect"}[r.IntN(3)]
				partial := i%3 == 2
				tr := walkTree{
					kind: drafter + " drafter",
					p:    sampling.Params{Temperature: []float32{0.7, 1.3}[r.IntN(2)], TopP: []float32{1, 0.9, 0.5}[r.IntN(3)]},
					row0: len(params),
				}
				var mask []float32 // the drafter head's −∞
				if partial {
					tr.kind += ", partial head"
					mask = make([]float32, V)
					subsetHead(r, mask)
				}
				kids := walkShape(r, i%2 == 0, c.maxChain, c.maxKids, c.maxDepth)
				tr.nodes = make([]sampling.Node, len(kids))
				tr.slots = make([]int, len(kids))
				for j := range kids {
					l := randVec(r, V, 3)
					target = append(target, l...)
					params = append(params, tr.p)
					tr.nodes[j].U, tr.nodes[j].V, tr.slots[j] = randUniforms(r, len(kids[j])), r.Float32(), -1
					vs = append(vs, tr.nodes[j].V)
					if len(kids[j]) == 0 {
						continue
					}
					// The drafter's q, kept in f32 as Propose keeps it, and
					// the children drawn from it.
					dl := slices.Clone(l)
					for i := range dl {
						switch drafter {
						case "near":
							dl[i] += float32(r.NormFloat64() * 0.25)
						case "poor":
							dl[i] = float32(r.NormFloat64() * 3)
						}
					}
					var q []float64
					var drawn []int
					for flat := float32(1); len(drawn) < len(kids[j]); flat /= 2 { // a nucleus too small for the children: a flatter row
						fl := slices.Clone(dl)
						for i := range fl {
							fl[i] *= flat
							if partial {
								fl[i] += mask[i]
							}
						}
						qd, err := sampling.Dist(fl, tr.p)
						if err != nil {
							t.Fatal(err)
						}
						q = make([]float64, V)
						for i, x := range qd {
							q[i] = float64(float32(x))
						}
						if drawn, err = sampling.DrawDistinct(q, randUniforms(r, len(kids[j]))); err != nil {
							t.Fatal(err)
						}
					}
					for _, x := range q {
						qrows = append(qrows, float32(x))
					}
					tr.slots[j] = len(qrows)/V - 1
					tr.nodes[j].Q, tr.nodes[j].Children = q, kids[j]
					for k, ch := range kids[j] {
						tr.nodes[ch].Token = drawn[k]
					}
				}
				// The root's first child's uniform 2·10⁻⁴ (relative) to one side
				// of its acceptance, p(x)/q(x): well past f32's reach, but a p
				// or q off by a part in a thousand decides it the other way.
				if root := &tr.nodes[0]; len(root.Children) > 0 {
					pr, err := sampling.Dist(target[tr.row0*V:(tr.row0+1)*V], tr.p)
					if err != nil {
						t.Fatal(err)
					}
					x := tr.nodes[root.Children[0]].Token
					var qsum float64
					for _, v := range root.Q {
						qsum += v
					}
					if ratio := pr[x] / (root.Q[x] / qsum); ratio > 1e-4 && ratio < 0.995 {
						root.U[0] = float32(ratio * (1 + float64(1-2*(i%2))*2e-4))
						probes++
					}
				}
				trees = append(trees, tr)
			}
			// Two trees the walk must refuse: a NaN in the root's row, a
			// child that is not after its node.
			nanRow, badRow := len(params), len(params)+1
			for range 2 {
				target = append(target, randVec(r, V, 3)...)
				params = append(params, sampling.Params{Temperature: 1})
				vs = append(vs, 0)
			}
			target[nanRow*V+r.IntN(V)] = float32(math.NaN())
			rows, slots := len(params), len(qrows)/V

			records := 0
			path := 0
			for _, tr := range trees {
				records += len(tr.nodes)
				path = max(path, len(tr.nodes)-1)
			}
			entries := make([]uint32, (len(trees)+2)*WalkEntryWords)
			nodes := make([]uint32, (records+2)*WalkNodeWords)
			rec := 0
			for i, tr := range trees {
				PutWalkEntry(entries[i*WalkEntryWords:], tr.row0, rec, len(tr.nodes))
				for j, n := range tr.nodes {
					wn := WalkNode{Slot: tr.slots[j], Children: n.Children, U: n.U, V: n.V}
					for _, ch := range n.Children {
						wn.Tokens = append(wn.Tokens, tr.nodes[ch].Token)
					}
					if err := PutWalkNode(nodes[(rec+j)*WalkNodeWords:], wn); err != nil {
						t.Fatal(err)
					}
				}
				rec += len(tr.nodes)
			}
			PutWalkEntry(entries[len(trees)*WalkEntryWords:], nanRow, rec, 1)
			PutWalkEntry(entries[(len(trees)+1)*WalkEntryWords:], badRow, rec+1, 1)
			if err := PutWalkNode(nodes[(rec+1)*WalkNodeWords:], WalkNode{Slot: 0, Children: []int{0}, Tokens: []int{0}, U: []float32{0.5}}); err != nil {
				t.Fatal(err)
			}
			records += 2

			lb := upload(t, d, "logits", target)
			qb := upload(t, d, "qstore", qrows)
			eb, nb := uploadU32(t, d, "entries", entries), uploadU32(t, d, "nodes", nodes)
			ro := newReadOut(t, d, params, vs, V)
			walk := poisoned(t, d, "walk", (len(trees)+2)*WalkWords(path))
			poisonScratch(t, d, (len(trees)+2)*2*V+rows*(V/walkChunk+1))
			run(t, d, "tree walk", func(b *gpu.Batch) error {
				if err := ro.record(b, lb); err != nil {
					return err
				}
				return TreeWalk(b, walk, lb, ro.out, ro.temps, qb, eb, nb, len(trees)+2, rows, V, slots, records, path)
			})
			read := ro.read(t)
			ww, err := walk.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			edges, thetaEdges, accepted := 0, 0, 0
			for i, tr := range trees {
				name := fmt.Sprintf("tree %d (%s, %+v, %d nodes)", i, tr.kind, tr.p, len(tr.nodes))
				alt := make([][][]float64, len(tr.nodes)) // each node's p, and its others at θ's edge
				for j := range tr.nodes {
					row := tr.row0 + j
					ps, ok := rowDists(t, target[row*V:(row+1)*V], tr.p, read[row].Threshold)
					if !ok {
						want, _ := sampling.Choose(target[row*V:(row+1)*V], tr.p, sampling.Draw{X: sampling.NoProposal})
						t.Fatalf("%s: row %d: Sample's threshold %v is not the nucleus's, %v", name, row, read[row].Threshold, want.Threshold)
					}
					tr.nodes[j].P, alt[j] = ps[0], ps[1:]
				}
				got, lps, bonus, err := WalkResult(ww[i*WalkWords(path):], path)
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				match, edge := walkMatch(t, tr.nodes, got, bonus.Token)
				for j := 0; !match && j < len(tr.nodes); j++ {
					for _, p := range alt[j] {
						moved := slices.Clone(tr.nodes)
						moved[j].P = p
						if match, _ = walkMatch(t, moved, got, bonus.Token); match {
							thetaEdges++
							break
						}
					}
				}
				if !match {
					var ver sampling.Verifier
					want, wb, _ := ver.AcceptTree(tr.nodes)
					t.Errorf("%s: path %v, bonus %d; want %v, %d", name, got, bonus.Token, want, wb)
					continue
				}
				if edge {
					edges++
				}
				accepted += len(got)
				// Each token's log p at temperature 1 under its parent's row.
				parent := 0
				for k, n := range append(got, -1) {
					row := tr.row0 + parent
					l := target[row*V : (row+1)*V]
					want, err := sampling.Choose(l, sampling.Params{}, sampling.Draw{})
					if err != nil {
						t.Fatal(err)
					}
					token, lp := bonus.Token, bonus.Logprob
					if n >= 0 {
						token, lp = tr.nodes[n].Token, lps[k]
					}
					if w := l[token] - want.LogSumExp; !(math.Abs(float64(lp-w)) <= 1e-4*max(1, math.Abs(float64(w)))) {
						t.Errorf("%s: log p(%d) after node %d = %v, want %v", name, token, parent, lp, w)
					}
					parent = n
				}
			}
			if _, _, _, err := WalkResult(ww[len(trees)*WalkWords(path):], path); !errors.Is(err, sampling.ErrNaN) {
				t.Errorf("a tree with a NaN: %v, want ErrNaN", err)
			}
			if _, _, _, err := WalkResult(ww[(len(trees)+1)*WalkWords(path):], path); !errors.Is(err, ErrWalkTree) {
				t.Errorf("a malformed tree: %v, want ErrWalkTree", err)
			}
			t.Logf("%d trees (%d probed at the root), %d tokens accepted; %d walks by a uniform within %v of a boundary, %d by a token at θ kept as Go's division would not (or the reverse)", len(trees), probes, accepted, edges, boundary, thetaEdges)
		})
	}
}

// walkAlpha is the p-value below which TestTreeWalkFollowsP's check
// rejects: the right rule fails one check in 10⁴.
const walkAlpha = 1e-4

// TestTreeWalkFollowsP: over many walks of one node — a poor drafter's
// children drawn from its q, fresh uniforms each walk, all the walks one
// dispatch, each a tree of its own over the same rows — the first token
// out (the accepted child, or the draw from the residual) is distributed
// as the target's p at the node. And the check catches a walk that does
// not renormalize q after a rejection (tree_walk.wgsl's FAULT), on fixed
// rows where that matters.
func TestTreeWalkFollowsP(t *testing.T) {
	d := gputest.Device(t)
	const V, trials = 16, 4000
	for _, c := range []struct {
		name  string
		p     sampling.Params
		kids  int
		fault bool
		seed  uint64 // 0: fresh
	}{
		{"T 1, 4 children", sampling.Params{Temperature: 1}, 4, false, 0},
		{"T 0.7, top_p 0.9, 3 children", sampling.Params{Temperature: 0.7, TopP: 0.9}, 3, false, 0},
		{"chain", sampling.Params{Temperature: 1.3}, 1, false, 0},
		{"FAULT: q not renormalized", sampling.Params{Temperature: 1}, 4, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r *rand.Rand
			if c.seed == 0 {
				r = newRand(t)
			} else {
				r = rand.New(rand.NewPCG(c.seed, 0x5eed))
			}
			// Row 0 the node's, rows 1 … kids its children's (their
			// bonus draws are not counted).
			rows := 1 + c.kids
			target := randVec(r, rows*V, 1.5)
			for { // a node whose nucleus holds a few tokens: bins to test
				p, err := sampling.Dist(target[:V], c.p)
				if err != nil {
					t.Fatal(err)
				}
				if countPositive(p) >= 4 {
					break
				}
				target = append(randVec(r, V, 1.5), target[V:]...)
			}
			params := make([]sampling.Params, rows)
			for i := range params {
				params[i] = c.p
			}
			qd, err := sampling.Dist(randVec(r, V, 2.5), c.p) // a poor drafter
			if err != nil {
				t.Fatal(err)
			}
			q32 := make([]float32, V)
			q := make([]float64, V)
			for i, x := range qd {
				q32[i] = float32(x)
				q[i] = float64(q32[i])
			}
			entries := make([]uint32, trials*WalkEntryWords)
			nodes := make([]uint32, trials*rows*WalkNodeWords)
			tokens := make([][]int, trials)
			for e := range trials {
				PutWalkEntry(entries[e*WalkEntryWords:], 0, e*rows, rows)
				drawn, err := sampling.DrawDistinct(q, randUniforms(r, c.kids))
				if err != nil {
					t.Fatal(err)
				}
				tokens[e] = drawn
				root := WalkNode{Slot: 0, Tokens: drawn, U: randUniforms(r, len(drawn)), V: r.Float32()}
				for k := range drawn {
					root.Children = append(root.Children, 1+k)
				}
				for j := range rows {
					n := WalkNode{V: r.Float32()}
					if j == 0 {
						n = root
					}
					if err := PutWalkNode(nodes[(e*rows+j)*WalkNodeWords:], n); err != nil {
						t.Fatal(err)
					}
				}
			}
			lb, qb := upload(t, d, "logits", target), upload(t, d, "qstore", q32)
			eb, nb := uploadU32(t, d, "entries", entries), uploadU32(t, d, "nodes", nodes)
			ro := newReadOut(t, d, params, nil, V) // the leaves' draws are not counted
			path := rows - 1
			walk := poisoned(t, d, "walk", trials*WalkWords(path))
			var consts gpu.Consts
			if c.fault {
				consts = gpu.Consts{"FAULT": 1}
			}
			run(t, d, "tree walk", func(b *gpu.Batch) error {
				if err := ro.record(b, lb); err != nil {
					return err
				}
				return treeWalk(b, walk, lb, ro.out, ro.temps, qb, eb, nb, trials, rows, V, 1, trials*rows, path, consts)
			})
			ww, err := walk.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			ps, ok := rowDists(t, target[:V], c.p, ro.read(t)[0].Threshold)
			if !ok {
				t.Fatal("Sample's threshold is not the nucleus's")
			}
			counts := make([]int, V)
			first := 0
			for e := range trials {
				got, _, bonus, err := WalkResult(ww[e*WalkWords(path):], path)
				if err != nil {
					t.Fatalf("walk %d: %v", e, err)
				}
				token := bonus.Token
				if len(got) > 0 {
					token = tokens[e][got[0]-1]
					if got[0] == 1 {
						first++
					}
				}
				counts[token]++
			}
			var fit samplingtest.Fit
			for k, p := range ps { // the best fit among p and its others at θ's edge
				f, err := samplingtest.GoodnessOfFit(counts, p)
				if err != nil {
					t.Fatal(err)
				}
				if k == 0 || f.PValue > fit.PValue {
					fit = f
				}
			}
			t.Logf("χ² %.2f on %d df, p-value %.3g; first child accepted %.3f", fit.Stat, fit.DF, fit.PValue, float64(first)/trials)
			if c.fault != (fit.PValue < walkAlpha) {
				t.Errorf("fault %v: p-value %.3g against %v", c.fault, fit.PValue, walkAlpha)
			}
		})
	}
}

// countPositive is how many of p are above 0.
func countPositive(p []float64) int {
	n := 0
	for _, x := range p {
		if x > 0 {
			n++
		}
	}
	return n
}
