package tokenizer

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzEncode checks, for any input: no panic; the pre-tokenizer's pieces
// tile the text and equal regexp2's where that engine is exact; every id is
// in the vocabulary; decoding round-trips to NFC(s) (valid UTF-8 without added
// tokens) and streaming decode equals Decode. Bounded run for CI:
//
//	go test ./tokenizer -run '^$' -fuzz FuzzEncode -fuzztime 20s
//
// A plain `go test` runs the seed corpus (the golden strings).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{
		"", "Hello, world!", "it'S 'll'ſ", "  \n\n \t x", "a\u00a0\u00a0b", "<|im_end|>\u0338",
		"<|im_start|>user\nhi<|im_end|>", "\xff\xfe invalid", "\xe4\xb8", "中文 👨‍👩‍👧", strings.Repeat(" ", 100),
		strings.Repeat("ab", 60), "x\U0002ebf0y \U00010940",
	} {
		f.Add(s)
	}
	g := readGolden(f)
	for _, c := range g.Encode {
		if len(c.Text) < 2000 {
			f.Add(c.Text)
		}
	}
	tok := qwen3(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		for _, id := range ids {
			if !tok.valid(id) {
				t.Fatalf("Encode(%q): id %d outside the vocabulary", s, id)
			}
		}
		text, err := tok.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.ValidString(text) {
			t.Fatalf("Decode(Encode(%q)) = %q: invalid UTF-8", s, text)
		}
		if got := streamDecode(t, tok, ids); got != text {
			t.Fatalf("stream decode %q, Decode %q", got, text)
		}
		if !utf8.ValidString(s) {
			return
		}
		if !hasAddedToken(tok, s) {
			if want := norm.NFC.String(s); text != want {
				t.Fatalf("Decode(Encode(%q)) = %q, want NFC %q", s, text, want)
			}
		}
		n := tok.normalize(s)
		checkTiling(t, tok, n)
		if n != "" && regexp2Comparable(n) {
			if got, want := tok.pieces(n), regexp2Split(n); !reflect.DeepEqual(got, want) {
				t.Fatalf("pieces(%q) = %q, regexp2 %q", n, got, want)
			}
		}
		for _, p := range tok.pieces(n) {
			if len(p) > smallPiece {
				continue
			}
			var buf [smallPiece]int32
			if a, b := tok.model.mergeSmall(p, buf[:0]), tok.model.mergeHeap(p); !reflect.DeepEqual(a, b) && len(a)+len(b) > 0 {
				t.Fatalf("piece %q: scan merge %v, heap merge %v", p, a, b)
			}
		}
	})
}
