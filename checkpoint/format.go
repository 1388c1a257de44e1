// Package checkpoint reads Qwen3 model folders — Hugging Face checkpoints as
// published, and the folders webdraft convert writes — into a qwen3.Weights
// tree, and converts the first into the second (docs/reference.md, "Model folders" and "The int4 scheme").
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"webdraft/safetensors"
)

// Quant is how a folder stores its weight matrices.
type Quant string

const (
	Int4 Quant = "int4" // the §2 scheme: NAME.qweight (U32) and NAME.scales (F16)
	F16  Quant = "f16"  // NAME as F16
	F32  Quant = "f32"  // NAME as F32
)

// ParseQuant validates a --quant value.
func ParseQuant(s string) (Quant, error) {
	switch q := Quant(s); q {
	case Int4, F16, F32:
		return q, nil
	}
	return "", fmt.Errorf("unknown quant %q (want int4, f16 or f32)", s)
}

// Metadata keys of a webdraft model.safetensors, and their values.
const (
	metaFormat    = "format"
	metaVersion   = "format_version"
	metaQuant     = "quant"
	metaGroupSize = "group_size"

	// A model that uses another folder's embedding (a drafter sharing its
	// target's, say): that folder's path relative to this one, and the
	// sha256 of the embedding's stored bytes (embeddingHash).
	metaSharedEmbedding     = "shared_embedding"
	metaSharedEmbeddingHash = "shared_embedding_sha256"

	formatName    = "webdraft"
	formatVersion = 1
)

// SharedEmbeddingDir is the folder, relative to a webdraft folder and
// slash-separated, whose embedding the model of this safetensors metadata
// uses; "" when it has its own.
func SharedEmbeddingDir(meta map[string]string) string { return meta[metaSharedEmbedding] }

// embedName is the checkpoint name of the token embedding.
const embedName = "model.embed_tokens.weight"

// embeddingHash is the hex sha256 of the stored bytes of a webdraft
// folder's embedding: for int4 its qweight, then its scales.
func embeddingHash(f *safetensors.Folder, q Quant) (string, error) {
	names := []string{embedName}
	if q == Int4 {
		names = []string{embedName + qweightSuffix, embedName + scalesSuffix}
	}
	h := sha256.New()
	for _, n := range names {
		t, ok := f.Tensor(n)
		if !ok {
			return "", fmt.Errorf("%s: tensor %s is missing", f.Dir, n)
		}
		h.Write(t.Data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Suffixes of the two tensors an int4 matrix NAME is stored as.
const (
	qweightSuffix = ".qweight"
	scalesSuffix  = ".scales"
)

func metadata(q Quant, groupSize int) map[string]string {
	m := map[string]string{
		metaFormat:  formatName,
		metaVersion: strconv.Itoa(formatVersion),
		metaQuant:   string(q),
	}
	if q == Int4 {
		m[metaGroupSize] = strconv.Itoa(groupSize)
	}
	return m
}

// parseMetadata reads the format fields of a webdraft folder.
func parseMetadata(m map[string]string) (q Quant, groupSize int, err error) {
	v, err := strconv.Atoi(m[metaVersion])
	if err != nil || v != formatVersion {
		return "", 0, fmt.Errorf("webdraft format version %q is not supported (this build reads version %d; reconvert with this webdraft)", m[metaVersion], formatVersion)
	}
	q, err = ParseQuant(m[metaQuant])
	if err != nil {
		return "", 0, err
	}
	if q == Int4 {
		groupSize, err = strconv.Atoi(m[metaGroupSize])
		if err != nil || groupSize <= 0 || groupSize%8 != 0 {
			return "", 0, fmt.Errorf("bad int4 group_size %q", m[metaGroupSize])
		}
	}
	return q, groupSize, nil
}
