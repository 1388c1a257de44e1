// Package dist holds the browser build of webdraft, embedded in the
// binary: files/drafter.wasm (the Go program of package wasm, compiled
// with GOOS=js GOARCH=wasm) and files/wasm_exec.js (the Go toolchain's
// loader for it, which must come from the toolchain that built the
// program). `go tool task wasm` writes both; they are not committed (git
// ignores them), so a binary built without that task serves the page
// without its in-browser engine, and Built says so.
package dist

import (
	"embed"
	"io/fs"
)

//go:embed files
var files embed.FS

// The files of the build within FS.
const (
	Program = "drafter.wasm"
	Loader  = "wasm_exec.js"
)

// FS is the build's file system: Program and Loader when built.
func FS() fs.FS {
	sub, err := fs.Sub(files, "files")
	if err != nil {
		panic(err) // unreachable: go:embed requires the folder
	}
	return sub
}

// Built reports whether this binary carries the browser build.
func Built() bool {
	for _, name := range []string{Program, Loader} {
		if _, err := fs.Stat(FS(), name); err != nil {
			return false
		}
	}
	return true
}
