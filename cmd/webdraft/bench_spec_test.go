package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestBenchSpecTextStats: the offline report gives the loop rate and
// distinct-4 of the target's continuations, and --live those of the
// target alone's outputs; at greedy they are the same continuations.
func TestBenchSpecTextStats(t *testing.T) {
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"ids\":[1,2,3]}\n{\"ids\":[9,8]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join("..", "..", "testdata", "golden", "untied")
	stats := regexp.MustCompile(`loop rate (\d\.\d{3}) \((\d+) of 2 loop: a run of 12 tokens 3 times without overlap\), distinct-4 (\d\.\d{3}) `)
	code, stdout, stderr := webdraft(t, "bench", "spec", "--target", model, "--drafter", model, "--prompts", prompts,
		"--k", "4", "--new-tokens", "40", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	offline := stats.FindStringSubmatch(stdout)
	if offline == nil || !strings.Contains(stdout, "the target's continuations: loop rate") {
		t.Fatalf("no text figures in\n%s", stdout)
	}
	code, stdout, stderr = webdraft(t, "bench", "spec", "--live", "--target", model, "--drafter", model, "--prompts", prompts,
		"--ks", "2", "--new-tokens", "40", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("--live: exit %d: %s", code, stderr)
	}
	live := stats.FindStringSubmatch(stdout)
	if live == nil || !strings.Contains(stdout, "the target alone's outputs: loop rate") || !strings.Contains(stdout, ", greedy, 1 at once") {
		t.Fatalf("--live: no text figures or no greedy in\n%s", stdout)
	}
	if live[0] != offline[0] {
		t.Errorf("greedy: live %q, offline %q", live[0], offline[0])
	}
}

// TestBenchSpecLiveSampled: --live --temperature samples every generation
// with a seed per prompt: the header says so, the table has a τ for each
// k, and a second run measures the same τ and acceptance.
func TestBenchSpecLiveSampled(t *testing.T) {
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"ids\":[1,2,3]}\n{\"ids\":[9,8]}\n{\"ids\":[500,7,7]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join("..", "..", "testdata", "golden", "untied")
	row := regexp.MustCompile(`(?m)^\s+(\d+)\s+(\d+\.\d\d)\s+(\d+)%\s`)
	var rows [][]string
	for range 2 {
		code, stdout, stderr := webdraft(t, "bench", "spec", "--live", "--target", model, "--drafter", model, "--prompts", prompts,
			"--ks", "1,3", "--new-tokens", "24", "--backend", "cpu", "--temperature", "0.7", "--top-p", "0.9")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if !strings.Contains(stdout, "temperature 0.7, top-p 0.9, prompt i with seed i") || strings.Contains(stdout, "greedy") ||
			!strings.Contains(stdout, "the target alone's outputs: loop rate") {
			t.Errorf("header:\n%s", stdout)
		}
		var taus []string
		for _, m := range row.FindAllStringSubmatch(stdout, -1) {
			taus = append(taus, m[1]+" "+m[2]+" "+m[3])
		}
		if len(taus) != 2 || !strings.HasPrefix(taus[0], "1 ") || !strings.HasPrefix(taus[1], "3 ") {
			t.Fatalf("want a row for k 1 and 3:\n%s", stdout)
		}
		// The drafter is the target, so at greedy every draft token would
		// be accepted (τ = k + 1); sampled, only some are.
		for _, m := range row.FindAllStringSubmatch(stdout, -1) {
			k, _ := strconv.Atoi(m[1])
			tau, _ := strconv.ParseFloat(m[2], 64)
			if tau < 1 || tau >= float64(k+1) {
				t.Errorf("k %d: τ %s, want 1 ≤ τ < %d", k, m[2], k+1)
			}
		}
		rows = append(rows, taus)
	}
	if strings.Join(rows[0], "; ") != strings.Join(rows[1], "; ") {
		t.Errorf("the same seeds measured %v, then %v", rows[0], rows[1])
	}
	for _, args := range [][]string{
		{"--temperature", "0.7"},                           // not --live
		{"--live", "--temperature", "-1"},                  // below 0
		{"--live", "--temperature", "0.7", "--top-p", "0"}, // outside (0, 1]
	} {
		code, _, stderr := webdraft(t, append([]string{"bench", "spec", "--prompts", prompts}, args...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, code, stderr)
		}
	}
}
