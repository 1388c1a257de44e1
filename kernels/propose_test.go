package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
)

// The kernels of sampled drafts join TestParamsMatchWGSL's list.
func init() {
	kernelsOf["proposeWeights"] = proposeWeights
	kernelsOf["proposeDraw"] = proposeDraw
	kernelsOf["proposeDense"] = proposeDense
	kernelsOf["treeWalkSums"] = treeWalkSums
	kernelsOf["treeWalkKernel"] = treeWalkKernel
}

// boundary is how far (as a uniform) a draw's or a test's uniform may come
// to a boundary of the rule before the tests let the kernel fall on either
// side of it: the kernels sum in f32, in another order than the oracle's
// float64.
const boundary = 1e-5

// readOut is Sample's buffers for rows read out with given params, no
// proposals and given draw uniforms (nil: 0), as a drafter's or a
// target's pass reads them out before Propose or TreeWalk (a walked row's
// uniform is its node's V: PutWalkSampleRow).
type readOut struct {
	out, temps, draws, top, ids, lps *gpu.Buffer
	rows, V                          int
}

func newReadOut(tb testing.TB, d *gpu.Device, params []sampling.Params, vs []float32, V int) *readOut {
	tb.Helper()
	rows := len(params)
	dw, tw := make([]uint32, rows*SampleDrawWords), make([]float32, rows*SampleTempWords)
	for row, p := range params {
		var v float32
		if vs != nil {
			v = vs[row]
		}
		PutWalkSampleRow(dw[row*SampleDrawWords:], tw[row*SampleTempWords:], p, v)
	}
	k := tbBuffers{tb, d}
	return &readOut{
		out: k.poisoned("sampled", rows*SampleWords), temps: k.keep(d.UploadF32("temps", tw)), draws: k.keep(d.UploadU32("draws", dw)),
		top: k.poisoned("top", rows*2), ids: k.poisoned("ids", rows), lps: k.poisoned("lps", rows),
		rows: rows, V: V,
	}
}

// tbBuffers makes buffers for a test or a benchmark, released when it
// ends.
type tbBuffers struct {
	tb testing.TB
	d  *gpu.Device
}

// keep fails the test on err, else releases b when the test ends.
func (k tbBuffers) keep(b *gpu.Buffer, err error) *gpu.Buffer {
	k.tb.Helper()
	if err != nil {
		k.tb.Fatal(err)
	}
	k.tb.Cleanup(b.Release)
	return b
}

// poisoned is a buffer of n words of NaN.
func (k tbBuffers) poisoned(name string, n int) *gpu.Buffer {
	k.tb.Helper()
	b := k.keep(k.d.NewBuffer(name, uint64(n)*4))
	if err := b.Fill(gpu.NaN32); err != nil {
		k.tb.Fatal(err)
	}
	return b
}

// record records Sample over logits.
func (ro *readOut) record(b *gpu.Batch, logits *gpu.Buffer) error {
	return Sample(b, ro.out, ro.top, ro.ids, ro.lps.All(), logits, ro.draws, ro.temps, ro.rows, ro.V, 0)
}

// read returns each row's read-out.
func (ro *readOut) read(t testing.TB) []sampling.Row {
	t.Helper()
	w, err := ro.out.ReadU32()
	if err != nil {
		t.Fatal(err)
	}
	rows := make([]sampling.Row, ro.rows)
	for i := range rows {
		rows[i], _ = SampleRow(w[i*SampleWords:]) // a NaN row stays zero
	}
	return rows
}

// rowDists returns the distributions the kernels may hold row l to under
// p, given Sample's nucleus threshold theta. First sampling.Dist — or,
// where theta is not sampling's threshold but a neighbour at its edge (the
// f32 sums' order deciding, see nucleusEdge), the softmax over the tokens
// at or above theta, as Dist computes it. Then, for each token whose
// scaled logit lies within edgeULPs of theta, the same with that token
// kept or not the other way: an adapter whose division does not round as
// Go's does (NVIDIA's) may scale the token at θ an ulp apart, and keeps it
// where Go would not (it is the token θ was taken from). ok is false when
// theta is neither threshold.
func rowDists(t testing.TB, l []float32, p sampling.Params, theta float32) (qs [][]float64, ok bool) {
	t.Helper()
	q, err := sampling.Dist(l, p)
	if err != nil {
		t.Fatal(err)
	}
	if p.Greedy() || p.TopP <= 0 || p.TopP >= 1 {
		return [][]float64{q}, true
	}
	want, err := sampling.Choose(l, p, sampling.Draw{X: sampling.NoProposal})
	if err != nil {
		t.Fatal(err)
	}
	kept := func(i int) bool { return l[i]/p.Temperature >= theta }
	if theta != want.Threshold {
		if !nucleusEdge(l, p, theta, want.Threshold) {
			return nil, false
		}
		q = softmaxOver(l, p.Temperature, kept)
	}
	if q != nil { // nil: Go's division puts every token below theta
		qs = append(qs, q)
	}
	ulp := math.Nextafter32(theta, float32(math.Inf(1))) - theta
	for i, x := range l {
		if d := x/p.Temperature - theta; d >= -edgeULPs*ulp && d <= edgeULPs*ulp {
			if q := softmaxOver(l, p.Temperature, func(k int) bool { return kept(k) != (k == i) }); q != nil {
				qs = append(qs, q)
			}
		}
	}
	return qs, len(qs) > 0
}

// edgeULPs is how many ulps of θ a token's scaled logit may lie from it
// and be kept or not either way (rowDists).
const edgeULPs = 4

// softmaxOver is the softmax of l / T over the tokens kept, 0 elsewhere,
// computed as sampling.Dist computes it; nil when none is kept.
func softmaxOver(l []float32, T float32, kept func(i int) bool) []float64 {
	best := slices.Max(l)
	q := make([]float64, len(l))
	var sum float64
	for i, x := range l {
		if kept(i) {
			q[i] = math.Exp(float64((x - best) / T))
			sum += q[i]
		}
	}
	if sum == 0 {
		return nil
	}
	for i := range q {
		q[i] /= sum
	}
	return q
}

// nudged returns u with u[k] moved by delta, kept in [0, 1).
func nudged(u []float32, k int, delta float32) []float32 {
	v := slices.Clone(u)
	v[k] = min(max(v[k]+delta, 0), math.Nextafter32(1, 0))
	return v
}

// proposeRow is one row of TestPropose: its params, its uniforms, its
// Q-store slot and what the row is.
type proposeRow struct {
	p    sampling.Params
	us   []float32
	slot int
	kind string
}

// TestPropose holds propose.wgsl to sampling.Dist and sampling.DrawDistinct
// on fresh random rows read out by Sample, as a drafter's pass runs them:
// temperatures 0.7 and 1.3, top_p 1, 0.9 and 0.5, heads over the whole
// vocabulary and over a random part of it (scattered among −∞), 1, 3 or
// 20 tokens a row; a peaked row whose nucleus holds fewer tokens than it
// draws, a greedy row, a NaN row, a row that keeps no q and one that draws
// nothing. The tokens must be the oracle's (a uniform within 1e-5 of a
// boundary may fall either way), log q within 1e-4, and the dense q row
// within 1e-6 of the oracle's everywhere.
func TestPropose(t *testing.T) {
	d := gputest.Device(t)
	r := newRand(t)
	for _, V := range []int{1000 + r.IntN(4001), 151936} {
		rows := 14
		t.Run(fmt.Sprintf("V%d", V), func(t *testing.T) {
			logits := randVec(r, rows*V, 3)
			spec := make([]proposeRow, rows)
			params := make([]sampling.Params, rows)
			slots := rows + 2
			slotOf := r.Perm(slots)
			for row := range rows {
				l := logits[row*V : (row+1)*V]
				s := proposeRow{
					p:    sampling.Params{Temperature: []float32{0.7, 1.3}[r.IntN(2)], TopP: []float32{1, 0.9, 0.5}[r.IntN(3)]},
					us:   randUniforms(r, []int{1, 3, 20}[r.IntN(3)]),
					slot: slotOf[row],
					kind: "full head",
				}
				if row%2 == 1 {
					s.kind = "partial head"
					subsetHead(r, l)
				}
				switch row {
				case 0:
					s.kind, s.p, s.us = "peaked", sampling.Params{Temperature: 1, TopP: 0.5}, randUniforms(r, 3)
					l[r.IntN(V)] = 40
				case 2:
					s.kind, s.p = "greedy", sampling.Params{}
				case 4:
					s.kind = "NaN"
					l[r.IntN(V)] = float32(math.NaN())
				case 6:
					s.kind, s.slot = "no q kept", ProposeNoSlot
				case 8:
					s.kind, s.us = "no draws", nil
				}
				spec[row], params[row] = s, s.p
			}
			props := make([]uint32, rows*ProposeWords)
			for row, s := range spec {
				if err := PutProposeRow(props[row*ProposeWords:], s.us, s.slot); err != nil {
					t.Fatal(err)
				}
			}
			lb := upload(t, d, "logits", logits)
			ro := newReadOut(t, d, params, nil, V)
			pb := uploadU32(t, d, "props", props)
			drawn := poisoned(t, d, "drawn", rows*ProposeDrawnWords)
			qb := poisoned(t, d, "qstore", slots*V)
			poisonScratch(t, d, rows*(V/proposeChunk+2))
			run(t, d, "propose", func(b *gpu.Batch) error {
				if err := ro.record(b, lb); err != nil {
					return err
				}
				return Propose(b, drawn, qb, lb, ro.out, ro.temps, pb, rows, V, slots)
			})
			read := ro.read(t)
			dw, err := drawn.ReadU32()
			if err != nil {
				t.Fatal(err)
			}
			qstore := readF32(t, qb, slots*V)
			edges, thetaEdges := 0, 0
			for row, s := range spec {
				l := logits[row*V : (row+1)*V]
				name := fmt.Sprintf("row %d (%s, %+v, %d draws)", row, s.kind, s.p, len(s.us))
				got, logq := ProposeDrawn(dw[row*ProposeDrawnWords:])
				if s.kind == "NaN" {
					if len(got) != 0 {
						t.Errorf("%s: drew %v", name, got)
					}
					for i, v := range qstore[s.slot*V : (s.slot+1)*V] {
						if v != 0 {
							t.Errorf("%s: q[%d] = %v, want 0", name, i, v)
							break
						}
					}
					continue
				}
				qs, ok := rowDists(t, l, s.p, read[row].Threshold)
				if !ok {
					t.Errorf("%s: Sample's threshold %v is not the nucleus's", name, read[row].Threshold)
					continue
				}
				var qrow []float32
				if s.slot != ProposeNoSlot {
					qrow = qstore[s.slot*V : (s.slot+1)*V]
				}
				var errs []string
				for k, q := range qs { // the first that fits
					var edge bool
					if errs, edge = checkProposal(q, s.us, got, logq, qrow); len(errs) == 0 {
						if edge {
							edges++
						}
						if k > 0 {
							thetaEdges++
						}
						break
					}
				}
				for _, e := range errs {
					t.Errorf("%s: %s", name, e)
				}
				if s.kind == "peaked" && len(got) != 1 {
					t.Errorf("%s: %d tokens drawn from a nucleus of one", name, len(got))
				}
			}
			// The slots no row names keep their poison.
			for slot := range slots {
				if !slices.ContainsFunc(spec, func(s proposeRow) bool { return s.slot == slot }) && !math.IsNaN(float64(qstore[slot*V])) {
					t.Errorf("slot %d, no row's, was written", slot)
				}
			}
			if edges+thetaEdges > 0 {
				t.Logf("%d rows drew by a uniform within %v of a boundary, %d kept a token at θ that Go's division leaves out or the reverse", edges, boundary, thetaEdges)
			}
		})
	}
}

// checkProposal holds one row's proposals to q: the tokens drawn with u
// (edge: where they are not sampling.DrawDistinct's, each lies within
// boundary, as a uniform, of where its u falls in the inverse CDF of q
// without the tokens drawn before it), their log q, and the dense row qrow
// (nil: none kept).
func checkProposal(q []float64, u []float32, got []int, logq []float32, qrow []float32) (errs []string, edge bool) {
	want, err := sampling.DrawDistinct(q, u)
	if err != nil {
		return []string{err.Error()}, false
	}
	if !slices.Equal(got, want) {
		edge = true
		left := slices.Clone(q)
		for k, x := range got {
			var below, total float64
			for i, w := range left {
				if i < x {
					below += w
				}
				total += w
			}
			if at := float64(u[k]) * total; k >= len(u) || x < 0 || x >= len(q) || left[x] == 0 ||
				at < below-boundary*total || at > below+left[x]+boundary*total {
				errs = append(errs, fmt.Sprintf("drew %v, want %v (draw %d too far from its uniform)", got, want, k))
				break
			}
			left[x] = 0
		}
		if slices.Max(append(left, 0)) > 0 && len(got) < len(u) {
			errs = append(errs, fmt.Sprintf("drew %v, want %v (stopped with mass left)", got, want))
		}
	}
	for k, x := range got {
		if x < 0 || x >= len(q) || q[x] == 0 {
			errs = append(errs, fmt.Sprintf("token %d drawn, q = 0 there", x))
			continue
		}
		if w := math.Log(q[x]); !(math.Abs(float64(logq[k])-w) <= 1e-4) {
			errs = append(errs, fmt.Sprintf("log q(%d) = %v, want %v", x, logq[k], w))
		}
	}
	for i, v := range qrow {
		if !(math.Abs(float64(v)-q[i]) <= 1e-6) {
			errs = append(errs, fmt.Sprintf("q[%d] = %v, want %v", i, v, q[i]))
			break
		}
	}
	return errs, edge
}

// randUniforms returns n uniforms in [0, 1).
func randUniforms(r *rand.Rand, n int) []float32 {
	u := make([]float32, n)
	for i := range u {
		u[i] = r.Float32()
	}
	return u
}

// subsetHead makes l a row of a head over a random part of the vocabulary
// (a quarter to three quarters of it), scattered among −∞.
func subsetHead(r *rand.Rand, l []float32) {
	keep := len(l)/4 + r.IntN(len(l)/2+1)
	for _, i := range r.Perm(len(l))[keep:] {
		l[i] = float32(math.Inf(-1))
	}
}
