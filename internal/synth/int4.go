package synth

import (
	"math/rand/v2"

	"webdraft/internal/parallel"
	"webdraft/qwen3"
	"webdraft/tensor"
)

// Int4Weights returns a random int4 weight tree for cfg, built directly in
// memory (random codes, scales near std/3): for speed benchmarks of real
// shapes without writing and quantizing a checkpoint.
func Int4Weights(cfg qwen3.Config, seed uint64, std float64) *qwen3.Weights {
	w, slots := qwen3.NewWeights(&cfg)
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
	if err := w.Tie(&cfg); err != nil {
		panic(err) // unreachable: a head over the whole vocabulary
	}
	return w
}
