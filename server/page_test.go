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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/gorilla/websocket"

	"webdraft/internal/browsertest"
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
// embedded pair, the page's marks and τ equal the server's event log of
// the session, the race reports both rates, a token's tip shows both
// models' top 5 from the keyboard, a second tab runs a session of its own,
// and closing a tab mid-run frees its generation. It saves screenshots
// (desktop and phone width) to $WEBDRAFT_SCREENSHOTS, or the test's
// temporary folder.
func TestPage(t *testing.T) {
	browsertest.Require(t, "the page test")
	f := newPairFixture(t, "")
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
	const k = 2 // the CPU engine's default, the fixture's engine
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
		`["tps-spec", "tps-alone", "speedup"].map(id => document.getElementById(id).textContent)`))
	t.Logf("race: %q", race)
	if len(race) != 3 || !strings.HasSuffix(race[0], "tok/s") || !strings.HasSuffix(race[1], "tok/s") || !strings.HasSuffix(race[2], "× speedup") {
		t.Errorf("race panel %q", race)
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
