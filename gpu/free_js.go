//go:build js

package gpu

import "github.com/cogentcore/webgpu/wgpu"

// free destroys a buffer — the browser frees its memory once the work
// submitted before is done, rather than when its garbage collector gets to
// the object — and drops its handle.
func free(b *wgpu.Buffer) {
	b.Destroy()
	b.Release()
}
