//go:build !js

package gpu

import "github.com/cogentcore/webgpu/wgpu"

func endPass(p *wgpu.ComputePassEncoder) error { return p.End() }
