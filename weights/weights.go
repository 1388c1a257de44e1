// Package weights ships the model webdraft serves when no --model is given,
// embedded in the binary.
//
// default/ holds a webdraft folder (config.json, model.safetensors). Until the
// trained demo pair lands it is the small random Qwen3 checkpoint of
// testdata/golden/tied (built by Hugging Face transformers), converted to int4
// with `webdraft convert` (see Taskfile.yml, task weights:default).
package weights

import (
	"embed"
	"io/fs"
)

// DefaultDir is the embedded default model's folder within Default's file system.
const DefaultDir = "default"

//go:embed default/config.json default/model.safetensors
var files embed.FS

// Default returns the file system holding the default model and its folder.
func Default() (fs.FS, string) { return files, DefaultDir }
