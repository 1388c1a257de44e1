package live

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/speculative"
	"webdraft/tokenizer"
)

// runner is a page's runner on the golden pair (vocabulary 1024, the
// reference engine): enough for Request's checks, which run nothing.
func runner(t *testing.T) *Runner {
	t.Helper()
	open := func(name string) engine.Engine {
		m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", name), checkpoint.LoadOptions{Quant: checkpoint.F32})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		e, err := engine.NewReference(m.Config, m.Weights, 8<<20)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	gen, err := speculative.New(open("tied"), open("untied"), speculative.Options{K: 4})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	return &Runner{Gen: gen, Tokenizer: tok, MaxContext: 512, TopN: TopN} // the golden models' context
}

// TestRequestShape: a start's topk and draft_tokens become the request's
// tree shape; a chain's is explicit (TopK 1), so the generator's defaults
// never make it a tree. A sampled tree is taken: its rows are keyed, on
// any engines.
func TestRequestShape(t *testing.T) {
	r := runner(t)
	for _, c := range []struct {
		name              string
		topK, draftTokens int
		wantK, wantNodes  int
	}{
		{"absent: a chain", 0, 0, 1, 0},
		{"topk 1: a chain, draft_tokens ignored", 1, 9, 1, 0},
		{"a tree, the default budget", 3, 0, 3, speculative.DefaultTreeNodes},
		{"a tree", 4, 10, 4, 10},
		{"the bounds", speculative.MaxTopK, speculative.MaxTreeNodes, speculative.MaxTopK, speculative.MaxTreeNodes},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := r.Request(Start{Type: "start", Prompt: "x", K: 3, MaxTokens: 4, TopK: c.topK, DraftTokens: c.draftTokens})
			if err != nil {
				t.Fatal(err)
			}
			if req.K != 3 || req.TopK != c.wantK || req.TreeNodes != c.wantNodes {
				t.Errorf("k %d, top k %d, tree nodes %d; want 3, %d, %d", req.K, req.TopK, req.TreeNodes, c.wantK, c.wantNodes)
			}
		})
	}
	t.Run("a sampled tree", func(t *testing.T) {
		req, err := r.Request(Start{Type: "start", Prompt: "x", K: 3, MaxTokens: 4, Temperature: 0.7, TopK: 2, DraftTokens: 5})
		if err != nil || req.TopK != 2 || req.TreeNodes != 5 || req.Sampling.Greedy() {
			t.Errorf("top k %d, tree nodes %d, sampling %+v (%v); want 2, 5, temperature 0.7", req.TopK, req.TreeNodes, req.Sampling, err)
		}
	})
}

// TestRequestRefusesBadTrees: a tree shape out of bounds and an edge tree
// are refused, each error naming what to change.
func TestRequestRefusesBadTrees(t *testing.T) {
	r := runner(t)
	for _, c := range []struct {
		name string
		m    Start
		want string
	}{
		{"topk below 0", Start{TopK: -1}, fmt.Sprintf("topk -1: want 1…%d", speculative.MaxTopK)},
		{"topk past MaxTopK", Start{TopK: speculative.MaxTopK + 1}, fmt.Sprintf("topk %d: want 1…%d", speculative.MaxTopK+1, speculative.MaxTopK)},
		{"draft_tokens below 0", Start{TopK: 2, DraftTokens: -3}, fmt.Sprintf("draft_tokens -3: want 1…%d", speculative.MaxTreeNodes)},
		{"draft_tokens past MaxTreeNodes", Start{TopK: 2, DraftTokens: speculative.MaxTreeNodes + 1}, fmt.Sprintf("draft_tokens %d: want 1…%d", speculative.MaxTreeNodes+1, speculative.MaxTreeNodes)},
		{"draft_tokens past the bound in a chain", Start{TopK: 1, DraftTokens: 1000}, "draft_tokens 1000"},
		{"an edge tree", Start{TopK: 2, Edge: true}, "edge drafting drafts chains"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := c.m
			m.Type, m.Prompt, m.K, m.MaxTokens = "start", "x", 3, 4
			_, err := r.Request(m)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// TestStepEventTree: a tree step's event carries every explored node —
// its token's text, parent, depth, the drafter's probability, and
// verified and accepted only when true — and a chain step's no tree.
func TestStepEventTree(t *testing.T) {
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(" a b c d")
	if len(ids) != 4 {
		t.Fatalf("%q encodes to %v: want 4 tokens", " a b c d", ids)
	}
	node := func(id int, p float32, parent, depth int, verified, accepted bool) speculative.DraftNode {
		return speculative.DraftNode{Token: engine.Token{ID: id, Logprob: p}, Parent: parent, Depth: depth, Verified: verified, Accepted: accepted}
	}
	// Two roots; the first accepted, its child verified and refused, a
	// pruned grandchild; the second root pruned.
	tree := []speculative.DraftNode{
		node(ids[0], -0.1, -1, 1, true, true),
		node(ids[1], -2.5, -1, 1, false, false),
		node(ids[2], -0.5, 0, 2, true, false),
		node(ids[3], -9, 2, 3, false, false), // p 0.000123: 3 significant digits, not 0
	}
	step := speculative.Step{
		Draft:    []engine.Token{tree[0].Token, tree[2].Token},
		Accepted: 1,
		Tree:     tree,
		Tokens:   []speculative.Token{{ID: ids[0], Drafted: true}, {ID: ids[1]}},
	}
	ev := StepEvent("speculative", 1, step, tok, tok.NewStreamDecoder())
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Tree []map[string]any `json:"tree"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"id": float64(ids[0]), "text": " a", "parent": -1.0, "depth": 1.0, "p": 0.905, "verified": true, "accepted": true},
		{"id": float64(ids[1]), "text": " b", "parent": -1.0, "depth": 1.0, "p": 0.0821},
		{"id": float64(ids[2]), "text": " c", "parent": 0.0, "depth": 2.0, "p": 0.607, "verified": true},
		{"id": float64(ids[3]), "text": " d", "parent": 2.0, "depth": 3.0, "p": 0.000123},
	}
	if len(got.Tree) != len(want) {
		t.Fatalf("tree %s: want %d nodes", b, len(want))
	}
	for i := range want {
		if g, w := toJSON(t, got.Tree[i]), toJSON(t, want[i]); g != w {
			t.Errorf("node %d: %s, want %s", i, g, w)
		}
	}

	step.Tree = nil
	if _, ok := StepEvent("speculative", 1, step, tok, tok.NewStreamDecoder())["tree"]; ok {
		t.Error("a chain step has a tree")
	}
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestStepEventChained: a fused step's event says so, and a step run in a
// chain on the device says that too (the page's note then explains its
// times); a step of separate calls says neither.
func TestStepEventChained(t *testing.T) {
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		step          speculative.Step
		fused, chaind bool
	}{
		{speculative.Step{}, false, false},
		{speculative.Step{Fused: true}, true, false},
		{speculative.Step{Fused: true, Chained: true}, true, true},
	} {
		tc.step.Tokens = []speculative.Token{{ID: tok.Encode(" a")[0]}}
		ev := StepEvent("speculative", 1, tc.step, tok, tok.NewStreamDecoder())
		if _, ok := ev["fused"]; ok != tc.fused {
			t.Errorf("%+v: fused in the event %v, want %v", tc.step, ok, tc.fused)
		}
		if _, ok := ev["chained"]; ok != tc.chaind {
			t.Errorf("%+v: chained in the event %v, want %v", tc.step, ok, tc.chaind)
		}
	}
}

// TestBeginRace: a race sends each run's events in turn, then the race;
// with WarmRaces both runs go once first, untimed and unshown — a warming
// event, then nothing until the timed runs' starts —, and the timed runs
// emit all their tokens.
func TestBeginRace(t *testing.T) {
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			r := runner(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { r.Gen.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			events := make(chan map[string]any, 1024)
			r.Emit = func(ev map[string]any) { events <- ev }
			r.WarmRaces = warm
			r.Begin(speculative.Request{Prompt: []int{11, 12, 13}, MaxTokens: 6, K: 2, TopK: 1}, true)
			var seen []string // the events' types and runs, a run's steps as one
			tokens := map[string]any{}
			for ev := range events {
				what := fmt.Sprint(ev["type"])
				if run, ok := ev["run"].(string); ok {
					what += " " + run
				}
				if ev["type"] == "done" {
					tokens[ev["run"].(string)] = ev["tokens"]
				}
				if ev["type"] == "race" && ev["same_tokens"] != true {
					t.Errorf("race %v: want the same tokens in both runs", ev)
				}
				if len(seen) == 0 || seen[len(seen)-1] != what || ev["type"] != "step" {
					seen = append(seen, what)
				}
				if ev["type"] == "finished" || ev["type"] == "error" {
					break
				}
			}
			want := []string{"start speculative", "step speculative", "done speculative", "start target", "step target", "done target", "race", "finished"}
			if warm {
				want = append([]string{"warming"}, want...)
			}
			if !slices.Equal(seen, want) {
				t.Errorf("events %q, want %q", seen, want)
			}
			if tokens["speculative"] != 6 || tokens["target"] != 6 {
				t.Errorf("tokens %v: want 6 for each run", tokens)
			}
		})
	}
}
