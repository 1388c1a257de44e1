package tokenizer

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"fmt"
	"sync"
)

// qwen3JSONGz is Qwen3's tokenizer.json, gzip-compressed (qwen3/NOTICE.md
// says where it comes from and under which license).
//
//go:embed qwen3/tokenizer.json.gz
var qwen3JSONGz []byte

// Qwen3SHA256 is the sha256 of the embedded tokenizer.json, decompressed.
const Qwen3SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

// Qwen3JSON returns the embedded Qwen3 tokenizer.json.
func Qwen3JSON() ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(qwen3JSONGz))
	if err != nil {
		return nil, fmt.Errorf("embedded qwen3/tokenizer.json.gz: %w", err)
	}
	// The gzip trailer's last 4 bytes hold the size (mod 2^32) of the data.
	size := int64(binary.LittleEndian.Uint32(qwen3JSONGz[len(qwen3JSONGz)-4:]))
	var buf bytes.Buffer
	buf.Grow(int(size) + 1)
	if _, err := buf.ReadFrom(zr); err != nil {
		return nil, fmt.Errorf("embedded qwen3/tokenizer.json.gz: %w", err)
	}
	return buf.Bytes(), nil
}

var defaultTokenizer = sync.OnceValues(func() (*Tokenizer, error) {
	data, err := Qwen3JSON()
	if err != nil {
		return nil, err
	}
	t, err := FromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("embedded qwen3/tokenizer.json: %w", err)
	}
	return t, nil
})

// Default returns the embedded Qwen3 tokenizer, parsed on first use and
// shared afterwards.
func Default() (*Tokenizer, error) { return defaultTokenizer() }
