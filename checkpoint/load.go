package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"webdraft/qwen3"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// Model is a loaded model folder. Its weights may alias mapped files: use
// them only until Close.
type Model struct {
	Dir       string
	Config    qwen3.Config
	Weights   *qwen3.Weights
	Converted bool  // a webdraft folder (false: an HF checkpoint quantized on load)
	Quant     Quant // how the weights are held in memory
	GroupSize int   // int4 group size
	// Tokenizer is the path of the folder's tokenizer.json within its file
	// system, or "" when it has none.
	Tokenizer string
	folder    *safetensors.Folder
	fsys      fs.FS // the folder's file system (os.DirFS for a folder on disk)
}

// TokenizerJSON returns the folder's tokenizer.json, or ok == false when it
// has none.
func (m *Model) TokenizerJSON() (data []byte, ok bool, err error) {
	if m.Tokenizer == "" {
		return nil, false, nil
	}
	data, err = fs.ReadFile(m.fsys, m.Tokenizer)
	return data, err == nil, err
}

// LoadOptions choose how an HF checkpoint is held once loaded; a webdraft
// folder keeps its own format.
type LoadOptions struct {
	Quant     Quant // default Int4
	GroupSize int   // default tensor.DefaultGroupSize
}

func (o *LoadOptions) defaults() {
	if o.Quant == "" {
		o.Quant = Int4
	}
	if o.GroupSize == 0 {
		o.GroupSize = tensor.DefaultGroupSize
	}
}

// Load reads a model folder on disk (memory-mapped): a webdraft folder as it
// is stored, or an HF checkpoint converted in memory per opts.
func Load(dir string, opts LoadOptions) (*Model, error) {
	cfg, err := qwen3.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	folder, err := safetensors.OpenFolder(dir)
	if err != nil {
		return nil, err
	}
	m := &Model{Dir: dir, Config: cfg, folder: folder, fsys: os.DirFS(dir)}
	if fileExists(filepath.Join(dir, "tokenizer.json")) {
		m.Tokenizer = "tokenizer.json"
	}
	return m.load(opts)
}

// LoadFS reads a model folder from fsys (an embedded model, or files a
// browser fetched).
func LoadFS(fsys fs.FS, dir string, opts LoadOptions) (*Model, error) {
	cfgPath := path.Join(dir, "config.json")
	data, err := fs.ReadFile(fsys, cfgPath)
	if err != nil {
		return nil, err
	}
	cfg, err := qwen3.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	folder, err := safetensors.OpenFolderFS(fsys, dir)
	if err != nil {
		return nil, err
	}
	m := &Model{Dir: dir, Config: cfg, folder: folder, fsys: fsys}
	if tok := path.Join(dir, "tokenizer.json"); fsExists(fsys, tok) {
		m.Tokenizer = tok
	}
	return m.load(opts)
}

func (m *Model) load(opts LoadOptions) (*Model, error) {
	opts.defaults()
	var err error
	folder := m.folder
	if folder.Metadata()[metaFormat] == formatName {
		err = m.loadConverted()
	} else {
		err = m.loadHF(opts)
	}
	if err != nil {
		folder.Close()
		return nil, err
	}
	return m, nil
}

// Close releases the mapped files.
func (m *Model) Close() error { return m.folder.Close() }

// loadHF converts each HF tensor into opts' format in memory.
func (m *Model) loadHF(opts LoadOptions) error {
	m.Quant, m.GroupSize = opts.Quant, opts.GroupSize
	w, slots := qwen3.NewWeights(&m.Config)
	if err := checkMatrixShapes(slots, m.Quant, m.GroupSize); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	for _, s := range slots {
		src, err := checkSource(m.folder, s.Name, s.Shape)
		if err != nil {
			return err
		}
		if s.Vector != nil {
			*s.Vector = make([]float32, s.Shape[0])
			sourceRow(src, 0, s.Shape[0], *s.Vector)
			continue
		}
		mat := newMatrix(m.Quant, s.Shape[0], s.Shape[1], m.GroupSize)
		if err := encodeRows(mat, src, 0); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", m.folder.FileOf(s.Name), s.Name, err)
		}
		*s.Matrix = mat
	}
	w.Tie(&m.Config)
	m.Weights = w
	return nil
}

// loadConverted points the weight tree at a webdraft folder's mapped tensors.
func (m *Model) loadConverted() error {
	q, g, err := parseMetadata(m.folder.Metadata())
	if err != nil {
		return fmt.Errorf("%s: %w", m.folder.FileOf(""), err)
	}
	m.Quant, m.GroupSize, m.Converted = q, g, true
	w, slots := qwen3.NewWeights(&m.Config)
	if err := checkMatrixShapes(slots, q, g); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	for _, s := range slots {
		if s.Vector != nil {
			t, err := m.tensor(s.Name, safetensors.F32, s.Shape)
			if err != nil {
				return err
			}
			*s.Vector = safetensors.Float32s(t.Data)
			continue
		}
		rows, cols := s.Shape[0], s.Shape[1]
		switch q {
		case Int4:
			qw, err := m.tensor(s.Name+qweightSuffix, safetensors.U32, []int{rows, cols / 8})
			if err != nil {
				return err
			}
			sc, err := m.tensor(s.Name+scalesSuffix, safetensors.F16, []int{rows, cols / g})
			if err != nil {
				return err
			}
			*s.Matrix = &tensor.Int4{Rows: rows, Cols: cols, GroupSize: g,
				QWeight: safetensors.Uint32s(qw.Data), Scales: safetensors.Uint16s(sc.Data)}
		case F16:
			t, err := m.tensor(s.Name, safetensors.F16, s.Shape)
			if err != nil {
				return err
			}
			*s.Matrix = &tensor.F16{Rows: rows, Cols: cols, Data: safetensors.Uint16s(t.Data)}
		case F32:
			t, err := m.tensor(s.Name, safetensors.F32, s.Shape)
			if err != nil {
				return err
			}
			*s.Matrix = &tensor.F32{Rows: rows, Cols: cols, Data: safetensors.Float32s(t.Data)}
		}
	}
	w.Tie(&m.Config)
	m.Weights = w
	return nil
}

// tensor fetches a stored tensor and checks its dtype and shape.
func (m *Model) tensor(name string, dt safetensors.DType, shape []int) (safetensors.Tensor, error) {
	t, ok := m.folder.Tensor(name)
	switch {
	case !ok:
		return t, fmt.Errorf("%s: tensor %s is missing", m.Dir, name)
	case t.DType != dt:
		return t, fmt.Errorf("%s: tensor %s has dtype %s, want %s", m.folder.FileOf(name), name, t.DType, dt)
	case !sameShape(t.Shape, shape):
		return t, fmt.Errorf("%s: tensor %s has shape %v, want %v", m.folder.FileOf(name), name, t.Shape, shape)
	}
	return t, nil
}

// checkMatrixShapes refuses int4 for matrices whose width is not a multiple
// of the group size, before any work is done.
func checkMatrixShapes(slots []qwen3.Slot, q Quant, groupSize int) error {
	if q != Int4 {
		return nil
	}
	for _, s := range slots {
		if s.Matrix != nil {
			if err := tensor.CheckInt4Shape(s.Shape[0], s.Shape[1], groupSize); err != nil {
				return fmt.Errorf("tensor %s: %w (convert with a --group-size that divides every matrix width, or --quant f16|f32)", s.Name, err)
			}
		}
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil || !errors.Is(err, fs.ErrNotExist)
}

func fsExists(fsys fs.FS, name string) bool {
	_, err := fs.Stat(fsys, name)
	return err == nil
}
