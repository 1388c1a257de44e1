// Package live runs the live view's generations: a page's start and stop
// messages become speculative runs (and, with a race, the target alone
// after them), and each run's progress comes back as the events the page
// draws — the protocol of web/README.md. It knows no transport: the server
// feeds it from a websocket, the browser build from the page's worker, and
// both send the same events.
package live

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"webdraft/sampling"
	"webdraft/speculative"
	"webdraft/tokenizer"
)

// Bounds of a run.
const (
	MaxTokens = 512 // a run's longest output
	TopN      = 5   // the alternatives shown for each token, at most
)

// Start is the page's request for a run.
type Start struct {
	Type        string  `json:"type"`
	Prompt      string  `json:"prompt"`
	Chat        bool    `json:"chat"`
	K           int     `json:"k"`
	MaxTokens   int     `json:"max_tokens"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	Seed        uint64  `json:"seed"`
	Race        bool    `json:"race"`
	// Edge drafts in the page (edge drafting): the server's target
	// verifies what the page's drafter proposes (Runner.Remote).
	Edge bool `json:"edge"`
	// EdgeHead: the page drafts with the server's EAGLE-3 head, and each
	// draft request carries the target's features it reads
	// (speculative.NewHeadRemote). Only with Edge.
	EdgeHead bool `json:"edge_head"`
	// TopK above 1 drafts a token tree (speculative.Request.TopK; the
	// API's speculative.topk and draft_tokens, SGLang's names): each
	// node's TopK children, K levels deep, DraftTokens nodes verified (0:
	// speculative.DefaultTreeNodes). 0 or 1 drafts a chain of K tokens,
	// where DraftTokens does not apply.
	TopK        int `json:"topk"`
	DraftTokens int `json:"draft_tokens"`
}

// Runner runs one page's generations, one at a time, on a generator.
type Runner struct {
	Gen        *speculative.Generator
	Tokenizer  *tokenizer.Tokenizer // the target's
	Stop       []int                // the tokens that end a generation
	MaxContext int                  // positions both models hold
	// TopN is how many alternatives each token shows, 0 … TopN: each costs
	// the read-out of a row's top tokens (slow on a CPU-rendered GPU, where
	// the browser may run; 0 reads out the argmax alone).
	TopN int
	// WarmRaces makes a race run each generation once untimed and
	// unshown before its timed run (warm): for engines whose first run of
	// a shape does one-time work, as a GPU compiles its pipelines.
	WarmRaces bool
	// Emit takes each event, in order (from the run's goroutine).
	Emit func(event map[string]any)
	// Done, when set, is told of each finished generation and its kind
	// ("speculative" or "target").
	Done func(run string, res speculative.Result)
	// Timeout, when set, bounds a start's runs together; past it the run
	// ends with TimeoutError as its error event.
	Timeout      time.Duration
	TimeoutError error
	// Remote, when set, makes the remote drafter of an edge run (Start.Edge:
	// the page drafts, over the transport; head: with an EAGLE-3 head over
	// the target's features, Start.EdgeHead); without it edge runs are
	// refused.
	Remote func(head bool) *speculative.Remote

	mu     sync.Mutex
	cancel context.CancelFunc // the current run's; nil when none
	ran    chan struct{}      // closed when the current run has ended
}

// Request checks a start message and makes it a generation request.
func (r *Runner) Request(m Start) (speculative.Request, error) {
	tok := r.Tokenizer
	switch {
	case tok == nil:
		return speculative.Request{}, errors.New("the target has no tokenizer: the page takes text")
	case strings.TrimSpace(m.Prompt) == "":
		return speculative.Request{}, errors.New("the prompt is empty")
	case m.K < 1 || m.K > speculative.MaxK:
		return speculative.Request{}, fmt.Errorf("k %d: want 1…%d", m.K, speculative.MaxK)
	case m.MaxTokens < 1 || m.MaxTokens > MaxTokens:
		return speculative.Request{}, fmt.Errorf("max tokens %d: want 1…%d", m.MaxTokens, MaxTokens)
	case !(m.Temperature >= 0 && m.Temperature <= 2):
		return speculative.Request{}, fmt.Errorf("temperature %v: want 0…2", m.Temperature)
	case m.TopP != 0 && !(m.TopP > 0 && m.TopP <= 1):
		return speculative.Request{}, fmt.Errorf("top_p %v: want a value in (0, 1]", m.TopP)
	case m.TopK < 0 || m.TopK > speculative.MaxTopK:
		return speculative.Request{}, fmt.Errorf("topk %d: want 1…%d (1 drafts a chain, more a tree of topk children a node)", m.TopK, speculative.MaxTopK)
	case m.DraftTokens < 0 || m.DraftTokens > speculative.MaxTreeNodes:
		return speculative.Request{}, fmt.Errorf("draft_tokens %d: want 1…%d (a tree's nodes verified a step)", m.DraftTokens, speculative.MaxTreeNodes)
	case m.TopK > 1 && m.Edge:
		return speculative.Request{}, fmt.Errorf("edge drafting drafts chains (the page sends one draft a step): set topk 1, not %d", m.TopK)
	case m.EdgeHead && !m.Edge:
		return speculative.Request{}, errors.New("edge_head without edge: the page's head drafts only in edge drafting")
	case m.Edge && r.Remote == nil:
		return speculative.Request{}, errors.New("edge drafting (the page drafts, the server verifies) needs the server's target: here both models run in this browser")
	}
	text := m.Prompt
	if m.Chat {
		var err error
		if text, err = tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: m.Prompt}}, true, true); err != nil {
			return speculative.Request{}, err
		}
	}
	prompt := tok.Encode(text)
	if room := r.MaxContext - len(prompt); room < m.MaxTokens {
		return speculative.Request{}, fmt.Errorf("a prompt of %d tokens leaves %d of the context's %d for the output, not %d", len(prompt), max(room, 0), r.MaxContext, m.MaxTokens)
	}
	req := speculative.Request{
		Prompt: prompt, MaxTokens: m.MaxTokens, K: m.K, Seed: m.Seed, TopN: r.TopN, DraftTopN: r.TopN,
		Sampling: sampling.Params{Temperature: float32(m.Temperature), TopP: float32(m.TopP)}, Stop: r.Stop, Fresh: true,
		// The shape explicit, so that the generator's defaults
		// (Options.TopK, TreeNodes) never turn the page's chain into a tree.
		TopK: 1,
	}
	if m.TopK > 1 {
		req.TopK, req.TreeNodes = m.TopK, m.DraftTokens
		if req.TreeNodes == 0 {
			req.TreeNodes = speculative.DefaultTreeNodes
		}
	}
	if m.Edge {
		// The page's drafter reads out its chosen tokens only.
		req.DraftTopN = 0
		if err := r.Gen.Check(req); err != nil {
			return speculative.Request{}, err
		}
		if m.EdgeHead && !r.Gen.ServesRemoteHeads() {
			return speculative.Request{}, errors.New("edge_head: the server's target keeps no features for an EAGLE-3 head (the server serves none)")
		}
		req.Remote = r.Remote(m.EdgeHead)
	}
	return req, r.Gen.Check(req)
}

// Begin ends the current run, if any, and starts req: speculative
// decoding, then with race the target alone on the same prompt, one after
// the other so neither slows the other, both from a cold prompt. With
// WarmRaces a race first runs both untimed (warm), so that neither run's
// time holds one-time work the other was spared.
func (r *Runner) Begin(req speculative.Request, race bool) {
	r.End()
	ctx, cancel := context.WithCancel(context.Background())
	if r.Timeout > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), r.Timeout)
	}
	ran := make(chan struct{})
	r.mu.Lock()
	r.cancel, r.ran = cancel, ran
	r.mu.Unlock()
	go func() {
		defer close(ran)
		defer cancel()
		alone := req
		alone.K, alone.DraftTopN, alone.Remote = speculative.NoDraft, 0, nil
		if race && r.WarmRaces {
			r.Emit(map[string]any{"type": "warming"})
			if !r.warm(ctx, req) || !r.warm(ctx, alone) {
				return
			}
		}
		spec, specTokens, ok := r.generate(ctx, "speculative", req)
		if !ok {
			return
		}
		if race {
			base, baseTokens, ok := r.generate(ctx, "target", alone)
			if !ok {
				return
			}
			// Greedy, and sampled keyed (a chain: speculative.Generator.Keyed),
			// both runs generate the same tokens: the race times the same work.
			r.Emit(map[string]any{"type": "race", "speculative_tokens_per_s": spec, "target_tokens_per_s": base, "speedup": spec / base,
				"same_tokens": slices.Equal(specTokens, baseTokens)})
		}
		r.Emit(map[string]any{"type": "finished"})
	}()
}

// End ends the current run, if any, and waits until its sequences are
// back with the generator.
func (r *Runner) End() {
	r.mu.Lock()
	cancel, ran := r.cancel, r.ran
	r.cancel, r.ran = nil, nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-ran
}

// Abort ends the current run without waiting (from Emit, say, when the
// events cannot be delivered).
func (r *Runner) Abort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
	}
}

// generate runs one generation, sending its events; it returns its
// tokens/s, its tokens and whether it finished.
func (r *Runner) generate(ctx context.Context, run string, req speculative.Request) (float64, []int, bool) {
	dec := r.Tokenizer.NewStreamDecoder()
	steps := 0
	req.OnStep = func(s speculative.Step) bool {
		steps++
		if req.TopK <= 1 {
			s.Tree = nil // a chain, which an unkeyed sampled generation (speculative.Options.Uncoupled) drafts as a tree of one child a node
		}
		r.Emit(StepEvent(run, steps, s, r.Tokenizer, dec))
		return true
	}
	ev := map[string]any{"type": "start", "run": run, "prompt_tokens": len(req.Prompt), "k": max(req.K, 0)}
	if req.Remote != nil {
		ev["edge"] = true
		if req.Remote.ReadsFeatures() {
			ev["edge_head"] = true
		}
	}
	if req.K > 0 && req.TopK > 1 {
		ev["topk"], ev["draft_tokens"] = req.TopK, req.TreeNodes
	}
	r.Emit(ev)
	start := time.Now()
	res, err := r.Gen.Submit(ctx, req)
	secs := time.Since(start).Seconds()
	if err != nil {
		r.failed(run, err)
		return 0, nil, false
	}
	if r.Done != nil {
		r.Done(run, res)
	}
	tps := float64(len(res.Tokens)) / secs
	r.Emit(map[string]any{
		"type": "done", "run": run, "tokens": len(res.Tokens), "steps": res.Stats.Steps, "seconds": round3(secs),
		"tokens_per_s": round3(tps), "tau": round3(res.Stats.Tau()), "drafted": res.Stats.Drafted,
		"accepted": res.Stats.Accepted, "finish": res.Finish,
	})
	ids := make([]int, len(res.Tokens))
	for i, t := range res.Tokens {
		ids[i] = t.ID
	}
	return tps, ids, true
}

// warm runs req once untimed and unshown, so that its timed run does not
// include one-time work: on a GPU the first run of a shape compiles its
// pipelines, and a speculative run's shapes (chains as long as a
// read-back's 20 ms hold, rows a step) are those of the whole run, so a
// run of its first tokens would not do. It reports whether it ran; where
// not, it has sent the error (failed) as run "warm-up".
func (r *Runner) warm(ctx context.Context, req speculative.Request) bool {
	req.OnStep = nil
	if _, err := r.Gen.Submit(ctx, req); err != nil {
		r.failed("warm-up", err)
		return false
	}
	return true
}

// failed sends the event of a run that ended in err: stopped where it was
// canceled, else an error.
func (r *Runner) failed(run string, err error) {
	switch {
	case errors.Is(err, context.Canceled):
		r.Emit(map[string]any{"type": "stopped", "run": run})
	case errors.Is(err, context.DeadlineExceeded) && r.TimeoutError != nil:
		r.Emit(map[string]any{"type": "error", "message": r.TimeoutError.Error()})
	default:
		r.Emit(map[string]any{"type": "error", "message": err.Error()})
	}
}

// Token is a token as the page shows it.
type Token struct {
	ID      int      `json:"id"`
	Text    string   `json:"text"`
	P       float64  `json:"p"` // its probability (the softmax at temperature 1)
	Drafted bool     `json:"drafted,omitempty"`
	Top     []Choice `json:"top"`
}

// Choice is one of a model's most likely tokens at a position.
type Choice struct {
	ID   int     `json:"id"`
	Text string  `json:"text"`
	P    float64 `json:"p"`
}

// Node is a node of a step's token tree as the page gets it.
type Node struct {
	ID     int     `json:"id"`
	Text   string  `json:"text"`   // its text alone
	Parent int     `json:"parent"` // its parent's index in the tree; −1 for a root (after the context)
	Depth  int     `json:"depth"`  // 1 for a root: a node at depth d stands at draft position d
	P      float64 `json:"p"`      // its probability under the drafter (the softmax at temperature 1), to 3 significant digits
	// Verified: the node went to the target (absent: the drafter explored
	// it and the node budget pruned it). Accepted: it is on the path the
	// target kept.
	Verified bool `json:"verified,omitempty"`
	Accepted bool `json:"accepted,omitempty"`
}

// StepEvent is a step as the page gets it: the draft with the drafter's
// alternatives, how much of it was accepted, the tokens emitted (their
// text through dec, so that it adds up to the output) with the target's
// alternatives, and the step's times; for a tree step, every node the
// drafter explored too (its draft is the accepted path and the drafter's
// best verified continuation below it).
func StepEvent(run string, n int, s speculative.Step, tok *tokenizer.Tokenizer, dec *tokenizer.StreamDecoder) map[string]any {
	one := func(id int) string {
		t, err := tok.Decode([]int{id})
		if err != nil {
			return fmt.Sprintf("<%d>", id)
		}
		return t
	}
	choices := func(top []sampling.TokenLogprob) []Choice {
		out := make([]Choice, len(top))
		for i, c := range top {
			out[i] = Choice{ID: c.Token, Text: one(c.Token), P: prob(c.Logprob)}
		}
		return out
	}
	draft := make([]Token, len(s.Draft))
	for i, d := range s.Draft {
		draft[i] = Token{ID: d.ID, Text: one(d.ID), P: prob(d.Logprob), Top: choices(d.Top)}
	}
	tokens := make([]Token, len(s.Tokens))
	for i, t := range s.Tokens {
		text, err := dec.Next(t.ID)
		if err != nil {
			text = fmt.Sprintf("<%d>", t.ID)
		}
		tokens[i] = Token{ID: t.ID, Text: text, P: prob(t.Logprob), Drafted: t.Drafted, Top: choices(t.Top)}
	}
	ev := map[string]any{
		"type": "step", "run": run, "step": n, "draft": draft, "accepted": s.Accepted, "tokens": tokens,
		"draft_ms": round3(ms(s.DraftTime)), "verify_ms": round3(ms(s.VerifyTime)),
	}
	if s.Remote {
		ev["network_ms"] = round3(ms(s.NetworkTime))
	}
	if s.Fused {
		ev["fused"] = true
	}
	if s.Chained {
		ev["chained"] = true
	}
	if s.Tree != nil {
		tree := make([]Node, len(s.Tree))
		for i, n := range s.Tree {
			tree[i] = Node{ID: n.ID, Text: one(n.ID), Parent: n.Parent, Depth: n.Depth, P: probDigits(n.Logprob), Verified: n.Verified, Accepted: n.Accepted}
		}
		ev["tree"] = tree
	}
	return ev
}

func prob(logprob float32) float64 { return round3(math.Exp(float64(logprob))) }

// probDigits is a probability to 3 significant digits: a wide tree's
// last children fall below prob's 0.0005.
func probDigits(logprob float32) float64 {
	p, _ := strconv.ParseFloat(strconv.FormatFloat(math.Exp(float64(logprob)), 'g', 3, 64), 64) // a number FormatFloat wrote parses
	return p
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
