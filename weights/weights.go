// Package weights ships webdraft's default model pair, embedded in the
// binary: a small Qwen3 target and the int4 drafter distilled from it, both
// with the real Qwen3 tokenizer and its full 151,936-token vocabulary,
// trained by the recipe in weights/train on the data of DATA_MANIFEST.md.
//
//	drafter/  the drafter `webdraft serve` and `webdraft draft` run when no
//	          --model is given (a webdraft int4 folder that uses target/'s
//	          embedding, and a head over the 32,768 most used tokens)
//	target/   its target, for the speculative demo and `webdraft bench spec`
//
// A binary built with the tag webdraft_noembed carries neither (for
// machines that get the folders some other way); Embedded then says so.
package weights

import "io/fs"

// The folders of the pair within FS.
const (
	DrafterDir = "drafter"
	TargetDir  = "target"
)

// FS is the file system holding the embedded pair.
func FS() fs.FS { return files }

// Embedded reports whether this binary carries the pair.
func Embedded() bool { return embedded }
