package server

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/speculative"
)

// edgeClient plays the browser in edge drafting: a speculative.Session of
// its drafter — a model, or an EAGLE-3 head over a target engine that
// takes the features the requests carry — answering each draft request,
// as the page's worker does (wasm's session).
type edgeClient struct {
	s *speculative.Session
}

func newEdgeClient(t *testing.T, drafter engine.Engine) *edgeClient {
	t.Helper()
	s, err := speculative.NewSession(drafter)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &edgeClient{s: s}
}

func (c *edgeClient) draft(t *testing.T, m map[string]any) []int {
	t.Helper()
	a := speculative.DraftAsk{Reset: m["reset"] == true, K: int(m["k"].(float64)), Tokens: []int{}}
	for _, v := range m["tokens"].([]any) {
		a.Tokens = append(a.Tokens, int(v.(float64)))
	}
	if f, ok := m["features"]; ok {
		raw, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		a.Features = new(speculative.FeatureRows)
		if err := json.Unmarshal(raw, a.Features); err != nil {
			t.Fatal(err)
		}
	}
	if v, ok := m["coupled"]; ok {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		a.Coupled = new(speculative.Coupling)
		if err := json.Unmarshal(raw, a.Coupled); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := c.s.Draft(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestEdgeDrafting: a Go client acting as the browser drafts on its own
// drafter (the native CPU one) over the websocket, the server's target
// verifies: the output is the target's greedy continuation, each step has
// its network time; bad drafts get error events and the run goes on; a
// sampled edge run repeats with its seed; a socket closed while its draft
// is awaited ends the run at once.
func TestEdgeDrafting(t *testing.T) {
	f := newPairFixture(t, "")
	d, err := engine.NewReference(pairDrafter.Config, pairDrafter.Weights, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	p := dialPage(t, f.url)
	expectError := func(msg any, want string) {
		t.Helper()
		if err := p.c.WriteJSON(msg); err != nil {
			t.Fatal(err)
		}
		if m := p.next(t); m["type"] != "error" || !strings.Contains(m["message"].(string), want) {
			t.Errorf("after %v: %v, want an error saying %q", msg, m, want)
		}
	}
	expectError(map[string]any{"type": "draft", "id": 1, "tokens": []int{1}}, "no edge run asked")

	lastID := 0.0 // the last draft_request's id
	// run makes an edge run; bad, when set, is sent before the first
	// answer. It returns the run's tokens and step events.
	run := func(prompt string, n int, temperature float64, bad func(req map[string]any)) ([]int, []map[string]any) {
		t.Helper()
		if err := p.c.WriteJSON(map[string]any{"type": "start", "prompt": prompt, "k": 4, "max_tokens": n, "edge": true,
			"temperature": temperature, "top_p": 0.95, "seed": 7}); err != nil {
			t.Fatal(err)
		}
		c := newEdgeClient(t, d)
		var out []int
		var steps []map[string]any
		for {
			m := p.next(t)
			switch m["type"] {
			case "start":
				if m["edge"] != true {
					t.Errorf("an edge run's start: %v", m)
				}
			case "draft_request":
				lastID = m["id"].(float64)
				// A sampled run's requests carry its keys (seed 7's words)
				// and sampling: the page drafts coupled draws.
				wantCoupled := map[string]any{"keys": []any{7.0, 0.0}, "temperature": temperature, "top_p": 0.95}
				if c, ok := m["coupled"]; temperature > 0 && fmt.Sprint(c) != fmt.Sprint(wantCoupled) || temperature == 0 && ok {
					t.Errorf("a draft request at temperature %v: coupled %v, want %v", temperature, c, wantCoupled)
				}
				if bad != nil {
					bad(m)
					bad = nil
				}
				begin := time.Now()
				ids := c.draft(t, m)
				if err := p.c.WriteJSON(map[string]any{"type": "draft", "id": m["id"], "tokens": ids,
					"draft_ms": float64(time.Since(begin).Microseconds()) / 1000}); err != nil {
					t.Fatal(err)
				}
			case "step":
				steps = append(steps, m)
				out = append(out, eventIDs(m["tokens"])...)
				if _, ok := m["network_ms"].(float64); !ok {
					t.Errorf("an edge step without network_ms: %v", m)
				}
			case "error":
				t.Fatalf("edge run: %v", m["message"])
			case "finished":
				return out, steps
			}
		}
	}

	prompt := "def fibonacci(n):\n    "
	const n = 24
	got, steps := run(prompt, n, 0, func(req map[string]any) {
		id := int(req["id"].(float64))
		k := int(req["k"].(float64))
		vocab := pairTarget.Config.VocabSize
		for _, bad := range []struct {
			msg  any
			want string
		}{
			{map[string]any{"type": "draft", "id": id + 1, "tokens": []int{1}}, "no such draft"},
			{map[string]any{"type": "draft", "id": id, "tokens": make([]int, k+1)}, "more than"},
			{map[string]any{"type": "draft", "id": id, "tokens": []int{1, vocab}}, "outside the vocabulary"},
			{map[string]any{"type": "draft", "id": id, "tokens": []int{-1}}, "outside the vocabulary"},
			{map[string]any{"type": "draft", "id": id, "tokens": []int{1}, "draft_ms": -1}, "draft_ms"},
			{map[string]any{"type": "draft", "id": id, "tokens": []int{1}, "extra": 1}, "extra"},
			{map[string]any{"type": "draft", "id": id, "tokens": nil}, "null"},
			{map[string]any{"type": "draft", "id": id}, "tokens missing"},
			{map[string]any{"type": "draft", "id": "1", "tokens": []int{1}}, "id"},
			{map[string]any{"type": "draft", "id": id, "tokens": []any{1.5}}, "tokens"},
		} {
			expectError(bad.msg, bad.want)
		}
	})
	want, _ := f.greedy(t, f.tok.Encode(prompt), n)
	if !slices.Equal(got, want) {
		t.Errorf("edge drafting gave %v, the target's greedy continuation is %v", got, want)
	}
	accepted, network := 0, 0.0
	for _, s := range steps {
		accepted += int(s["accepted"].(float64))
		network += s["network_ms"].(float64)
	}
	t.Logf("edge: %d tokens in %d steps (τ %.2f), %d draft tokens accepted, network %.2f ms a step",
		len(got), len(steps), float64(len(got))/float64(len(steps)), accepted, network/float64(len(steps)))
	if accepted == 0 {
		t.Error("no draft token accepted: the drafter's KV cache out of step?")
	}

	// A draft for the run that has ended is dropped without a word: the
	// next message is the error of the one after it.
	if err := p.c.WriteJSON(map[string]any{"type": "draft", "id": lastID, "tokens": []int{1}}); err != nil {
		t.Fatal(err)
	}
	expectError(map[string]any{"type": "drafts"}, "want start, stop or draft")

	// Sampled: the page drafts coupled draws under the run's keys, and the
	// run gives its seed's tokens — those the server's own drafter gives,
	// and the target alone's.
	edge, _ := run(prompt, 12, 0.8, nil)
	again, _ := run(prompt, 12, 0.8, nil)
	if len(edge) != 12 || !slices.Equal(edge, again) {
		t.Errorf("sampled: edge %v, then with the same seed %v", edge, again)
	}
	served := p.runTokens(t, map[string]any{"type": "start", "prompt": prompt, "k": 4, "max_tokens": 12, "temperature": 0.8, "top_p": 0.95, "seed": 7})
	if !slices.Equal(edge, served) {
		t.Errorf("sampled, seed 7: edge drafting gave %v, the server's drafter %v", edge, served)
	}

	// A socket closed while the server waits for its draft: the run ends
	// at once (the next page runs without waiting for it).
	if err := p.c.WriteJSON(map[string]any{"type": "start", "prompt": prompt, "k": 4, "max_tokens": 100, "edge": true}); err != nil {
		t.Fatal(err)
	}
	for m := p.next(t); m["type"] != "draft_request"; m = p.next(t) {
	}
	p.c.Close()
	begin := time.Now()
	q := dialPage(t, f.url)
	if text := q.run(t, prompt); text == "" || time.Since(begin) > 30*time.Second {
		t.Errorf("after a closed edge socket: %q in %v", text, time.Since(begin))
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.srv.ready.Load().gen.Gauges().Running != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := f.srv.ready.Load().gen.Gauges(); g.Running != 0 {
		t.Errorf("after the closed socket: %d generations running", g.Running)
	}
}

// TestEdgeDraftingHead: a page drafting with the server's EAGLE-3 head
// (edge_head) — the head over a target engine of its own that computes
// nothing, taking the features each draft request carries — gives the
// target's greedy continuation and drafts as the server's own head does:
// the same draft tokens in the same steps. The first request carries
// the prompt's features but its last token's, each later one those of the
// tokens the target fed since. A server without a head refuses edge_head,
// as does edge_head without edge.
func TestEdgeDraftingHead(t *testing.T) {
	f := newHeadFixture(t, "head")
	aux := f.head.Config.Aux(pairTarget.Config.NumHiddenLayers)
	tg, err := cpu.New(pairTarget.Config, pairTarget.Weights, cpu.Options{KVBytes: 64 << 20, FeatureLayers: aux})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	h, err := cpu.NewHead(tg, f.head.Config, f.head.Weights, cpu.HeadOptions{KVBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := newEdgeClient(t, h)
	p := dialPage(t, f.url)
	prompt, n := "def fibonacci(n):\n    ", 24
	promptLen := len(f.tok.Encode(prompt))

	// run makes a run and returns its tokens and each step's draft; an
	// edge run answers its requests on c.
	run := func(edge bool) (out []int, drafts [][]int) {
		t.Helper()
		if err := p.c.WriteJSON(map[string]any{"type": "start", "prompt": prompt, "k": 3, "max_tokens": n,
			"edge": edge, "edge_head": edge}); err != nil {
			t.Fatal(err)
		}
		held := 0 // the positions of features the page holds
		for {
			m := p.next(t)
			switch m["type"] {
			case "start":
				if edge && m["edge_head"] != true {
					t.Errorf("an edge head run's start: %v", m)
				}
			case "draft_request":
				feat, ok := m["features"].(map[string]any)
				if !ok {
					t.Fatalf("a draft request without features: %v", m)
				}
				from, width := int(feat["from"].(float64)), int(feat["width"].(float64))
				if m["reset"] == true {
					held = 0
					if rows := len(feat["rows"].(string)) * 3 / 4 / 4 / width; rows != promptLen-1 {
						t.Errorf("the first request carries %d rows of features for a prompt of %d tokens", rows, promptLen)
					}
				}
				if width != len(aux)*pairTarget.Config.HiddenSize || from != held {
					t.Errorf("features from %d, %d wide: want from %d, %d wide", from, width, held, len(aux)*pairTarget.Config.HiddenSize)
				}
				ids := c.draft(t, m)
				held = from + len(feat["rows"].(string))*3/4/4/width
				if err := p.c.WriteJSON(map[string]any{"type": "draft", "id": m["id"], "tokens": ids, "draft_ms": 0.1}); err != nil {
					t.Fatal(err)
				}
			case "step":
				out = append(out, eventIDs(m["tokens"])...)
				drafts = append(drafts, eventIDs(m["draft"]))
			case "error":
				t.Fatalf("run (edge %v): %v", edge, m["message"])
			case "finished":
				return out, drafts
			}
		}
	}
	own, ownDrafts := run(false)
	got, gotDrafts := run(true)
	want, _ := f.greedy(t, f.tok.Encode(prompt), n)
	if !slices.Equal(got, want) || !slices.Equal(own, want) {
		t.Errorf("edge head drafting gave %v, the server's head %v; the target's greedy continuation is %v", got, own, want)
	}
	if !slices.EqualFunc(gotDrafts, ownDrafts, slices.Equal) {
		t.Errorf("drafts: %v in the page, %v on the server", gotDrafts, ownDrafts)
	}
	t.Logf("edge head: %d tokens in %d steps, drafts %v", len(got), len(gotDrafts), gotDrafts)

	expectError := func(p *pageConn, msg any, want string) {
		t.Helper()
		if err := p.c.WriteJSON(msg); err != nil {
			t.Fatal(err)
		}
		if m := p.next(t); m["type"] != "error" || !strings.Contains(m["message"].(string), want) {
			t.Errorf("after %v: %v, want an error saying %q", msg, m, want)
		}
	}
	expectError(p, map[string]any{"type": "start", "prompt": prompt, "k": 3, "max_tokens": 4, "edge_head": true}, "edge_head without edge")
	plain := dialPage(t, newPairFixture(t, "").url)
	expectError(plain, map[string]any{"type": "start", "prompt": prompt, "k": 3, "max_tokens": 4, "edge": true, "edge_head": true}, "keeps no features")
}
