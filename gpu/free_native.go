//go:build !js

package gpu

import "github.com/cogentcore/webgpu/wgpu"

// free drops a buffer's handle; wgpu-native frees its memory once no work
// submitted before uses it. Destroying it first, which WebGPU defines as
// waiting for that work too, went with crashes of lavapipe: a null
// pointer read in its queue thread during engine/webgpu's TestConformance
// while other test packages ran beside it — three runs of three then, and
// none of four with the destroy left out, under the same load.
func free(b *wgpu.Buffer) { b.Release() }
