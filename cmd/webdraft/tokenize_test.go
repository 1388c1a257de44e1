package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"webdraft/tokenizer"
)

func TestTokenizeCommand(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // stdout
	}{
		{"plain", []string{"tokenize", "--text", "Hello, world!"}, `{"ids":[9707,11,1879,0]}`},
		{"special tokens matched", []string{"tokenize", "--text", "<|im_start|>user\nhi<|im_end|>"}, `{"ids":[151644,872,198,6023,151645]}`},
		{"empty text", []string{"tokenize", "--text", ""}, `{"ids":[]}`},
		{"model folder without tokenizer.json", []string{"tokenize", "--model", qwen3Folder(t), "--text", "Hello, world!"}, `{"ids":[9707,11,1879,0]}`},
		{"detokenize", []string{"detokenize", "--ids", "9707,11,1879,0"}, `{"text":"Hello, world!"}`},
		{"detokenize brackets and spaces", []string{"detokenize", "--ids", "[9707, 11, 1879, 0]"}, `{"text":"Hello, world!"}`},
		{"detokenize specials unescaped", []string{"detokenize", "--ids", "151644,872,198,6023,151645"}, `{"text":"<|im_start|>user\nhi<|im_end|>"}`},
		{"detokenize incomplete UTF-8", []string{"detokenize", "--ids", "160"}, "{\"text\":\"\uFFFD\"}"}, // byte 0xE4 alone
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := webdraft(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if got := strings.TrimSuffix(stdout, "\n"); got != tc.want {
				t.Errorf("stdout %q, want %q", got, tc.want)
			}
			if strings.Count(stdout, "\n") != 1 {
				t.Errorf("stdout %q is not one line", stdout)
			}
		})
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	text := "Grüße, 世界! 👨‍👩‍👧 <think>\n\n</think>\n\n  x\r\n"
	code, stdout, stderr := webdraft(t, "tokenize", "--text", text)
	if code != 0 {
		t.Fatalf("tokenize: exit %d: %s", code, stderr)
	}
	var enc struct{ IDs []int }
	if err := json.Unmarshal([]byte(stdout), &enc); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = webdraft(t, "detokenize", "--ids", joinIDs(enc.IDs))
	if code != 0 {
		t.Fatalf("detokenize: exit %d: %s", code, stderr)
	}
	var dec struct{ Text string }
	if err := json.Unmarshal([]byte(stdout), &dec); err != nil {
		t.Fatal(err)
	}
	if dec.Text != text {
		t.Errorf("round trip %q, want %q", dec.Text, text)
	}
}

// A model folder's own tokenizer.json wins over the embedded one.
func TestTokenizeModelTokenizer(t *testing.T) {
	data, err := tokenizer.Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	// Add one token to the folder's copy: <|webdraft|>, which takes id 151669.
	var file map[string]json.RawMessage
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var added []map[string]any
	if err := json.Unmarshal(file["added_tokens"], &added); err != nil {
		t.Fatal(err)
	}
	added = append(added, map[string]any{"id": 151669, "content": "<|webdraft|>", "special": true})
	if file["added_tokens"], err = json.Marshal(added); err != nil {
		t.Fatal(err)
	}
	patched, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), patched, 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := webdraft(t, "tokenize", "--model", dir, "--text", "a<|webdraft|>")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if want := `{"ids":[64,151669]}` + "\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	code, stdout, _ = webdraft(t, "detokenize", "--model", dir, "--ids", "151669")
	if want := `{"text":"<|webdraft|>"}` + "\n"; code != 0 || stdout != want {
		t.Errorf("detokenize: exit %d, stdout %q, want %q", code, stdout, want)
	}
}

// qwen3Folder returns a model folder with the embedded drafter's
// config.json (Qwen3's vocabulary) and no tokenizer.json.
func qwen3Folder(t *testing.T) string {
	t.Helper()
	cfg, err := os.ReadFile(filepath.Join("..", "..", "weights", "drafter", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestTokenizeErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "tokenizer.json"), []byte(`{"model": {"type": "Unigram"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string // a substring of stderr
	}{
		{"no text", []string{"tokenize"}, 2, "--text is required"},
		{"stray argument", []string{"tokenize", "--text", "a", "b"}, 2, `unexpected argument "b"`},
		{"unknown flag", []string{"tokenize", "--txt", "a"}, 2, "flag provided but not defined"},
		{"no ids", []string{"detokenize"}, 2, "--ids is required"},
		{"empty ids", []string{"detokenize", "--ids", ""}, 2, "no ids given"},
		{"not an integer", []string{"detokenize", "--ids", "1,x,3"}, 2, `"x" at position 1 is not a non-negative integer`},
		{"negative", []string{"detokenize", "--ids", "-1"}, 2, "not a non-negative integer"},
		{"empty item", []string{"detokenize", "--ids", "1,,2"}, 2, `"" at position 1`},
		{"out of vocabulary", []string{"detokenize", "--ids", "1,151669"}, 1, "token id 151669 is outside the vocabulary"},
		{"missing model folder", []string{"tokenize", "--model", filepath.Join(bad, "nope"), "--text", "a"}, 1, "no such file or directory"},
		{"bad tokenizer.json", []string{"tokenize", "--model", bad, "--text", "a"}, 1, "not supported"},
		{"no tokenizer for a small vocabulary", []string{"tokenize", "--model", goldenTied, "--text", "hi"}, 1,
			goldenTied + ": no tokenizer: it has no tokenizer.json, and the embedded Qwen3 tokenizer's 151669 tokens do not fit its vocabulary of 1024"},
		{"no config to tell", []string{"tokenize", "--model", t.TempDir(), "--text", "hi"}, 1, "has no tokenizer.json, so its config.json says whether the embedded one fits"},
		{"draft text, no tokenizer", []string{"draft", "--model", goldenTied, "--text", "hi", "--backend", "cpu"}, 1, "--text: " + goldenTied + ": no tokenizer: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := webdraft(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tc.stderr)
			}
			if tc.code == 1 && strings.Count(strings.TrimSuffix(stderr, "\n"), "\n") != 0 {
				t.Errorf("stderr %q is not one line", stderr)
			}
		})
	}
}

func TestParseIDs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		ok   bool
	}{
		{"1,2,3", []int{1, 2, 3}, true},
		{" 1 , 2 ,3 ", []int{1, 2, 3}, true},
		{"[0]", []int{0}, true},
		{"[ 151643, 151645 ]", []int{151643, 151645}, true},
		{"", nil, false},
		{"[]", nil, false},
		{"1,", nil, false},
		{"1.5", nil, false},
		{"0x10", nil, false},
		{"-3", nil, false},
		{"99999999999999999999999", nil, false},
	} {
		got, err := parseIDs(tc.in)
		if (err == nil) != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseIDs(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
