//go:build !js

package gpu

/*
typedef struct WGPUDeviceImpl* WGPUDevice;
void wgpuDeviceDestroy(WGPUDevice device);
*/
import "C"

// destroy asks wgpu-native to destroy the device. The bundled build
// accepts the call and goes on working (measured on lavapipe), so Lose's
// own mark is what makes the device fail natively.
func (d *Device) destroy() { C.wgpuDeviceDestroy(C.WGPUDevice(rawDevice(d.dev))) }
