package tokenizer

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

var goldenPath = flag.String("golden", "testdata/golden.json.gz",
	"Hugging Face golden file, written by scripts/golden.py (gzip if it ends in .gz)")

// goldenFile is what scripts/golden.py writes.
type goldenFile struct {
	Versions map[string]string `json:"versions"`
	Encode   []struct {
		Name    string `json:"name"`
		Text    string `json:"text"`
		IDs     []int  `json:"ids"`
		Decoded string `json:"decoded"` // HF decode(ids, skip_special_tokens=False)
	} `json:"encode"`
	Decode []struct {
		IDs  []int  `json:"ids"`
		Text string `json:"text"`
	} `json:"decode"`
	Chat []struct {
		Name                string    `json:"name"`
		Messages            []Message `json:"messages"`
		AddGenerationPrompt bool      `json:"add_generation_prompt"`
		EnableThinking      bool      `json:"enable_thinking"`
		Text                string    `json:"text"`
		IDs                 []int     `json:"ids"`
	} `json:"chat"`
	Flags struct {
		AddedTokens []map[string]any `json:"added_tokens"`
		IDs         map[string]int   `json:"ids"`
		Cases       []struct {
			Text string `json:"text"`
			IDs  []int  `json:"ids"`
		} `json:"cases"`
	} `json:"flags"`
	Corpus struct {
		Bytes     int    `json:"bytes"`
		Tokens    int    `json:"tokens"`
		IDsSHA256 string `json:"ids_sha256"`
	} `json:"corpus"`
}

func readGolden(t testing.TB) *goldenFile {
	t.Helper()
	f, err := os.Open(*goldenPath)
	if err != nil {
		t.Fatalf("golden file: %v (scripts/golden.py writes it)", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(*goldenPath, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	var g goldenFile
	if err := json.NewDecoder(r).Decode(&g); err != nil {
		t.Fatalf("%s: %v", *goldenPath, err)
	}
	return &g
}

func qwen3(t testing.TB) *Tokenizer {
	t.Helper()
	tok, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// firstDiff describes where two id lists part.
func firstDiff(tok *Tokenizer, got, want []int) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	show := func(ids []int) string {
		lo, hi := max(0, i-3), min(len(ids), i+4)
		s, _ := tok.Decode(ids[lo:hi])
		return fmt.Sprintf("%v %q", ids[lo:hi], s)
	}
	return fmt.Sprintf("len %d vs %d, first difference at %d: got %s, want %s", len(got), len(want), i, show(got), show(want))
}

func equalIDs(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// hasAddedToken reports whether s contains an added token's text, where
// HF normalizes the text around it piecewise rather than as a whole.
func hasAddedToken(tok *Tokenizer, s string) bool {
	for content := range tok.addedIDs {
		if strings.Contains(s, content) {
			return true
		}
	}
	return false
}

func TestGoldenEncode(t *testing.T) {
	g := readGolden(t)
	tok := qwen3(t)
	if len(g.Encode) < 300 {
		t.Errorf("only %d golden strings, want ≥ 300", len(g.Encode))
	}
	t.Logf("%d strings; HF versions %v", len(g.Encode), g.Versions)
	for _, c := range g.Encode {
		t.Run(c.Name, func(t *testing.T) {
			got := tok.Encode(c.Text)
			if !equalIDs(got, c.IDs) {
				t.Errorf("Encode(%.80q): %s", c.Text, firstDiff(tok, got, c.IDs))
			}
			text, err := tok.Decode(got)
			if err != nil {
				t.Fatal(err)
			}
			if text != c.Decoded {
				t.Errorf("Decode(Encode(%.80q)) = %.80q, HF decodes to %.80q", c.Text, text, c.Decoded)
			}
			if want := norm.NFC.String(c.Text); text != want && !hasAddedToken(tok, c.Text) {
				t.Errorf("Decode(Encode(%.80q)) = %.80q, want NFC(s) = %.80q", c.Text, text, want)
			}
		})
	}
}

func TestGoldenDecode(t *testing.T) {
	g := readGolden(t)
	tok := qwen3(t)
	if len(g.Decode) == 0 {
		t.Fatal("no decode cases")
	}
	for i, c := range g.Decode {
		got, err := tok.Decode(c.IDs)
		if err != nil {
			t.Errorf("case %d: Decode(%v): %v", i, c.IDs, err)
			continue
		}
		if got != c.Text {
			t.Errorf("case %d: Decode(%v) = %q, HF: %q", i, c.IDs, got, c.Text)
		}
		// Streaming gives the same text.
		d := tok.NewStreamDecoder()
		var b strings.Builder
		for _, id := range c.IDs {
			s, err := d.Next(id)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(s)
		}
		b.WriteString(d.Flush())
		if b.String() != c.Text {
			t.Errorf("case %d: streaming %v = %q, HF: %q", i, c.IDs, b.String(), c.Text)
		}
	}
}

func TestGoldenChat(t *testing.T) {
	g := readGolden(t)
	tok := qwen3(t)
	if len(g.Chat) == 0 {
		t.Fatal("no chat cases")
	}
	for _, c := range g.Chat {
		name := fmt.Sprintf("%s/gen=%v/think=%v", c.Name, c.AddGenerationPrompt, c.EnableThinking)
		t.Run(name, func(t *testing.T) {
			got, err := tok.ApplyChatTemplate(c.Messages, c.AddGenerationPrompt, c.EnableThinking)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.Text {
				t.Fatalf("ApplyChatTemplate:\n got %q\nwant %q", got, c.Text)
			}
			if ids := tok.Encode(got); !equalIDs(ids, c.IDs) {
				t.Errorf("Encode(template): %s", firstDiff(tok, ids, c.IDs))
			}
		})
	}
}

// idsDigest is scripts/golden.py's ids_digest: sha256 of "1,2,3".
func idsDigest(ids []int) string {
	h := sha256.New()
	buf := make([]byte, 0, 16)
	for i, id := range ids {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		h.Write(strconv.AppendInt(buf, int64(id), 10))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestGoldenCorpus(t *testing.T) {
	g := readGolden(t)
	if g.Corpus.IDsSHA256 == "" {
		t.Skip("golden file has no corpus digest")
	}
	tok := qwen3(t)
	corpus := readCorpus(t)
	if len(corpus) != g.Corpus.Bytes {
		t.Fatalf("corpus has %d bytes, golden %d: regenerate one or the other", len(corpus), g.Corpus.Bytes)
	}
	ids := tok.Encode(corpus)
	if len(ids) != g.Corpus.Tokens || idsDigest(ids) != g.Corpus.IDsSHA256 {
		t.Errorf("Encode(corpus): %d tokens (HF %d), digest %s (HF %s)", len(ids), g.Corpus.Tokens, idsDigest(ids), g.Corpus.IDsSHA256)
	}
}

// readCorpus returns testdata/corpus.txt.gz (scripts/make_corpus.py); it
// panics on error when t is nil.
func readCorpus(t testing.TB) string {
	data, err := func() ([]byte, error) {
		f, err := os.Open("testdata/corpus.txt.gz")
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	}()
	if err != nil {
		if t == nil {
			panic(err)
		}
		t.Fatal(err)
	}
	return string(data)
}

// withAddedTokens returns the Qwen3 tokenizer with extra entries appended to
// its added_tokens.
func withAddedTokens(t *testing.T, extra []map[string]any) *Tokenizer {
	t.Helper()
	data, err := Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]json.RawMessage
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var added []map[string]any
	if err := json.Unmarshal(file["added_tokens"], &added); err != nil {
		t.Fatal(err)
	}
	next := 151669
	for i, tok := range extra {
		tok["id"] = next + i
		added = append(added, tok)
	}
	if file["added_tokens"], err = json.Marshal(added); err != nil {
		t.Fatal(err)
	}
	if data, err = json.Marshal(file); err != nil {
		t.Fatal(err)
	}
	tok, err := FromJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestGoldenFlags covers the added-token flags that Qwen3's own tokens leave
// false: lstrip, rstrip, single_word, normalized.
func TestGoldenFlags(t *testing.T) {
	g := readGolden(t)
	if len(g.Flags.Cases) == 0 {
		t.Fatal("no flag cases")
	}
	tok := withAddedTokens(t, g.Flags.AddedTokens)
	for content, want := range g.Flags.IDs {
		id, ok := tok.TokenID(tok.normalize(content))
		if !ok {
			id, ok = tok.TokenID(content)
		}
		if !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; HF: %d", content, id, ok, want)
		}
	}
	for _, c := range g.Flags.Cases {
		if got := tok.Encode(c.Text); !equalIDs(got, c.IDs) {
			t.Errorf("Encode(%q): %s", c.Text, firstDiff(tok, got, c.IDs))
		}
	}
}
