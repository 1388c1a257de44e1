package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// Decode returns the text of ids, special tokens included. Byte sequences
// that are not valid UTF-8 become U+FFFD, one per maximal invalid subpart
// (as Rust's String::from_utf8_lossy, which HF's ByteLevel decoder uses). An
// id outside the vocabulary is an error.
func (t *Tokenizer) Decode(ids []int) (string, error) {
	n := 0
	for _, id := range ids {
		if !t.valid(id) {
			return "", t.idError(id)
		}
		n += len(t.idBytes[id])
	}
	buf := make([]byte, 0, n)
	for _, id := range ids {
		buf = append(buf, t.idBytes[id]...)
	}
	return lossyUTF8(buf), nil
}

// TokenBytes returns the bytes one token stands for (a piece of a UTF-8
// sequence, perhaps: OpenAI's logprobs report them as they are).
func (t *Tokenizer) TokenBytes(id int) ([]byte, error) {
	if !t.valid(id) {
		return nil, t.idError(id)
	}
	return []byte(t.idBytes[id]), nil
}

func (t *Tokenizer) valid(id int) bool { return id >= 0 && id < len(t.known) && t.known[id] }

func (t *Tokenizer) idError(id int) error {
	return fmt.Errorf("token id %d is outside the vocabulary (0…%d)", id, len(t.known)-1)
}

// StreamDecoder decodes ids one at a time, holding back the bytes of a UTF-8
// sequence that the next tokens may complete. The concatenation of what Next
// returns, followed by Flush, equals Decode of all the ids.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte // an incomplete UTF-8 sequence (at most 3 bytes)
}

// NewStreamDecoder returns a decoder with nothing pending.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// Next adds one id and returns the text that became complete, possibly "".
// An id outside the vocabulary is an error and changes nothing.
func (d *StreamDecoder) Next(id int) (string, error) {
	if !d.t.valid(id) {
		return "", d.t.idError(id)
	}
	d.pending = append(d.pending, d.t.idBytes[id]...)
	cut := len(d.pending) - incompleteTail(d.pending)
	if cut == 0 {
		return "", nil
	}
	out := lossyUTF8(d.pending[:cut])
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out, nil
}

// Flush returns what is held back (U+FFFD for an unfinished sequence) and
// resets the decoder.
func (d *StreamDecoder) Flush() string {
	out := lossyUTF8(d.pending)
	d.pending = d.pending[:0]
	return out
}

// seqLen is the length of the UTF-8 sequence a lead byte starts, and the
// range its second byte must fall in; n == 0 marks bytes that start no
// sequence (continuation bytes, C0, C1, F5…FF).
func seqLen(b byte) (n int, lo, hi byte) {
	switch {
	case b < 0x80:
		return 1, 0, 0
	case 0xC2 <= b && b <= 0xDF:
		return 2, 0x80, 0xBF
	case b == 0xE0:
		return 3, 0xA0, 0xBF
	case b == 0xED:
		return 3, 0x80, 0x9F // no surrogates
	case 0xE1 <= b && b <= 0xEF:
		return 3, 0x80, 0xBF
	case b == 0xF0:
		return 4, 0x90, 0xBF
	case 0xF1 <= b && b <= 0xF3:
		return 4, 0x80, 0xBF
	case b == 0xF4:
		return 4, 0x80, 0x8F // ≤ U+10FFFF
	}
	return 0, 0, 0
}

// validPrefix returns how many bytes at the start of p continue the sequence
// p[0] starts (1 ≤ k ≤ its length), and that length.
func validPrefix(p []byte) (k, n int) {
	n, lo, hi := seqLen(p[0])
	if n <= 1 {
		return 1, n
	}
	k = 1
	for k < n && k < len(p) {
		c := p[k]
		if k == 1 && (c < lo || c > hi) || k > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
		k++
	}
	return k, n
}

// incompleteTail is the length of the unfinished but so far valid UTF-8
// sequence at the end of p, or 0.
func incompleteTail(p []byte) int {
	for k := 1; k <= 3 && k <= len(p); k++ {
		b := p[len(p)-k]
		if b >= 0x80 && b < 0xC0 {
			continue // a continuation byte: look further back
		}
		got, n := validPrefix(p[len(p)-k:])
		if n > k && got == k {
			return k
		}
		return 0
	}
	return 0
}

// lossyUTF8 converts p to a string, replacing each maximal invalid subpart
// with U+FFFD.
func lossyUTF8(p []byte) string {
	if utf8.Valid(p) {
		return string(p)
	}
	out := make([]byte, 0, len(p)+8)
	for i := 0; i < len(p); {
		if p[i] < utf8.RuneSelf {
			out = append(out, p[i])
			i++
			continue
		}
		k, n := validPrefix(p[i:])
		if k == n {
			out = append(out, p[i:i+k]...)
		} else {
			out = append(out, "\uFFFD"...)
		}
		i += k
	}
	return string(out)
}
