package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"time"

	"webdraft/wasm/dist"
)

// The browser's engine: the page can run the drafter and the target on the
// user's GPU. The server then only serves files — the engine's build
// (/wasm/, package dist) and the models (/models/) — and the page keeps
// the models in its Cache Storage under their content hashes.

// ModelFiles is where a served model's folder lies, for the browser: Dir
// within FS, a folder `webdraft convert` wrote (config.json, one
// model.safetensors, maybe tokenizer.json). A model sharing another's
// embedding names it by a path relative to Dir, so both lie in one FS.
type ModelFiles struct {
	FS  fs.FS
	Dir string
}

// modelFile is one file of the manifest.
type modelFile struct {
	Path   string `json:"path"` // within the browser's file system: DIR/NAME
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// modelManifest is GET /models/index.json: the files of the drafter and
// the target (each folder at its Dir) and, where the server drafts with
// an EAGLE-3 head, the head's (the page runs it over the target in its
// in-browser mode, and over the features the server sends in edge
// drafting), with their sizes and content
// hashes, which name the files in the browser's cache.
type modelManifest struct {
	Drafter string      `json:"drafter"` // its folder among Files
	Target  string      `json:"target"`
	Head    string      `json:"head,omitempty"`
	Files   []modelFile `json:"files"`
	// Program and Loader are the engine's build, "" when this binary has
	// none (the page then runs on the server only).
	Program string `json:"program"`
	Loader  string `json:"loader"`
}

// browserFiles is what the browser's engine is served: the manifest and
// the files by path.
type browserFiles struct {
	manifest []byte
	files    map[string]ModelFiles // path -> its folder (path's first element is the folder)
	reason   string                // why the browser cannot run the pair, or ""
	// headReason is why the page's in-browser mode drafts with the
	// drafter though the server has a head, or "".
	headReason string
}

// newBrowserFiles hashes the pair's files once (tens of milliseconds for
// the embedded pair), and head's where it is set (an EAGLE-3 head's
// folder: config.json and one model.safetensors). A pair without files,
// whose folders collide or are of another shape gets a reason instead,
// which the manifest carries; so does a head of another shape, or whose
// folder's name is the drafter's or the target's, in headUnavailable (the
// page then drafts with the drafter).
func newBrowserFiles(drafter, target, head *ModelFiles) (*browserFiles, error) {
	b := &browserFiles{files: map[string]ModelFiles{}}
	m := modelManifest{Files: []modelFile{}}
	if dist.Built() {
		m.Program, m.Loader = "/wasm/"+dist.Program+"?v="+hashOf(dist.FS(), dist.Program), "/wasm/"+dist.Loader
	}
	switch {
	case drafter == nil || target == nil:
		b.reason = "the server has no files of the pair to send (it serves the page with a drafter and a target loaded from folders)"
	case path.Base(drafter.Dir) == path.Base(target.Dir):
		b.reason = "the drafter's and the target's folders have the same name"
	}
	if b.reason == "" {
		m.Drafter, m.Target = path.Base(drafter.Dir), path.Base(target.Dir)
		for _, mf := range []*ModelFiles{drafter, target} {
			if b.reason != "" {
				break
			}
			for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
				p := path.Join(mf.Dir, name)
				f, err := hashFile(mf.FS, p)
				if err != nil {
					if name == "tokenizer.json" && isNotExist(err) {
						continue
					}
					// A folder of another shape (shards, say): the page runs on
					// the server only.
					b.reason = fmt.Sprintf("the browser takes folders `webdraft convert` wrote, with one model.safetensors: %v", err)
					m.Files, b.files = []modelFile{}, map[string]ModelFiles{}
					break
				}
				f.Path = path.Join(path.Base(mf.Dir), name)
				m.Files = append(m.Files, f)
				b.files[f.Path] = *mf
			}
		}
	}
	if b.reason == "" && head != nil {
		m.Head, m.Files, b.headReason = b.addHead(head, m.Drafter, m.Target, m.Files)
	}
	var err error
	if b.manifest, err = json.Marshal(struct {
		modelManifest
		Unavailable     string `json:"unavailable,omitempty"`
		HeadUnavailable string `json:"headUnavailable,omitempty"`
	}{m, b.reason, b.headReason}); err != nil {
		return nil, err
	}
	return b, nil
}

// addHead adds an EAGLE-3 head's files to the manifest's files: it
// returns the head's folder among them and the files, or "", the files as
// they were and why the head is left out.
func (b *browserFiles) addHead(head *ModelFiles, drafter, target string, files []modelFile) (string, []modelFile, string) {
	dir := path.Base(head.Dir)
	switch dir {
	case drafter:
		return "", files, fmt.Sprintf("the EAGLE-3 head's folder has the drafter's name (%s)", dir)
	case target:
		return "", files, fmt.Sprintf("the EAGLE-3 head's folder has the target's name (%s)", dir)
	}
	var add []modelFile
	for _, name := range []string{"config.json", "model.safetensors"} {
		f, err := hashFile(head.FS, path.Join(head.Dir, name))
		if err != nil {
			return "", files, fmt.Sprintf("the browser takes an EAGLE-3 head's folder with one model.safetensors: %v", err)
		}
		f.Path = path.Join(dir, name)
		add = append(add, f)
	}
	for _, f := range add {
		b.files[f.Path] = *head
	}
	return dir, append(files, add...), ""
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// hashFile sizes and hashes a file of fsys.
func hashFile(fsys fs.FS, p string) (modelFile, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return modelFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return modelFile{}, fmt.Errorf("%s: %w", p, err)
	}
	return modelFile{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// hashOf is a short content hash of a file of fsys ("" when unreadable),
// for cache busting.
func hashOf(fsys fs.FS, name string) string {
	f, err := hashFile(fsys, name)
	if err != nil {
		return ""
	}
	return f.SHA256[:12]
}

// modelsIndex serves GET /models/index.json.
func (s *Server) modelsIndex(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		s.fail(w, s.unavailable())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(st.browser.manifest) // a failed write is the client's going
}

// modelFileHandler serves GET /models/{dir}/{name}: a file of the
// manifest, cacheable for good (the page asks for it by its hash).
func (s *Server) modelFileHandler(w http.ResponseWriter, r *http.Request) {
	st := s.ready.Load()
	if st == nil {
		s.fail(w, s.unavailable())
		return
	}
	p := r.PathValue("dir") + "/" + r.PathValue("name")
	mf, ok := st.browser.files[p]
	if !ok {
		s.fail(w, &apiError{http.StatusNotFound, "not_found", "no such model file: " + quote(p)})
		return
	}
	f, err := mf.FS.Open(path.Join(mf.Dir, r.PathValue("name")))
	if err != nil {
		s.fail(w, &apiError{http.StatusInternalServerError, "internal", "reading " + p + ": " + err.Error()})
		return
	}
	defer f.Close()
	content, ok := f.(io.ReadSeeker) // embedded and on-disk files are: served as they are read
	if !ok {
		data, err := io.ReadAll(f)
		if err != nil {
			s.fail(w, &apiError{http.StatusInternalServerError, "internal", "reading " + p + ": " + err.Error()})
			return
		}
		content = bytes.NewReader(data)
	}
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, path.Base(p), time.Time{}, content)
}

// wasmFiles serves GET /wasm/…: the browser engine's build (mount it
// under StripPrefix).
func (s *Server) wasmFiles() http.Handler {
	files := http.FileServer(http.FS(dist.FS()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains([]string{"/" + dist.Program, "/" + dist.Loader}, r.URL.Path) || !dist.Built() {
			s.fail(w, &apiError{http.StatusNotFound, "not_found", "no such file of the browser engine (a binary built with `go tool task build` carries it)"})
			return
		}
		if r.URL.Query().Get("v") != "" {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		}
		files.ServeHTTP(w, r)
	})
}
