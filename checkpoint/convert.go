package checkpoint

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"webdraft/qwen3"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// ConvertOptions configure Convert.
type ConvertOptions struct {
	Quant     Quant // default Int4
	GroupSize int   // default tensor.DefaultGroupSize
	// EmbeddingFrom, when set, is a webdraft folder whose
	// model.embed_tokens.weight the output uses, in that folder's format,
	// instead of storing its own (a drafter trained on its target's frozen
	// embedding). The input's own embedding, when it has one, must encode
	// to the same values.
	EmbeddingFrom string
	// HeadTokens keeps the first HeadTokens entries of the input's
	// lm_head.token_ids (frequency-ranked: a head over the most used
	// tokens); 0 keeps them all.
	HeadTokens int
	// Progress, when set, is called with the source bytes done and in all.
	Progress func(done, total int64)
}

// ConvertStats reports what Convert wrote.
type ConvertStats struct {
	Tensors     int      // matrices and vectors converted
	SourceBytes int64    // weight bytes read
	OutputBytes int64    // size of the written model.safetensors
	Ignored     []string // source tensors that are not part of the model
}

// rowBlock is how many rows are encoded and written at a time: enough work to
// spread over cores, little memory.
const rowBlock = 4096

// Convert writes the webdraft folder for the HF checkpoint in inDir to outDir:
// config.json and tokenizer.json copied, the weights re-encoded into one
// model.safetensors. Tensors are streamed row block by row block, so memory
// stays far below the checkpoint's size; the output appears atomically.
func Convert(ctx context.Context, inDir, outDir string, opts ConvertOptions) (ConvertStats, error) {
	var stats ConvertStats
	if err := opts.prepare(inDir, outDir); err != nil {
		return stats, err
	}
	cfgPath := filepath.Join(inDir, "config.json")
	cfg, err := qwen3.LoadConfig(cfgPath)
	if err != nil {
		return stats, err
	}
	folder, err := openSource(inDir)
	if err != nil {
		return stats, err
	}
	defer folder.Close()

	// Check every source tensor before writing anything.
	w, err := emptyWeights(folder, &cfg, opts.HeadTokens)
	if err != nil {
		return stats, err
	}
	slots := w.Slots(&cfg)
	if err := checkMatrixShapes(slots, opts.Quant, opts.GroupSize); err != nil {
		return stats, fmt.Errorf("%s: %w", inDir, err)
	}
	meta := metadata(opts.Quant, opts.GroupSize)
	if opts.EmbeddingFrom != "" {
		if meta, err = shareEmbedding(folder, &cfg, outDir, opts); err != nil {
			return stats, err
		}
		slots = slices.DeleteFunc(slots, func(s qwen3.Slot) bool { return s.Name == embedName })
	}
	sources := make([]safetensors.Tensor, len(slots))
	known := map[string]bool{qwen3.HeadTokensName: w.HeadTokens != nil, embedName: opts.EmbeddingFrom != ""}
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

	var raw []rawTensor
	if w.HeadTokens != nil {
		raw = append(raw, rawTensor{safetensors.Spec{Name: qwen3.HeadTokensName, DType: safetensors.I32, Shape: []int{len(w.HeadTokens)}}, w.HeadTokens})
	}
	if stats.OutputBytes, err = writeWeights(ctx, inDir, outDir, meta, raw, slots, sources, opts, stats.SourceBytes); err != nil {
		return stats, err
	}
	if err := copyFile(cfgPath, filepath.Join(outDir, "config.json")); err != nil {
		return stats, err
	}
	if tok := filepath.Join(inDir, "tokenizer.json"); fileExists(tok) {
		if err := copyFile(tok, filepath.Join(outDir, "tokenizer.json")); err != nil {
			return stats, err
		}
	}
	return stats, nil
}

// rawTensor is an output tensor written as given, ahead of the weights.
type rawTensor struct {
	spec safetensors.Spec
	data any // its elements, for binary.Append: []int32, []int64
}

// writeWeights writes outDir's model.safetensors (creating outDir): the raw
// tensors first, in the order given (8-byte elements before 4-byte ones, for
// alignment), then each slot encoded from its source per opts. The file is
// written under a temporary name and renamed when complete, so an error
// leaves no partial file. It returns the file's size.
func writeWeights(ctx context.Context, inDir, outDir string, meta map[string]string, raw []rawTensor,
	slots []qwen3.Slot, sources []safetensors.Tensor, opts ConvertOptions, total int64) (int64, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return 0, err
	}
	outPath := filepath.Join(outDir, safetensors.SingleFile)
	tmp, err := os.CreateTemp(outDir, safetensors.SingleFile+".tmp*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	bw := bufio.NewWriterSize(tmp, 4<<20)
	plan := planOutput(slots, opts.Quant, opts.GroupSize)
	var specs []safetensors.Spec
	for _, r := range raw {
		specs = append(specs, r.spec)
	}
	sw, err := safetensors.NewWriter(bw, append(specs, plan.specs...), meta)
	if err != nil {
		tmp.Close()
		return 0, err
	}
	conv := &converter{ctx: ctx, w: sw, opts: opts, total: total}
	for _, r := range raw {
		if err := conv.write(r.data); err != nil {
			tmp.Close()
			return 0, fmt.Errorf("write %s: %w", outPath, err)
		}
	}
	if err := conv.run(slots, sources, plan.order); err != nil {
		tmp.Close()
		return 0, fmt.Errorf("convert %s: %w", inDir, err)
	}
	if err := firstErr(sw.Close(), bw.Flush(), tmp.Chmod(0o644), tmp.Sync()); err != nil {
		tmp.Close()
		return 0, fmt.Errorf("write %s: %w", outPath, err)
	}
	var size int64
	if st, err := tmp.Stat(); err == nil {
		size = st.Size()
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("write %s: %w", outPath, err)
	}
	if err := os.Rename(tmp.Name(), outPath); err != nil {
		return 0, err
	}
	return size, nil
}

// prepare fills opts' defaults (int4, the default group size) and refuses
// an output folder that is the input.
func (opts *ConvertOptions) prepare(inDir, outDir string) error {
	if opts.Quant == "" {
		opts.Quant = Int4
	}
	if opts.GroupSize == 0 {
		opts.GroupSize = tensor.DefaultGroupSize
	}
	same, err := sameDir(inDir, outDir)
	if err == nil && same {
		err = fmt.Errorf("--out %s is the input folder", outDir)
	}
	return err
}

// openSource opens the checkpoint a conversion reads, refusing a folder
// webdraft convert already wrote.
func openSource(inDir string) (*safetensors.Folder, error) {
	folder, err := safetensors.OpenFolder(inDir)
	if err != nil {
		return nil, err
	}
	if folder.Metadata()[metaFormat] == formatName {
		folder.Close()
		return nil, fmt.Errorf("%s is already a webdraft folder", inDir)
	}
	return folder, nil
}

// emptyWeights returns a folder's empty weight tree, with the first n of its
// lm_head.token_ids when it has them (all for n == 0): they set the head's
// rows.
func emptyWeights(folder *safetensors.Folder, cfg *qwen3.Config, n int) (*qwen3.Weights, error) {
	// The config's layers must be in the folder before the tree is sized
	// by them: the last one's first tensor, and 11 tensors a layer.
	if l := cfg.NumHiddenLayers; l > 0 {
		if last := fmt.Sprintf("model.layers.%d.input_layernorm.weight", l-1); !folderHas(folder, last) {
			return nil, fmt.Errorf("%s: tensor %s is missing", folder.Dir, last)
		}
		if have := len(folder.Names()); l > have/11 {
			return nil, fmt.Errorf("%s: num_hidden_layers %d needs 11 tensors a layer; the folder holds %d", folder.Dir, l, have)
		}
	}
	w, _ := qwen3.NewWeights(cfg)
	t, ok := folder.Tensor(qwen3.HeadTokensName)
	switch {
	case !ok && n > 0:
		return nil, fmt.Errorf("%s: --head-tokens needs the input's ranked %s, and it has none", folder.Dir, qwen3.HeadTokensName)
	case !ok:
		return w, nil
	case t.DType != safetensors.I32 && t.DType != safetensors.I64 || len(t.Shape) != 1:
		return nil, fmt.Errorf("%s: tensor %s has dtype %s and shape %v, want I32 or I64 (head rows)", folder.FileOf(t.Name), t.Name, t.DType, t.Shape)
	}
	ids := make([]int32, t.Shape[0])
	for i := range ids {
		if t.DType == safetensors.I64 {
			v := int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
			if v < math.MinInt32 || v > math.MaxInt32 {
				return nil, fmt.Errorf("%s: %s: token %d at index %d is outside the vocabulary [0, %d)", folder.FileOf(t.Name), t.Name, v, i, cfg.VocabSize)
			}
			ids[i] = int32(v)
		} else {
			ids[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	}
	if n > 0 {
		if n > len(ids) {
			return nil, fmt.Errorf("--head-tokens %d: the input's %s has only %d", n, qwen3.HeadTokensName, len(ids))
		}
		ids = ids[:n]
	}
	if err := qwen3.CheckHeadTokens(ids, cfg.VocabSize); err != nil {
		return nil, fmt.Errorf("%s: %w", folder.FileOf(t.Name), err)
	}
	w.HeadTokens = ids
	return w, nil
}

func folderHas(f *safetensors.Folder, name string) bool {
	_, ok := f.Tensor(name)
	return ok
}

// shareEmbedding checks opts.EmbeddingFrom for an output that uses its
// embedding — a webdraft folder with an embedding of the right shape, to
// whose values the input's own embedding, if any, encodes in that folder's
// format — and returns the output's metadata naming it.
func shareEmbedding(in *safetensors.Folder, cfg *qwen3.Config, outDir string, opts ConvertOptions) (map[string]string, error) {
	from := opts.EmbeddingFrom
	where := "--embedding-from " + from
	shared, err := safetensors.OpenFolder(from)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	defer shared.Close()
	if shared.Metadata()[metaFormat] != formatName {
		return nil, fmt.Errorf("%s: not a webdraft folder (convert it first)", where)
	}
	q, g, err := parseMetadata(shared.Metadata())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	w, _ := qwen3.NewWeights(cfg)
	embed := qwen3.Slot{Name: embedName, Shape: []int{cfg.VocabSize, cfg.HiddenSize}, Matrix: &w.EmbedTokens}
	if err := loadSlot(shared, embed, q, g); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if src, ok := in.Tensor(embedName); ok {
		if src, err = checkSource(in, embedName, embed.Shape); err != nil {
			return nil, err
		}
		if err := sameEncoding(*embed.Matrix, src, q, g); err != nil {
			return nil, fmt.Errorf("%s: the input's embedding differs from that folder's (%w): was it trained with that embedding frozen?", where, err)
		}
	}
	sum, err := embeddingHash(shared, q)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	absOut, err := filepath.Abs(outDir)
	if err != nil {
		return nil, err
	}
	absFrom, err := filepath.Abs(from)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(absOut, absFrom)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	meta := metadata(opts.Quant, opts.GroupSize)
	meta[metaSharedEmbedding] = filepath.ToSlash(rel)
	meta[metaSharedEmbeddingHash] = sum
	return meta, nil
}

// sameEncoding reports whether src, encoded as q, decodes to exactly m's
// values.
func sameEncoding(m tensor.Matrix, src safetensors.Tensor, q Quant, g int) error {
	rows, cols := m.Shape()
	want := make([]float32, cols)
	got := make([]float32, cols)
	for r0 := 0; r0 < rows; r0 += rowBlock {
		n := min(rowBlock, rows-r0)
		block := newMatrix(q, n, cols, g)
		if err := encodeRows(block, src, r0); err != nil {
			return err
		}
		for r := range n {
			block.Row(r, got)
			m.Row(r0+r, want)
			for c := range got {
				if math.Float32bits(got[c]) != math.Float32bits(want[c]) {
					return fmt.Errorf("row %d column %d: %g against %g", r0+r, c, got[c], want[c])
				}
			}
		}
	}
	return nil
}

// outputPlan lists the output tensors and the order of the work that fills
// them. Tensors of 4-byte elements come first and 2-byte ones last, so every
// tensor stays aligned for zero-copy use of the mapped file; int4 scales are
// therefore held back (1/16 of the int4 weights) and written at the end.
type outputPlan struct {
	specs []safetensors.Spec
	order []int // slot indices in the order their main tensor is written
}

func planOutput(slots []qwen3.Slot, q Quant, g int) outputPlan {
	var wide, narrow []safetensors.Spec
	var wideSlots, narrowSlots []int
	for i, s := range slots {
		switch {
		case s.Vector != nil || q == F32:
			wide = append(wide, safetensors.Spec{Name: s.Name, DType: safetensors.F32, Shape: s.Shape})
			wideSlots = append(wideSlots, i)
		case q == F16:
			narrow = append(narrow, safetensors.Spec{Name: s.Name, DType: safetensors.F16, Shape: s.Shape})
			narrowSlots = append(narrowSlots, i)
		default: // int4
			rows, cols := s.Shape[0], s.Shape[1]
			wide = append(wide, safetensors.Spec{Name: s.Name + qweightSuffix, DType: safetensors.U32, Shape: []int{rows, cols / 8}})
			wideSlots = append(wideSlots, i)
			narrow = append(narrow, safetensors.Spec{Name: s.Name + scalesSuffix, DType: safetensors.F16, Shape: []int{rows, cols / g}})
		}
	}
	return outputPlan{specs: append(wide, narrow...), order: append(wideSlots, narrowSlots...)}
}

// converter streams the encoded tensors into the writer.
type converter struct {
	ctx     context.Context
	w       io.Writer
	opts    ConvertOptions
	done    int64
	total   int64
	scales  [][]uint16 // int4 scales held back until the 4-byte tensors are out
	scratch []byte
}

func (c *converter) run(slots []qwen3.Slot, sources []safetensors.Tensor, order []int) error {
	for _, i := range order {
		s, src := slots[i], sources[i]
		if s.Vector != nil {
			v := make([]float32, s.Shape[0])
			sourceRow(src, 0, len(v), v)
			if err := c.write(v); err != nil {
				return err
			}
			c.advance(int64(len(src.Data)))
			continue
		}
		if err := c.matrix(s, src); err != nil {
			return fmt.Errorf("tensor %s: %w", s.Name, err)
		}
	}
	for _, sc := range c.scales {
		if err := c.write(sc); err != nil {
			return err
		}
	}
	return nil
}

// matrix encodes one weight matrix block by block.
func (c *converter) matrix(s qwen3.Slot, src safetensors.Tensor) error {
	rows, cols := s.Shape[0], s.Shape[1]
	var scales []uint16
	if c.opts.Quant == Int4 {
		scales = make([]uint16, 0, rows*cols/c.opts.GroupSize)
	}
	rowBytes := int64(len(src.Data) / rows)
	for r0 := 0; r0 < rows; r0 += rowBlock {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		n := min(rowBlock, rows-r0)
		block := newMatrix(c.opts.Quant, n, cols, c.opts.GroupSize)
		if err := encodeRows(block, src, r0); err != nil {
			return err
		}
		var err error
		switch b := block.(type) {
		case *tensor.Int4:
			err = c.write(b.QWeight)
			scales = append(scales, b.Scales...)
		case *tensor.F16:
			err = c.write(b.Data)
		case *tensor.F32:
			err = c.write(b.Data)
		}
		if err != nil {
			return err
		}
		c.advance(int64(n) * rowBytes)
	}
	if scales != nil {
		c.scales = append(c.scales, scales)
	}
	return nil
}

// write sends little-endian elements to the writer.
func (c *converter) write(data any) error {
	n := binary.Size(data)
	if cap(c.scratch) < n {
		c.scratch = make([]byte, n)
	}
	buf, err := binary.Append(c.scratch[:0], binary.LittleEndian, data)
	if err != nil {
		return err
	}
	_, err = c.w.Write(buf)
	return err
}

func (c *converter) advance(n int64) {
	c.done += n
	if c.opts.Progress != nil {
		c.opts.Progress(c.done, c.total)
	}
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func sameDir(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false, nil // the output does not exist yet
	}
	return os.SameFile(sa, sb), nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
