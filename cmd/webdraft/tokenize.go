package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

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
	tok, err := tokenizer.ForModel(*model)
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
	tok, err := tokenizer.ForModel(*model)
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
