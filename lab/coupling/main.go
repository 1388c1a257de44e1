// Command coupling measures how often a drafter's proposal is accepted
// under three rules for sampled drafts, on the embedded pair in plain Go
// (package reference), one draft position at a time: the target samples
// its own continuation of each held-out prompt at a temperature, and at
// each position p (the target's distribution) and q (the EAGLE-3 head's,
// over the target's features) give
//
//	greedy:  p(argmax q)    a greedy proposal under the greedy-draft rule
//	coupled: P(x = y)       x, y Gumbel-max draws of q and p under one key
//	                        (sampling's coupled draws; Monte Carlo)
//	optimal: Σ min(p, q)    a draw from q under speculative sampling
//
// At --temperature 0 the target continues greedily and the rules are one:
// how often the head's greedy token is the target's, by the target's own
// probability of its token (how sure it is), with how many of the target's
// tokens the head's draft vocabulary holds.
//
// Usage: go run ./lab/coupling [--prompts 12] [--tokens 40] [--temperature 0.7] [--keys 400]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strings"

	"webdraft/checkpoint"
	"webdraft/reference"
	"webdraft/weights"
)

func main() {
	prompts := flag.Int("prompts", 12, "held-out prompts (weights/heldout_prompts.jsonl)")
	tokens := flag.Int("tokens", 40, "positions a prompt: the target's sampled continuation")
	temp := flag.Float64("temperature", 0.7, "the sampling temperature of both models (0: greedy, by the target's confidence)")
	keys := flag.Int("keys", 400, "coupled draws a position (Monte Carlo)")
	flag.Parse()
	if err := run(*prompts, *tokens, *temp, *keys); err != nil {
		slog.Error("coupling", "err", err)
		os.Exit(1)
	}
}

// pair is the embedded target and head in plain Go.
type pair struct {
	target *reference.Model
	head   *reference.Head
	aux    []int
	vocab  int
	// draftVocab is the head's draft vocabulary's size; draftSet its
	// tokens in the target's vocabulary, made on first use.
	draftVocab int
	draftSet   map[int]bool
}

func load() (*pair, error) {
	if !weights.Embedded() {
		return nil, errors.New("built without the embedded models")
	}
	tm, err := checkpoint.LoadFS(weights.FS(), weights.TargetDir, checkpoint.LoadOptions{})
	if err != nil {
		return nil, err
	}
	hm, err := checkpoint.LoadEagle3FS(weights.FS(), weights.HeadDir, checkpoint.LoadOptions{})
	if err != nil {
		return nil, err
	}
	target, err := reference.New(tm.Config, tm.Weights)
	if err != nil {
		return nil, err
	}
	head, err := reference.NewHead(hm.Config, hm.Weights, tm.Weights.EmbedTokens)
	if err != nil {
		return nil, err
	}
	return &pair{target: target, head: head, aux: hm.Config.Aux(tm.Config.NumHiddenLayers), vocab: tm.Config.VocabSize, draftVocab: hm.Config.DraftVocabSize}, nil
}

func run(nPrompts, nTokens int, T float64, nKeys int) error {
	pr, err := load()
	if err != nil {
		return fmt.Errorf("the embedded pair: %w", err)
	}
	f, err := os.Open("weights/heldout_prompts.jsonl")
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	rng := rand.New(rand.NewPCG(1, 2))
	var sure confidence
	var greedy, coupled, optimal float64
	n := 0
	for i := 0; i < nPrompts && sc.Scan(); i++ {
		var line struct {
			IDs []int `json:"ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("prompt %d: %w", i, err)
		}
		text, start, err := pr.continuation(line.IDs[:min(len(line.IDs), 96)], nTokens, T, rng)
		if err != nil {
			return fmt.Errorf("prompt %d: %w", i, err)
		}
		dT := T
		if T == 0 { // the distributions themselves, to weigh the target's confidence
			dT = 1
		}
		ps, qs, err := pr.dists(text, start, dT)
		if err != nil {
			return fmt.Errorf("prompt %d: %w", i, err)
		}
		if T == 0 {
			for k := range ps {
				sure.add(ps[k], qs[k], text[start+k+1], pr)
			}
			fmt.Printf("prompts %d: %s", i+1, &sure)
			continue
		}
		for k := range ps {
			g, c, o := rates(ps[k], qs[k], nKeys, rng)
			greedy, coupled, optimal, n = greedy+g, coupled+c, optimal+o, n+1
		}
		fmt.Printf("prompts %d, positions %d: greedy %.3f, coupled %.3f, optimal %.3f\n", i+1, n, greedy/float64(n), coupled/float64(n), optimal/float64(n))
	}
	return sc.Err()
}

// continuation appends the target's continuation of nTokens to prompt,
// sampled at T (greedy at 0); start is the first position it predicts.
func (pr *pair) continuation(prompt []int, nTokens int, T float64, rng *rand.Rand) ([]int, int, error) {
	text := append([]int(nil), prompt...)
	seq := pr.target.NewSequence()
	l, err := pr.target.Forward(seq, text)
	if err != nil {
		return nil, 0, err
	}
	for range nTokens {
		y := argmax(l)
		if T > 0 {
			p := softmax(l, 1/T)
			u, acc := rng.Float64(), 0.0
			y = len(p) - 1
			for i, pi := range p {
				if acc += pi; u < acc {
					y = i
					break
				}
			}
		}
		text = append(text, y)
		if l, err = pr.target.Forward(seq, []int{y}); err != nil {
			return nil, 0, err
		}
	}
	return text, len(prompt), nil
}

// dists returns, for each position from start on but the last, the
// target's and the head's distributions over the next token.
func (pr *pair) dists(text []int, start int, T float64) (ps, qs [][]float64, err error) {
	logits, feats, err := pr.target.ForwardFeatures([]reference.Input{{Seq: pr.target.NewSequence(), Tokens: text}}, []int{len(text)}, pr.aux)
	if err != nil {
		return nil, nil, err
	}
	// The head's row at token s reads the target's features at s − 1.
	rows, err := pr.head.Forward(pr.head.NewSequence(), text[1:], feats[0][:len(text)-1])
	if err != nil {
		return nil, nil, err
	}
	for s := start; s < len(text)-1; s++ {
		q := make([]float64, pr.vocab)
		for d, v := range softmax(rows[s-1].Logits, 1/T) {
			q[pr.head.TargetToken(d)] += v
		}
		ps, qs = append(ps, softmax(logits[0][s], 1/T)), append(qs, q)
	}
	return ps, qs, nil
}

// rates are one position's acceptance rates under the three rules.
func rates(p, q []float64, nKeys int, rng *rand.Rand) (greedy, coupled, optimal float64) {
	best := 0
	for i := range q {
		optimal += math.Min(p[i], q[i])
		if q[i] > q[best] {
			best = i
		}
	}
	// Tokens below 1e-9 under both never win a Gumbel-max draw in practice.
	var lp, lq []float64
	for i := range p {
		if p[i] > 1e-9 || q[i] > 1e-9 {
			lp, lq = append(lp, math.Log(p[i])), append(lq, math.Log(q[i]))
		}
	}
	hits := 0
	for range nKeys {
		bx, by, x, y := math.Inf(-1), math.Inf(-1), -1, -1
		for i := range lp {
			g := -math.Log(-math.Log(rng.Float64()))
			if v := lp[i] + g; v > by {
				by, y = v, i
			}
			if v := lq[i] + g; v > bx {
				bx, x = v, i
			}
		}
		if x == y {
			hits++
		}
	}
	return p[best], float64(hits) / float64(nKeys), optimal
}

func softmax(l []float32, invT float64) []float64 {
	m := math.Inf(-1)
	for _, v := range l {
		m = math.Max(m, float64(v))
	}
	p := make([]float64, len(l))
	var s float64
	for i, v := range l {
		p[i] = math.Exp((float64(v) - m) * invT)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}

// confidence is greedy agreement by the target's probability of its own
// token, in five bins of 0.2.
type confidence struct {
	positions, agree, outside int
	bins                      [5][2]int // positions, agreements
}

// add counts one position: p the target's distribution (at T = 1), q the
// head's over the target's vocabulary, y the target's greedy token.
func (c *confidence) add(p, q []float64, y int, pr *pair) {
	x := 0
	for i := range q {
		if q[i] > q[x] {
			x = i
		}
	}
	b := min(int(p[y]*5), 4)
	c.positions++
	c.bins[b][0]++
	if x == y {
		c.agree++
		c.bins[b][1]++
	}
	if !pr.inDraftVocab(y) {
		c.outside++
	}
}

func (c *confidence) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "positions %d, head agrees %.3f, target tokens outside the draft vocabulary %d\n", c.positions, float64(c.agree)/float64(c.positions), c.outside)
	for b, x := range c.bins {
		fmt.Fprintf(&s, "  target's p(its token) in [%.1f, %.1f): %4.1f %% of positions, head agrees %.3f\n",
			float64(b)/5, float64(b+1)/5, 100*float64(x[0])/float64(c.positions), float64(x[1])/float64(max(x[0], 1)))
	}
	return s.String()
}

// inDraftVocab reports whether target token y is one the head drafts.
func (pr *pair) inDraftVocab(y int) bool {
	if pr.draftSet == nil {
		pr.draftSet = map[int]bool{}
		for d := range pr.draftVocab {
			pr.draftSet[pr.head.TargetToken(d)] = true
		}
	}
	return pr.draftSet[y]
}

func argmax(l []float32) int {
	b := 0
	for i, v := range l {
		if v > l[b] {
			b = i
		}
	}
	return b
}
