package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// qwen2Pattern is the pre-tokenizer split regex of Qwen2, Qwen2.5 and Qwen3
// (tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex), applied
// with behavior "Isolated": every match is one piece.
//
// Go's regexp has no lookahead for `\s+(?!\S)`, so splitQwen2 is a scanner
// written for this one pattern. It reproduces the leftmost-first backtracking
// semantics of Oniguruma, which HF tokenizers uses: see the alternatives'
// comments in nextPiece. It runs in time linear in the input.
const qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// Rune classes for the scanner. Each rune is exactly one of letter (\p{L}),
// number (\p{N}), space (\s: the Unicode White_Space property, as Oniguruma's
// \s) or other. CR and LF are spaces with the extra newline bit.
const (
	clsOther  uint8 = 0
	clsLetter uint8 = 1
	clsNumber uint8 = 2
	clsSpace  uint8 = 4
	clsNL     uint8 = 8 // '\r' or '\n'; always together with clsSpace
)

// classOf is the class of any rune, by Unicode 16.0 as Oniguruma has it
// (unicode16.go adds what Go's 15.0 tables lack).
func classOf(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clsSpace | clsNL
	case unicode.IsLetter(r) || unicode.Is(unicode16Letters, r):
		return clsLetter
	case unicode.IsNumber(r) || unicode.Is(unicode16Numbers, r):
		return clsNumber
	case unicode.IsSpace(r): // White_Space
		return clsSpace
	}
	return clsOther
}

// bmpClass holds classOf for the Basic Multilingual Plane (64 KiB), built on
// first use; runes above it use classOf directly.
var bmpClass = sync.OnceValue(func() *[1 << 16]uint8 {
	var t [1 << 16]uint8
	for r := range t {
		t[r] = classOf(rune(r))
	}
	return &t
})

// scanner walks a normalized string piece by piece.
type scanner struct {
	cls *[1 << 16]uint8
}

func newScanner() scanner { return scanner{cls: bmpClass()} }

// at decodes the rune at s[i] and returns its class and byte width.
func (sc scanner) at(s string, i int) (c rune, cls uint8, size int) {
	if b := s[i]; b < utf8.RuneSelf {
		return rune(b), sc.cls[b], 1
	}
	c, size = utf8.DecodeRuneInString(s[i:])
	if c < 1<<16 {
		return c, sc.cls[c], size
	}
	return c, classOf(c), size
}

// run returns the end of the longest run from i of runes whose class has any
// bit of mask (want true) or none of it (want false).
func (sc scanner) run(s string, i int, mask uint8, want bool) int {
	for i < len(s) {
		_, cls, size := sc.at(s, i)
		if (cls&mask != 0) != want {
			break
		}
		i += size
	}
	return i
}

// nextPiece returns the end of the piece that starts at s[i] (i < len(s)).
// Every rune is covered by some alternative, so pieces tile the string.
func (sc scanner) nextPiece(s string, i int) int {
	c, cls, size := sc.at(s, i)

	// (?i:'s|'t|'re|'ve|'m|'ll|'d) — case-insensitive by Unicode case
	// folding, so 'ſ' (U+017F, folds to 's') counts as 's'.
	if c == '\'' {
		if n := contraction(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}

	// [^\r\n\p{L}\p{N}]?\p{L}+ — letters, with at most one leading rune that
	// is neither a newline, a letter nor a number (a space, a tab, '(', …).
	if cls == clsLetter {
		return sc.run(s, i+size, clsLetter, true)
	}
	if cls&(clsNumber|clsNL) == 0 && i+size < len(s) {
		if _, next, _ := sc.at(s, i+size); next == clsLetter {
			return sc.run(s, i+size, clsLetter, true)
		}
	}

	// \p{N} — one number rune.
	if cls == clsNumber {
		return i + size
	}

	// ` ?[^\s\p{L}\p{N}]+[\r\n]*` — symbols, with at most one leading ASCII
	// space, then any newlines.
	j := i
	if c == ' ' {
		j++
	}
	if end := sc.run(s, j, clsLetter|clsNumber|clsSpace, false); end > j {
		return sc.run(s, end, clsNL, true)
	}

	// Here c is whitespace. Let run = the maximal whitespace run from i.
	end := sc.run(s, i, clsSpace, true)

	// \s*[\r\n]+ — the run up to and including its last newline.
	lastNL := -1
	last := i // start of the run's last rune
	for k := i; k < end; {
		_, cls, size := sc.at(s, k)
		if cls&clsNL != 0 {
			lastNL = k
		}
		last = k
		k += size
	}
	if lastNL >= 0 {
		return lastNL + 1
	}

	// \s+(?!\S) — the whole run at the end of the text, else the run less its
	// last rune (so that rune can lead the next word), if that leaves any.
	if end == len(s) {
		return end
	}
	if last > i {
		return last
	}

	// \s+ — a single whitespace rune before a non-space.
	return end
}

// contraction returns the byte length of the contraction suffix ("s", "t",
// "re", "ve", "m", "ll", "d", any case) at the start of s, or 0.
func contraction(s string) int {
	if len(s) == 0 {
		return 0
	}
	// b|0x20 lower-cases an ASCII letter, and equals a given lower-case
	// letter only for that letter and its upper case.
	second := func(want byte) int {
		if len(s) >= 2 && s[1]|0x20 == want {
			return 2
		}
		return 0
	}
	switch s[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		return second('e')
	case 'l':
		return second('l')
	}
	if len(s) >= 2 && s[0] == 0xC5 && s[1] == 0xBF { // U+017F LATIN SMALL LETTER LONG S
		return 2
	}
	return 0
}
