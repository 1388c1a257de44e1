package cpu_test

import (
	"context"
	"fmt"
	"testing"

	"webdraft/bench"
	"webdraft/checkpoint"
	"webdraft/engine/cpu"
	"webdraft/weights"
)

// BenchmarkVerify is a verification pass of the embedded target at
// context 128, by rows read out (bench engine's figure, alone for
// profiling: go test -bench Verify -cpuprofile).
func BenchmarkVerify(b *testing.B) {
	if !weights.Embedded() {
		b.Skip("no embedded weights")
	}
	m, err := checkpoint.LoadFS(weights.FS(), "target", checkpoint.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	e, err := cpu.New(m.Config, m.Weights, cpu.Options{KVBytes: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	for _, rows := range []int{1, 2, 4, 7} {
		b.Run(fmt.Sprintf("rows%d", rows), func(b *testing.B) {
			d, err := bench.Verify(context.Background(), e, rows, 128, b.N)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(d.Microseconds())/1000, "ms/pass")
		})
	}
}
