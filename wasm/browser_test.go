//go:build !js

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"webdraft/bench"
	"webdraft/checkpoint"
	"webdraft/internal/browsertest"
	"webdraft/internal/synth"
	"webdraft/reference"
	"webdraft/shaders"
)

// browserTimeout bounds the whole browser session (SwiftShader is slow).
const browserTimeout = 8 * time.Minute

// tickInterval is the period of the page timer that shows whether the event
// loop kept running during a draft.
const tickInterval = 5 * time.Millisecond

// TestBrowser builds the drafter for GOOS=js GOARCH=wasm, serves it with the
// golden models, and drafts in headless Chromium on SwiftShader's WebGPU:
// the tokens must be Hugging Face's greedy ones (the plain-Go reference's for
// a sharded random checkpoint), and the page must stay responsive while the
// draft runs. It also compiles every shader with the browser's WGSL compiler.
func TestBrowser(t *testing.T) {
	browsertest.Require(t, "the browser test (about 15 s)")
	site := t.TempDir()
	buildSite(t, site)
	modules := wgslModules(t)
	// A sharded HF folder (index + 3 shards) of random weights, whose oracle
	// is the plain-Go reference model.
	sharded := filepath.Join(t.TempDir(), "sharded")
	if err := synth.Write(sharded, synth.Shapes["tiny"], synth.Options{Seed: 11, Std: 0.3, Shards: 3}); err != nil {
		t.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("GET /models/sharded/", http.StripPrefix("/models/sharded/", http.FileServer(http.Dir(sharded))))
	// The shipped drafter (vocab 151,936), which uses the target's
	// embedding: load fetches that folder beside it too.
	drafter := filepath.Join("..", "weights", "drafter")
	mux.Handle("GET /models/drafter/", http.StripPrefix("/models/drafter/", http.FileServer(http.Dir(drafter))))
	mux.Handle("GET /models/target/", http.StripPrefix("/models/target/", http.FileServer(http.Dir(filepath.Join("..", "weights", "target")))))
	mux.Handle("GET /models/", http.StripPrefix("/models/", http.FileServer(http.Dir(filepath.Join("..", "testdata", "golden")))))
	mux.HandleFunc("GET /shaders.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(modules); err != nil {
			t.Error(err)
		}
	})
	mux.Handle("GET /", http.FileServer(http.Dir(site)))
	srv := httptest.NewServer(mux) // on 127.0.0.1
	defer srv.Close()

	ctx := newBrowser(t)
	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, eval[bool](`webdraftReady.then(() => true)`)); err != nil {
		t.Fatalf("starting the Go program: %v", err)
	}
	adapter, err := chromedp.Run(ctx, eval[adapterInfo](`webdraft.adapter()`))
	if err != nil {
		t.Fatalf("opening the WebGPU device: %v", err)
	}
	t.Logf("adapter: %q (backend %s, shader-f16 %v), features %v", adapter.Adapter, adapter.Backend, adapter.F16, adapter.Features)
	if adapter.Adapter == "" || adapter.Backend != "webgpu" {
		t.Fatalf("no adapter reported: %+v", adapter)
	}
	t.Logf("page ready and device open in %v", time.Since(start).Round(time.Millisecond))

	t.Run("shaders", func(t *testing.T) { checkShaders(t, ctx) })
	t.Run("errors", func(t *testing.T) { checkErrors(t, ctx) })
	t.Run("session", func(t *testing.T) { checkSession(t, ctx) })
	t.Run("page", func(t *testing.T) {
		out, err := chromedp.Run(ctx, eval[string](pageScript))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the page's buttons: %q", out)
	})
	for _, c := range []struct {
		folder    string // under /models/
		weights   string // dense or int4, as in golden.json
		converted bool   // a folder written by webdraft convert
		want      func(t *testing.T) draftCase
	}{
		{"tied", "int4", false, golden("tied", "int4", 40)},
		{"untied", "int4", false, golden("untied", "int4", 300)}, // prefill over several attention tiles
		{"untied", "dense", false, golden("untied", "dense", 1)},
		{"drafter", "int4", true, referenceCase(drafter, []int{750, 75698, 1445, 982, 262}, 12)}, // "def fibonacci(n):\n   "
		{"sharded", "int4", false, referenceCase(sharded, []int{5, 17, 200, 3, 99}, 8)},
	} {
		t.Run(fmt.Sprintf("%s/%s", c.folder, c.weights), func(t *testing.T) {
			gc := c.want(t)
			quant := map[string]string{"dense": "f32", "int4": "int4"}[c.weights]
			script := fmt.Sprintf(draftScript, "models/"+c.folder+"/", quant, jsonString(t, gc.Prompt), len(gc.Greedy), tickInterval.Milliseconds())
			r, err := chromedp.Run(ctx, eval[draftResult](script))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("load %.0f ms (%s, converted folder %v), draft of %d tokens %.0f ms; timer ticked %d times, longest gap %.0f ms",
				r.LoadMS, r.Quant, r.Converted, len(gc.Greedy), r.DraftMS, r.Ticks, r.MaxGapMS)
			if r.Quant != quant || r.Converted != c.converted {
				t.Errorf("loaded as %s (converted %v), want %s (converted %v)", r.Quant, r.Converted, quant, c.converted)
			}
			checkGreedy(t, r.Tokens, gc)
			// The page stayed responsive: its timer kept firing while the
			// draft ran, with no gap near the draft's whole length.
			if want := max(int(r.DraftMS/float64(tickInterval.Milliseconds())/10), 1); r.Ticks < want {
				t.Errorf("the page's timer ticked %d times in %.0f ms of drafting (want ≥ %d): the event loop was blocked", r.Ticks, r.DraftMS, want)
			}
			if r.DraftMS > 500 && r.MaxGapMS > r.DraftMS/2 {
				t.Errorf("the page's timer stalled for %.0f ms of a %.0f ms draft", r.MaxGapMS, r.DraftMS)
			}
		})
	}
}

// draftScript loads a model (URL, quant), drafts (prompt, n) while a timer
// (period in ms) counts its ticks and longest gap, and closes the model.
const draftScript = `(async () => {
  const t0 = performance.now();
  const m = await webdraft.load(%q, {quant: %q});
  try {
    const loadMS = performance.now() - t0;
    let ticks = 0, last = performance.now(), maxGapMS = 0;
    const timer = setInterval(() => {
      const now = performance.now();
      maxGapMS = Math.max(maxGapMS, now - last);
      last = now;
      ticks++;
    }, %[5]d);
    const t1 = performance.now();
    const tokens = await m.draft(%[3]s, %[4]d);
    const draftMS = performance.now() - t1;
    clearInterval(timer);
    maxGapMS = Math.max(maxGapMS, performance.now() - last);
    return {tokens, loadMS, draftMS, ticks, maxGapMS, quant: m.quant, converted: m.converted};
  } finally {
    await m.close();
  }
})()`

// wgslModules returns every kernel — package shaders' and package bench's
// — as it is compiled, prelude items linked, by file name.
func wgslModules(t *testing.T) map[string]string {
	t.Helper()
	mods, err := shaders.Modules()
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range bench.Modules() {
		mods[name] = src
	}
	return mods
}

// checkShaders compiles every kernel (served at /shaders.json) with the
// browser's WGSL compiler (Tint), which is stricter than the native one
// (naga): the drafts reach most kernels but not all of them.
func checkShaders(t *testing.T, ctx context.Context) {
	errs, err := chromedp.Run(ctx, eval[map[string][]string](shadersScript))
	if err != nil {
		t.Fatal(err)
	}
	for name, msgs := range errs {
		for _, msg := range msgs {
			t.Errorf("%s:%s", name, msg)
		}
	}
	t.Logf("%d shaders checked", len(errs))
	if len(errs) < 15 {
		t.Errorf("only %d shaders were compiled", len(errs))
	}
}

// shadersScript compiles the kernels of /shaders.json (file name →
// source) on a device of its own and returns each one's error messages.
const shadersScript = `(async () => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice();
  const modules = await (await fetch("shaders.json")).json();
  const errors = {};
  for (const [name, code] of Object.entries(modules)) {
    const info = await device.createShaderModule({code, label: name}).getCompilationInfo();
    errors[name] = info.messages.filter(m => m.type === "error").map(m => m.lineNum + ":" + m.linePos + ": " + m.message);
  }
  device.destroy();
  return errors;
})()`

// checkErrors: bad calls reject their Promise with a message that says
// what was wrong, and the Go program lives on (the drafts after it run).
func checkErrors(t *testing.T, ctx context.Context) {
	msgs, err := chromedp.Run(ctx, eval[[]string](errorsScript))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"HTTP 404", "not a number", "not an integer", "outside the vocabulary", "model is closed"}
	if len(msgs) != len(want) {
		t.Fatalf("got %d rejections, want %d: %q", len(msgs), len(want), msgs)
	}
	for i, w := range want {
		t.Logf("rejected: %s", msgs[i])
		if !strings.Contains(msgs[i], w) {
			t.Errorf("rejection %d: %q, want it to say %q", i, msgs[i], w)
		}
	}
}

// checkSession: a drafting session (edge drafting's) drafts what a fresh
// sequence drafts from the same context, step after step, whatever part of
// its last draft the context kept; bad calls reject.
func checkSession(t *testing.T, ctx context.Context) {
	type result struct {
		Errors []string `json:"errors"`
		Same   []bool   `json:"same"`
	}
	r, err := chromedp.Run(ctx, eval[result](sessionScript))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"must reset", "k 0", "outside the vocabulary", "session is closed"}
	if len(r.Errors) != len(want) {
		t.Fatalf("got %d rejections, want %d: %q", len(r.Errors), len(want), r.Errors)
	}
	for i, w := range want {
		if !strings.Contains(r.Errors[i], w) {
			t.Errorf("rejection %d: %q, want it to say %q", i, r.Errors[i], w)
		}
	}
	if len(r.Same) != 6 || slices.Contains(r.Same, false) {
		t.Errorf("the session's drafts equal a fresh sequence's: %v", r.Same)
	}
}

// sessionScript drafts on a session as edge drafting does — each step's
// context the last one, the draft's first tokens kept (none, some, all)
// and a token of the target's — against fresh drafts.
const sessionScript = `(async () => {
  const out = { errors: [], same: [] };
  const expectReject = async (p) => {
    try { await p; out.errors.push("resolved"); } catch (e) { out.errors.push(e.message); }
  };
  const m = await webdraft.load("models/tied/");
  const s = m.session();
  await expectReject(s.draft([1, 2], false, 2));
  await expectReject(s.draft([1, 2], true, 0));
  await expectReject(s.draft([1, 99999], true, 2));
  let ctx = [5, 6, 7, 8];
  let d = await s.draft(ctx, true, 4);
  for (const keep of [0, 1, 2, 4, 3]) {
    out.same.push(JSON.stringify(d.tokens) === JSON.stringify(await m.draft(ctx, 4)));
    const add = d.tokens.slice(0, keep).concat([((d.tokens[keep] ?? 0) + 1) % 1024]);
    ctx = ctx.concat(add);
    d = await s.draft(add, false, 4);
  }
  out.same.push(JSON.stringify(d.tokens) === JSON.stringify(await m.draft(ctx, 4)));
  await s.close();
  await expectReject(s.draft([1], true, 2));
  await m.close();
  return out;
})()`

// errorsScript makes bad calls and returns the messages they are rejected
// with, in order.
const errorsScript = `(async () => {
  const msgs = [];
  const expectReject = async (p) => {
    try { await p; msgs.push("resolved"); } catch (e) { msgs.push(e.message); }
  };
  await expectReject(webdraft.load("models/missing/"));
  const m = await webdraft.load("models/tied/");
  await expectReject(m.draft([1, "2"], 2));
  await expectReject(m.draft([1, 2.5], 2));
  await expectReject(m.draft([1, 99999], 2));
  await m.close();
  await expectReject(m.draft([1], 2));
  return msgs;
})()`

// pageScript loads the page's default model and drafts with its buttons,
// and returns what the page shows.
const pageScript = `(async () => {
  const $ = (id) => document.getElementById(id);
  const until = async (prefix) => {
    for (let i = 0; i < 1200; i++) {
      const text = $("out").textContent;
      if (text.startsWith(prefix)) return;
      if (text.includes("failed")) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error("the page shows " + JSON.stringify($("out").textContent) + ", not " + prefix);
  };
  $("load").click();
  await until("loaded");
  $("ids").value = "1, 2, 3";
  $("n").value = "4";
  $("draft").click();
  await until("draft: ");
  return $("out").textContent;
})()`

type adapterInfo struct {
	Adapter  string
	Backend  string
	Features []string
	F16      bool
}

type draftResult struct {
	Tokens    []int
	Quant     string
	Converted bool
	LoadMS    float64
	DraftMS   float64
	Ticks     int
	MaxGapMS  float64
}

// eval evaluates a script in the page and awaits the Promise it returns.
func eval[T any](script string) chromedp.Action[T] { return browsertest.Eval[T](script) }

// buildSite writes the page, drafter.wasm (go build for js/wasm) and the Go
// toolchain's wasm_exec.js into dir.
func buildSite(t *testing.T, dir string) {
	t.Helper()
	start := time.Now()
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "drafter.wasm"), ".")
	build.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build for js/wasm: %v\n%s", err, out)
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	for src, dst := range map[string]string{
		filepath.Join(strings.TrimSpace(string(goroot)), "lib", "wasm", "wasm_exec.js"): "wasm_exec.js",
		"index.html": "index.html",
	} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("built drafter.wasm in %v", time.Since(start).Round(time.Millisecond))
}

// newBrowser starts headless Chromium for the test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	return browsertest.New(t, browserTimeout)
}

// draftCase is a prompt and the greedy tokens an oracle drafted after it,
// with each step's top-1 − top-2 logit margin and largest |logit|.
type draftCase struct {
	Weights      string
	Prompt       []int
	Greedy       []int
	Margins      []float64
	MaxAbsLogits []float64 `json:"max_abs_logits"`
}

// golden returns the case of testdata/golden/MODEL/golden.json for weights
// (dense or int4) and a prompt of promptLen tokens: Hugging Face's drafts.
func golden(model, weights string, promptLen int) func(t *testing.T) draftCase {
	return func(t *testing.T) draftCase {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("..", "testdata", "golden", model, "golden.json"))
		if err != nil {
			t.Fatal(err)
		}
		var g struct{ Cases []draftCase }
		if err := json.Unmarshal(data, &g); err != nil {
			t.Fatal(err)
		}
		for _, c := range g.Cases {
			if c.Weights == weights && len(c.Prompt) == promptLen {
				return c
			}
		}
		t.Fatalf("%s/golden.json has no %s case with a %d-token prompt", model, weights, promptLen)
		return draftCase{}
	}
}

// referenceCase drafts n tokens after prompt with the plain-Go reference
// model on the folder's weights as checkpoint.Load holds them (int4).
func referenceCase(dir string, prompt []int, n int) func(t *testing.T) draftCase {
	return func(t *testing.T) draftCase {
		t.Helper()
		m, err := checkpoint.Load(dir, checkpoint.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ref, err := reference.New(m.Config, m.Weights)
		if err != nil {
			t.Fatal(err)
		}
		c := draftCase{Weights: "int4", Prompt: prompt}
		seq, tokens := ref.NewSequence(), prompt
		for range n {
			logits, err := ref.Forward(seq, tokens)
			if err != nil {
				t.Fatal(err)
			}
			next, err := reference.Argmax(logits)
			if err != nil {
				t.Fatal(err)
			}
			var second, most float32 = float32(math.Inf(-1)), 0
			for i, v := range logits {
				if i != next {
					second = max(second, v)
				}
				most = max(most, float32(math.Abs(float64(v))))
			}
			c.Greedy = append(c.Greedy, next)
			c.Margins = append(c.Margins, float64(logits[next]-second))
			c.MaxAbsLogits = append(c.MaxAbsLogits, float64(most))
			tokens = []int{next}
		}
		return c
	}
}

// checkGreedy compares drafted tokens with the oracle's greedy ones, as
// engine/webgpu's TestGolden does: a differing step at a near tie (margin
// below 1e-3 of the largest logit) ends the comparison.
func checkGreedy(t *testing.T, got []int, c draftCase) {
	t.Helper()
	if len(got) != len(c.Greedy) {
		t.Fatalf("drafted %d tokens, want %d: %v", len(got), len(c.Greedy), got)
	}
	for i := range c.Greedy {
		if got[i] == c.Greedy[i] {
			continue
		}
		if c.Margins[i] < 1e-3*c.MaxAbsLogits[i] {
			t.Logf("step %d differs at a near tie (margin %.3g): later steps not compared", i, c.Margins[i])
			return
		}
		t.Fatalf("greedy tokens differ at step %d:\n got %v\nHF   %v", i, got, c.Greedy)
	}
}

func jsonString(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
