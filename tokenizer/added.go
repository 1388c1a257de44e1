package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// AddedToken is one entry of tokenizer.json's added_tokens: a string matched
// in the text before normalization and BPE (<|im_start|>, <think>, …).
type AddedToken struct {
	ID         int    `json:"id"` // as HF assigns it on load (see assignAddedIDs)
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"` // match only between non-word runes
	LStrip     bool   `json:"lstrip"`      // the match takes the whitespace on its left
	RStrip     bool   `json:"rstrip"`      // … and on its right
	Normalized bool   `json:"normalized"`  // matched in the normalized text, not the raw text
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens leftmost-longest, as the Aho-Corasick
// automaton of HF's AddedVocabulary does (MatchKind::LeftmostLongest).
type addedMatcher struct {
	tokens []AddedToken  // content as matched (normalized tokens: normalized)
	first  [256][]uint16 // indices into tokens by first byte, longest first
	any    bool
}

func newAddedMatcher(tokens []AddedToken) *addedMatcher {
	m := &addedMatcher{tokens: tokens}
	for i, tok := range tokens {
		if tok.Content == "" {
			continue
		}
		b := tok.Content[0]
		m.first[b] = append(m.first[b], uint16(i))
		m.any = true
	}
	for b := range m.first {
		l := m.first[b]
		sort.SliceStable(l, func(i, j int) bool { return len(tokens[l[i]].Content) > len(tokens[l[j]].Content) })
	}
	return m
}

// find returns the leftmost-longest match at or after from.
func (m *addedMatcher) find(s string, from int) (start, end, tok int, ok bool) {
	for i := from; i < len(s); i++ {
		for _, k := range m.first[s[i]] {
			if c := m.tokens[k].Content; strings.HasPrefix(s[i:], c) {
				return i, i + len(c), int(k), true
			}
		}
	}
	return 0, 0, 0, false
}

// split cuts s into text segments and added tokens, calling text for each
// non-empty text segment and token for each token id, in order.
//
// HF: AddedVocabulary::find_matches, including its handling of single_word,
// lstrip and rstrip (the scan resumes after the token proper, not after the
// whitespace it strips).
func (m *addedMatcher) split(s string, text func(string), token func(int)) {
	if !m.any {
		if s != "" {
			text(s)
		}
		return
	}
	offset := 0 // end of what has been emitted
	for pos := 0; pos < len(s); {
		start, stop, k, ok := m.find(s, pos)
		if !ok {
			break
		}
		pos = stop
		tok := &m.tokens[k]
		if tok.SingleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), offset)
		}
		if tok.RStrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if start > offset {
			text(s[offset:start])
		}
		token(tok.ID)
		offset = stop
	}
	if offset < len(s) {
		text(s[offset:])
	}
}

// isWordRune is regex \w: letters, marks, decimal digits, connector
// punctuation.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || unicode.Is(unicode.Pc, r)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordRune(r)
}
