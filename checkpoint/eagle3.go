package checkpoint

import (
	"encoding/binary"
	"fmt"
	"path/filepath"

	"webdraft/eagle3"
	"webdraft/qwen3"
	"webdraft/safetensors"
)

// Eagle3 is an EAGLE-3 head loaded from its folder: config.json and its
// tensors in the public layout (safetensors, BF16, F16 or F32, one file or
// sharded), held in memory as LoadOptions say.
type Eagle3 struct {
	Dir       string
	Config    eagle3.Config
	Weights   *eagle3.Weights
	Quant     Quant
	GroupSize int
}

// LoadEagle3 reads an EAGLE-3 head's folder, converting its matrices per
// opts (int4 by default) and checking d2t.
func LoadEagle3(dir string, opts LoadOptions) (*Eagle3, error) {
	opts.defaults()
	cfg, err := eagle3.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	folder, err := safetensors.OpenFolder(dir)
	if err != nil {
		return nil, err
	}
	defer folder.Close()
	w := &eagle3.Weights{}
	slots := w.Slots(&cfg)
	if _, ok := folder.Tensor(eagle3.EmbedName); ok {
		slots = append(slots, qwen3.Slot{Name: eagle3.EmbedName, Shape: []int{cfg.VocabSize, cfg.HiddenSize}, Matrix: &w.EmbedTokens})
	}
	if err := checkMatrixShapes(slots, opts.Quant, opts.GroupSize); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := fillSlots(folder, slots, opts.Quant, opts.GroupSize); err != nil {
		return nil, err
	}
	d2t, err := int64Vector(folder, eagle3.D2TName, cfg.DraftVocabSize)
	if err != nil {
		return nil, err
	}
	if w.TargetIDs, err = eagle3.TargetIDsFrom(d2t, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", folder.FileOf(eagle3.D2TName), err)
	}
	return &Eagle3{Dir: dir, Config: cfg, Weights: w, Quant: opts.Quant, GroupSize: opts.GroupSize}, nil
}

// int64Vector reads a one-dimensional I64 tensor of n elements.
func int64Vector(folder *safetensors.Folder, name string, n int) ([]int64, error) {
	t, ok := folder.Tensor(name)
	switch {
	case !ok:
		return nil, fmt.Errorf("%s: tensor %s is missing", folder.Dir, name)
	case t.DType != safetensors.I64:
		return nil, fmt.Errorf("%s: tensor %s has dtype %s, want I64", folder.FileOf(name), name, t.DType)
	case !sameShape(t.Shape, []int{n}):
		return nil, fmt.Errorf("%s: tensor %s has shape %v, the config implies [%d]", folder.FileOf(name), name, t.Shape, n)
	}
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return out, nil
}
