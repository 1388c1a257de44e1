// Package web is webdraft's live page: templ components that lay out
// speculative decoding as it happens — the text, each step's accepted and
// rejected draft tokens, τ, the histograms, the race against the target
// alone — and the script and style they need, embedded. The page talks to
// the server over one websocket (its protocol: web/README.md); package
// server does the HTTP wiring.
package web

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Static serves the page's script and style (mount it at /static/); the
// page links them with Version in the URL, so they may be cached for good.
func Static() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(fmt.Sprintf("web: the embedded static folder: %v", err)) // a build without it cannot happen: go:embed requires it
	}
	files := http.FileServer(http.FS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("v") == Version {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		}
		files.ServeHTTP(w, r)
	})
}

// Version is a digest of the static files, for cache busting.
var Version = func() string {
	h := sha256.New()
	err := fs.WalkDir(static, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	if err != nil {
		panic(fmt.Sprintf("web: reading the embedded static files: %v", err))
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}()

// PageData is what the page knows before its websocket opens.
type PageData struct {
	Drafter string `json:"drafter"`
	Target  string `json:"target"` // "" when the server has no target
	K       int    `json:"k"`      // the default draft length (a tree's depth)
	MaxK    int    `json:"max_k"`  // the longest draft a run may ask for
	// A token tree's shape: TopK children a node (1: a chain), DraftTokens
	// nodes verified a step; the defaults and the bounds.
	TopK           int  `json:"topk"`
	MaxTopK        int  `json:"max_topk"`
	DraftTokens    int  `json:"draft_tokens"`
	MaxDraftTokens int  `json:"max_draft_tokens"`
	MaxTokens      int  `json:"max_tokens"` // a run's longest output
	Auth           bool `json:"auth"`       // the websocket needs the API key
}
