package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/internal/browsertest"
	"webdraft/internal/synth"
	"webdraft/sampling"
	"webdraft/wasm/dist"
	"webdraft/weights"
)

// TestBrowserEngine drives the page's in-browser mode in headless Chromium
// (WebGPU on SwiftShader): a worker loads the engine's build and both
// models from the server, with progress, and runs prompts on the page's
// GPU. Each draft equals the native drafter's greedy tokens from the same
// context, each output the target's greedy continuation, the race reports
// a speedup; a reload takes the models from Cache Storage (the server
// sends no model file twice). Run `go tool task wasm` first (task test
// does): the binary embeds the build it serves.
func TestBrowserEngine(t *testing.T) {
	browsertest.Require(t, "the in-browser engine test")
	if !dist.Built() {
		t.Skip("no browser build in wasm/dist/files: run `go tool task wasm` first")
	}
	f := newPairFixture(t, "")
	ctx := browsertest.NewStrict(t, 25*time.Minute)
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	ready := func() string {
		t.Helper()
		do("choosing this browser", chromedp.Click("#where-browser"))
		state, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.engine || false`, chromedp.WithPollingTimeout(5*time.Minute)))
		note, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("engine-note").textContent`))
		if err != nil || state != "ready" {
			t.Fatalf("the engine did not start (%q, %v): %s", state, err, note)
		}
		t.Logf("engine: %s", note)
		return note
	}

	do("opening the page", chromedp.Navigate(f.url+"/"))
	first := ready()
	if !strings.Contains(first, "SwiftShader") && !strings.Contains(first, "ready on") {
		t.Errorf("the note does not name the adapter: %q", first)
	}
	downloads := f.modelDownloads.Load()
	if downloads == 0 {
		t.Fatal("the server sent no model file")
	}
	// The page's thread while the engine runs: the long tasks (over 50 ms)
	// it sees.
	do("watching long tasks", chromedp.Evaluate[chromedp.Void](`window.longTasks = [];
		new PerformanceObserver((l) => { for (const e of l.getEntries()) window.longTasks.push(e.duration); }).observe({type: "longtask"})`))

	// Short runs: SwiftShader renders on the CPU, and slowly — a step of
	// the target takes seconds there (BENCHMARKS.md, "Browser").
	const n = 3
	start := func(prompt string, race bool) {
		t.Helper()
		do("starting a run",
			chromedp.SetValue("#prompt", prompt), chromedp.SetValue("#k", "4"), chromedp.SetValue("#max_tokens", strconv.Itoa(n)),
			chromedp.SetValue("#temperature", "0"),
			chromedp.Evaluate[chromedp.Void](`document.getElementById("race").checked = `+strconv.FormatBool(race)),
			chromedp.Click("#start"))
	}
	run := func(i int, prompt string, race bool) {
		t.Helper()
		before, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`window.webdraftEngineLog.length`))
		start(prompt, race)
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
			chromedp.WithPollingTimeout(8*time.Minute))); err != nil {
			status, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status").textContent`))
			last, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.webdraftEngineLog.slice(-3))`))
			t.Fatalf("prompt %d: the run never finished (status %q): %v; the last events: %.2000s", i, status, err, last)
		}
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.webdraftEngineLog.slice(`+strconv.Itoa(before)+`))`))
		if err != nil {
			t.Fatal(err)
		}
		var events []map[string]any
		if err := json.Unmarshal([]byte(raw), &events); err != nil {
			t.Fatal(err)
		}
		ids := f.tok.Encode(prompt)
		seen := append([]int(nil), ids...) // the context so far
		var out []int
		steps := 0
		for _, ev := range events {
			if ev["type"] != "step" || ev["run"] != "speculative" {
				continue
			}
			steps++
			draft := eventIDs(ev["draft"])
			if want := f.drafterGreedy(t, seen, len(draft)); !slices.Equal(draft, want) {
				t.Errorf("prompt %d step %d: the browser drafted %v, the native drafter %v", i, steps, draft, want)
			}
			emitted := eventIDs(ev["tokens"])
			seen = append(seen, emitted...)
			out = append(out, emitted...)
		}
		want, _ := f.greedy(t, ids, n)
		if steps == 0 || !slices.Equal(out, want) {
			t.Errorf("prompt %d: %d steps gave %v, the target's greedy continuation is %v", i, steps, out, want)
		}
		if race {
			speedup, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("speedup").textContent`))
			if !strings.HasSuffix(speedup, "× speedup") {
				t.Errorf("the race: %q", speedup)
			}
			t.Logf("in the browser: %s (%d steps)", speedup, steps)
			same, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("race-same").hidden ? "" : document.getElementById("race-same").textContent`))
			if !strings.HasPrefix(same, "Both runs generated the same tokens") {
				t.Errorf("the race's note on its runs' tokens: %q", same)
			}
			// The race's note is the GPU's: the target alone chains there.
			notes, _ := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`["gpu-note", "cpu-note"].map(id => document.getElementById(id).hidden)`))
			if len(notes) != 2 || notes[0] || !notes[1] {
				t.Errorf("in the browser the race's GPU note should show and the CPU note not: hidden %v", notes)
			}
		}
	}
	prompts := []string{"import os\n\n\ndef read_config(path):\n    \"\"\"", "class Stack:\n    def __init__(self):\n        "}
	for i, prompt := range prompts {
		run(i, prompt, i == 0)
	}

	// The engine ran in its worker: the page's thread never stalled for
	// as long as the engine's work takes here (a step is seconds on
	// SwiftShader). Drawing a step's tokens may take a few frames on a
	// busy machine, so the bound is a second, not a frame.
	long, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`window.longTasks`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the page's long tasks while the engine ran: %d, longest %.0f ms", len(long), slices.Max(append(long, 0)))
	if m := slices.Max(append(long, 0)); m > 1000 {
		t.Errorf("the page's thread was blocked for %.0f ms while the engine ran in its worker", m)
	}

	// A fault drill: the page's GPU device is lost. The next run meets
	// it and fails; the worker starts the engine again on a new device,
	// with the models from the cache, and it runs as before.
	do("losing the device", chromedp.Evaluate[chromedp.Void](`window.webdraftLoseDevice()`))
	start(prompts[1], false)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.body.dataset.engine === "recovering" || document.getElementById("engine-note").textContent.includes("restarted")`,
		chromedp.WithPollingTimeout(5*time.Minute))); err != nil {
		note, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("engine-note").textContent`))
		t.Fatalf("the lost device went unnoticed: %v (%s)", err, note)
	}
	state, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.engine === "recovering" ? false : document.body.dataset.engine`,
		chromedp.WithPollingTimeout(8*time.Minute)))
	note, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("engine-note").textContent`))
	if err != nil || state != "ready" || !strings.Contains(note, "restarted after a GPU fault") {
		t.Fatalf("after the fault the engine is %q (%v): %s", state, err, note)
	}
	t.Logf("after the fault: %s", note)
	run(1, prompts[1], false)
	if n := f.modelDownloads.Load(); n != downloads {
		t.Errorf("the restart after the fault downloaded %d model files", n-downloads)
	}

	// A reload: the models come from the cache.
	do("reloading", chromedp.Reload())
	again := ready()
	if n := f.modelDownloads.Load(); n != downloads {
		t.Errorf("after a reload the server sent %d model files more", n-downloads)
	}
	if !strings.Contains(again, "from this browser's cache") {
		t.Errorf("after a reload: %q", again)
	}
}

// drafterGreedy is the native drafter's n greedy tokens after context.
func (f *pairFixture) drafterGreedy(t *testing.T, seen []int, n int) []int {
	t.Helper()
	if n == 0 {
		return nil
	}
	seq, err := f.drafter.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	out, err := engine.Draft(context.Background(), f.drafter, seq, seen, n)
	if err != nil {
		t.Fatal(err)
	}
	return engine.IDs(out)
}

// drafterCoupled is the native drafter's n coupled draws after seen, as
// an edge page drafts them in a sampled run of seed's keys at params:
// token i the draw under the key of position len(seen) + i.
func (f *pairFixture) drafterCoupled(t *testing.T, seen []int, n int, seed uint64, params sampling.Params) []int {
	t.Helper()
	if n == 0 {
		return nil
	}
	seq, err := f.drafter.NewSequence()
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	keys := sampling.NewKeys(seed)
	draws := make([]sampling.Draw, n)
	for i := range draws {
		draws[i] = keys.At(len(seen) + i)
	}
	out, err := engine.SampleN(context.Background(), f.drafter, []*engine.VerifyEntry{{Seq: seq, Tokens: seen, Out: 1, Sampling: params, Draws: draws}}, n)
	if err != nil {
		t.Fatal(err)
	}
	return engine.IDs(out[0])
}

// countModelFiles counts the model files (not the manifest) the server
// sends.
func (f *pairFixture) countModelFiles(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/models/") && r.URL.Path != "/models/index.json" {
			f.modelDownloads.Add(1)
		}
		next.ServeHTTP(w, r)
	})
}

func eventIDs(v any) []int {
	var ids []int
	for _, t := range v.([]any) {
		ids = append(ids, int(t.(map[string]any)["id"].(float64)))
	}
	return ids
}

// TestModelFiles: the manifest lists the pair's files with the hashes of
// the bytes served; nothing else under /models/ or /wasm/ is served.
func TestModelFiles(t *testing.T) {
	f := newPairFixture(t, "")
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(f.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}
	code, body := get("/models/index.json")
	var man modelManifest
	if err := json.Unmarshal(body, &man); code != 200 || err != nil {
		t.Fatalf("the manifest: %d %v %s", code, err, body)
	}
	if man.Drafter != "drafter" || man.Target != "target" || len(man.Files) != 4 {
		t.Fatalf("manifest %+v", man)
	}
	for _, mf := range man.Files {
		code, data := get("/models/" + mf.Path)
		sum := sha256.Sum256(data)
		if code != 200 || int64(len(data)) != mf.Size || hex.EncodeToString(sum[:]) != mf.SHA256 {
			t.Errorf("%s: %d, %d bytes (manifest %d), hash %x (manifest %s)", mf.Path, code, len(data), mf.Size, sum[:4], mf.SHA256[:8])
		}
	}
	for _, p := range []string{"/models/drafter/other.json", "/models/x/config.json", "/models/target/model.safetensors.index.json", "/wasm/main.go", "/wasm/"} {
		if code, body := get(p); code != 404 && code != 301 || code == 404 && !json.Valid(body) {
			t.Errorf("%s: %d %s", p, code, body)
		}
	}
}

// TestBrowserEdge drives edge drafting in headless Chromium (WebGPU on
// SwiftShader): the page's worker loads the drafter alone, the server's
// target verifies over the websocket what it drafts. Each draft equals the
// native drafter's greedy tokens from the same context (the browser's KV
// cache stays in step across the run's draft requests), the output is the
// target's greedy continuation, every step reports its network time, and
// the page names the mode and the adapter, at desktop and phone width; a
// sampled run's drafts are the native drafter's coupled draws under the
// run's keys (each draft_request carries them). Run `go tool task wasm`
// first.
func TestBrowserEdge(t *testing.T) {
	browsertest.Require(t, "the edge drafting test")
	if !dist.Built() {
		t.Skip("no browser build in wasm/dist/files: run `go tool task wasm` first")
	}
	f := newPairFixture(t, "")
	ctx := browsertest.NewStrict(t, 15*time.Minute)
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(js string) string {
		s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		return s
	}
	begin := time.Now()
	do("opening the page", chromedp.EmulateViewport(1280, 1130), chromedp.Navigate(f.url+"/"))
	do("choosing edge drafting", chromedp.Click("#where-edge"))
	state, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.engine || false`, chromedp.WithPollingTimeout(5*time.Minute)))
	note := text(`document.getElementById("engine-note").textContent`)
	if err != nil || state != "ready" || !strings.Contains(note, "drafter ready on") {
		t.Fatalf("the drafter did not start (%q, %v): %s", state, err, note)
	}
	t.Logf("drafter: %s (%.0f s)", note, time.Since(begin).Seconds())
	mode := text(`document.getElementById("mode-name").textContent`)
	if adapter := text(`document.getElementById("engine-note").textContent.replace(/^drafter ready on (.*) in .*$/, "$1")`); !strings.HasPrefix(mode, "edge · drafting on "+adapter) {
		t.Errorf("the page names the mode %q (adapter %q)", mode, adapter)
	}
	session, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.session || false`, chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		t.Fatal(err)
	}

	const n = 4
	// run makes an edge run, greedy or (temperature > 0) sampled from seed
	// 3, where the page drafts coupled draws.
	run := func(prompt string, temperature float64) {
		t.Helper()
		before := len(f.events(t, session))
		do("starting an edge run",
			chromedp.SetValue("#prompt", prompt), chromedp.SetValue("#k", "4"), chromedp.SetValue("#max_tokens", strconv.Itoa(n)),
			chromedp.SetValue("#temperature", strconv.FormatFloat(temperature, 'g', -1, 64)), chromedp.SetValue("#seed", "3"),
			chromedp.Evaluate[chromedp.Void](`document.getElementById("race").checked = false`),
			chromedp.Click("#start"))
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
			chromedp.WithPollingTimeout(8*time.Minute))); err != nil {
			t.Fatalf("the edge run never finished (status %q): %v", text(`document.getElementById("status").textContent`), err)
		}

		ids := f.tok.Encode(prompt)
		seen := slices.Clone(ids)
		var out []int
		steps, asks := 0, 0
		var network, draftMS []float64
		for _, ev := range f.events(t, session)[before:] {
			switch ev["type"] {
			case "draft_request":
				asks++
			case "start":
				if ev["edge"] != true {
					t.Errorf("the run's start: %v", ev)
				}
			case "step":
				steps++
				draft := eventIDs(ev["draft"])
				want := f.drafterGreedy(t, seen, len(draft))
				if temperature > 0 {
					want = f.drafterCoupled(t, seen, len(draft), 3, sampling.Params{Temperature: float32(temperature), TopP: 1})
				}
				if !slices.Equal(draft, want) {
					t.Errorf("step %d (temperature %v): the browser drafted %v, the native drafter %v", steps, temperature, draft, want)
				}
				ms, ok := ev["network_ms"].(float64)
				if !ok {
					t.Errorf("step %d has no network_ms: %v", steps, ev)
				}
				network, draftMS = append(network, ms), append(draftMS, ev["draft_ms"].(float64))
				emitted := eventIDs(ev["tokens"])
				seen = append(seen, emitted...)
				out = append(out, emitted...)
			case "done":
				t.Logf("edge on SwiftShader: %v tokens in %v steps, τ %v, %v tokens/s, %v of %v draft tokens accepted; draft ms %v, network ms %v",
					ev["tokens"], ev["steps"], ev["tau"], ev["tokens_per_s"], ev["accepted"], ev["drafted"], draftMS, network)
			case "error":
				t.Errorf("error event: %v", ev["message"])
			}
		}
		if want, _ := f.greedy(t, ids, n); steps == 0 || temperature == 0 && !slices.Equal(out, want) || len(out) != n {
			t.Errorf("%d steps gave %v, the target's greedy continuation is %v", steps, out, want)
		}
		if asks == 0 {
			t.Error("the server asked the page for no draft")
		}
	}
	prompts := []string{"def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        "}
	run(prompts[0], 0)
	if shown := text(`document.getElementById("network").hidden ? "" : document.getElementById("network_ms").textContent`); shown == "" || shown == "–" {
		t.Errorf("the page shows no network time: %q", shown)
	}
	// With $WEBDRAFT_SCREENSHOTS set, the edge run as the page shows it.
	shot := func(name string, capture chromedp.Action[[]byte]) {
		if dir := os.Getenv("WEBDRAFT_SCREENSHOTS"); dir != "" {
			png, err := chromedp.Run(ctx, capture)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name), png, 0o644)
			}
			if err != nil {
				t.Error(err)
			}
		}
	}
	shot("page-edge-desktop.png", chromedp.CaptureScreenshot())
	do("phone width", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)))
	if width, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`)); width > 390 {
		t.Errorf("at phone width the page scrolls sideways: %d px wide", width)
	}
	shot("page-edge-phone.png", chromedp.FullScreenshot(100))
	do("desktop width", chromedp.EmulateViewport(1280, 1130))

	// A fault drill: the browser's GPU device is lost. The next draft
	// fails, the run ends with an error, the worker starts the drafter
	// again on a new device (from Cache Storage), and edge runs go on.
	downloads := f.modelDownloads.Load()
	do("losing the device", chromedp.Evaluate[chromedp.Void](`window.webdraftLoseDevice()`))
	do("starting a run on the lost device",
		chromedp.SetValue("#prompt", prompts[1]), chromedp.Click("#start"))
	state, err = chromedp.Run(ctx, chromedp.Poll[string](`document.getElementById("engine-note").textContent.includes("restarted") ? document.body.dataset.engine : false`,
		chromedp.WithPollingTimeout(5*time.Minute)))
	if err != nil || state != "ready" {
		t.Fatalf("after the fault the drafter is %q (%v): %s", state, err, text(`document.getElementById("engine-note").textContent`))
	}
	var failed bool
	for _, ev := range f.events(t, session) {
		failed = failed || ev["type"] == "error" && strings.Contains(ev["message"].(string), "remote drafter")
	}
	if !failed {
		t.Error("the run on the lost device did not end with the drafter's error")
	}
	t.Logf("after the fault: %s", text(`document.getElementById("engine-note").textContent`))
	run(prompts[1], 0)
	if d := f.modelDownloads.Load() - downloads; d != 0 {
		t.Errorf("the restart downloaded %d model files", d)
	}
	run(prompts[0], 0.8)
}

// newHeadFixture serves the embedded pair as `serve --model HEAD` does: the
// target on the CPU engine keeping the features a random EAGLE-3 head
// reads, the head (written into a folder named dir, 4,096 draft tokens)
// drafting the generations and listed for the page's in-browser mode and
// edge drafting, the drafter serving /draft.
func newHeadFixture(t *testing.T, dir string) *pairFixture {
	t.Helper()
	loadPair(t)
	root := t.TempDir()
	if err := synth.WriteEagle3(filepath.Join(root, dir), pairTarget.Config, synth.Eagle3Options{Seed: 5, DraftVocabSize: 4096}); err != nil {
		t.Fatal(err)
	}
	h, err := checkpoint.LoadEagle3(filepath.Join(root, dir), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return serveHead(t, h, "EAGLE-3 head "+dir, &ModelFiles{FS: os.DirFS(root), Dir: dir})
}

// newEmbeddedHeadFixture serves what `serve` runs by default without a
// GPU: the embedded EAGLE-3 head drafting over the embedded target on the
// CPU engine, the embedded drafter serving /draft.
func newEmbeddedHeadFixture(t *testing.T) *pairFixture {
	t.Helper()
	loadPair(t)
	h, err := checkpoint.LoadEagle3FS(weights.FS(), weights.HeadDir, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return serveHead(t, h, "EAGLE-3 head embedded:"+weights.HeadDir, &ModelFiles{FS: weights.FS(), Dir: weights.HeadDir})
}

// serveHead serves the embedded pair with the head h (closed when the
// test ends) drafting the generations on the CPU engine.
func serveHead(t *testing.T, h *checkpoint.Eagle3, name string, files *ModelFiles) *pairFixture {
	t.Helper()
	t.Cleanup(func() { h.Close() })
	f := newPairEngines(t, h.Config.Aux(pairTarget.Config.NumHiddenLayers))
	head, err := cpu.NewHead(f.target.(*cpu.Engine), h.Config, h.Weights, cpu.HeadOptions{KVBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close() })
	f.head = h
	f.serve(t, Options{}, &Model{Name: name, Engine: head, Files: files})
	return f
}

// TestModelFilesHead: a server drafting with an EAGLE-3 head lists the
// head's folder and files in the manifest, served with the hashes listed;
// a head whose folder has the drafter's name is left out, with the reason.
func TestModelFilesHead(t *testing.T) {
	f := newHeadFixture(t, "head")
	resp, err := http.Get(f.url + "/models/index.json")
	if err != nil {
		t.Fatal(err)
	}
	var man struct {
		modelManifest
		HeadUnavailable string `json:"headUnavailable"`
	}
	err = json.NewDecoder(resp.Body).Decode(&man)
	resp.Body.Close()
	if err != nil || man.Head != "head" || len(man.Files) != 6 || man.HeadUnavailable != "" {
		t.Fatalf("manifest %+v (%v)", man, err)
	}
	for _, mf := range man.Files[4:] {
		resp, err := http.Get(f.url + "/models/" + mf.Path)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		sum := sha256.Sum256(data)
		if !strings.HasPrefix(mf.Path, "head/") || resp.StatusCode != 200 || hex.EncodeToString(sum[:]) != mf.SHA256 {
			t.Errorf("%s: %d, hash %x (manifest %s)", mf.Path, resp.StatusCode, sum[:4], mf.SHA256[:8])
		}
	}

	b, err := newBrowserFiles(&ModelFiles{FS: weights.FS(), Dir: weights.DrafterDir}, &ModelFiles{FS: weights.FS(), Dir: weights.TargetDir},
		&ModelFiles{FS: weights.FS(), Dir: weights.DrafterDir})
	if err != nil {
		t.Fatal(err)
	}
	var left struct {
		modelManifest
		HeadUnavailable string `json:"headUnavailable"`
	}
	if err := json.Unmarshal(b.manifest, &left); err != nil || left.Head != "" || len(left.Files) != 4 || !strings.Contains(left.HeadUnavailable, "drafter's name") {
		t.Errorf("a head named as the drafter: %+v", left)
	}
}

// TestBrowserEngineHead: where the server drafts with an EAGLE-3 head, the
// page's in-browser mode runs that head over the target in headless
// Chromium (WebGPU on SwiftShader): the note says the head drafts, the
// live view's hello names it, and the output is the target's greedy
// continuation. Then edge drafting: the worker's head drafts over the
// features the server sends with each draft request (its target loaded
// but computing nothing), the note says so, and the output is again the
// target's greedy continuation.
func TestBrowserEngineHead(t *testing.T) {
	browsertest.Require(t, "the in-browser engine test with an EAGLE-3 head")
	if !dist.Built() {
		t.Skip("no browser build in wasm/dist/files: run `go tool task wasm` first")
	}
	f := newHeadFixture(t, "head")
	ctx := browsertest.NewStrict(t, 20*time.Minute)
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	do("opening the page", chromedp.Navigate(f.url+"/"), chromedp.Click("#where-browser"))
	state, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.engine || false`, chromedp.WithPollingTimeout(8*time.Minute)))
	note, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("engine-note").textContent`))
	if err != nil || state != "ready" || !strings.Contains(note, "the EAGLE-3 head head drafts") {
		t.Fatalf("the engine (%q, %v): %s", state, err, note)
	}
	t.Logf("engine: %s", note)
	const n = 3
	prompt := "def add(a, b):\n    "
	do("starting a run",
		chromedp.SetValue("#prompt", prompt), chromedp.SetValue("#k", "3"), chromedp.SetValue("#max_tokens", strconv.Itoa(n)),
		chromedp.SetValue("#temperature", "0"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("race").checked = false`),
		chromedp.Click("#start"))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
		chromedp.WithPollingTimeout(10*time.Minute))); err != nil {
		last, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.webdraftEngineLog.slice(-3))`))
		t.Fatalf("the run never finished: %v; the last events: %.2000s", err, last)
	}
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.webdraftEngineLog)`))
	if err != nil {
		t.Fatal(err)
	}
	var events []map[string]any
	if err := json.Unmarshal([]byte(raw), &events); err != nil {
		t.Fatal(err)
	}
	var out []int
	hello, steps, drafted := "", 0, 0
	for _, ev := range events {
		switch {
		case ev["type"] == "hello":
			hello, _ = ev["drafter"].(string)
		case ev["type"] == "step" && ev["run"] == "speculative":
			steps++
			drafted += len(eventIDs(ev["draft"]))
			out = append(out, eventIDs(ev["tokens"])...)
		}
	}
	want, _ := f.greedy(t, f.tok.Encode(prompt), n)
	if hello != "EAGLE-3 head head" || steps == 0 || drafted == 0 || !slices.Equal(out, want) {
		t.Errorf("hello's drafter %q; %d steps, %d tokens drafted, gave %v; the target's greedy continuation is %v", hello, steps, drafted, out, want)
	}

	// Edge drafting with the head: the worker keeps the target it loaded,
	// which now computes nothing, and the head drafts over the features
	// the server sends with each draft request.
	do("choosing edge drafting", chromedp.Click("#where-edge"))
	note, err = chromedp.Run(ctx, chromedp.Poll[string](`(t => t.startsWith("drafter ready") ? t : false)(document.getElementById("engine-note").textContent)`,
		chromedp.WithPollingTimeout(5*time.Minute)))
	if err != nil || !strings.Contains(note, "the EAGLE-3 head head drafts") || !strings.Contains(note, "the server sends them with each draft request") {
		t.Fatalf("edge drafting with the head (%v): %s", err, note)
	}
	t.Logf("edge: %s", note)
	session, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.session || false`, chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	before := len(f.events(t, session))
	do("starting an edge run", chromedp.Click("#start"))
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("status").textContent.startsWith("done")`,
		chromedp.WithPollingTimeout(10*time.Minute))); err != nil {
		t.Fatalf("the edge run never finished (status %q): %v", text(ctx, `document.getElementById("status").textContent`), err)
	}
	out, steps, drafted = nil, 0, 0
	asks, featured := 0, 0
	for _, ev := range f.events(t, session)[before:] {
		switch ev["type"] {
		case "start":
			if ev["edge_head"] != true {
				t.Errorf("the edge run's start: %v", ev)
			}
		case "draft_request":
			asks++
			if feat, ok := ev["features"].(map[string]any); ok && feat["width"] == float64(3*pairTarget.Config.HiddenSize) {
				featured++
			}
		case "step":
			steps++
			drafted += len(eventIDs(ev["draft"]))
			out = append(out, eventIDs(ev["tokens"])...)
		case "error":
			t.Errorf("error event: %v", ev["message"])
		}
	}
	if dir := os.Getenv("WEBDRAFT_SCREENSHOTS"); dir != "" { // the edge run as the page shows it
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "page-edge-head.png"), png, 0o644)
		}
		if err != nil {
			t.Error(err)
		}
	}
	if steps == 0 || asks == 0 || featured != asks || drafted == 0 || !slices.Equal(out, want) {
		t.Errorf("edge with the head: %d steps, %d draft requests (%d with the features), %d tokens drafted, gave %v; the target's greedy continuation is %v",
			steps, asks, featured, drafted, out, want)
	}
}

// text evaluates a JavaScript expression to a string ("" on failure).
func text(ctx context.Context, js string) string {
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	return s
}
