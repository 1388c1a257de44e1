//go:build js

package gpu

// destroy destroys the device: the browser loses it for real (reason
// "destroyed"), and every later call fails.
func (d *Device) destroy() { d.scopes.dev.Call("destroy") }
