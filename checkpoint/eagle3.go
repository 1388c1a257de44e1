package checkpoint

import (
	"context"
	"encoding/binary"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"

	"webdraft/eagle3"
	"webdraft/qwen3"
	"webdraft/safetensors"
)

// Eagle3 is an EAGLE-3 head loaded from its folder: config.json and its
// tensors, either in the public layout (safetensors, BF16, F16 or F32, one
// file or sharded; held in memory as LoadOptions say) or as ConvertEagle3
// writes them (a webdraft folder, used as stored). A converted head's
// weights alias its mapped file: use them only until Close.
type Eagle3 struct {
	Dir       string
	Config    eagle3.Config
	Weights   *eagle3.Weights
	Converted bool                // a webdraft folder (false: the public layout, converted on load)
	Quant     Quant               // how the matrices are held in memory
	GroupSize int                 // int4 group size
	folder    *safetensors.Folder // a converted head's mapped tensors; nil once closed
}

// LoadEagle3 reads an EAGLE-3 head's folder. A folder in the public layout
// has its matrices converted per opts (int4 by default); a webdraft folder
// (ConvertEagle3's) keeps its own format whatever opts say, as Load does
// for a model folder: Quant and GroupSize report the format used. d2t is
// checked either way.
func LoadEagle3(dir string, opts LoadOptions) (*Eagle3, error) {
	cfg, err := eagle3.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	folder, err := safetensors.OpenFolder(dir)
	if err != nil {
		return nil, err
	}
	return loadEagle3(dir, cfg, folder, opts)
}

// LoadEagle3FS is LoadEagle3 of the folder dir of fsys (files a browser
// fetched).
func LoadEagle3FS(fsys fs.FS, dir string, opts LoadOptions) (*Eagle3, error) {
	cfgPath := path.Join(dir, "config.json")
	data, err := fs.ReadFile(fsys, cfgPath)
	if err != nil {
		return nil, err
	}
	cfg, err := eagle3.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	folder, err := safetensors.OpenFolderFS(fsys, dir)
	if err != nil {
		return nil, err
	}
	return loadEagle3(dir, cfg, folder, opts)
}

// loadEagle3 reads the head of cfg from its open folder, which it owns.
func loadEagle3(dir string, cfg eagle3.Config, folder *safetensors.Folder, opts LoadOptions) (*Eagle3, error) {
	opts.defaults()
	h := &Eagle3{Dir: dir, Config: cfg, Weights: &eagle3.Weights{}}
	var err error
	if folder.Metadata()[metaFormat] == formatName {
		h.folder = folder // the weights alias it until Close
		err = h.loadConverted()
	} else {
		defer folder.Close() // the weights are converted into memory
		err = h.loadPublic(folder, opts)
	}
	if err == nil {
		_, err = h.loadTargetIDs(folder)
	}
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Close releases a converted head's mapped file; its weights must not be
// used afterwards. A head read from the public layout holds no file.
func (h *Eagle3) Close() error {
	if h.folder == nil {
		return nil
	}
	err := h.folder.Close()
	h.folder = nil
	return err
}

// slots lists the head's tensors to fill (eagle3.Weights.Slots), with the
// optional embedding when folder has one (stored as NAME.qweight and
// NAME.scales when int4Stored, a converted int4 folder).
func (h *Eagle3) slots(folder *safetensors.Folder, int4Stored bool) []qwen3.Slot {
	c, w := &h.Config, h.Weights
	slots := w.Slots(c)
	embed := eagle3.EmbedName
	if int4Stored {
		embed += qweightSuffix
	}
	if folderHas(folder, embed) {
		slots = append(slots, qwen3.Slot{Name: eagle3.EmbedName, Shape: []int{c.VocabSize, c.HiddenSize}, Matrix: &w.EmbedTokens})
	}
	return slots
}

// loadPublic converts each tensor of the public layout into opts' format in
// memory.
func (h *Eagle3) loadPublic(folder *safetensors.Folder, opts LoadOptions) error {
	h.Quant, h.GroupSize = opts.Quant, opts.GroupSize
	slots := h.slots(folder, false)
	if err := checkMatrixShapes(slots, opts.Quant, opts.GroupSize); err != nil {
		return fmt.Errorf("%s: %w", h.Dir, err)
	}
	return fillSlots(folder, slots, opts.Quant, opts.GroupSize)
}

// loadConverted points the weight tree at a webdraft folder's mapped
// tensors, in the format its metadata names.
func (h *Eagle3) loadConverted() error {
	meta := h.folder.Metadata()
	q, g, err := parseMetadata(meta)
	if err != nil {
		return fmt.Errorf("%s: %w", h.folder.FileOf(""), err)
	}
	if rel := meta[metaSharedEmbedding]; rel != "" {
		return fmt.Errorf("%s: shared_embedding %s: an EAGLE-3 head holds its own embedding or takes its target's, never another folder's", h.folder.FileOf(""), rel)
	}
	h.Quant, h.GroupSize, h.Converted = q, g, true
	slots := h.slots(h.folder, q == Int4)
	if err := checkMatrixShapes(slots, q, g); err != nil {
		return fmt.Errorf("%s: %w", h.Dir, err)
	}
	for _, s := range slots {
		if err := loadSlot(h.folder, s, q, g); err != nil {
			return err
		}
	}
	return nil
}

// loadTargetIDs reads d2t, stored as I64 in either layout, checks it and
// sets the weights' TargetIDs; it returns d2t.
func (h *Eagle3) loadTargetIDs(folder *safetensors.Folder) ([]int64, error) {
	d2t, err := int64Vector(folder, eagle3.D2TName, h.Config.DraftVocabSize)
	if err != nil {
		return nil, err
	}
	if h.Weights.TargetIDs, err = eagle3.TargetIDsFrom(d2t, &h.Config); err != nil {
		return nil, fmt.Errorf("%s: %w", folder.FileOf(eagle3.D2TName), err)
	}
	return d2t, nil
}

// int64Vector reads a one-dimensional I64 tensor of n elements.
func int64Vector(folder *safetensors.Folder, name string, n int) ([]int64, error) {
	t, err := storedTensor(folder, name, safetensors.I64, []int{n})
	if err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return out, nil
}

// ConvertEagle3 writes the webdraft folder for the EAGLE-3 head in inDir
// (the public layout LoadEagle3 reads) to outDir: config.json copied, and
// one model.safetensors in the webdraft format — the matrices (and the
// optional embed_tokens.weight) as opts.Quant, the norm vectors F32, d2t
// I64 as it was; t2d, which webdraft does not use, is dropped. LoadEagle3
// of the output holds exactly what LoadEagle3 of the input does with the
// same Quant and GroupSize. Every tensor is checked before anything is
// written, and the weights are written under a temporary name, as Convert
// does. EmbeddingFrom and HeadTokens are refused: they are for Qwen3
// models.
func ConvertEagle3(ctx context.Context, inDir, outDir string, opts ConvertOptions) (ConvertStats, error) {
	var stats ConvertStats
	switch {
	case opts.EmbeddingFrom != "":
		return stats, fmt.Errorf("--embedding-from %s: an EAGLE-3 head holds its own embedding or takes its target's; it shares no other folder's", opts.EmbeddingFrom)
	case opts.HeadTokens != 0:
		return stats, fmt.Errorf("--head-tokens %d: an EAGLE-3 head's draft vocabulary is its d2t; it has no lm_head.token_ids to cut", opts.HeadTokens)
	}
	if err := opts.prepare(inDir, outDir); err != nil {
		return stats, err
	}
	cfgPath := filepath.Join(inDir, "config.json")
	cfg, err := eagle3.LoadConfig(cfgPath)
	if err != nil {
		return stats, err
	}
	folder, err := openSource(inDir)
	if err != nil {
		return stats, err
	}
	defer folder.Close()

	// Check every source tensor before writing anything.
	h := &Eagle3{Dir: inDir, Config: cfg, Weights: &eagle3.Weights{}}
	d2t, err := h.loadTargetIDs(folder)
	if err != nil {
		return stats, err
	}
	slots := h.slots(folder, false)
	if err := checkMatrixShapes(slots, opts.Quant, opts.GroupSize); err != nil {
		return stats, fmt.Errorf("%s: %w", inDir, err)
	}
	sources := make([]safetensors.Tensor, len(slots))
	known := map[string]bool{eagle3.D2TName: true, eagle3.T2DName: true}
	for i, s := range slots {
		if sources[i], err = checkSource(folder, s.Name, s.Shape); err != nil {
			return stats, err
		}
		stats.SourceBytes += int64(len(sources[i].Data))
		known[s.Name] = true
	}
	for _, n := range folder.Names() {
		if !known[n] {
			stats.Ignored = append(stats.Ignored, n)
		}
	}
	stats.Tensors = len(slots)

	raw := []rawTensor{{safetensors.Spec{Name: eagle3.D2TName, DType: safetensors.I64, Shape: []int{len(d2t)}}, d2t}}
	meta := metadata(opts.Quant, opts.GroupSize)
	if stats.OutputBytes, err = writeWeights(ctx, inDir, outDir, meta, raw, slots, sources, opts, stats.SourceBytes); err != nil {
		return stats, err
	}
	if err := copyFile(cfgPath, filepath.Join(outDir, "config.json")); err != nil {
		return stats, err
	}
	return stats, nil
}
