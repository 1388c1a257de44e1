// Package browserbench measures speculative decoding in the browser: the
// page's in-browser mode — drafter and target both on the page's GPU, in
// the engine's worker — racing the target alone, prompt by prompt, in
// headless Chromium (WebGPU on SwiftShader, the browser's case on a
// machine without a GPU). It is a measurement, not a test: it runs only
// when asked,
//
//	go tool task wasm && go test ./lab/browserbench -run TestSpeedup -v -timeout 2h -args -browserbench.prompts 3 -browserbench.tokens 16
//
// and writes its table to the log (and to -browserbench.out).
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
	drafterFolder = flag.String("browserbench.drafter", "", "a drafter folder to race instead of the embedded one (named drafter, beside a copy of the embedded target named target when it uses the target's embedding)")
)

func TestSpeedup(t *testing.T) {
	if *prompts == 0 {
		t.Skip("a measurement: -browserbench.prompts N runs it")
	}
	browsertest.Require(t, "the browser measurement")
	if !dist.Built() {
		t.Fatal("no browser build in wasm/dist/files: run `go tool task wasm` first")
	}
	url := serve(t)
	ctx := browsertest.New(t, 2*time.Hour)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	run("opening the page", chromedp.Navigate(url+"/"), chromedp.Click("#where-browser"))
	start := time.Now()
	if state, err := chromedp.Run(ctx, chromedp.Poll[string](`document.body.dataset.engine || false`, chromedp.WithPollingTimeout(10*time.Minute))); err != nil || state != "ready" {
		t.Fatalf("the engine did not start: %q %v", state, err)
	}
	note, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("engine-note").textContent`))
	t.Logf("engine: %s (%.0f s)", note, time.Since(start).Seconds())

	var rows []string
	var specSum, baseSum, tauSum float64
	for i, p := range heldOut(t, *prompts) {
		before, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`window.webdraftEngineLog.length`))
		run("a race",
			chromedp.SetValue("#prompt", p), chromedp.SetValue("#k", strconv.Itoa(*k)), chromedp.SetValue("#max_tokens", strconv.Itoa(*tokens)),
			chromedp.SetValue("#temperature", "0"), chromedp.Evaluate[chromedp.Void](`document.getElementById("race").checked = true`),
			chromedp.Click("#start"))
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`window.webdraftEngineLog.slice(`+strconv.Itoa(before)+`).some((e) => e.type === "finished" || e.type === "error")`,
			chromedp.WithPollingTimeout(time.Hour))); err != nil {
			t.Fatalf("prompt %d: %v", i, err)
		}
		raw, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.webdraftEngineLog.slice(`+strconv.Itoa(before)+`))`))
		var events []map[string]any
		if err := json.Unmarshal([]byte(raw), &events); err != nil {
			t.Fatal(err)
		}
		var spec, base, tau float64
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
		rows = append(rows, fmt.Sprintf("| %d | %.3f | %.3f | %.2f | %.2f× |", i, spec, base, tau, spec/base))
		specSum, baseSum, tauSum = specSum+spec, baseSum+base, tauSum+tau
		t.Logf("prompt %d: speculative %.3f tok/s (τ %.2f), the target alone %.3f tok/s: %.2f×", i, spec, tau, base, spec/base)
	}
	n := float64(len(rows))
	table := fmt.Sprintf("In-browser (%s), k = %d, %d tokens a run, greedy:\n\n| prompt | speculative tok/s | target alone tok/s | τ | speedup |\n| ---: | ---: | ---: | ---: | ---: |\n%s\n| mean | %.3f | %.3f | %.2f | %.2f× |\n",
		note, *k, *tokens, strings.Join(rows, "\n"), specSum/n, baseSum/n, tauSum/n, specSum/baseSum)
	t.Logf("\n%s", table)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// serve serves the embedded pair on CPU engines (the page's files and
// models; the browser runs both models itself).
func serve(t *testing.T) string {
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
		e, err := engine.NewCPU(m.Config, m.Weights, 64<<20)
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
	ts := httptest.NewServer(srv.Handler())
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
				return ts.URL
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
