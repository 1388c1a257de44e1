// Package gputest gives a test binary one shared gpu.Device.
//
// Without any WebGPU adapter, tests that ask for the device fail when the
// CI environment variable is "true" — CI must run them, on lavapipe if
// nothing else (`apt-get install mesa-vulkan-drivers`) — and are skipped
// with a loud message elsewhere.
package gputest

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"webdraft/gpu"
)

var (
	once   sync.Once
	device *gpu.Device
	err    error
)

// Device returns the device shared by the test binary, opening it on first
// use.
func Device(tb testing.TB) *gpu.Device {
	tb.Helper()
	once.Do(func() {
		device, err = gpu.Open(gpu.Options{})
		if err == nil {
			fmt.Fprintf(os.Stderr, "gputest: adapter %s, shader-f16 %v\n", device.Info(), device.F16())
		}
	})
	switch {
	case errors.Is(err, gpu.ErrNoAdapter) && os.Getenv("CI") == "true":
		tb.Fatalf("%v: CI must run the GPU tests (apt-get install mesa-vulkan-drivers gives lavapipe)", err)
	case errors.Is(err, gpu.ErrNoAdapter):
		fmt.Fprintf(os.Stderr, "\n*** gputest: %v: SKIPPING %s (apt-get install mesa-vulkan-drivers gives lavapipe) ***\n\n", err, tb.Name())
		tb.Skip(err)
	case err != nil:
		tb.Fatal(err)
	}
	return device
}

// Fresh returns a device of the test's own, closed when the test ends,
// for a test that breaks it (a fault drill). It skips or fails without an
// adapter as Device does.
func Fresh(tb testing.TB) *gpu.Device {
	tb.Helper()
	Device(tb) // the adapter check and its message
	d, err := gpu.Open(gpu.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(d.Close)
	return d
}

// BuiltSince returns the pipelines built on d that before (an earlier
// d.PipelineNames) did not hold, sorted: what a call built.
func BuiltSince(d *gpu.Device, before []string) []string {
	var out []string
	for _, n := range d.PipelineNames() {
		if _, found := slices.BinarySearch(before, n); !found {
			out = append(out, n)
		}
	}
	return out
}
