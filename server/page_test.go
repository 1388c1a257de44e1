package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/gorilla/websocket"

	"webdraft/internal/browsertest"
	"webdraft/speculative"
)

// drawnToken is a token as the page drew it.
type drawnToken struct {
	Kind string `json:"kind"`
	Step int    `json:"step"`
	Text string `json:"text"`
}

// expectedMarks are the marks the server's own event log of a session
// implies for its speculative run: a step's accepted draft tokens, then
// from the first disagreement the rest of the draft rejected, then the
// target's token (a correction, or the bonus after a whole draft).
func expectedMarks(t *testing.T, events []map[string]any) ([]drawnToken, string) {
	t.Helper()
	var marks []drawnToken
	tau := ""
	for _, ev := range events {
		if ev["run"] != "speculative" {
			continue
		}
		switch ev["type"] {
		case "step":
			step := int(ev["step"].(float64))
			draft := ev["draft"].([]any)
			a := int(ev["accepted"].(float64))
			for i, tk := range ev["tokens"].([]any) {
				tok := tk.(map[string]any)
				if i == a && a < len(draft) {
					for _, d := range draft[a:] {
						marks = append(marks, drawnToken{"rej", step, d.(map[string]any)["text"].(string)})
					}
				}
				kind := "bonus"
				switch {
				case tok["drafted"] == true:
					kind = "acc"
				case len(draft) == 0:
					kind = "own"
				case a < len(draft):
					kind = "fix"
				}
				marks = append(marks, drawnToken{kind, step, tok["text"].(string)})
			}
		case "done":
			tau = strconv.FormatFloat(ev["tau"].(float64), 'f', 2, 64)
		}
	}
	return marks, tau
}

func (f *pairFixture) events(t *testing.T, session string) []map[string]any {
	t.Helper()
	resp, err := http.Get(f.url + "/sessions/" + session + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&evs); err != nil {
		t.Fatal(err)
	}
	return evs
}

// metricsText is /metrics' exposition.
func (f *pairFixture) metricsText(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// metricSum adds up the samples of /metrics whose series starts with
// prefix (a metric's name and its first labels).
func (f *pairFixture) metricSum(t *testing.T, prefix string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(prefix)+`.* (\S+)$`).FindAllStringSubmatch(f.metricsText(t), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// metric reads one sample of /metrics.
func (f *pairFixture) metric(t *testing.T, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(f.metricsText(t))
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestPage drives the live page in headless Chromium: a prompt runs on the
// embedded models as `serve` runs them by default (the EAGLE-3 head
// drafting over the target, CPU engine), the page's marks and τ equal the server's event log of
// the session, the race reports both rates, a token's tip shows both
// models' top 5 from the keyboard, a second tab runs a session of its own,
// and closing a tab mid-run frees its generation. It saves screenshots
// (desktop and phone width) to $WEBDRAFT_SCREENSHOTS, or the test's
// temporary folder.
func TestPage(t *testing.T) {
	browsertest.Require(t, "the page test")
	f := newEmbeddedHeadFixture(t)
	ctx := browsertest.NewStrict(t, 5*time.Minute)
	shots := os.Getenv("WEBDRAFT_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	do := func(ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	session := func(ctx context.Context) string {
		t.Helper()
		id, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.session || false`, chromedp.WithPollingTimeout(20*time.Second)))
		if err != nil {
			t.Fatalf("the page never got a session: %v", err)
		}
		return id
	}
	start := func(ctx context.Context, prompt string, k, maxTokens int) {
		t.Helper()
		do(ctx, "filling the form",
			chromedp.SetValue("#prompt", prompt),
			chromedp.SetValue("#k", strconv.Itoa(k)),
			chromedp.SetValue("#max_tokens", strconv.Itoa(maxTokens)),
			chromedp.Click("#start"))
	}

	do(ctx, "opening the page", chromedp.EmulateViewport(1280, 1130), chromedp.Navigate(f.url+"/"))
	id := session(ctx)
	const k = 1 // the CPU engine's default, the fixture's engine
	start(ctx, "import os\n\n\ndef read_config(path):\n    \"\"\"", k, 40)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
		chromedp.WithPollingTimeout(3*time.Minute))); err != nil {
		status, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status").textContent`))
		t.Fatalf("the run never finished (status %q): %v", status, err)
	}

	// The page's marks and τ are the server's.
	drawn, err := chromedp.Run(ctx, chromedp.Evaluate[[]drawnToken](
		`[...document.querySelectorAll("#output .tok")].map(s => ({kind: s.dataset.kind, step: +s.dataset.step, text: s.textContent}))`))
	if err != nil {
		t.Fatal(err)
	}
	events := f.events(t, id)
	want, wantTau := expectedMarks(t, events)
	if len(want) == 0 || fmt.Sprint(drawn) != fmt.Sprint(want) {
		t.Errorf("the page's marks differ from the session's events:\npage   %v\nserver %v", drawn, want)
	}
	kinds := map[string]int{}
	for _, d := range drawn {
		kinds[d.Kind]++
	}
	t.Logf("marks: %v", kinds)
	if kinds["acc"] == 0 || kinds["rej"]+kinds["bonus"] == 0 {
		t.Errorf("a run of 40 tokens at k %d with no accepted or no rejected/bonus marks: %v", k, kinds)
	}
	tau, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("tau").textContent`))
	if tau != wantTau {
		t.Errorf("the page's τ %q, the server's %q", tau, wantTau)
	}
	race, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`["tps-spec", "tps-alone", "speedup", "race-same"].map(id => document.getElementById(id).hidden ? "" : document.getElementById(id).textContent)`))
	t.Logf("race: %q", race)
	if len(race) != 4 || !strings.HasSuffix(race[0], "tok/s") || !strings.HasSuffix(race[1], "tok/s") || !strings.HasSuffix(race[2], "× speedup") ||
		!strings.HasPrefix(race[3], "Both runs generated the same tokens") {
		t.Errorf("race panel %q", race)
	}
	// The server's target runs on a CPU engine here: its note shows, the
	// GPU's does not.
	notes, _ := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`["cpu-note", "gpu-note"].map(id => document.getElementById(id).hidden)`))
	if len(notes) != 2 || notes[0] || !notes[1] {
		t.Errorf("on the CPU engine the race's CPU note should show and the GPU note not: hidden %v", notes)
	}
	alone, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#alone .tok").length`))
	if out := len(drawn) - kinds["rej"]; alone != out {
		t.Errorf("the target alone drew %d tokens, the speculative output has %d", alone, out)
	}

	// From the keyboard: the output takes focus, arrows move, the tip
	// shows both models' alternatives.
	firstAccepted := 0
	for firstAccepted < len(drawn) && drawn[firstAccepted].Kind != "acc" {
		firstAccepted++
	}
	do(ctx, "focusing the text", chromedp.Focus("#output"))
	for range firstAccepted {
		do(ctx, "moving along the text", chromedp.KeyEvent(kb.ArrowRight))
	}
	tip, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const t = document.getElementById("tip"); return t.hidden ? "" : t.textContent })()`))
	if err != nil || !strings.Contains(tip, "target's top 5") || !strings.Contains(tip, "drafter's top 5") {
		t.Errorf("the tip from the keyboard: %q (%v)", tip, err)
	}
	shot := func(ctx context.Context, name string, full bool) {
		t.Helper()
		capture := chromedp.CaptureScreenshot() // the viewport as it is, the tip open
		if full {
			capture = chromedp.FullScreenshot(100)
		}
		png, err := chromedp.Run(ctx, capture)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", filepath.Join(shots, name))
	}
	shot(ctx, "page-desktop.png", false)
	do(ctx, "phone width", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)))
	width, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	if width > 390 {
		t.Errorf("at phone width the page scrolls sideways: %d px wide", width)
	}
	shot(ctx, "page-phone.png", true)

	// A second tab: a session of its own; closing it mid-run frees its
	// generation, and the first session's events are untouched.
	tab, closeTab := chromedp.NewContext(ctx)
	do(tab, "opening a second tab", chromedp.Navigate(f.url+"/"))
	id2 := session(tab)
	if id2 == id {
		t.Fatalf("two tabs share session %s", id)
	}
	start(tab, "class Stack:", 8, 400)
	if _, err := chromedp.Run(tab, chromedp.Poll[bool](`document.querySelectorAll("#output .tok").length > 0`, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		t.Fatalf("the second tab's run never started: %v", err)
	}
	if running := f.metric(t, "webdraft_generations_running"); running != 1 {
		t.Errorf("generations running with one tab generating: %v", running)
	}
	closeTab()
	deadline := time.Now().Add(20 * time.Second)
	for f.metric(t, "webdraft_generations_running") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a closed tab's generation still runs after 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(f.events(t, id)); n != len(events) {
		t.Errorf("the first session's log changed while the second ran: %d events, then %d", len(events), n)
	}
	if evs := f.events(t, id2); len(evs) < 3 || evs[0]["session"] != id2 {
		t.Errorf("the second session's log: %v", evs)
	}
	if pages := f.metricSum(t, `webdraft_generations_total{endpoint="page",`); pages < 2 {
		t.Errorf("page generations in /metrics: %v, want the run and its race", pages)
	}

	// Sampled at temperature 1, some tokens are drawn from outside their
	// model's top 5: every table of every tip still marks the chosen
	// token, those as drawn, after the list.
	do(ctx, "sampling", chromedp.SetValue("#temperature", "1"), chromedp.SetValue("#seed", "11"))
	start(ctx, "import os\n\n\ndef read_config(path):\n    \"\"\"", k, 24)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
		chromedp.WithPollingTimeout(3*time.Minute))); err != nil {
		t.Fatalf("the sampled run never finished: %v", err)
	}
	marks, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`(() => {
		const tip = document.getElementById("tip");
		let tables = 0, unmarked = 0, drawn = 0;
		for (const s of document.querySelectorAll("#output .tok")) {
			s.dispatchEvent(new Event("mouseenter"));
			for (const tb of tip.querySelectorAll("table")) {
				tables++;
				if (tb.querySelectorAll("tr.chosen").length !== 1) unmarked++;
				drawn += tb.querySelectorAll("tr.drawn").length;
			}
		}
		return [tables, unmarked, drawn];
	})()`))
	if err != nil || len(marks) != 3 {
		t.Fatalf("the sampled run's tips: %v (%v)", marks, err)
	}
	t.Logf("sampled run: %d tip tables, %d chosen tokens drawn from outside the top 5", marks[0], marks[2])
	if marks[0] == 0 || marks[1] > 0 || marks[2] == 0 {
		t.Errorf("sampled run: %d tip tables, %d without their chosen token marked, %d marked as drawn; want every table marked and some drawn", marks[0], marks[1], marks[2])
	}
}

// TestWebsocket: the socket refuses another origin, answers bad messages
// with an error and goes on, and a stop ends a run.
func TestWebsocket(t *testing.T) {
	f := newPairFixture(t, "")
	// Not a websocket request: a JSON error.
	resp, err := http.Get(f.url + "/ws")
	if err != nil {
		t.Fatal(err)
	}
	var e map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusBadRequest || e["error"] == nil {
		t.Errorf("GET /ws without an upgrade: %d %v (%v)", resp.StatusCode, e, err)
	}
	resp.Body.Close()
	url := "ws" + strings.TrimPrefix(f.url, "http") + "/ws"
	if _, resp, err := websocket.DefaultDialer.Dial(url, http.Header{"Origin": {"http://evil.example"}}); err == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("another origin: %v", err)
	}
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{"Origin": {f.url}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	next := func() map[string]any {
		t.Helper()
		var m map[string]any
		if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := c.ReadJSON(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := next(); m["type"] != "hello" {
		t.Fatalf("first message %v", m)
	}
	for _, bad := range []string{`nope`, `{"type":"dance"}`, `{"type":"start","prompt":"x","k":0,"max_tokens":5}`,
		`{"type":"start","prompt":"","k":2,"max_tokens":5}`, `{"type":"start","prompt":"x","k":2,"max_tokens":100000}`,
		// Strict input: exact-case names, no duplicates, no nulls, no unknown fields.
		`{"type":"start","prompt":"x","K":3,"k":2,"max_tokens":5}`, `{"type":"start","prompt":"x","k":2,"k":3,"max_tokens":5}`,
		`{"type":"start","prompt":"x","k":2,"max_tokens":5,"seed":null}`, `{"type":"start","prompt":"x","k":2,"max_tokens":5,"colour":"red"}`,
		`{"type":"` + strings.Repeat("t", 60_000) + `"}`} {
		if err := c.WriteMessage(websocket.TextMessage, []byte(bad)); err != nil {
			t.Fatal(err)
		}
		if m := next(); m["type"] != "error" || m["message"] == "" || len(m["message"].(string)) > 300 {
			t.Errorf("%.80s: %.300v", bad, m)
		}
	}
	if err := c.WriteJSON(map[string]any{"type": "start", "prompt": "def f(x):", "k": 3, "max_tokens": 300}); err != nil {
		t.Fatal(err)
	}
	for m := next(); m["type"] != "step"; m = next() {
	}
	if err := c.WriteJSON(map[string]any{"type": "stop"}); err != nil {
		t.Fatal(err)
	}
	for m := next(); m["type"] != "stopped"; m = next() {
		if m["type"] == "done" {
			t.Fatal("the run finished despite the stop")
		}
	}
}

// TestWebsocketRace: a race runs the speculative generation and the
// target alone whole, one after the other, and compares them; on the CPU
// engine with no warm-up first (live.Runner.WarmRaces: a GPU's). Sampled
// from one seed, both runs generate the same tokens (same_tokens).
func TestWebsocketRace(t *testing.T) {
	f := newPairFixture(t, "")
	url := "ws" + strings.TrimPrefix(f.url, "http") + "/ws"
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{"Origin": {f.url}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteJSON(map[string]any{"type": "start", "prompt": "def f(x):", "k": 3, "max_tokens": 12, "race": true, "temperature": 0.8, "seed": 5}); err != nil {
		t.Fatal(err)
	}
	var seen []string // the messages' types and runs, steps folded into one
	tokens := map[string]float64{}
	same := false
	for {
		var m map[string]any
		if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := c.ReadJSON(&m); err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprint(m["type"])
		if run, ok := m["run"].(string); ok {
			what += " " + run
		}
		if m["type"] == "done" {
			tokens[m["run"].(string)] = m["tokens"].(float64)
		}
		if m["type"] == "race" {
			same, _ = m["same_tokens"].(bool)
		}
		if m["type"] == "error" {
			t.Fatalf("error: %v", m["message"])
		}
		if len(seen) == 0 || seen[len(seen)-1] != what || m["type"] != "step" {
			seen = append(seen, what)
		}
		if m["type"] == "finished" {
			break
		}
	}
	want := []string{"hello", "start speculative", "step speculative", "done speculative", "start target", "step target", "done target", "race", "finished"}
	if !slices.Equal(seen, want) {
		t.Errorf("messages %q, want %q", seen, want)
	}
	if tokens["speculative"] != 12 || tokens["target"] != 12 {
		t.Errorf("tokens %v: want 12 for each run", tokens)
	}
	if !same {
		t.Error("the race's runs sampled different tokens from one seed: want the same (keyed rows)")
	}
}

// checkTreeStep checks a tree step's message against the protocol
// (web/README.md) for a tree of depth k, topk b and draft_tokens n: each
// node has exactly its fields, a parent before it (−1: a root) one level
// up, a probability in (0, 1]; at most b children a node, at most n
// verified nodes, every verified node's parent verified; the accepted
// nodes verified, a path from a root as long as accepted whose tokens
// are draft[:accepted] and the emitted tokens'. It returns the tree's
// verified and pruned counts.
func checkTreeStep(t *testing.T, m map[string]any, k, b, n int) (verified, pruned int) {
	t.Helper()
	tree, ok := m["tree"].([]any)
	if !ok || len(tree) == 0 {
		t.Fatalf("step %v: no tree", m["step"])
	}
	type node struct {
		id, parent, depth  int
		p                  float64
		verified, accepted bool
	}
	nodes := make([]node, len(tree))
	children := map[int]int{}
	for i, raw := range tree {
		obj := raw.(map[string]any)
		for key := range obj {
			if !slices.Contains([]string{"id", "text", "parent", "depth", "p", "verified", "accepted"}, key) {
				t.Errorf("step %v node %d: field %q", m["step"], i, key)
			}
		}
		for _, key := range []string{"id", "parent", "depth", "p"} {
			if _, ok := obj[key].(float64); !ok {
				t.Fatalf("step %v node %d: %s %v", m["step"], i, key, obj[key])
			}
		}
		if _, ok := obj["text"].(string); !ok {
			t.Errorf("step %v node %d: text %v", m["step"], i, obj["text"])
		}
		for _, key := range []string{"verified", "accepted"} {
			if v, ok := obj[key]; ok && v != true {
				t.Errorf("step %v node %d: %s %v, want true or absent", m["step"], i, key, v)
			}
		}
		nd := node{id: int(obj["id"].(float64)), parent: int(obj["parent"].(float64)), depth: int(obj["depth"].(float64)), p: obj["p"].(float64),
			verified: obj["verified"] == true, accepted: obj["accepted"] == true}
		nodes[i] = nd
		switch {
		case nd.parent < -1 || nd.parent >= i:
			t.Fatalf("step %v node %d: parent %d, want −1 or a node before it", m["step"], i, nd.parent)
		case nd.parent == -1 && nd.depth != 1 || nd.parent >= 0 && nd.depth != nodes[nd.parent].depth+1:
			t.Errorf("step %v node %d: depth %d under parent %d", m["step"], i, nd.depth, nd.parent)
		case nd.depth > k:
			t.Errorf("step %v node %d: depth %d in a tree of depth %d", m["step"], i, nd.depth, k)
		case !(nd.p > 0 && nd.p <= 1):
			t.Errorf("step %v node %d: p %v", m["step"], i, nd.p)
		case nd.accepted && !nd.verified:
			t.Errorf("step %v node %d: accepted, not verified", m["step"], i)
		case nd.verified && nd.parent >= 0 && !nodes[nd.parent].verified:
			t.Errorf("step %v node %d: verified, its parent %d not", m["step"], i, nd.parent)
		}
		if children[nd.parent]++; children[nd.parent] > b {
			t.Errorf("step %v: node %d has more than topk %d children", m["step"], nd.parent, b)
		}
		if nd.verified {
			verified++
		} else {
			pruned++
		}
	}
	if verified > n {
		t.Errorf("step %v: %d nodes verified, draft_tokens %d", m["step"], verified, n)
	}
	// The accepted path, root first: draft[:accepted], emitted as drafted.
	a := int(m["accepted"].(float64))
	draft, emitted := eventIDs(m["draft"]), m["tokens"].([]any)
	var path []int
	at := -1
	for i, nd := range nodes {
		if nd.accepted {
			if nd.parent != at {
				t.Fatalf("step %v: accepted node %d's parent %d is not the path's last node %d", m["step"], i, nd.parent, at)
			}
			path, at = append(path, nd.id), i
		}
	}
	if len(path) != a || a > len(draft) || !slices.Equal(path, draft[:a]) {
		t.Errorf("step %v: accepted path %v, accepted %d of draft %v", m["step"], path, a, draft)
	}
	for i, id := range path {
		if i < len(emitted) {
			tok := emitted[i].(map[string]any)
			if int(tok["id"].(float64)) != id || tok["drafted"] != true {
				t.Errorf("step %v: emitted token %d %v, the accepted node's id %d", m["step"], i, tok, id)
			}
		}
	}
	return verified, pruned
}

// TestWebsocketTrees: a start's tree shape is checked (topk 1…MaxTopK,
// draft_tokens 1…MaxTreeNodes, not edge: each refusal an error naming the
// field), the bounds are taken, and a tree run's step messages carry their
// trees (checkTreeStep), the done message counts the verified nodes as
// drafted, and the output is the chain run's (both the target's greedy
// output) whose steps carry none. Sampled, a run's rows are keyed by its
// seed: a tree run repeats with its seed and gives the chain run's tokens
// of that seed, whose steps carry no tree.
func TestWebsocketTrees(t *testing.T) {
	f := newPairFixture(t, "")
	p := dialPage(t, f.url)
	for _, c := range []struct{ msg, want string }{
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":0.5}`, "topk"},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":"2"}`, "topk"},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":null}`, "topk"},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":-1}`, "topk -1"},
		{fmt.Sprintf(`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":%d}`, speculative.MaxTopK+1), fmt.Sprintf("topk %d: want 1…%d", speculative.MaxTopK+1, speculative.MaxTopK)},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":2,"draft_tokens":-1}`, "draft_tokens -1"},
		{fmt.Sprintf(`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":2,"draft_tokens":%d}`, speculative.MaxTreeNodes+1), fmt.Sprintf("draft_tokens %d: want 1…%d", speculative.MaxTreeNodes+1, speculative.MaxTreeNodes)},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":2,"draft_tokens":1e9}`, "draft_tokens"},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"topk":2,"edge":true}`, "edge drafting drafts chains"},
		{`{"type":"start","prompt":"x","k":0,"max_tokens":5,"topk":2}`, "k 0"},
		{`{"type":"start","prompt":"x","k":2,"max_tokens":5,"Top_k":2}`, "Top_k"},
	} {
		if err := p.c.WriteMessage(websocket.TextMessage, []byte(c.msg)); err != nil {
			t.Fatal(err)
		}
		if m := p.next(t); m["type"] != "error" || !strings.Contains(fmt.Sprint(m["message"]), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.msg, m, c.want)
		}
	}

	// run starts a run and returns its messages up to finished.
	run := func(start map[string]any) []map[string]any {
		t.Helper()
		if err := p.c.WriteJSON(start); err != nil {
			t.Fatal(err)
		}
		var msgs []map[string]any
		for {
			m := p.next(t)
			msgs = append(msgs, m)
			switch m["type"] {
			case "error":
				t.Fatalf("%v: %v", start, m["message"])
			case "finished":
				return msgs
			}
		}
	}
	text := func(msgs []map[string]any) string {
		var s strings.Builder
		for _, m := range msgs {
			if m["type"] == "step" {
				for _, tk := range m["tokens"].([]any) {
					s.WriteString(tk.(map[string]any)["text"].(string))
				}
			}
		}
		return s.String()
	}
	const prompt, k, b, n, maxTokens = "def quicksort(xs):", 3, 2, 6, 32
	tree := run(map[string]any{"type": "start", "prompt": prompt, "k": k, "topk": b, "draft_tokens": n, "max_tokens": maxTokens})
	steps, accepted, verified, pruned, drafted := 0, 0, 0, 0, -1
	for _, m := range tree {
		switch m["type"] {
		case "start":
			if m["k"] != float64(k) || m["topk"] != float64(b) || m["draft_tokens"] != float64(n) {
				t.Errorf("the tree run's start: %v", m)
			}
		case "step":
			steps++
			if len(eventIDs(m["draft"])) == 0 { // no room left to draft: the target's token alone
				if _, ok := m["tree"]; ok {
					t.Errorf("step %v drafted nothing and has a tree", m["step"])
				}
				continue
			}
			v, pr := checkTreeStep(t, m, k, b, n)
			verified, pruned, accepted = verified+v, pruned+pr, accepted+int(m["accepted"].(float64))
		case "done":
			drafted = int(m["drafted"].(float64))
		}
	}
	t.Logf("a tree run (k %d, topk %d, draft_tokens %d): %d steps, %d nodes verified, %d pruned, %d accepted", k, b, n, steps, verified, pruned, accepted)
	if drafted != verified {
		t.Errorf("done's drafted %d, the trees' verified nodes %d", drafted, verified)
	}
	if steps == 0 || accepted == 0 || pruned == 0 {
		t.Errorf("a tree run of %d tokens: %d steps, %d accepted, %d pruned", maxTokens, steps, accepted, pruned)
	}
	chain := run(map[string]any{"type": "start", "prompt": prompt, "k": k, "topk": 1, "max_tokens": maxTokens})
	for _, m := range chain {
		if _, ok := m["tree"]; ok {
			t.Fatalf("a chain's message has a tree: %v", m)
		}
		if _, ok := m["topk"]; ok {
			t.Fatalf("a chain's start names a topk: %v", m)
		}
	}
	if a, b := text(tree), text(chain); a != b || a == "" {
		t.Errorf("greedy outputs differ:\ntree  %q\nchain %q", a, b)
	}

	sampled := func(b int) []map[string]any {
		t.Helper()
		msgs := run(map[string]any{"type": "start", "prompt": prompt, "k": k, "topk": b, "draft_tokens": n, "max_tokens": 16, "temperature": 0.8, "seed": 3})
		trees := 0
		for _, m := range msgs {
			if _, ok := m["tree"]; !ok {
				continue
			}
			if b == 1 {
				t.Fatalf("a sampled chain's message has a tree: %v", m)
			}
			trees++
			checkTreeStep(t, m, k, b, n)
		}
		if b > 1 && trees == 0 {
			t.Error("a sampled tree run with no tree step")
		}
		return msgs
	}
	if a, again, chain := text(sampled(b)), text(sampled(b)), text(sampled(1)); a != again || a != chain || a == "" {
		t.Errorf("a sampled tree run, again with its seed, and a chain's with that seed:\n%q\n%q\n%q", a, again, chain)
	}

	// The bounds are taken: the widest, largest tree at the deepest k (as
	// deep as 4 tokens leave room for), its steps checked until a stop.
	if err := p.c.WriteJSON(map[string]any{"type": "start", "prompt": prompt, "k": speculative.MaxK, "topk": speculative.MaxTopK,
		"draft_tokens": speculative.MaxTreeNodes, "max_tokens": 4}); err != nil {
		t.Fatal(err)
	}
	for m := p.next(t); m["type"] != "stopped" && m["type"] != "finished"; m = p.next(t) {
		switch m["type"] {
		case "error":
			t.Fatalf("the bounds: %v", m["message"])
		case "step":
			v, pr := checkTreeStep(t, m, speculative.MaxK, speculative.MaxTopK, speculative.MaxTreeNodes)
			raw, _ := json.Marshal(m)
			t.Logf("a step at the bounds: %d nodes verified, %d pruned, %d bytes", v, pr, len(raw))
			if err := p.c.WriteJSON(map[string]any{"type": "stop"}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// visibleText is a token's text as the page's trees write it (app.js's
// visible): spaces, tabs and newlines shown, the empty text as ∅.
func visibleText(s string) string {
	if s == "" {
		return "∅"
	}
	return strings.NewReplacer("\n", "⏎", "\t", "⇥", " ", "·").Replace(s)
}

// TestPageTree drives a tree run (topk b = 2) in headless Chromium: the
// text's marks are the chain's rules on each step's draft; each tree step
// has a folded line in the trees' list, none drawn until opened; opened
// from the keyboard (Enter on its line), it shows the step's nodes — the
// accepted path marked ✓ ("accepted" to a screen reader), the verified
// and refused ✗, the pruned ○ in folded groups, the target's own token
// after the path — as the session's events have them; Enter on a token
// of the text opens its step's tree; the rates panel reads by depth. It
// saves page-tree-desktop.png and page-tree-phone.png (390 px wide, no
// sideways scrolling) to $WEBDRAFT_SCREENSHOTS, or the test's temporary
// folder.
func TestPageTree(t *testing.T) {
	browsertest.Require(t, "the page's tree test")
	f := newPairFixture(t, "")
	ctx := browsertest.NewStrict(t, 5*time.Minute)
	shots := os.Getenv("WEBDRAFT_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(what, js string) map[string]any {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]any](js))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", filepath.Join(shots, name))
	}

	do("opening the page", chromedp.EmulateViewport(1280, 1130), chromedp.Navigate(f.url+"/"))
	id, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.session || false`, chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		t.Fatalf("the page never got a session: %v", err)
	}
	if off := eval("the form", `({off: document.getElementById("draft_tokens").disabled})`); off["off"] != true {
		t.Error("draft tokens N is open to a chain (b = 1)")
	}
	const k, b, n = 3, 2, 6
	do("filling the form",
		chromedp.SetValue("#prompt", "import os\n\n\ndef read_config(path):\n    \"\"\""),
		chromedp.SetValue("#k", strconv.Itoa(k)),
		chromedp.SetValue("#max_tokens", "32"),
		chromedp.Focus("#topk"), chromedp.KeyEvent(kb.ArrowUp), // b 1 → 2 from the keyboard: N opens
		chromedp.SetValue("#draft_tokens", strconv.Itoa(n)),
		chromedp.Click("#start"))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
		chromedp.WithPollingTimeout(3*time.Minute))); err != nil {
		status, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status").textContent`))
		t.Fatalf("the run never finished (status %q): %v", status, err)
	}

	events := f.events(t, id)
	drawn, err := chromedp.Run(ctx, chromedp.Evaluate[[]drawnToken](
		`[...document.querySelectorAll("#output .tok")].map(s => ({kind: s.dataset.kind, step: +s.dataset.step, text: s.textContent}))`))
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := expectedMarks(t, events); len(want) == 0 || fmt.Sprint(drawn) != fmt.Sprint(want) {
		t.Errorf("the page's marks differ from the session's events:\npage   %v\nserver %v", drawn, want)
	}

	// The session's tree steps; the one to open: accepted tokens, pruned
	// nodes and a refused one.
	var trees []map[string]any
	var pick map[string]any
	for _, ev := range events {
		if ev["type"] == "start" && ev["run"] == "speculative" && (ev["topk"] != float64(b) || ev["draft_tokens"] != float64(n)) {
			t.Errorf("the run's start %v: want topk %d, draft_tokens %d", ev, b, n)
		}
		if ev["type"] != "step" || ev["run"] != "speculative" || ev["tree"] == nil {
			continue
		}
		trees = append(trees, ev)
		verified, pruned := checkTreeStep(t, ev, k, b, n)
		a := int(ev["accepted"].(float64))
		if pick == nil && a > 0 && pruned > 0 && verified > a {
			pick = ev
		}
	}
	if pick == nil {
		t.Fatalf("no tree step with accepted, refused and pruned nodes among %d", len(trees))
	}
	list := eval("the trees' list", `(() => {
		const steps = [...document.querySelectorAll("#tree-list details.tree-step")];
		return {hidden: document.getElementById("trees").hidden, steps: steps.length, open: steps.filter(d => d.open).length,
			drawn: document.querySelectorAll("#tree-list ul.tree").length, rates: document.getElementById("rates-title").textContent};
	})()`)
	if list["hidden"] != false || list["steps"] != float64(len(trees)) || list["open"] != 0.0 || list["drawn"] != 0.0 {
		t.Errorf("the trees' list %v: want shown, %d folded steps, none drawn", list, len(trees))
	}
	if list["rates"] != "Acceptance by depth" {
		t.Errorf("the rates panel's title %q in a tree run", list["rates"])
	}

	// Open the picked step from the keyboard.
	step := int(pick["step"].(float64))
	sel := fmt.Sprintf(`#tree-list details[data-step="%d"]`, step)
	do("opening a step's tree with Enter", chromedp.Focus(sel+" > summary"), chromedp.KeyEvent(kb.Enter))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('`+sel+` ul.tree') !== null`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("step %d's tree was not drawn once opened: %v", step, err)
	}
	got := eval("the opened tree", `(() => {
		const d = document.querySelector('`+sel+`');
		const texts = (q) => [...d.querySelectorAll(q)].map(e => e.textContent);
		return {open: d.open,
			acc: texts(".node.acc > .nrow .ntext"), accMarks: d.querySelectorAll('.node.acc > .nrow .mark[aria-label="accepted"]').length,
			rej: d.querySelectorAll(".node.rej").length, pruned: d.querySelectorAll(".node.pruned").length,
			prunedFolds: d.querySelectorAll("details.pruned").length, prunedOpen: d.querySelectorAll("details.pruned[open]").length,
			own: texts(".node.own > .nrow .ntext")};
	})()`)
	var wantAcc []any
	rej, pruned := 0, 0
	for _, raw := range pick["tree"].([]any) {
		nd := raw.(map[string]any)
		switch {
		case nd["accepted"] == true:
			wantAcc = append(wantAcc, visibleText(nd["text"].(string)))
		case nd["verified"] == true:
			rej++
		default:
			pruned++
		}
	}
	a := int(pick["accepted"].(float64))
	var wantOwn []any
	if toks := pick["tokens"].([]any); a < len(toks) {
		wantOwn = append(wantOwn, visibleText(toks[a].(map[string]any)["text"].(string)))
	}
	if got["open"] != true || fmt.Sprint(got["acc"]) != fmt.Sprint(wantAcc) || got["accMarks"] != float64(a) ||
		got["rej"] != float64(rej) || got["pruned"] != float64(pruned) || got["prunedFolds"] == 0.0 || got["prunedOpen"] != 0.0 ||
		fmt.Sprint(got["own"]) != fmt.Sprint(wantOwn) {
		t.Errorf("step %d's tree on the page %v;\nwant accepted %q (%d ✓ marks), %d refused, %d pruned in closed folds, the target's %q", step, got, wantAcc, a, rej, pruned, wantOwn)
	}
	t.Logf("step %d's tree: %v", step, got)
	// Open the first pruned fold too, for the screenshot.
	do("opening a pruned fold", chromedp.Click(sel+" details.pruned > summary"))

	// The text's first token, from the keyboard: its tip lists the
	// drafter's alternatives there (its siblings in the tree); Enter opens
	// its step's tree.
	do("focusing the text", chromedp.Focus("#output"))
	tip, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const t = document.getElementById("tip"); return t.hidden ? "" : t.textContent })()`))
	if err != nil || !strings.Contains(tip, fmt.Sprintf("drafter's top %d (the tree's branches here)", b)) || !strings.Contains(tip, "target's top 5") {
		t.Errorf("the first token's tip: %q (%v)", tip, err)
	}
	do("Enter on the text's first token", chromedp.KeyEvent(kb.Enter))
	focus := eval("the focus", `(() => { const d = document.activeElement.closest("details.tree-step"); return {step: d ? +d.dataset.step : 0, open: d ? d.open : false} })()`)
	if first := drawn[0].Step; focus["step"] != float64(first) || focus["open"] != true {
		t.Errorf("Enter on the text's first token (step %d): the focus is on %v", first, focus)
	}
	do("showing the picked tree", chromedp.Evaluate[chromedp.Void](`document.querySelector('`+sel+`').scrollIntoView({block: "center"})`))
	shot("page-tree-desktop.png")
	do("phone width", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)))
	if width, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); width > 390 {
		t.Errorf("at phone width the page scrolls sideways: %d px wide", width)
	}
	shot("page-tree-phone.png")
}
