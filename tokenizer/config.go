package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// fileJSON is the part of an HF tokenizer.json that this package reads.
type fileJSON struct {
	AddedTokens   []AddedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelJSON       `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Vocab                   json.RawMessage `json:"vocab"` // BPE: {"token": id, …}
	Merges                  json.RawMessage `json:"merges"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
}

// component is any normalizer, pre-tokenizer or decoder object.
type component struct {
	Type string `json:"type"`
	// Sequence members.
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	// Split.
	Pattern  struct{ Regex, String *string } `json:"pattern"`
	Behavior string                          `json:"behavior"`
	Invert   bool                            `json:"invert"`
	// ByteLevel.
	AddPrefixSpace bool  `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// parseNormalizer supports the Unicode normal forms, alone or in a Sequence.
func parseNormalizer(raw json.RawMessage) ([]norm.Form, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch c.Type {
	case "NFC":
		return []norm.Form{norm.NFC}, nil
	case "NFD":
		return []norm.Form{norm.NFD}, nil
	case "NFKC":
		return []norm.Form{norm.NFKC}, nil
	case "NFKD":
		return []norm.Form{norm.NFKD}, nil
	case "Sequence":
		var forms []norm.Form
		for _, sub := range c.Normalizers {
			f, err := parseNormalizer(sub)
			if err != nil {
				return nil, err
			}
			forms = append(forms, f...)
		}
		return forms, nil
	}
	return nil, fmt.Errorf("normalizer type %q is not supported (want NFC, NFD, NFKC, NFKD or a Sequence of them)", c.Type)
}

// checkPreTokenizer accepts the Qwen2 pre-tokenizer: the Qwen2 Split regex
// (Isolated) followed by ByteLevel without its own regex.
func checkPreTokenizer(raw json.RawMessage) error {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	var split, bl component
	if c.Type != "Sequence" || len(c.PreTokenizers) != 2 ||
		json.Unmarshal(c.PreTokenizers[0], &split) != nil || json.Unmarshal(c.PreTokenizers[1], &bl) != nil {
		return fmt.Errorf("pre_tokenizer: only the Qwen2 Sequence [Split, ByteLevel] is supported, got %s", brief(raw))
	}
	if split.Type != "Split" || split.Pattern.Regex == nil || *split.Pattern.Regex != qwen2Pattern ||
		split.Behavior != "Isolated" || split.Invert {
		return fmt.Errorf("pre_tokenizer: only the Qwen2 split regex (Isolated) is supported, got %s", brief(c.PreTokenizers[0]))
	}
	if bl.Type != "ByteLevel" || bl.AddPrefixSpace || (bl.UseRegex != nil && *bl.UseRegex) {
		return fmt.Errorf("pre_tokenizer: want ByteLevel with add_prefix_space and use_regex false, got %s", brief(c.PreTokenizers[1]))
	}
	return nil
}

func checkDecoder(raw json.RawMessage) error {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	if c.Type != "ByteLevel" {
		return fmt.Errorf("decoder: only ByteLevel is supported, got %s", brief(raw))
	}
	return nil
}

// parseMerges reads merges as [["a","b"],…] (current format) or ["a b",…]
// (legacy).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("model.merges: want [[a, b], …] or [\"a b\", …]: %w", err)
	}
	pairs = make([][2]string, len(lines))
	for i, l := range lines {
		a, b, ok := strings.Cut(l, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("model.merges[%d] = %q: want two tokens separated by one space", i, l)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

// brief shortens a JSON value for an error message.
func brief(raw json.RawMessage) string {
	s := strings.Join(strings.Fields(string(raw)), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}
