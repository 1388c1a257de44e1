package webgpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"webdraft/engine"
	"webdraft/gpu"
	"webdraft/kernels"
)

var (
	_ engine.FeatureReader = (*Engine)(nil)
	_ engine.FeatureWriter = (*Engine)(nil)
)

// FeatureWidth is the floats of one position's features
// (engine.FeatureReader): len(FeatureLayers)·hidden, 0 when none are kept.
func (e *Engine) FeatureWidth() int { return len(e.features) * e.cfg.HiddenSize }

// Features reads positions from … to−1 of seq's features back from the
// KV cache's feature buffers (engine.FeatureReader): one read after every
// pass submitted before it, with the moves of a path kept since the last
// pass made first. A position's row is its features in FeatureLayers'
// order, as the head gathers them.
func (e *Engine) Features(seq engine.Sequence, from, to int) ([]float32, error) {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	s, err := e.featureSequence(seq)
	if err != nil {
		return nil, err
	}
	if from < 0 || to < from || to > s.Len() {
		return nil, fmt.Errorf("webgpu engine: features of positions %d … %d: the sequence holds %d", from, to-1, s.Len())
	}
	if to == from {
		return []float32{}, nil
	}
	H, F := e.cfg.HiddenSize, e.FeatureWidth()
	runs, err := e.featureRuns(s, from, to)
	if err != nil {
		return nil, err
	}
	var ranges []gpu.Binding
	for i := range e.features {
		for _, r := range runs {
			ranges = append(ranges, gpu.Binding{Buf: e.kv.Feature(i), Offset: uint64(r.row*H) * 4, Size: uint64(r.n*H) * 4})
		}
	}
	b, err := e.dev.NewBatch("features")
	if err != nil {
		return nil, e.broken(err)
	}
	if err := e.kv.RecordMoves(b); err != nil {
		b.Discard()
		return nil, e.broken(err)
	}
	got, err := b.SubmitRead(ranges...)
	if err != nil {
		return nil, e.broken(err)
	}
	out := make([]float32, (to-from)*F)
	for i := range e.features {
		for j, r := range runs {
			words := got[i*len(runs)+j]
			for p := range r.n {
				row := out[(r.pos-from+p)*F+i*H:][:H]
				for c := range row {
					row[c] = math.Float32frombits(binary.LittleEndian.Uint32(words[(p*H+c)*4:]))
				}
			}
		}
	}
	return out, nil
}

// AppendFeatures extends seq by the positions whose features rows holds,
// row after row (engine.FeatureWriter): it maps their blocks and writes
// the rows into the feature buffers at their slots, and computes nothing,
// so that a head drafts over features its target computed elsewhere. The
// model's own passes refuse seq from then until it is truncated to no
// positions (engine.ErrFeaturesOnly).
func (e *Engine) AppendFeatures(seq engine.Sequence, rows []float32) error {
	e.g.mu.Lock()
	defer e.g.mu.Unlock()
	s, err := e.featureSequence(seq)
	if err != nil {
		return err
	}
	H, F := e.cfg.HiddenSize, e.FeatureWidth()
	if len(rows)%F != 0 {
		return fmt.Errorf("webgpu engine: %d feature values: want rows of %d", len(rows), F)
	}
	n, from := len(rows)/F, s.Len()
	if from+n > e.cfg.MaxPositionEmbeddings {
		return fmt.Errorf("webgpu engine: %d positions and %d more of features exceed the model's %d", from, n, e.cfg.MaxPositionEmbeddings)
	}
	if n == 0 {
		return nil
	}
	if err := e.kv.Reserve([]*kernels.KVSeq{s}, []int{from + n}); err != nil {
		return kvError(err)
	}
	if err := e.kv.SyncTables([]*kernels.KVSeq{s}); err != nil {
		s.Truncate(from)
		return e.broken(err)
	}
	runs, err := e.featureRuns(s, from, from+n)
	if err != nil {
		s.Truncate(from)
		return err
	}
	part := make([]float32, 0, n*H)
	for i := range e.features {
		for _, r := range runs {
			part = part[:0]
			for p := range r.n {
				part = append(part, rows[(r.pos-from+p)*F+i*H:][:H]...)
			}
			if err := e.kv.Feature(i).WriteF32(uint64(r.row*H)*4, part); err != nil {
				s.Truncate(from)
				return e.broken(fmt.Errorf("webgpu engine: writing features: %w", err))
			}
		}
	}
	if err := s.Commit(from+n, nil); err != nil {
		s.Truncate(from)
		return err
	}
	s.MarkFeaturesOnly()
	return nil
}

// featureSequence checks that e keeps features and is usable, and that
// seq is a live sequence of its cache holding no token tree. The group's
// lock is held.
func (e *Engine) featureSequence(seq engine.Sequence) (*kernels.KVSeq, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	if len(e.features) == 0 {
		return nil, errors.New("webgpu engine: the engine keeps no features (Options.FeatureLayers)")
	}
	s, ok := seq.(*kernels.KVSeq)
	switch {
	case !ok || s.Cache() != e.kv:
		return nil, errors.New("webgpu engine: features: a sequence of another engine, or released")
	case s.Line() != s.Len():
		return nil, errors.New("webgpu engine: features: the sequence holds a token tree")
	}
	return s, nil
}

// featureRun is n consecutive positions from pos whose slots lie in one
// block: rows row … row+n−1 of the feature buffers.
type featureRun struct{ pos, row, n int }

// featureRuns splits positions from … to−1 of s into runs of one block.
func (e *Engine) featureRuns(s *kernels.KVSeq, from, to int) ([]featureRun, error) {
	var runs []featureRun
	bs := e.kv.BlockSize
	for p := from; p < to; {
		row, err := s.PoolRow(p)
		if err != nil {
			return nil, err
		}
		n := min(to, (p/bs+1)*bs) - p
		runs = append(runs, featureRun{pos: p, row: row, n: n})
		p += n
	}
	return runs, nil
}
