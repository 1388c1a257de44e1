// Package weights ships webdraft's default models, embedded in the binary:
// a small Qwen3 target, the int4 drafter distilled from it and an EAGLE-3
// head trained for it, with the real Qwen3 tokenizer and its full
// 151,936-token vocabulary, made by the recipe in weights/train on the
// data of DATA_MANIFEST.md.
//
//	drafter/  the standalone drafter: what `webdraft draft` and serve's
//	          /draft run when no --model is given (a webdraft int4 folder
//	          that uses target/'s embedding, and a head over the 32,768
//	          most used tokens)
//	target/   its target, for the speculative demo and `webdraft bench spec`
//	eagle3/   an EAGLE-3 draft head for target/ (one layer over the
//	          target's hidden states at layers 2, 8 and 15, int4): what
//	          `webdraft serve` and `generate` draft with when given
//	          neither --model nor --target, the drafter then serving /draft
//
// A binary built with the tag webdraft_noembed carries none of them (for
// machines that get the folders some other way); Embedded then says so.
package weights

import "io/fs"

// The folders of the pair within FS.
const (
	DrafterDir = "drafter"
	TargetDir  = "target"
	HeadDir    = "eagle3"
)

// FS is the file system holding the embedded models.
func FS() fs.FS { return files }

// Embedded reports whether this binary carries the models.
func Embedded() bool { return embedded }
