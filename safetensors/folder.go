package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// Folder is the weights of a Hugging Face checkpoint folder: one
// model.safetensors, or shards listed by model.safetensors.index.json.
type Folder struct {
	Dir   string
	files []*File
	index map[string]*File // tensor name -> the file holding it
}

// SingleFile and IndexFile are the names Hugging Face writes.
const (
	SingleFile = "model.safetensors"
	IndexFile  = "model.safetensors.index.json"
)

// OpenFolder opens the weights of a checkpoint folder on disk, memory-mapped,
// preferring the shard index when there is one.
func OpenFolder(dir string) (*Folder, error) {
	return openFolder(dir, os.ReadFile, Open)
}

// ReadOnlyFS is a file system that can hand out a file's bytes without a
// copy, read-only (an embedded model's weights): OpenFolderFS reads it so,
// and the tensors then alias those bytes.
type ReadOnlyFS interface {
	fs.FS
	ReadFileReadOnly(name string) ([]byte, error)
}

// OpenFolderFS opens the weights of a checkpoint folder in fsys (an embedded
// model, or files fetched by a browser), reading each file whole (in place
// from a ReadOnlyFS).
func OpenFolderFS(fsys fs.FS, dir string) (*Folder, error) {
	read := func(name string) ([]byte, error) {
		if r, ok := fsys.(ReadOnlyFS); ok {
			return r.ReadFileReadOnly(filepath.ToSlash(name))
		}
		return fs.ReadFile(fsys, filepath.ToSlash(name))
	}
	open := func(name string) (*File, error) {
		data, err := read(name)
		if err != nil {
			return nil, err
		}
		return Parse(name, data)
	}
	return openFolder(dir, read, open)
}

func openFolder(dir string, read func(string) ([]byte, error), open func(string) (*File, error)) (*Folder, error) {
	idxPath := filepath.Join(dir, IndexFile)
	idxData, err := read(idxPath)
	switch {
	case err == nil:
		return openSharded(dir, idxPath, idxData, open)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	f, err := open(filepath.Join(dir, SingleFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: no %s or %s", dir, SingleFile, IndexFile)
		}
		return nil, err
	}
	folder := &Folder{Dir: dir, files: []*File{f}, index: map[string]*File{}}
	for name := range f.tensors {
		folder.index[name] = f
	}
	return folder, nil
}

func openSharded(dir, idxPath string, idxData []byte, open func(string) (*File, error)) (*Folder, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(idxData, &idx); err != nil {
		return nil, fmt.Errorf("%s: bad index: %w", idxPath, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: empty weight_map", idxPath)
	}
	folder := &Folder{Dir: dir, index: map[string]*File{}}
	byShard := map[string]*File{}
	shards := make([]string, 0)
	for _, shard := range idx.WeightMap {
		if _, ok := byShard[shard]; !ok {
			byShard[shard] = nil
			shards = append(shards, shard)
		}
	}
	sort.Strings(shards)
	for _, shard := range shards {
		if filepath.Base(shard) != shard {
			folder.Close()
			return nil, fmt.Errorf("%s: shard name %q is not a plain file name", idxPath, shard)
		}
		f, err := open(filepath.Join(dir, shard))
		if err != nil {
			folder.Close()
			return nil, fmt.Errorf("shard of %s: %w", idxPath, err)
		}
		byShard[shard] = f
		folder.files = append(folder.files, f)
	}
	for name, shard := range idx.WeightMap {
		f := byShard[shard]
		if _, ok := f.tensors[name]; !ok {
			folder.Close()
			return nil, fmt.Errorf("%s: tensor %s is listed in %s but %s does not hold it", dir, name, IndexFile, shard)
		}
		folder.index[name] = f
	}
	return folder, nil
}

// Tensor returns the named tensor, or false.
func (f *Folder) Tensor(name string) (Tensor, bool) {
	file, ok := f.index[name]
	if !ok {
		return Tensor{}, false
	}
	return file.Tensor(name)
}

// FileOf names the file holding a tensor (for error messages).
func (f *Folder) FileOf(name string) string {
	if file, ok := f.index[name]; ok {
		return file.Path
	}
	return f.Dir
}

// Names lists every tensor in name order.
func (f *Folder) Names() []string {
	names := make([]string, 0, len(f.index))
	for n := range f.index {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Metadata returns the first file's metadata (shards of one checkpoint share it).
func (f *Folder) Metadata() map[string]string {
	if len(f.files) == 0 {
		return nil
	}
	return f.files[0].Metadata
}

// Close unmaps every file.
func (f *Folder) Close() error {
	var errs []error
	for _, file := range f.files {
		if file != nil {
			errs = append(errs, file.Close())
		}
	}
	return errors.Join(errs...)
}
