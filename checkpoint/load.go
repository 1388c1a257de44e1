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
	// SharedEmbedding is the folder whose model.embed_tokens.weight this
	// model uses (its path relative to Dir, slash-separated), or "" when
	// the model holds its own.
	SharedEmbedding string
	folder          *safetensors.Folder
	shared          *safetensors.Folder // SharedEmbedding's tensors, open while the model is
	fsys            fs.FS               // the folder's file system (os.DirFS for a folder on disk)
	// sibling opens the model folder at a slash-separated path relative to
	// Dir in the same file system.
	sibling func(rel string) (*safetensors.Folder, error)
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

// LoadOptions choose how an HF checkpoint (or an EAGLE-3 head in the public
// layout) is held once loaded; a webdraft folder keeps its own format.
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
	m.sibling = func(rel string) (*safetensors.Folder, error) {
		return safetensors.OpenFolder(filepath.Join(dir, filepath.FromSlash(rel)))
	}
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
	m.sibling = func(rel string) (*safetensors.Folder, error) {
		p := path.Join(dir, rel)
		if !fs.ValidPath(p) {
			return nil, fmt.Errorf("%s is outside the file system", p)
		}
		return safetensors.OpenFolderFS(fsys, p)
	}
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
		m.Close()
		return nil, err
	}
	return m, nil
}

// Close releases the mapped files.
func (m *Model) Close() error {
	err := m.folder.Close()
	if m.shared != nil {
		err = errors.Join(err, m.shared.Close())
	}
	return err
}

// loadHF converts each HF tensor into opts' format in memory.
func (m *Model) loadHF(opts LoadOptions) error {
	m.Quant, m.GroupSize = opts.Quant, opts.GroupSize
	w, err := emptyWeights(m.folder, &m.Config, 0)
	if err != nil {
		return err
	}
	slots := w.Slots(&m.Config)
	if err := checkMatrixShapes(slots, m.Quant, m.GroupSize); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	if err := fillSlots(m.folder, slots, m.Quant, m.GroupSize); err != nil {
		return err
	}
	if err := w.Tie(&m.Config); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	m.Weights = w
	return nil
}

// fillSlots fills each slot from the folder's BF16, F16 or F32 tensor of
// its name and shape: vectors as f32, matrices in format q.
func fillSlots(folder *safetensors.Folder, slots []qwen3.Slot, q Quant, groupSize int) error {
	for _, s := range slots {
		src, err := checkSource(folder, s.Name, s.Shape)
		if err != nil {
			return err
		}
		if s.Vector != nil {
			*s.Vector = make([]float32, s.Shape[0])
			sourceRow(src, 0, s.Shape[0], *s.Vector)
			continue
		}
		mat := newMatrix(q, s.Shape[0], s.Shape[1], groupSize)
		if err := encodeRows(mat, src, 0); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", folder.FileOf(s.Name), s.Name, err)
		}
		*s.Matrix = mat
	}
	return nil
}

// loadConverted points the weight tree at a webdraft folder's mapped tensors.
func (m *Model) loadConverted() error {
	q, g, err := parseMetadata(m.folder.Metadata())
	if err != nil {
		return fmt.Errorf("%s: %w", m.folder.FileOf(""), err)
	}
	m.Quant, m.GroupSize, m.Converted = q, g, true
	w, err := emptyWeights(m.folder, &m.Config, 0)
	if err != nil {
		return err
	}
	slots := w.Slots(&m.Config)
	if err := checkMatrixShapes(slots, q, g); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	sq, sg, err := m.openSharedEmbedding()
	if err != nil {
		return err
	}
	for _, s := range slots {
		if s.Name == embedName && m.shared != nil {
			// In that folder's format, which must fit the embedding's shape.
			if err := checkMatrixShapes([]qwen3.Slot{s}, sq, sg); err != nil {
				return fmt.Errorf("%s: the embedding shared with %s: %w", m.Dir, m.SharedEmbedding, err)
			}
			err = loadSlot(m.shared, s, sq, sg)
		} else {
			err = loadSlot(m.folder, s, q, g)
		}
		if err != nil {
			return err
		}
	}
	if err := w.Tie(&m.Config); err != nil {
		return fmt.Errorf("%s: %w", m.Dir, err)
	}
	m.Weights = w
	return nil
}

// loadSlot points slot s at its tensors in a webdraft folder, stored as q
// (group g): the slot then aliases the folder's mapped bytes.
func loadSlot(from *safetensors.Folder, s qwen3.Slot, q Quant, g int) error {
	if s.Vector != nil {
		t, err := storedTensor(from, s.Name, safetensors.F32, s.Shape)
		if err != nil {
			return err
		}
		*s.Vector = safetensors.Float32s(t.Data)
		return nil
	}
	rows, cols := s.Shape[0], s.Shape[1]
	switch q {
	case Int4:
		qw, err := storedTensor(from, s.Name+qweightSuffix, safetensors.U32, []int{rows, cols / 8})
		if err != nil {
			return err
		}
		sc, err := storedTensor(from, s.Name+scalesSuffix, safetensors.F16, []int{rows, cols / g})
		if err != nil {
			return err
		}
		*s.Matrix = &tensor.Int4{Rows: rows, Cols: cols, GroupSize: g,
			QWeight: safetensors.Uint32s(qw.Data), Scales: safetensors.Uint16s(sc.Data)}
	case F16:
		t, err := storedTensor(from, s.Name, safetensors.F16, s.Shape)
		if err != nil {
			return err
		}
		*s.Matrix = &tensor.F16{Rows: rows, Cols: cols, Data: safetensors.Uint16s(t.Data)}
	case F32:
		t, err := storedTensor(from, s.Name, safetensors.F32, s.Shape)
		if err != nil {
			return err
		}
		*s.Matrix = &tensor.F32{Rows: rows, Cols: cols, Data: safetensors.Float32s(t.Data)}
	}
	return nil
}

// openSharedEmbedding opens the folder named by the shared_embedding
// metadata, when there is one, checks that it is a webdraft folder whose
// embedding has the recorded hash, and returns its format (which the
// embedding keeps: an int4 embedding may serve a model of f32 layers).
func (m *Model) openSharedEmbedding() (Quant, int, error) {
	meta := m.folder.Metadata()
	rel := meta[metaSharedEmbedding]
	if rel == "" {
		return "", 0, nil
	}
	where := fmt.Sprintf("%s: the embedding shared with %s", m.Dir, rel)
	shared, err := m.sibling(rel)
	if err != nil {
		return "", 0, fmt.Errorf("%s (a path from this folder: keep the two folders as they were converted, or convert again with --embedding-from): %w", where, err)
	}
	m.shared, m.SharedEmbedding = shared, rel
	q, g, err := parseMetadata(shared.Metadata())
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", where, err)
	}
	sum, err := embeddingHash(shared, q)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", where, err)
	}
	if want := meta[metaSharedEmbeddingHash]; sum != want {
		return "", 0, fmt.Errorf("%s: its embedding has sha256 %s, this model was made with %s (convert it again against that folder)", where, sum, want)
	}
	return q, g, nil
}

// storedTensor fetches a stored tensor of folder and checks its dtype and
// shape.
func storedTensor(folder *safetensors.Folder, name string, dt safetensors.DType, shape []int) (safetensors.Tensor, error) {
	t, ok := folder.Tensor(name)
	switch {
	case !ok:
		return t, fmt.Errorf("%s: tensor %s is missing", folder.Dir, name)
	case t.DType != dt:
		return t, fmt.Errorf("%s: tensor %s has dtype %s, want %s", folder.FileOf(name), name, t.DType, dt)
	case !sameShape(t.Shape, shape):
		return t, fmt.Errorf("%s: tensor %s has shape %v, want %v", folder.FileOf(name), name, t.Shape, shape)
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
