//go:build js

package gpu

// beforeCompile does nothing in the browser, which compiles beside the
// queue's work (compile_native.go says why lavapipe waits).
func (d *Device) beforeCompile() {}
