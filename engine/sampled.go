package engine

import (
	"fmt"
	"math"

	"webdraft/sampling"
)

// HostSampler reads out sampled drafts on the host, for the engines whose
// logits are in host memory (the reference and CPU engines): a drafter's
// proposals (VerifyEntry.Propose) and a target's verification of them
// (VerifyEntry.Tree), by package sampling's rule. It keeps its scratch rows
// from entry to entry; it is not safe for concurrent use.
type HostSampler struct {
	ver  sampling.Verifier
	q    []float64
	toks []int
}

// Read applies e's proposals or tree to its read-out rows: logits(j) is
// row j's logits over the whole vocabulary (valid until the next call).
// Rows already hold each row's greedy read-out.
func (h *HostSampler) Read(e *VerifyEntry, logits func(j int) []float32) error {
	switch {
	case e.Sampling.Greedy():
		return nil
	case e.Propose != nil:
		return h.propose(e, logits)
	case e.Tree != nil:
		return h.verify(e, logits)
	}
	return nil
}

// propose draws each row's proposals from its distribution and keeps the
// distribution (compacted to its non-zero tokens where they are few).
func (h *HostSampler) propose(e *VerifyEntry, logits func(j int) []float32) error {
	for j, us := range e.Propose {
		if len(us) == 0 {
			continue
		}
		q, err := h.ver.Dist(logits(j), e.Sampling)
		if err != nil {
			return fmt.Errorf("row %d: %w", j, err)
		}
		drawn, err := h.ver.DrawDistinct(q, us)
		if err != nil {
			return fmt.Errorf("row %d: %w", j, err)
		}
		r := &e.Rows[j]
		r.Drawn, r.DrawnLogprob = drawn, make([]float32, len(drawn))
		for k, x := range drawn {
			r.DrawnLogprob[k] = float32(math.Log(q[x]))
		}
		r.Q = compact(q)
	}
	return nil
}

// compact is q as a HostDist: its non-zero tokens alone when they are at
// most half of it.
func compact(q []float64) *HostDist {
	n := 0
	for _, p := range q {
		if p > 0 {
			n++
		}
	}
	if n > len(q)/2 {
		d := &HostDist{P: make([]float32, len(q))}
		for i, p := range q {
			d.P[i] = float32(p)
		}
		return d
	}
	d := &HostDist{Tokens: make([]int32, 0, n), P: make([]float32, 0, n)}
	for i, p := range q {
		if p > 0 {
			d.Tokens = append(d.Tokens, int32(i))
			d.P = append(d.P, float32(p))
		}
	}
	return d
}

// verify walks e's tree from the root by the multi-draft rule.
func (h *HostSampler) verify(e *VerifyEntry, logits func(j int) []float32) error {
	t := e.Tree
	t.Path, t.Logprobs = t.Path[:0], t.Logprobs[:0]
	first := len(e.Tokens) - e.Out
	node := 0
	for {
		row := logits(node)
		p, err := h.ver.Dist(row, e.Sampling)
		if err != nil {
			return fmt.Errorf("node %d: %w", node, err)
		}
		n := t.Nodes[node]
		var q []float64
		h.toks = h.toks[:0]
		if len(n.Children) > 0 {
			hd, ok := n.Q.(*HostDist)
			if !ok {
				return fmt.Errorf("node %d: a distribution of another engine (%T)", node, n.Q)
			}
			h.q = hd.Dense(h.q, len(p))
			q = h.q
			for _, ch := range n.Children {
				h.toks = append(h.toks, e.Tokens[first+ch])
			}
		}
		at, tok, err := h.ver.AcceptNode(p, q, h.toks, n.U, n.V)
		if err != nil {
			return fmt.Errorf("node %d: %w", node, err)
		}
		lse := e.Rows[node].LogSumExp
		if at < 0 {
			t.Bonus = sampling.TokenLogprob{Token: tok, Logprob: row[tok] - lse}
			return nil
		}
		node = n.Children[at]
		t.Path = append(t.Path, node)
		t.Logprobs = append(t.Logprobs, row[tok]-lse)
	}
}
