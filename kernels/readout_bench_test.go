package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
	"webdraft/sampling"
)

// BenchmarkReadout times a verifier's read-out of rows of Qwen3's 151,936
// logits, as the engine records it after the head: argmax.wgsl (greedy,
// no top-N) against sample.wgsl greedy with a top-20 list, sampled at
// temperature 0.7 with every token kept, and with a 0.95 nucleus. Rows 1
// (a step) and 7 (a verification at k = 6). Reports µs a read-out.
func BenchmarkReadout(b *testing.B) {
	d := gputest.Device(b)
	const V = 151936
	r := rand.New(rand.NewPCG(3, 4))
	for _, rows := range []int{1, 7} {
		logits := make([]float32, rows*V)
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * 3)
		}
		lg, err := d.UploadF32("logits", logits)
		if err != nil {
			b.Fatal(err)
		}
		bufs := map[string]*gpu.Buffer{}
		for name, words := range map[string]int{"out": rows * SampleWords, "top": rows * 20 * 2, "ids": rows, "lp": 2 * rows} {
			if bufs[name], err = d.NewBuffer(name, uint64(words)*4); err != nil {
				b.Fatal(err)
			}
		}
		for _, c := range []struct {
			name string
			p    sampling.Params
			topN int
		}{
			{"argmax", sampling.Params{}, 0},
			{"sample_greedy_top20", sampling.Params{}, 20},
			{"sample_t0.7", sampling.Params{Temperature: 0.7, TopP: 1}, 0},
			{"sample_t0.7_p0.95", sampling.Params{Temperature: 0.7, TopP: 0.95}, 0},
		} {
			draws := make([]uint32, rows*SampleDrawWords)
			temps := make([]float32, rows*SampleTempWords)
			for i := range rows {
				PutSampleRow(draws[i*SampleDrawWords:], temps[i*SampleTempWords:], c.p, sampling.Draw{X: r.IntN(V), U: r.Float32(), V: r.Float32()})
			}
			dw, err := d.UploadU32("draws", draws)
			if err != nil {
				b.Fatal(err)
			}
			tw, err := d.UploadF32("temps", temps)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/rows%d", c.name, rows), func(b *testing.B) {
				sec := benchMatMuls(b, d, bufs["ids"], 16, func(bt *gpu.Batch) error {
					if c.name == "argmax" {
						return Argmax(bt, bufs["ids"].All(), bufs["lp"].All(), lg, rows, V, rows)
					}
					return Sample(bt, bufs["out"], bufs["top"], bufs["ids"], bufs["lp"].All(), lg, dw, tw, rows, V, c.topN)
				})
				b.ReportMetric(sec*1e6, "µs/readout")
			})
			dw.Release()
			tw.Release()
		}
		for _, buf := range bufs {
			buf.Release()
		}
		lg.Release()
	}
}
