package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

func TestEmbeddedSHA256(t *testing.T) {
	data, err := Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != Qwen3SHA256 {
		t.Errorf("embedded tokenizer.json: sha256 %s, want %s", got, Qwen3SHA256)
	}
	if len(qwen3JSONGz) > 3<<20 {
		t.Errorf("qwen3/tokenizer.json.gz is %d bytes, keep it ≤ 3 MiB", len(qwen3JSONGz))
	}
}

func TestDefault(t *testing.T) {
	a, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Default()
	if a != b {
		t.Error("Default() parsed twice")
	}
	if got := a.VocabSize(); got != 151669 {
		t.Errorf("VocabSize() = %d, want 151669", got)
	}
	for content, want := range map[string]int{"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667, "</think>": 151668} {
		if id, ok := a.TokenID(content); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", content, id, ok, want)
		}
	}
	if !a.IsSpecial(151645) || a.IsSpecial(151667) || a.IsSpecial(9707) || a.IsSpecial(-1) {
		t.Error("IsSpecial: <|im_end|> is special; <think>, ordinary tokens and -1 are not")
	}
}

func TestForModel(t *testing.T) {
	def := qwen3(t)
	if tok, err := ForModel("qwen3", nil, 151936); err != nil || tok != def {
		t.Errorf("ForModel(no tokenizer.json, Qwen3's vocabulary) = %p, %v; want Default()", tok, err)
	}
	_, err := ForModel("tiny", nil, 1024)
	if !errors.Is(err, ErrNoTokenizer) || !strings.HasPrefix(err.Error(), "tiny: no tokenizer: it has no tokenizer.json") {
		t.Errorf("ForModel(no tokenizer.json, 1,024 tokens): %v; want ErrNoTokenizer naming the folder", err)
	}
	data, err := Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ForModel("own", data, 1024) // the folder's own file, whatever its size
	if err != nil {
		t.Fatal(err)
	}
	if tok == def || !reflect.DeepEqual(tok.Encode("Hello, world!"), []int{9707, 11, 1879, 0}) {
		t.Error("ForModel(folder with tokenizer.json) did not load its own file")
	}
	if _, err := ForModel("bad", []byte("{"), 151936); err == nil || !strings.Contains(err.Error(), filepath.Join("bad", "tokenizer.json")) {
		t.Errorf("ForModel(bad tokenizer.json): %v; want an error naming the file", err)
	}
}

func TestEncodeExamples(t *testing.T) {
	tok := qwen3(t)
	for _, tc := range []struct {
		in   string
		want []int
	}{
		{"", []int{}},
		{"Hello, world!", []int{9707, 11, 1879, 0}},
		{"<|im_start|>user\nhi<|im_end|>", []int{151644, 872, 198, 6023, 151645}},
		{"<think>\n\n</think>\n\n", []int{151667, 271, 151668, 271}},
	} {
		if got := tok.Encode(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestByteLevelMapping(t *testing.T) {
	seen := map[rune]bool{}
	for b := 0; b < 256; b++ {
		r := byteToRune[b]
		if seen[r] {
			t.Fatalf("byte %#x: rune %U used twice", b, r)
		}
		seen[r] = true
		if got, ok := runeToByte(r); !ok || got != byte(b) {
			t.Errorf("runeToByte(%U) = %#x, %v; want %#x", r, got, ok, b)
		}
	}
	if byteToRune[' '] != 'Ġ' || byteToRune['\n'] != 'Ċ' || byteToRune['a'] != 'a' {
		t.Error("ByteLevel: want ' '→Ġ, '\\n'→Ċ, 'a'→a")
	}
	for _, r := range []rune{' ', '\n', 0xAD, 0x144, 0x4E2D} {
		if _, ok := runeToByte(r); ok {
			t.Errorf("runeToByte(%U) should fail", r)
		}
	}
	raw := []byte("héllo \x00\xff")
	if got := byteLevelDecode(byteLevelEncode(raw)); string(got) != string(raw) {
		t.Errorf("ByteLevel round trip %q → %q", raw, got)
	}
}

func TestDecodeErrors(t *testing.T) {
	tok := qwen3(t)
	for _, ids := range [][]int{{-1}, {151669}, {9707, 1 << 40}} {
		if s, err := tok.Decode(ids); err == nil {
			t.Errorf("Decode(%v) = %q, want an error", ids, s)
		}
	}
	d := tok.NewStreamDecoder()
	if _, err := d.Next(200000); err == nil {
		t.Error("StreamDecoder.Next(200000): no error")
	}
	if s, err := tok.Decode(nil); err != nil || s != "" {
		t.Errorf("Decode(nil) = %q, %v", s, err)
	}
}

func TestLossyUTF8(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"abc", "abc"},
		{"\xe4\xb8", "\ufffd"},                 // truncated 3-byte sequence: one U+FFFD
		{"\xe4\xb8x", "\ufffdx"},               // … followed by ASCII
		{"\xf0\x9f\x98", "\ufffd"},             // truncated 4-byte sequence
		{"\x80\x80", "\ufffd\ufffd"},           // lone continuation bytes: one each
		{"\xc0\xaf", "\ufffd\ufffd"},           // overlong lead byte
		{"\xed\xa0\x80", "\ufffd\ufffd\ufffd"}, // surrogate
		{"\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd"},
		{"\xe4\xb8\xad\xe4", "中\ufffd"},
		{"\ufffd", "\ufffd"},
	} {
		if got := lossyUTF8([]byte(tc.in)); got != tc.want {
			t.Errorf("lossyUTF8(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// streamDecode decodes ids token by token and checks each piece is valid
// UTF-8.
func streamDecode(t testing.TB, tok *Tokenizer, ids []int) string {
	d := tok.NewStreamDecoder()
	var b strings.Builder
	for _, id := range ids {
		s, err := d.Next(id)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.ValidString(s) {
			t.Fatalf("Next(%d) = %q: invalid UTF-8", id, s)
		}
		b.WriteString(s)
	}
	b.WriteString(d.Flush())
	return b.String()
}

func TestStreamDecoder(t *testing.T) {
	tok := qwen3(t)
	// 中 is E4 B8 AD; byte tokens for E4, B8, AD arrive one at a time.
	e4, b8, ad := 160, 116, 255
	for _, id := range []int{e4, b8, ad} {
		if s, _ := tok.Decode([]int{id}); s != "\ufffd" {
			t.Fatalf("test assumes id %d is a lone continuation/lead byte, decodes to %q", id, s)
		}
	}
	d := tok.NewStreamDecoder()
	for i, want := range []string{"", "", "中"} {
		if got, err := d.Next([]int{e4, b8, ad}[i]); err != nil || got != want {
			t.Errorf("Next #%d = %q, %v; want %q", i, got, err, want)
		}
	}
	// An unfinished sequence is flushed as U+FFFD, then the decoder is empty.
	d.Next(e4)
	if got := d.Flush(); got != "\ufffd" {
		t.Errorf("Flush() = %q, want U+FFFD", got)
	}
	if got := d.Flush(); got != "" {
		t.Errorf("second Flush() = %q", got)
	}
	// A byte that cannot continue the pending sequence releases it at once.
	d.Next(e4)
	if got, _ := d.Next(9707); got != "\ufffdHello" {
		t.Errorf("Next after broken sequence = %q, want \"\\ufffdHello\"", got)
	}
	// Every token boundary of real text.
	for _, s := range []string{"Grüße 中文 👨‍👩‍👧‍👦 \U0010fffd", readCorpus(t)[:20000]} {
		ids := tok.Encode(s)
		if got := streamDecode(t, tok, ids); got != s {
			t.Errorf("stream decode of %.40q… differs", s)
		}
	}
	// Random byte tokens: stream and whole decode agree.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		ids := make([]int, rng.IntN(8)+1)
		for i := range ids {
			ids[i] = int(tok.model.byteID[rng.IntN(256)])
		}
		want, _ := tok.Decode(ids)
		if got := streamDecode(t, tok, ids); got != want {
			t.Fatalf("ids %v: stream %q, Decode %q", ids, got, want)
		}
	}
}

// The heap merge (long pieces) and the scan merge (short ones) agree.
func TestMergeStrategiesAgree(t *testing.T) {
	tok := qwen3(t)
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "b", "e", "t", "h", " ", "Ġ", "中", "\n", "0", "ab", "the", "in"}
	for range 3000 {
		var b strings.Builder
		for n := rng.IntN(20); n >= 0; n-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		piece := b.String()
		if len(piece) > smallPiece {
			piece = piece[:smallPiece]
		}
		var buf [smallPiece]int32
		small := tok.model.mergeSmall(piece, buf[:0])
		large := tok.model.mergeHeap(piece)
		if !reflect.DeepEqual(small, large) && !(len(small) == 0 && len(large) == 0) {
			t.Fatalf("piece %q: scan merge %v, heap merge %v", piece, small, large)
		}
	}
}

func TestConcurrentEncode(t *testing.T) {
	data, err := Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromJSON(data) // a fresh cache
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(readCorpus(t), "\n")[:4000]
	want := make([][]int, len(lines))
	ref := qwen3(t)
	for i, l := range lines {
		want[i] = ref.Encode(l)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range lines {
				j := (i*7 + w*131) % len(lines)
				if got := tok.Encode(lines[j]); !reflect.DeepEqual(got, want[j]) {
					t.Errorf("worker %d: Encode(%q) = %v, want %v", w, lines[j], got, want[j])
					return
				}
			}
		})
	}
	wg.Wait()
}

// The cache holds at most cacheSlots pieces however many it sees, and a
// full cache gives the same results.
func TestCacheBounded(t *testing.T) {
	data, err := Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	ref := qwen3(t)
	var b strings.Builder
	for i := range 3 * cacheSlots {
		b.WriteString(" w")
		b.WriteString(strings.Repeat(string(rune('a'+i%26)), 1+i%5))
		b.WriteString(string(rune('a' + i/26%26)))
		b.WriteString(string(rune('a' + i/676%26)))
		b.WriteString(string(rune('a' + i/17576%26)))
	}
	text := b.String()
	got := tok.Encode(text)
	n := 0
	for i := range tok.model.cache.slots {
		if tok.model.cache.slots[i].Load() != nil {
			n++
		}
	}
	if n > cacheSlots {
		t.Errorf("cache holds %d entries, bound %d", n, cacheSlots)
	}
	if want := ref.Encode(text); !reflect.DeepEqual(got, want) {
		t.Error("results differ with a full cache")
	}
}

func TestFromJSONErrors(t *testing.T) {
	data, err := Qwen3JSON()
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]json.RawMessage
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	patch := func(key, value string) []byte {
		f := make(map[string]json.RawMessage, len(file))
		for k, v := range file {
			f[k] = v
		}
		f[key] = json.RawMessage(value)
		out, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"not JSON", []byte("{"), "unexpected end of JSON input"},
		{"model type", patch("model", `{"type": "Unigram", "vocab": []}`), `model.type "Unigram" is not supported`},
		{"normalizer", patch("normalizer", `{"type": "Lowercase"}`), `normalizer type "Lowercase" is not supported`},
		{"pre-tokenizer", patch("pre_tokenizer", `{"type": "Whitespace"}`), "pre_tokenizer: only the Qwen2"},
		{"split regex", patch("pre_tokenizer", `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}`), "only the Qwen2 split regex"},
		{"decoder", patch("decoder", `{"type": "WordPiece"}`), "decoder: only ByteLevel"},
		{"dropout", patch("model", `{"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []}`), "dropout"},
		{"merge out of vocab", patch("model", `{"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}`), `model.merges[0] = "a b": token not in model.vocab`},
		{"bad merge line", patch("model", `{"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}`), "want two tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromJSON(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("FromJSON: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

// Legacy "a b" merges and the current [a, b] pairs parse alike.
func TestParseMerges(t *testing.T) {
	a, err := parseMerges(json.RawMessage(`["Ġ t", "i n", "Ġt he"]`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseMerges(json.RawMessage(`[["Ġ", "t"], ["i", "n"], ["Ġt", "he"]]`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) || len(a) != 3 {
		t.Errorf("legacy %q, pairs %q", a, b)
	}
}

// A tokenizer with no added tokens and no normalizer, from a tiny JSON.
func TestTinyTokenizer(t *testing.T) {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["ab"], vocab["abc"], vocab["Ġab"] = 256, 257, 258
	file := map[string]any{
		"normalizer":    nil,
		"pre_tokenizer": json.RawMessage(`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ` + jsonString(qwen2Pattern) + `}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}`),
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a b", "ab c", "Ġ ab"}},
	}
	data, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	got := tok.Encode("abc ab abd")
	// "abc" | " ab" | " abd": abc→257; Ġab→258; Ġab + d → 258, 'd'.
	if want := []int{257, 258, 258, 'd'}; !reflect.DeepEqual(got, want) {
		t.Errorf("Encode = %v, want %v", got, want)
	}
	if s, _ := tok.Decode(got); s != "abc ab abd" {
		t.Errorf("Decode = %q", s)
	}
	if tok.VocabSize() != 259 {
		t.Errorf("VocabSize = %d, want 259", tok.VocabSize())
	}
}

// byteLevelEncode is the ByteLevel text of raw bytes.
func byteLevelEncode(raw []byte) string {
	out := make([]rune, 0, len(raw))
	for _, b := range raw {
		out = append(out, byteToRune[b])
	}
	return string(out)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestTokenBytes: a token's bytes, even a piece of a UTF-8 sequence, and
// their concatenation is the text.
func TestTokenBytes(t *testing.T) {
	tok := qwen3(t)
	ids := tok.Encode("中文 and ascii")
	var all []byte
	for _, id := range ids {
		b, err := tok.TokenBytes(id)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if string(all) != "中文 and ascii" {
		t.Errorf("bytes of %v: %q", ids, all)
	}
	if b, _ := tok.TokenBytes(160); len(b) != 1 || b[0] != 0xe4 {
		t.Errorf("the byte token 160: %x, want e4", b)
	}
	if _, err := tok.TokenBytes(-1); err == nil {
		t.Error("TokenBytes(-1): no error")
	}
}

// TestSameVocabulary: a tokenizer and a copy agree; one with a token
// changed does not, and says which id.
func TestSameVocabulary(t *testing.T) {
	a := qwen3(t)
	b, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := a.SameVocabulary(b); !ok {
		t.Errorf("the default tokenizer twice: %s", why)
	}
	c := *b
	c.idBytes = slices.Clone(b.idBytes)
	c.idBytes[42] = "changed"
	if ok, why := a.SameVocabulary(&c); ok || !strings.Contains(why, "id 42") {
		t.Errorf("a changed token: %v, %q", ok, why)
	}
}
