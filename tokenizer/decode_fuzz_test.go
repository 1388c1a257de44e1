package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// fuzzIDs reads token ids from data: a byte ≥ 0x80 is the token of that
// byte alone (byteIDs: so that UTF-8 sequences come split and broken, byte
// by byte as the fuzzer mutates them); a byte < 0x80 and the two after it
// are an id spread over the vocabulary, with a few past either end of it.
func fuzzIDs(data []byte, vocab int, byteIDs *[256]int) []int {
	ids := make([]int, 0, len(data))
	for i := 0; i < len(data); {
		if c := data[i]; c >= 0x80 || i+3 > len(data) {
			ids = append(ids, byteIDs[c])
			i++
			continue
		}
		v := int(data[i]) | int(data[i+1])<<7 | int(data[i+2])<<15
		ids = append(ids, v%(vocab+16)-8)
		i += 3
	}
	return ids
}

// byteTokens maps each byte to the token that stands for it alone.
func byteTokens(t testing.TB, tok *Tokenizer) *[256]int {
	var ids [256]int
	found := 0
	for id := range tok.VocabSize() {
		if b, err := tok.TokenBytes(id); err == nil && len(b) == 1 && !tok.IsSpecial(id) {
			ids[b[0]] = id
			found++
		}
	}
	if found != 256 {
		t.Fatalf("%d byte tokens, want 256", found)
	}
	return &ids
}

// FuzzDecode decodes arbitrary id sequences — byte tokens that split UTF-8
// sequences, special tokens, ids outside the vocabulary — where FuzzEncode
// only decodes what Encode made. Decode must never panic, and:
//   - it fails exactly when an id is outside the vocabulary;
//   - otherwise its text is the tokens' bytes (TokenBytes, concatenated)
//     with each maximal invalid UTF-8 subpart replaced by one U+FFFD, as
//     Rust's String::from_utf8_lossy does (checked against lossyOracle, an
//     independent implementation), the stream decoder's pieces add up to
//     it, and encoding it decodes back to its NFC form (no added token's
//     text in it).
//
// Seeds: testdata/fuzz/FuzzDecode and the ids of a few strings. Bounded run
// (Taskfile's fuzz task):
//
//	go test ./tokenizer -run '^$' -fuzz '^FuzzDecode$' -fuzztime 10s
func FuzzDecode(f *testing.F) {
	tok := qwen3(f)
	vocab := tok.VocabSize()
	byteIDs := byteTokens(f, tok)
	toBytes := func(ids []int) []byte { // fuzzIDs' inverse
		var b []byte
		for _, id := range ids {
			v := id + 8
			b = append(b, byte(v&0x7f), byte(v>>7), byte(v>>15))
		}
		return b
	}
	for _, s := range []string{"Hello, world!", "中文 👨‍👩‍👧", "<|im_start|>user\nhi<|im_end|>", "e\u0301 한국어"} {
		f.Add(toBytes(tok.Encode(s)))
	}
	f.Add([]byte{0xe4, 0xb8, 0xf4, 0x90, 0x80, 0x80, 0xed, 0xa0, 0x80, 0xc0, 0xaf}) // a cut 中, past U+10FFFF, a surrogate, overlong
	f.Add(toBytes([]int{-1, vocab}))
	f.Fuzz(func(t *testing.T, data []byte) {
		ids := fuzzIDs(data[:min(len(data), 8192)], vocab, byteIDs)
		text, err := tok.Decode(ids)
		var raw []byte
		for _, id := range ids {
			b, berr := tok.TokenBytes(id)
			if berr != nil {
				if err == nil {
					t.Fatalf("Decode(%v) accepted id %d, TokenBytes refuses it: %v", ids, id, berr)
				}
				return
			}
			raw = append(raw, b...)
		}
		if err != nil {
			t.Fatalf("Decode(%v) of valid ids: %v", ids, err)
		}
		if want := lossyOracle(raw); text != want {
			t.Fatalf("Decode(%v) = %q, want %q (bytes %q)", ids, text, want, raw)
		}
		if got := streamDecode(t, tok, ids); got != text {
			t.Fatalf("stream decode of %v = %q, Decode %q", ids, got, text)
		}
		if hasAddedToken(tok, text) {
			return
		}
		again, err := tok.Decode(tok.Encode(text))
		if err != nil {
			t.Fatal(err)
		}
		if want := norm.NFC.String(text); again != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want NFC %q", text, again, want)
		}
	})
}

// lossyOracle is String::from_utf8_lossy by the definition: each valid
// UTF-8 sequence as it is, and for each maximal subpart — the longest
// prefix of p[i:] that some continuation bytes would make a valid
// sequence, or one byte — one U+FFFD. It tries the completions rather
// than knowing UTF-8's byte ranges, unlike lossyUTF8.
func lossyOracle(p []byte) string {
	var b strings.Builder
	for i := 0; i < len(p); {
		if r, n := utf8.DecodeRune(p[i:]); r != utf8.RuneError || n > 1 {
			b.Write(p[i : i+n])
			i += n
			continue
		}
		k := 1
		for try := min(3, len(p)-i); try > 1; try-- {
			if completes(p[i : i+try]) {
				k = try
				break
			}
		}
		b.WriteRune(utf8.RuneError)
		i += k
	}
	return b.String()
}

// completes reports whether prefix, followed by some continuation bytes,
// is one valid UTF-8 sequence longer than prefix.
func completes(prefix []byte) bool {
	edges := []byte{0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf} // every range UTF-8 uses starts or ends at one
	var try func(seq []byte) bool
	try = func(seq []byte) bool {
		if r, n := utf8.DecodeRune(seq); (r != utf8.RuneError || n > 1) && n == len(seq) && n > len(prefix) {
			return true
		}
		if len(seq) == utf8.UTFMax {
			return false
		}
		for _, c := range edges {
			if try(append(seq[:len(seq):len(seq)], c)) {
				return true
			}
		}
		return false
	}
	return try(prefix)
}
