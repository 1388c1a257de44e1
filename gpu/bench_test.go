//go:build !js

package gpu_test

import (
	"fmt"
	"testing"

	"webdraft/gpu"
	"webdraft/gpu/gputest"
)

// BenchmarkRoundTrip times what every decode pass pays once besides its
// kernels: submitting a batch (here of one tiny dispatch) and reading 4
// bytes back, the wait included — with Read blocking in the driver
// ("wait") and polling without sleeping ("spin").
func BenchmarkRoundTrip(b *testing.B) {
	d := gputest.Device(b)
	p, err := d.Pipeline(affine, nil)
	if err != nil {
		b.Fatal(err)
	}
	buf, err := d.UploadF32("y", make([]float32, 64))
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Release()
	for _, spin := range []bool{false, true} {
		name := map[bool]string{false: "wait", true: "spin"}[spin]
		for _, dispatches := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/dispatches=%d", name, dispatches), func(b *testing.B) {
				defer gpu.SetSpinPoll(gpu.SetSpinPoll(spin))
				for b.Loop() {
					bt, err := d.NewBatch("round trip")
					if err != nil {
						b.Fatal(err)
					}
					for range dispatches {
						if err := gpu.Dispatch(bt, p, affineParams(64, 1, 1), []gpu.Binding{buf.All()}, 1, 1, 1); err != nil {
							b.Fatal(err)
						}
					}
					if err := bt.Submit(); err != nil {
						b.Fatal(err)
					}
					if _, err := buf.Read(0, 4); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
