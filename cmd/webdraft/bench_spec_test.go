package main

import (
	"fmt"
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
		"--ks", "2", "--trees", "2x8,3×4", "--tree-depth", "3", "--new-tokens", "40", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("--live: exit %d: %s", code, stderr)
	}
	// The trees' table: a row a tree, τ within 1…depth+1, the reproducing
	// line with --trees.
	trees := regexp.MustCompile(`(?m)^\s+(\d+×\d+)\s+separate\s+(\d+\.\d\d)\s+\d+%\s+[\d.]+\s+[\d.]+×(\s+[\d.]+){6}×\s*$`).FindAllStringSubmatch(stdout, -1)
	if len(trees) != 2 || trees[0][1] != "2×8" || trees[1][1] != "3×4" || !strings.Contains(stdout, "token trees 3 levels deep") ||
		!strings.Contains(stdout, "reproduce: webdraft bench spec --live") || !strings.Contains(stdout, "--trees 2x8,3×4 --tree-depth 3") {
		t.Fatalf("--live --trees: no table of trees in\n%s", stdout)
	}
	for _, r := range trees {
		if tau, _ := strconv.ParseFloat(r[2], 64); tau < 1 || tau > 4 {
			t.Errorf("tree %s: τ %s at depth 3", r[1], r[2])
		}
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
// with a seed per prompt: the header says so, the tables have a τ for
// each k and each tree, and a second run measures the same τ and
// acceptance.
func TestBenchSpecLiveSampled(t *testing.T) {
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"ids\":[1,2,3]}\n{\"ids\":[9,8]}\n{\"ids\":[500,7,7]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join("..", "..", "testdata", "golden", "untied")
	row := regexp.MustCompile(`(?m)^\s+(\d+)\s+separate\s+(\d+\.\d\d)\s+(\d+)%\s`)
	var rows [][]string
	for range 2 {
		code, stdout, stderr := webdraft(t, "bench", "spec", "--live", "--target", model, "--drafter", model, "--prompts", prompts,
			"--ks", "1,3", "--trees", "2x6", "--tree-depth", "3", "--new-tokens", "24", "--backend", "cpu", "--temperature", "0.7", "--top-p", "0.9", "--uncoupled")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if header, _, _ := strings.Cut(stdout, "\n"); !strings.Contains(header, "temperature 0.7, top-p 0.9, prompt i with seed i") || strings.Contains(header, "greedy") ||
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
		// The drafter is the target: its coupled drafts are the target's
		// own draws under the same keys, and unkeyed (--uncoupled) its
		// sampled drafts are draws from the target's distribution, which
		// the rule accepts every time. A chain's τ is k + 1. A keyed tree's
		// first child at each node is the drafter's coupled draw, the
		// target's: its path of draws is accepted to the tree's depth, τ
		// 4; unkeyed, a tree of 6 draws (2 roots, 2 children each of the 2
		// best) accepts a root and at most one child.
		for _, m := range row.FindAllStringSubmatch(stdout, -1) {
			k, _ := strconv.Atoi(m[1])
			if want := fmt.Sprintf("%d.00", k+1); m[2] != want || m[3] != "100" {
				t.Errorf("k %d: τ %s, %s%% accepted; want τ %s, all accepted", k, m[2], m[3], want)
			}
		}
		for _, sh := range []struct {
			name     string
			min, max float64
		}{{"2×6", 4, 4}, {"2×6 uncoupled", 2, 3}} {
			tree := regexp.MustCompile(`(?m)^\s+` + sh.name + `\s+separate\s+(\d+\.\d\d)\s+(\d+)%\s`).FindStringSubmatch(stdout)
			if tree == nil {
				t.Fatalf("no row for the tree %s:\n%s", sh.name, stdout)
			}
			if tau, _ := strconv.ParseFloat(tree[1], 64); tau < sh.min || tau > sh.max {
				t.Errorf("tree %s: τ %s, want %g…%g", sh.name, tree[1], sh.min, sh.max)
			}
			taus = append(taus, sh.name+" "+tree[1]+" "+tree[2])
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
		{"--trees", "2x8"},                                 // not --live
		{"--live", "--trees", "1x8"},                       // a chain
		{"--live", "--trees", "2x8,21x8"},                  // b past MaxTopK
		{"--live", "--trees", "2x65"},                      // N past MaxTreeNodes
		{"--live", "--trees", "2by8"},
		{"--live", "--trees", "2x8", "--tree-depth", "0"},
	} {
		code, _, stderr := webdraft(t, append([]string{"bench", "spec", "--prompts", prompts}, args...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, code, stderr)
		}
	}
}

// TestBenchSpecLivePMin: --p-mins measures each k again with each p_min.
// The drafter is the target, so that its greedy drafts are all accepted:
// at a p_min below every draft's probability a step drafts all k (τ k +
// 1), at 1 none (τ 1: the target's own token a step).
func TestBenchSpecLivePMin(t *testing.T) {
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"ids\":[1,2,3]}\n{\"ids\":[9,8]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join("..", "..", "testdata", "golden", "untied")
	code, stdout, stderr := webdraft(t, "bench", "spec", "--live", "--target", model, "--drafter", model, "--prompts", prompts,
		"--ks", "3", "--p-mins", "1e-9,1", "--new-tokens", "24", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	row := regexp.MustCompile(`(?m)^\s+3( p_min [0-9.e-]+)?\s+separate\s+(\d+\.\d\d)\s`)
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(stdout, -1) {
		got[m[1]] = m[2]
	}
	want := map[string]string{"": "4.00", " p_min 1e-09": "4.00", " p_min 1": "1.00"}
	if fmt.Sprint(got) != fmt.Sprint(want) || !strings.Contains(stdout, "p_min (--p-mins)") {
		t.Errorf("rows k, τ %v, want %v, and p_min's note in\n%s", got, want, stdout)
	}
	if code, _, stderr := webdraft(t, "bench", "spec", "--live", "--prompts", prompts, "--p-mins", "0.5,2"); code != 2 || !strings.Contains(stderr, "--p-mins") {
		t.Errorf("--p-mins 0.5,2: exit %d, %s", code, stderr)
	}
}
