package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
)

// BenchmarkPropose times a sampled drafter's proposals over rows of
// Qwen3's 151,936 logits already read out by Sample (recorded once, not
// timed): 4 or 20 tokens a row, every token kept or a 0.95 nucleus, q
// written to the Q store. Rows 1 (a chain's step) and 8 (a tree level).
// Reports µs a Propose. On the H200 (2026-12-02): 43 µs for 4 tokens, 184
// for 20, whatever the rows (their workgroups run side by side).
func BenchmarkPropose(b *testing.B) {
	d := gputest.Device(b)
	const V = 151936
	r := rand.New(rand.NewPCG(5, 6))
	for _, rows := range []int{1, 8} {
		for _, c := range []struct {
			name string
			p    sampling.Params
			m    int
		}{
			{"t0.7_m4", sampling.Params{Temperature: 0.7, TopP: 1}, 4},
			{"t0.7_m20", sampling.Params{Temperature: 0.7, TopP: 1}, 20},
			{"t0.7_p0.95_m20", sampling.Params{Temperature: 0.7, TopP: 0.95}, 20},
		} {
			b.Run(fmt.Sprintf("%s/rows%d", c.name, rows), func(b *testing.B) {
				params := make([]sampling.Params, rows)
				props := make([]uint32, rows*ProposeWords)
				for i := range rows {
					params[i] = c.p
					if err := PutProposeRow(props[i*ProposeWords:], randUniforms(r, c.m), i); err != nil {
						b.Fatal(err)
					}
				}
				k := tbBuffers{b, d}
				lg := k.keep(d.UploadF32("logits", randVec(r, rows*V, 3)))
				pb := k.keep(d.UploadU32("props", props))
				drawn := k.poisoned("drawn", rows*ProposeDrawnWords)
				qstore := k.poisoned("qstore", rows*V)
				ro := newReadOut(b, d, params, nil, V)
				if err := submit(d, func(bt *gpu.Batch) error { return ro.record(bt, lg) }); err != nil {
					b.Fatal(err)
				}
				sec := benchMatMuls(b, d, drawn, 16, func(bt *gpu.Batch) error {
					return Propose(bt, drawn, qstore, lg, ro.out, ro.temps, pb, rows, V, rows)
				})
				b.ReportMetric(sec*1e6, "µs/propose")
			})
		}
	}
}

// BenchmarkTreeWalk times the target's walk of sampled trees over rows of
// 151,936 logits read out by Sample (recorded once, not timed), one tree
// a workgroup, 1 or 8 trees at once: a chain of 8 whose drafter is the
// target (every node accepted: no pass over a row in the walk, the bonus
// Sample's draw), a node whose 4 children a poor drafter drew (mostly all
// rejected: 4 residual passes and a draw from the residual), and a node
// with no children (Sample's draw). Each includes TreeWalk's sums pass.
// Reports µs a TreeWalk. On the H200 (2026-12-02): 32, 358 and 13 µs
// (one tree), 51, 379 and 15 µs (8).
func BenchmarkTreeWalk(b *testing.B) {
	d := gputest.Device(b)
	const V = 151936
	r := rand.New(rand.NewPCG(7, 8))
	p := sampling.Params{Temperature: 0.7, TopP: 1}
	for _, trees := range []int{1, 8} {
		for _, c := range []struct {
			name       string
			nodes, kid int  // nodes a tree; children of its root (a chain: 1)
			same       bool // the drafter's logits are the target's
		}{
			{"chain8_accepted", 9, 1, true},
			{"4children_rejected", 5, 4, false},
			{"leaf", 1, 0, false},
		} {
			b.Run(fmt.Sprintf("%s/trees%d", c.name, trees), func(b *testing.B) {
				rows := trees * c.nodes
				target := randVec(r, rows*V, 3)
				params := make([]sampling.Params, rows)
				var qrows []float32
				entries := make([]uint32, trees*WalkEntryWords)
				nodes := make([]uint32, rows*WalkNodeWords)
				for t := range trees {
					PutWalkEntry(entries[t*WalkEntryWords:], t*c.nodes, t*c.nodes, c.nodes)
					for j := range c.nodes {
						row := t*c.nodes + j
						params[row] = p
						n := WalkNode{V: r.Float32()}
						kids := c.kid
						if c.kid == 1 && j == c.nodes-1 || c.kid > 1 && j > 0 {
							kids = 0
						}
						if kids > 0 {
							dl := target[row*V : (row+1)*V]
							if !c.same {
								dl = randVec(r, V, 3)
							}
							q, err := sampling.Dist(dl, p)
							if err != nil {
								b.Fatal(err)
							}
							drawn, err := sampling.DrawDistinct(q, randUniforms(r, kids))
							if err != nil {
								b.Fatal(err)
							}
							n.Slot = len(qrows) / V
							for _, x := range q {
								qrows = append(qrows, float32(x))
							}
							for k, x := range drawn {
								n.Children = append(n.Children, j+1+k)
								n.Tokens = append(n.Tokens, x)
							}
							n.U = randUniforms(r, kids)
						}
						if err := PutWalkNode(nodes[row*WalkNodeWords:], n); err != nil {
							b.Fatal(err)
						}
					}
				}
				if qrows == nil {
					qrows = make([]float32, V)
				}
				k := tbBuffers{b, d}
				lg, qb := k.keep(d.UploadF32("logits", target)), k.keep(d.UploadF32("qstore", qrows))
				eb, nb := k.keep(d.UploadU32("entries", entries)), k.keep(d.UploadU32("nodes", nodes))
				path := max(c.nodes-1, 1)
				walk := k.poisoned("walk", trees*WalkWords(path))
				ro := newReadOut(b, d, params, nil, V)
				if err := submit(d, func(bt *gpu.Batch) error { return ro.record(bt, lg) }); err != nil {
					b.Fatal(err)
				}
				sec := benchMatMuls(b, d, walk, 16, func(bt *gpu.Batch) error {
					return TreeWalk(bt, walk, lg, ro.out, ro.temps, qb, eb, nb, trees, rows, V, len(qrows)/V, rows, path)
				})
				b.ReportMetric(sec*1e6, "µs/walk")
				ww, err := walk.ReadU32()
				if err != nil {
					b.Fatal(err)
				}
				got, _, _, err := WalkResult(ww, path)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(len(got)), "accepted")
			})
		}
	}
}

// submit records ops into one batch and submits it.
func submit(d *gpu.Device, ops func(*gpu.Batch) error) error {
	bt, err := d.NewBatch("setup")
	if err != nil {
		return err
	}
	if err := ops(bt); err != nil {
		bt.Discard()
		return err
	}
	return bt.Submit()
}
