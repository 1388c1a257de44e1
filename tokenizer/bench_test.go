package tokenizer

import (
	"strings"
	"sync"
	"testing"
)

// The benchmarks print MB/s of input text (b.SetBytes) and tokens/op.
//
//	go test ./tokenizer -run '^$' -bench . -benchtime 20x
//
// Corpus: testdata/corpus.txt.gz (1.09 MB of Go/HTML/C/JS/Python code,
// English, French, CJK and a dozen other scripts; scripts/make_corpus.py).

var benchCorpus = sync.OnceValue(func() string { return readCorpus(nil) })

// BenchmarkEncodeCorpus: one Encode of the whole corpus, warm piece cache
// (the steady state of a long-running server).
func BenchmarkEncodeCorpus(b *testing.B) {
	tok := qwen3(b)
	text := benchCorpus()
	ids := tok.Encode(text) // warm the cache
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
	b.ReportMetric(float64(len(ids)), "tokens/op")
}

// BenchmarkEncodeCorpusCold: the same with the piece cache emptied before
// every run (every distinct piece is merged once per run).
func BenchmarkEncodeCorpusCold(b *testing.B) {
	tok := qwen3(b)
	text := benchCorpus()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		b.StopTimer()
		tok.model.cache.reset()
		b.StartTimer()
		tok.Encode(text)
	}
}

// BenchmarkEncodeLines: one Encode per line of the corpus, warm cache.
func BenchmarkEncodeLines(b *testing.B) {
	tok := qwen3(b)
	text := benchCorpus()
	lines := strings.SplitAfter(text, "\n")
	tok.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		for _, l := range lines {
			tok.Encode(l)
		}
	}
}

// BenchmarkEncodeParallel: Encode of the corpus lines from GOMAXPROCS
// goroutines sharing one Tokenizer (and its cache).
func BenchmarkEncodeParallel(b *testing.B) {
	tok := qwen3(b)
	text := benchCorpus()
	lines := strings.SplitAfter(text, "\n")
	tok.Encode(text)
	b.SetBytes(int64(len(text)) / int64(len(lines)))
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tok.Encode(lines[i%len(lines)])
			i++
		}
	})
}

// BenchmarkEncodeDegenerate: 1 MB of one repeated rune: one piece of a
// million bytes each (space, letter) or a million pieces (digit). These must
// stay linear-ish (no quadratic path).
func BenchmarkEncodeDegenerate(b *testing.B) {
	tok := qwen3(b)
	for _, c := range []struct{ name, unit string }{
		{"spaces", " "}, {"letter", "a"}, {"newlines", "\n"}, {"digit", "7"}, {"han", "中"},
	} {
		text := strings.Repeat(c.unit, 1<<20/len(c.unit))
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tok.Encode(text)
			}
		})
	}
}

// BenchmarkPretokenize compares the hand-written scanner with the same
// regex run by github.com/dlclark/regexp2 (backtracking, with lookahead).
func BenchmarkPretokenize(b *testing.B) {
	tok := qwen3(b)
	text := benchCorpus()
	b.Run("scanner", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			for i := 0; i < len(text); {
				i = tok.scan.nextPiece(text, i)
			}
		}
	})
	b.Run("regexp2", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			regexp2Split(text)
		}
	})
}

// BenchmarkEncodeCorpusRegexp2: the whole Encode with regexp2 doing the
// pre-tokenization instead of the scanner, warm cache.
func BenchmarkEncodeCorpusRegexp2(b *testing.B) {
	tok := qwen3(b)
	text := tok.normalize(benchCorpus())
	tok.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		var ids []int
		for _, p := range regexp2Split(text) {
			ids = tok.model.encodePiece(p, ids)
		}
	}
}

// BenchmarkDecode: Decode of the corpus's ids.
func BenchmarkDecode(b *testing.B) {
	tok := qwen3(b)
	text := benchCorpus()
	ids := tok.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := tok.Decode(ids); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoad: gunzip and parse the embedded tokenizer.json (what
// Default() costs once per process).
func BenchmarkLoad(b *testing.B) {
	for b.Loop() {
		data, err := Qwen3JSON()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := FromJSON(data); err != nil {
			b.Fatal(err)
		}
	}
}
