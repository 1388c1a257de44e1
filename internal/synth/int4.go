package synth

import (
	"math/rand/v2"

	"webdraft/eagle3"
	"webdraft/internal/parallel"
	"webdraft/qwen3"
	"webdraft/tensor"
)

// Int4Weights returns a random int4 weight tree for cfg, built directly in
// memory (random codes, scales near std/3): for speed benchmarks of real
// shapes without writing and quantizing a checkpoint.
func Int4Weights(cfg qwen3.Config, seed uint64, std float64) *qwen3.Weights {
	w, slots := qwen3.NewWeights(&cfg)
	fillInt4(slots, seed, std)
	if err := w.Tie(&cfg); err != nil {
		panic(err) // unreachable: a head over the whole vocabulary
	}
	return w
}

// Eagle3Int4Weights returns random int4 weights for the EAGLE-3 head cfg,
// built in memory as Int4Weights builds a model's: no embedding of its own
// (the head takes its target's), and the draft vocabulary the target's
// first DraftVocabSize tokens.
func Eagle3Int4Weights(cfg eagle3.Config, seed uint64, std float64) *eagle3.Weights {
	w := &eagle3.Weights{}
	fillInt4(w.Slots(&cfg), seed, std)
	w.TargetIDs = make([]int32, cfg.DraftVocabSize)
	for i := range w.TargetIDs {
		w.TargetIDs[i] = int32(i)
	}
	return w
}

// fillInt4 fills each slot: vectors with ones, matrices with random int4
// codes in groups of tensor.DefaultGroupSize columns at the scale std/3.
func fillInt4(slots []qwen3.Slot, seed uint64, std float64) {
	for i, s := range slots {
		if s.Vector != nil {
			v := make([]float32, s.Shape[0])
			for j := range v {
				v[j] = 1
			}
			*s.Vector = v
			continue
		}
		rows, cols := s.Shape[0], s.Shape[1]
		m := &tensor.Int4{Rows: rows, Cols: cols, GroupSize: tensor.DefaultGroupSize,
			QWeight: make([]uint32, rows*cols/8), Scales: make([]uint16, rows*cols/tensor.DefaultGroupSize)}
		scale := tensor.F32ToF16(float32(std / 3))
		parallel.For(rows, 256, func(lo, hi int) {
			rng := rand.New(rand.NewPCG(seed+uint64(i), uint64(lo)))
			for j := lo * cols / 8; j < hi*cols/8; j++ {
				m.QWeight[j] = rng.Uint32()
			}
			for j := lo * cols / m.GroupSize; j < hi*cols/m.GroupSize; j++ {
				m.Scales[j] = scale
			}
		})
		*s.Matrix = m
	}
}
