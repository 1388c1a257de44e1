package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"webdraft/qwen3"
	"webdraft/tokenizer"
)

func runTokenize(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "tokenize", `[--model DIR] --text "…"`)
	model := modelFlag(fs)
	text := fs.String("text", "", "text to tokenize; special tokens written in it (<|im_start|>, …) are matched, none are added")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if !isSet(fs, "text") {
		return usagef("--text is required")
	}
	tok, err := folderTokenizer(*model)
	if err != nil {
		return err
	}
	return writeJSON(e, struct {
		IDs []int `json:"ids"`
	}{tok.Encode(*text)})
}

func runDetokenize(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "detokenize", "[--model DIR] --ids 1,2,3")
	model := modelFlag(fs)
	idsFlag := fs.String("ids", "", "token ids, comma-separated (special tokens are kept in the text)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if !isSet(fs, "ids") {
		return usagef("--ids is required")
	}
	ids, err := parseIDs(*idsFlag)
	if err != nil {
		return usagef("--ids: %v", err)
	}
	tok, err := folderTokenizer(*model)
	if err != nil {
		return err
	}
	text, err := tok.Decode(ids)
	if err != nil {
		return fmt.Errorf("--ids: %w", err)
	}
	return writeJSON(e, struct {
		Text string `json:"text"`
	}{text})
}

// folderTokenizer returns the tokenizer of model folder dir without
// loading its weights (modelTokenizer's rule: its tokenizer.json, or the
// embedded Qwen3 tokenizer where its config's vocabulary holds that one's
// ids), or the embedded tokenizer when dir is "".
func folderTokenizer(dir string) (*tokenizer.Tokenizer, error) {
	if dir == "" {
		return tokenizer.Default()
	}
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err == nil {
		return tokenizer.ForModel(dir, data, 0)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("model folder: %w", err)
	}
	cfg, err := qwen3.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("%s has no tokenizer.json, so its config.json says whether the embedded one fits: %w", dir, err)
	}
	return tokenizer.ForModel(dir, nil, cfg.VocabSize)
}

func modelFlag(fs *flag.FlagSet) *string {
	return fs.String("model", "", "model folder (webdraft or HF checkpoint) whose tokenizer.json to use; default: the embedded Qwen3 tokenizer")
}

// isSet reports whether the flag was given, even as "".
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// writeJSON writes v as one line of JSON, with <, > and & left as they are.
func writeJSON(e *env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// parseIDs parses a comma-separated list of token ids such as "1,2,3" (spaces
// and enclosing brackets, as in "[1, 2, 3]", are allowed). It checks only
// that each is a non-negative integer; the vocabulary is the caller's to
// check.
func parseIDs(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	if s == "" {
		return nil, errors.New("no ids given")
	}
	parts := strings.Split(s, ",")
	ids := make([]int, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		id, err := strconv.Atoi(p)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%q at position %d is not a non-negative integer", p, i)
		}
		ids[i] = id
	}
	return ids, nil
}
