//go:build !js

package gpu

import "github.com/cogentcore/webgpu/wgpu"

// recorder records a batch's dispatches into its pass: natively each call
// goes straight to wgpu-native.
type recorder struct{}

// objectSlots is what a replayed dispatch caches for its recorder (nothing
// natively).
type objectSlots struct{}

func (recorder) dispatch(_ *Device, pass *wgpu.ComputePassEncoder, pipe *wgpu.ComputePipeline, group *wgpu.BindGroup, _ *objectSlots, offsets []uint32, x, y, z uint32) {
	pass.SetPipeline(pipe)
	pass.SetBindGroup(0, group, offsets)
	pass.DispatchWorkgroups(x, y, z)
}

// flush records what the recorder holds into pass (nothing natively).
func (*recorder) flush(*Device, *wgpu.ComputePassEncoder) {}

// reset drops what the recorder holds.
func (*recorder) reset() {}

// objects is a device's table of the GPU objects its recorders name
// (none natively).
type objects struct{}

func (*objects) forget(any) {}
