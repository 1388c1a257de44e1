package tokenizer

// The ByteLevel mapping of GPT-2 (and Qwen2/Qwen3): every byte is shown as a
// printable rune so that BPE vocabularies can be written as text. Printable
// Latin-1 bytes stand for themselves; the other 68 bytes (controls, space,
// DEL, NBSP, soft hyphen) map to U+0100 onwards in byte order, so the space
// 0x20 becomes 'Ġ' (U+0120) and '\n' becomes 'Ċ' (U+010A).
//
// HF: tokenizers/src/pre_tokenizers/byte_level.rs, bytes_char().

// byteToRune is the ByteLevel image of each byte.
var byteToRune = func() (m [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}()

// runeToByte inverts byteToRune; ok is false for runes that are no byte's
// image.
func runeToByte(r rune) (b byte, ok bool) {
	switch {
	case r < 256:
		b = byte(r)
	case r < 256+68:
		// The 68 remapped bytes in order: 0x00-0x20, 0x7F-0xA0, 0xAD.
		n := int(r - 256)
		switch {
		case n <= 0x20:
			b = byte(n)
		case n <= 0x20+34:
			b = byte(0x7F + n - 0x21)
		default:
			b = 0xAD
		}
	default:
		return 0, false
	}
	return b, byteToRune[b] == r
}

// byteLevelDecode turns one token's ByteLevel text back into raw bytes, the
// way HF's ByteLevel decoder does: a token all of whose runes are byte images
// yields those bytes; any other token yields its own UTF-8 text unchanged.
func byteLevelDecode(token string) []byte {
	out := make([]byte, 0, len(token))
	for _, r := range token {
		b, ok := runeToByte(r)
		if !ok {
			return []byte(token)
		}
		out = append(out, b)
	}
	return out
}
