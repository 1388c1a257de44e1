//go:build !js

package gpu

// beforeCompile waits, on lavapipe, until the queue has run the work
// submitted so far: lavapipe crashed in its queue thread (a segmentation
// fault in libvulkan_lvp) when a pipeline was compiled while the queue ran
// a chain's passes. Two processes of engine/webgpu's TestConformance
// side by side crashed one or both in three of five runs, neither in
// eight with this wait (each run 58–62 s against 76–91 s without: the compiler
// and the queue no longer share the two cores). A GPU compiles beside its
// work.
func (d *Device) beforeCompile() {
	if d.class == ClassLavapipe {
		d.dev.Poll(true, nil)
	}
}
