package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestGenerate: the embedded target generates greedily with its EAGLE-3
// head (the default) or the embedded drafter, the same tokens as the
// target alone, with a chain or a token tree, and the summary gives τ, the
// histogram and both rates; a golden pair (no tokenizer) prints ids.
func TestGenerate(t *testing.T) {
	// A prompt the pair continues past 24 tokens (no end of text).
	code, stdout, stderr := webdraft(t, "generate", "--text", "import os\n\n\ndef read_config(path):\n    \"\"\"", "--k", "4", "--max-tokens", "24", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"── EAGLE-3 head embedded:eagle3 drafting for embedded:target, k 4, greedy, cpu engine",
		"draft tokens accepted per step:",
		"the same tokens as the target alone: yes",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("no %q in\n%s", want, stdout)
		}
	}
	for _, re := range []string{`τ \d+\.\d\d tokens per verification step \(24 tokens in \d+ steps`, `(?m)^   4 │█*\s+\d+$`,
		`speculative\s+24 tokens in\s+[\d.]+ s:\s+[\d.]+ tokens/s`, `target alone\s+24 tokens in`, `speedup \d+\.\d\d×`} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("no match for %s in\n%s", re, stdout)
		}
	}
	// The standalone drafter, named.
	code, stdout, stderr = webdraft(t, "generate", "--model", "embedded:drafter", "--target", "embedded:target", "--text", "import os\n",
		"--k", "2", "--max-tokens", "12", "--backend", "cpu")
	if code != 0 || !strings.Contains(stdout, "── embedded:drafter drafting for embedded:target, k 2, greedy, cpu engine") ||
		!strings.Contains(stdout, "the same tokens as the target alone: yes") {
		t.Errorf("the embedded drafter: exit %d: %s%s", code, stdout, stderr)
	}
	// A token tree: the same tokens as the target alone, the shape in the
	// summary, a histogram to the tree's depth.
	code, stdout, stderr = webdraft(t, "generate", "--text", "def quicksort(xs):", "--k", "3", "--spec-topk", "2", "--spec-draft-tokens", "6",
		"--max-tokens", "16", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("a tree: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"a tree of depth 3, topk 2, 6 draft tokens, greedy, cpu engine", "the same tokens as the target alone: yes"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("a tree: no %q in\n%s", want, stdout)
		}
	}
	if !regexp.MustCompile(`(?m)^   3 │█*\s+\d+$`).MatchString(stdout) || regexp.MustCompile(`(?m)^   4 │`).MatchString(stdout) {
		t.Errorf("a tree of depth 3: the histogram in\n%s", stdout)
	}
	golden := filepath.Join("..", "..", "testdata", "golden")
	code, stdout, stderr = webdraft(t, "generate", "--model", filepath.Join(golden, "tied"), "--target", filepath.Join(golden, "untied"),
		"--ids", "1,2,3", "--max-tokens", "6", "--temperature", "0.8", "--seed", "3", "--backend", "cpu")
	if code != 0 || !regexp.MustCompile(`^(\d+ ){6}\n`).MatchString(stdout) || !strings.Contains(stdout, "temperature 0.8, top-p 1, seed 3") ||
		!strings.Contains(stdout, "the same tokens as the target alone: yes") { // sampled, keyed by the seed
		t.Errorf("ids only: exit %d\n%s%s", code, stdout, stderr)
	}
	// --warmup on runs each generation once untimed first (auto does on a
	// GPU only): the same tokens, said in the log.
	warmed := map[string]string{}
	for _, w := range []string{"on", "auto"} {
		code, stdout, stderr := webdraft(t, "generate", "--model", filepath.Join(golden, "tied"), "--target", filepath.Join(golden, "untied"),
			"--ids", "1,2,3", "--max-tokens", "6", "--temperature", "0.8", "--seed", "3", "--backend", "cpu", "--warmup", w)
		if code != 0 || strings.Contains(stderr, "warmed up") != (w == "on") {
			t.Errorf("--warmup %s on the CPU engine: exit %d, the log:\n%s", w, code, stderr)
		}
		warmed[w] = stdout[:strings.Index(stdout, "\n")]
	}
	if warmed["on"] != warmed["auto"] {
		t.Errorf("--warmup on: %q, without: %q", warmed["on"], warmed["auto"])
	}
	// A sampled tree on WebGPU: both models on one device, the drafter's
	// proposals drawn and the tree walked there — by the rule the CPU
	// engine follows on the host, with the same uniforms: the same tokens.
	sampledTree := func(backend string) string {
		code, stdout, stderr := webdraft(t, "generate", "--model", filepath.Join(golden, "tied"), "--target", filepath.Join(golden, "untied"),
			"--ids", "1,2,3", "--max-tokens", "10", "--temperature", "0.8", "--seed", "5", "--k", "3", "--spec-topk", "3", "--spec-draft-tokens", "8",
			"--backend", backend)
		if code != 0 {
			t.Fatalf("a sampled tree on %s: exit %d: %s", backend, code, stderr)
		}
		if backend == "webgpu" && strings.Count(stderr, `why="--backend webgpu; the models share it"`) != 2 {
			t.Errorf("the pair is not on one device:\n%s", stderr)
		}
		return stdout[:strings.Index(stdout, "\n")]
	}
	if gpu, cpu := sampledTree("webgpu"), sampledTree("cpu"); gpu != cpu {
		t.Errorf("a sampled tree: %q on webgpu, %q on the CPU engine", gpu, cpu)
	}
}

func TestGenerateUsage(t *testing.T) {
	for _, args := range [][]string{
		{"generate"},
		{"generate", "--text", "a", "--ids", "1"},
		{"generate", "--ids", "1", "--chat"},
		{"generate", "--text", "a", "--k", "0"},
		{"generate", "--text", "a", "--max-tokens", "0"},
		{"generate", "--text", "a", "--temperature", "-1"},
		{"generate", "--text", "a", "--top-p", "0"},
		{"generate", "--ids", "1,x"},
		{"generate", "--text", "a", "--spec-topk", "0"},
		{"generate", "--text", "a", "--spec-topk", "21"},
		{"generate", "--text", "a", "--spec-draft-tokens", "0"},
		{"generate", "--text", "a", "--spec-draft-tokens", "65"},
		{"generate", "--text", "a", "--warmup", "sometimes"},
	} {
		if code, _, _ := webdraft(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	golden := filepath.Join("..", "..", "testdata", "golden", "untied")
	if code, _, stderr := webdraft(t, "generate", "--target", golden, "--ids", "1", "--backend", "cpu"); code != 1 || !strings.Contains(stderr, "vocabulary") {
		t.Errorf("a mismatched pair: exit %d, %s", code, stderr)
	}
}
