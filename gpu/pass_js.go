//go:build js

package gpu

import "github.com/cogentcore/webgpu/wgpu"

// endPass ends the pass; the browser reports its errors through the
// device's error scopes.
func endPass(p *wgpu.ComputePassEncoder) error {
	p.End()
	return nil
}
