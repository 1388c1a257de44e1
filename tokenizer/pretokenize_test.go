package tokenizer

import (
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// pieces returns the pre-tokenized pieces of normalized text.
func (t *Tokenizer) pieces(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		j := t.scan.nextPiece(s, i)
		out = append(out, s[i:j])
		i = j
	}
	return out
}

func TestPieces(t *testing.T) {
	tok := qwen3(t)
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"Hello, world!", []string{"Hello", ",", " world", "!"}},
		{"I'm here", []string{"I", "'m", " here"}},
		{"WE'LL it'S 'sup", []string{"WE", "'LL", " it", "'S", " '", "sup"}},
		{"it'ſ", []string{"it", "'ſ"}}, // U+017F folds to 's' under (?i)
		{"a  b", []string{"a", " ", " b"}},
		{"a \n b", []string{"a", " \n", " b"}},
		{"x  \n\n  y", []string{"x", "  \n\n", " ", " y"}},
		{"end  ", []string{"end", "  "}},
		{"\tfoo", []string{"\tfoo"}},
		{"\t\tfoo", []string{"\t", "\tfoo"}},
		{"(foo)", []string{"(foo", ")"}},
		{" !!\n\nx", []string{" !!\n\n", "x"}},
		{"x !", []string{"x", " !"}},
		{"x  !", []string{"x", " ", " !"}},
		{"12345", []string{"1", "2", "3", "4", "5"}},
		{"a\u00a0\u00a0b", []string{"a", "\u00a0", "\u00a0b"}},
		{"a\u200b\u200bb", []string{"a", "\u200b\u200b", "b"}}, // ZWSP is not White_Space
		{"你好，世界。", []string{"你好", "，世界", "。"}},
		{"नमस्ते", []string{"नमस", "्त", "े"}},
		{"x\U0002ebf0y", []string{"x\U0002ebf0y"}},     // CJK Ext. I: a letter in Unicode 15.1
		{"x\U00010940y", []string{"x", "\U00010940y"}}, // Unicode 17.0: not yet a letter
		{"\r\n\r\nfoo", []string{"\r\n\r\n", "foo"}},
		{"a\r\n", []string{"a", "\r\n"}},
	} {
		if got := tok.pieces(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("pieces(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The scanner covers every byte, in order, for any input.
func checkTiling(t *testing.T, tok *Tokenizer, s string) {
	t.Helper()
	if got := strings.Join(tok.pieces(s), ""); got != s {
		t.Fatalf("pieces of %q join to %q", s, got)
	}
}

// regexp2Split is the pre-tokenizer done with a backtracking regex engine
// (.NET semantics), the alternative to the hand-written scanner. It differs
// from Oniguruma only in case folding ('ſ' does not match 's') and in using
// Go's Unicode 15.0 tables for \p{L} and \p{N}.
var qwen2Regexp2 = regexp2.MustCompile(qwen2Pattern)

func regexp2Split(s string) []string {
	locs, err := qwen2Regexp2.FindAllStringIndex(s, -1)
	if err != nil {
		panic(err)
	}
	out := make([]string, 0, len(locs))
	prev := 0
	for _, l := range locs {
		if l[0] > prev { // "Isolated" keeps the gaps too (there are none)
			out = append(out, s[prev:l[0]])
		}
		out = append(out, s[l[0]:l[1]])
		prev = l[1]
	}
	if prev < len(s) {
		out = append(out, s[prev:])
	}
	return out
}

// regexp2Comparable reports whether regexp2 should split s exactly as the
// scanner: valid UTF-8, no 'ſ' and no rune whose class Go 1.26 gets from
// unicode16.go.
func regexp2Comparable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == 'ſ' || unicode.Is(unicode16Letters, r) || unicode.Is(unicode16Numbers, r) {
			return false
		}
	}
	return true
}

func TestScannerMatchesRegexp2(t *testing.T) {
	tok := qwen3(t)
	var inputs []string
	for _, line := range strings.SplitAfter(readCorpus(t), "\n") {
		inputs = append(inputs, line)
	}
	g := readGolden(t)
	for _, c := range g.Encode {
		inputs = append(inputs, c.Text)
	}
	n := 0
	for _, s := range inputs {
		s = tok.normalize(s)
		if s == "" || !regexp2Comparable(s) {
			continue
		}
		n++
		if got, want := tok.pieces(s), regexp2Split(s); !reflect.DeepEqual(got, want) {
			t.Errorf("pieces(%.60q):\n got %q\nwant %q", s, got, want)
		}
	}
	t.Logf("%d strings agree with regexp2", n)
}

func TestUnicodeTablesVersion(t *testing.T) {
	// unicode16.go fills the gap between Go's tables and Oniguruma's (16.0).
	// A Go release with newer tables would classify Unicode 17 additions as
	// letters where HF does not: regenerate with tokenizer/scripts/unicode16.
	if unicode.Version != "15.0.0" {
		t.Errorf("Go's unicode tables are %s; unicode16.go was generated for 15.0.0", unicode.Version)
	}
}
