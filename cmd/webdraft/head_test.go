package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"webdraft/checkpoint"
	"webdraft/internal/synth"
	"webdraft/safetensors"
	"webdraft/weights"
)

// TestHead: generate --model and bench spec --drafter take an EAGLE-3
// head's folder and draft with it for the golden target (a random head in
// the public layout, quantized on load): generate gives the target's own
// greedy tokens, on the CPU engine and on WebGPU; bench spec measures τ; a
// head for another target, and a head on the reference engine, are refused
// in one line.
func TestHead(t *testing.T) {
	golden := filepath.Join("..", "..", "testdata", "golden")
	head := goldenHead(t)
	code, stdout, stderr := webdraft(t, "generate", "--model", head, "--target", filepath.Join(golden, "untied"), "--ids", "1,2,3",
		"--max-tokens", "12", "--k", "3", "--backend", "cpu")
	if code != 0 {
		t.Fatalf("generate: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"── EAGLE-3 head " + head + " drafting for " + filepath.Join(golden, "untied") + ", k 3, greedy, cpu engine",
		"the same tokens as the target alone: yes"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("generate: no %q in\n%s", want, stdout)
		}
	}
	// On WebGPU: the head in the target's group.
	code, stdout, stderr = webdraft(t, "generate", "--model", head, "--target", filepath.Join(golden, "untied"), "--ids", "1,2,3",
		"--max-tokens", "8", "--k", "3", "--backend", "webgpu")
	if code != 0 || !strings.Contains(stdout, "greedy, webgpu engine") || !strings.Contains(stdout, "the same tokens as the target alone: yes") ||
		!strings.Contains(stderr, "the head shares the target's device") {
		t.Errorf("generate on WebGPU: exit %d\n%s%s", code, stdout, stderr)
	}
	prompts := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(prompts, []byte("{\"ids\": [1, 2, 3]}\n{\"ids\": [400, 5, 6, 7]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = webdraft(t, "bench", "spec", "--prompts", prompts, "--drafter", head, "--target", filepath.Join(golden, "untied"),
		"--k", "4", "--new-tokens", "16", "--backend", "cpu")
	if code != 0 || !regexp.MustCompile(`drafter EAGLE-3 head .*: 2 prompts, k = 4`).MatchString(stdout) || !strings.Contains(stdout, "τ (mean tokens per verification step)") {
		t.Errorf("bench spec: exit %d\n%s%s", code, stdout, stderr)
	}

	other := t.TempDir()
	tied, err := checkpoint.Load(filepath.Join(golden, "tied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tied.Close()
	wide := tied.Config
	wide.HiddenSize, wide.VocabSize = 96, 2048 // the golden target: 128 wide, 1024 tokens
	if err := synth.WriteEagle3(other, wide, synth.Eagle3Options{Seed: 3, DType: safetensors.F32, DraftVocabSize: 64}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"generate", "--model", other, "--target", filepath.Join(golden, "untied"), "--ids", "1", "--backend", "cpu"}, 1, "does not fit target"},
		{[]string{"bench", "spec", "--prompts", prompts, "--drafter", other, "--target", filepath.Join(golden, "untied"), "--backend", "cpu"}, 1, "does not fit target"},
		{[]string{"generate", "--model", head, "--target", filepath.Join(golden, "untied"), "--ids", "1", "--backend", "reference"}, 2, "--backend reference"},
	} {
		code, _, stderr := webdraft(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(lastLine(stderr)), "\n") > 0 {
			t.Errorf("%v: exit %d (want %d), stderr %q", c.args, code, c.code, stderr)
		}
	}
}

// TestServeHead: serve --model HEAD drafts the generations with the head
// over the embedded target — greedy text equal to the target alone's — and
// keeps the embedded drafter for /draft; /health names both.
func TestServeHead(t *testing.T) {
	target, _, err := loadEmbedded(weights.TargetDir)
	if err != nil {
		t.Skip(err)
	}
	cfg := target.Config
	target.Close()
	head := t.TempDir()
	if err := synth.WriteEagle3(head, cfg, synth.Eagle3Options{Seed: 5, DType: safetensors.F32, DraftVocabSize: 512}); err != nil {
		t.Fatal(err)
	}
	addr, _ := startServe(t, "--model", head, "--backend", "cpu", "--k", "3", "--cache-mb", "64")
	post := func(path, body string, out any) {
		t.Helper()
		resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, err)
		}
	}
	var spec, alone struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	post("/v1/completions", `{"prompt":"def quicksort(xs):","max_tokens":12,"temperature":0}`, &spec)
	post("/v1/completions", `{"prompt":"def quicksort(xs):","max_tokens":12,"temperature":0,"speculative":{"k":0}}`, &alone)
	if len(spec.Choices) != 1 || len(alone.Choices) != 1 || spec.Choices[0].Text != alone.Choices[0].Text || spec.Choices[0].Text == "" {
		t.Errorf("greedy text with the head %+v, the target alone %+v", spec, alone)
	}
	var draft struct {
		Draft []int `json:"draft"`
	}
	post("/draft", `{"text":"def quicksort(xs):","n":4}`, &draft)
	if len(draft.Draft) != 4 {
		t.Errorf("/draft: %+v", draft)
	}
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h["head"] != "EAGLE-3 head "+head || h["model"] != "embedded:"+weights.DrafterDir {
		t.Errorf("/health: %v (%v)", h, err)
	}

	// --draft-model: another drafter serves /draft beside the head.
	drafter := filepath.Join("..", "..", "weights", weights.DrafterDir)
	addr, _ = startServe(t, "--model", head, "--draft-model", drafter, "--backend", "cpu", "--k", "3", "--cache-mb", "64")
	post("/draft", `{"text":"def quicksort(xs):","n":4}`, &draft)
	if len(draft.Draft) != 4 {
		t.Errorf("/draft from --draft-model: %+v", draft)
	}
	resp, err = http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h = nil
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h["head"] != "EAGLE-3 head "+head || h["model"] != drafter {
		t.Errorf("/health with --draft-model %s: %v (%v)", drafter, h, err)
	}
}

// goldenHead writes a random EAGLE-3 head in the public layout (F32, 256
// draft tokens) for the golden untied target into a temporary folder and
// returns the folder.
func goldenHead(t *testing.T) string {
	t.Helper()
	target, err := checkpoint.Load(filepath.Join("..", "..", "testdata", "golden", "untied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	head := t.TempDir()
	if err := synth.WriteEagle3(head, target.Config, synth.Eagle3Options{Seed: 3, Std: 0.1, DType: safetensors.F32, DraftVocabSize: 256}); err != nil {
		t.Fatal(err)
	}
	return head
}
