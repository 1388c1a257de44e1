//go:build !webdraft_noembed

package weights

import (
	"embed"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"
	"unsafe"
)

//go:embed drafter/config.json target/config.json eagle3/config.json
var configs embed.FS

// The weights themselves, as strings: in the binary's read-only data,
// which inPlace hands out without a copy.
var (
	//go:embed drafter/model.safetensors
	drafterWeights string
	//go:embed target/model.safetensors
	targetWeights string
	//go:embed eagle3/model.safetensors
	headWeights string
)

var files fs.FS = inPlace{configs, map[string]string{
	DrafterDir + "/model.safetensors": drafterWeights,
	TargetDir + "/model.safetensors":  targetWeights,
	HeadDir + "/model.safetensors":    headWeights,
}}

const embedded = true

// inPlace is the embedded folders: the configs' embed.FS, and the weight
// files, which ReadFileReadOnly hands out as the binary's own bytes
// rather than a copy (safetensors.OpenFolderFS asks for that) — a model
// loaded from them (tensors alias their file) then costs no memory of its
// own, and two models sharing a file (the drafter uses the target's
// embedding) share it. Those bytes are read-only: writing to them faults.
type inPlace struct {
	embed.FS
	data map[string]string
}

func (f inPlace) Open(name string) (fs.File, error) {
	if s, ok := f.data[name]; ok {
		return &dataFile{strings.NewReader(s), dataInfo{path.Base(name), int64(len(s))}}, nil
	}
	file, err := f.FS.Open(name)
	if err != nil {
		return nil, err
	}
	if d, ok := file.(fs.ReadDirFile); ok {
		return &dirFile{ReadDirFile: d, fsys: f, name: name}, nil
	}
	return file, nil
}

// ReadFile returns a copy, as fs.ReadFileFS promises.
func (f inPlace) ReadFile(name string) ([]byte, error) {
	if s, ok := f.data[name]; ok {
		return []byte(s), nil
	}
	return f.FS.ReadFile(name)
}

// ReadFileReadOnly returns a weight file's bytes in place (read-only), and
// a copy of any other file.
func (f inPlace) ReadFileReadOnly(name string) ([]byte, error) {
	if s, ok := f.data[name]; ok {
		return unsafe.Slice(unsafe.StringData(s), len(s)), nil
	}
	return f.FS.ReadFile(name)
}

func (f inPlace) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := f.FS.ReadDir(name)
	if err != nil {
		return nil, err
	}
	for p, s := range f.data {
		if path.Dir(p) == name {
			entries = append(entries, fs.FileInfoToDirEntry(dataInfo{path.Base(p), int64(len(s))}))
		}
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, nil
}

// dirFile is an open folder, listing the weight files in it too.
type dirFile struct {
	fs.ReadDirFile
	fsys    inPlace
	name    string
	entries []fs.DirEntry // what ReadDir has yet to return; nil: not listed yet
}

func (d *dirFile) ReadDir(n int) ([]fs.DirEntry, error) {
	if d.entries == nil {
		all, err := d.fsys.ReadDir(d.name)
		if err != nil {
			return nil, err
		}
		d.entries = all
	}
	if n <= 0 {
		rest := d.entries
		d.entries = d.entries[len(d.entries):]
		return rest, nil
	}
	if len(d.entries) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(d.entries))
	out := d.entries[:n]
	d.entries = d.entries[n:]
	return out, nil
}

// dataFile is an open weight file: a ReadSeeker, as http.ServeContent
// wants.
type dataFile struct {
	*strings.Reader
	info dataInfo
}

func (d *dataFile) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *dataFile) Close() error               { return nil }

type dataInfo struct {
	name string
	size int64
}

func (i dataInfo) Name() string       { return i.name }
func (i dataInfo) Size() int64        { return i.size }
func (i dataInfo) Mode() fs.FileMode  { return 0o444 }
func (i dataInfo) ModTime() time.Time { return time.Time{} }
func (i dataInfo) IsDir() bool        { return false }
func (i dataInfo) Sys() any           { return nil }
