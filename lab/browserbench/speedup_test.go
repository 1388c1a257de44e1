// Package browserbench measures speculative decoding in the browser: the
// page's in-browser mode — drafter and target both on the page's GPU, in
// the engine's worker — racing the target alone, prompt by prompt, in
// headless Chromium (WebGPU on SwiftShader, the browser's case on a
// machine without a GPU). It is a measurement, not a test: it runs only
// when asked,
//
//	go tool task wasm && go test ./lab/browserbench -run TestSpeedup -v -timeout 2h -args -browserbench.prompts 3 -browserbench.tokens 16
//
// and writes its table to the log (and to -browserbench.out). With
// -browserbench.wasm a.wasm,b.wasm it races builds of the engine (two
// revisions, say) against each other in one run.
package browserbench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/internal/browsertest"
	"webdraft/server"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/wasm/dist"
	"webdraft/weights"
)

var (
	prompts       = flag.Int("browserbench.prompts", 0, "held-out prompts to race (0: do not run)")
	tokens        = flag.Int("browserbench.tokens", 16, "tokens a run generates")
	k             = flag.Int("browserbench.k", 4, "the draft length")
	out           = flag.String("browserbench.out", "", "also write the table here")
	wasmFiles     = flag.String("browserbench.wasm", "", "drafter.wasm builds to race one against another, comma-separated (a tab each, the prompts alternating; default: the embedded build)")
	screenshot    = flag.String("browserbench.screenshot", "", "also save the first tab's page after the races here (PNG)")
	drafterFolder = flag.String("browserbench.drafter", "", "a drafter folder to race instead of the embedded one (named drafter, beside a copy of the embedded target named target when it uses the target's embedding)")
)

func TestSpeedup(t *testing.T) {
	if *prompts == 0 {
		t.Skip("a measurement: -browserbench.prompts N runs it")
	}
	browsertest.Require(t, "the browser measurement")
	builds := []string{""} // "": the embedded build
	if *wasmFiles != "" {
		builds = strings.Split(*wasmFiles, ",")
	} else if !dist.Built() {
		t.Fatal("no browser build in wasm/dist/files: run `go tool task wasm` first")
	}
	handler := serve(t)
	browser := browsertest.New(t, 4*time.Hour)
	// A tab a build, each on its own origin (its own Cache Storage), the
	// engine started once; the prompts alternate between the tabs.
	type tab struct {
		build string
		ctx   context.Context
		note  string
		rows  []string
		spec  float64
		base  float64
		tau   float64
	}
	var tabs []*tab
	for _, build := range builds {
		ctx, cancel := chromedp.NewContext(browser)
		t.Cleanup(cancel)
		tb := &tab{build: build, ctx: ctx}
		tb.note = startEngine(t, ctx, origin(t, handler, build))
		t.Logf("%s: engine %s", label(build), tb.note)
		tabs = append(tabs, tb)
	}
	for i, p := range heldOut(t, *prompts) {
		for _, tb := range tabs {
			spec, base, tau := race(t, tb.ctx, i, p)
			tb.rows = append(tb.rows, fmt.Sprintf("| %d | %.3f | %.3f | %.2f | %.2f× |", i, spec, base, tau, spec/base))
			tb.spec, tb.base, tb.tau = tb.spec+spec, tb.base+base, tb.tau+tau
			t.Logf("%s, prompt %d: speculative %.3f tok/s (τ %.2f), the target alone %.3f tok/s: %.2f×", label(tb.build), i, spec, tau, base, spec/base)
		}
	}
	if *screenshot != "" {
		png, err := chromedp.Run(tabs[0].ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var table strings.Builder
	for _, tb := range tabs {
		n := float64(len(tb.rows))
		fmt.Fprintf(&table, "In-browser (%s%s), k = %d, %d tokens a run, greedy:\n\n| prompt | speculative tok/s | target alone tok/s | τ | speedup |\n| ---: | ---: | ---: | ---: | ---: |\n%s\n| mean | %.3f | %.3f | %.2f | %.2f× |\n\n",
			tb.note, buildNote(tb.build), *k, *tokens, strings.Join(tb.rows, "\n"), tb.spec/n, tb.base/n, tb.tau/n, tb.spec/tb.base)
	}
	for _, tb := range tabs[1:] {
		fmt.Fprintf(&table, "%s against %s: speculative tok/s %.2f×, the target alone's %.2f×\n",
			label(tb.build), label(tabs[0].build), tb.spec/tabs[0].spec, tb.base/tabs[0].base)
	}
	t.Logf("\n%s", table.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(table.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func label(build string) string {
	if build == "" {
		return "the embedded build"
	}
	return build
}

func buildNote(build string) string {
	if build == "" {
		return ""
	}
	return "; " + build
}

// origin serves handler on an origin of its own, with build's
// drafter.wasm in place of the embedded one ("": the embedded one).
func origin(t *testing.T, handler http.Handler, build string) string {
	t.Helper()
	h := handler
	if build != "" {
		if _, err := os.Stat(build); err != nil {
			t.Fatal(err)
		}
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/wasm/"+dist.Program {
				w.Header().Set("Content-Type", "application/wasm")
				http.ServeFile(w, r, build)
				return
			}
			handler.ServeHTTP(w, r)
		})
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// startEngine opens the page at url in ctx's tab and starts its
// in-browser engine; it returns the page's note on it.
func startEngine(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(url+"/"), chromedp.Click("#where-browser")); err != nil {
		t.Fatalf("opening the page: %v", err)
	}
	start := time.Now()
	if state, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.engine || false`, chromedp.WithPollingTimeout(10*time.Minute))); err != nil || state != "ready" {
		t.Fatalf("the engine did not start: %q %v", state, err)
	}
	note, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("engine-note").textContent`))
	return fmt.Sprintf("%s (%.0f s)", note, time.Since(start).Seconds())
}

// race runs prompt p on the page in ctx's tab: speculative decoding and
// the target alone; it returns their tokens a second and τ.
func race(t *testing.T, ctx context.Context, i int, p string) (spec, base, tau float64) {
	t.Helper()
	before, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`window.webdraftEngineLog.length`))
	if err := chromedp.Do(ctx,
		chromedp.SetValue("#prompt", p), chromedp.SetValue("#k", strconv.Itoa(*k)), chromedp.SetValue("#max_tokens", strconv.Itoa(*tokens)),
		chromedp.SetValue("#temperature", "0"), chromedp.Evaluate[chromedp.Void](`document.getElementById("race").checked = true`),
		chromedp.Click("#start")); err != nil {
		t.Fatalf("a race: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`window.webdraftEngineLog.slice(`+strconv.Itoa(before)+`).some((e) => e.type === "finished" || e.type === "error")`,
		chromedp.WithPollingTimeout(time.Hour))); err != nil {
		t.Fatalf("prompt %d: %v", i, err)
	}
	raw, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.webdraftEngineLog.slice(`+strconv.Itoa(before)+`))`))
	var events []map[string]any
	if err := json.Unmarshal([]byte(raw), &events); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		switch {
		case e["type"] == "error":
			t.Fatalf("prompt %d: %v", i, e["message"])
		case e["type"] == "done" && e["run"] == "speculative":
			spec, tau = e["tokens_per_s"].(float64), e["tau"].(float64)
		case e["type"] == "done" && e["run"] == "target":
			base = e["tokens_per_s"].(float64)
		}
	}
	return spec, base, tau
}

// serve serves the embedded pair on CPU engines (the page's files and
// models; the browser runs both models itself): the server's handler.
func serve(t *testing.T) http.Handler {
	t.Helper()
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	model := func(name string, fsys fs.FS, dir string) server.Model {
		m, err := checkpoint.LoadFS(fsys, dir, checkpoint.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		e, err := engine.NewReference(m.Config, m.Weights, 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		return server.Model{Name: name, Engine: e, Tokenizer: tok, Files: &server.ModelFiles{FS: fsys, Dir: dir}}
	}
	drafterFS, drafterDir := weights.FS(), weights.DrafterDir
	if *drafterFolder != "" {
		drafterFS, drafterDir = os.DirFS(filepath.Dir(*drafterFolder)), filepath.Base(*drafterFolder)
	}
	drafter, target := model("drafter", drafterFS, drafterDir), model("target", weights.FS(), weights.TargetDir)
	srv := server.New(slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	h := srv.Handler()
	ts := httptest.NewServer(h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Run(ctx, server.Config{Drafter: drafter, Target: &target, Speculative: speculative.Options{K: *k}})
	}()
	t.Cleanup(func() { ts.Close(); cancel(); <-done })
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := ts.Client().Get(ts.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return h
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never became ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldOut returns the first n held-out prompts (weights/heldout_prompts.jsonl:
// token ids) as text, which the page takes.
func heldOut(t *testing.T, n int) []string {
	t.Helper()
	f, err := os.Open("../../weights/heldout_prompts.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && len(out) < n {
		var p struct {
			IDs []int `json:"ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil || len(p.IDs) == 0 {
			t.Fatalf("a held-out prompt: %v", err)
		}
		text, err := tok.Decode(p.IDs)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, text)
	}
	return out
}
