//go:build !js

package gpu

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The few wgpu-native entry points the Go binding does not expose. The
// symbols come from the libwgpu_native.a that package wgpu links; the
// WGPUErrorFilter and WGPUErrorType enums are 32-bit, as in webgpu.h.
typedef struct WGPUDeviceImpl* WGPUDevice;
typedef void (*WGPUErrorCallback)(uint32_t type, char const * message, void * userdata);
void wgpuDevicePushErrorScope(WGPUDevice device, uint32_t filter);
void wgpuDevicePopErrorScope(WGPUDevice device, WGPUErrorCallback callback, void * userdata);

typedef struct { uint32_t kind; char *message; } scopeResult;

static void scopeCallback(uint32_t type, char const * message, void * userdata) {
	scopeResult *r = userdata;
	r->kind = type;
	r->message = message ? strdup(message) : NULL;
}

// popScope pops the innermost error scope; wgpu-native answers before it
// returns. r->kind stays 0xffffffff if it did not answer.
static void popScope(WGPUDevice device, scopeResult *r) {
	r->kind = 0xffffffff;
	r->message = NULL;
	wgpuDevicePopErrorScope(device, scopeCallback, r);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// wgpu.Device (v0.23.0, native) is struct{ ref C.WGPUDevice }: this fails to
// compile if that ever changes, since rawDevice reads the handle directly.
var _ = [1]struct{}{}[unsafe.Sizeof(wgpu.Device{})-unsafe.Sizeof(uintptr(0))]

func rawDevice(d *wgpu.Device) C.WGPUDevice { return *(*C.WGPUDevice)(unsafe.Pointer(d)) }

// The filters of the catch-all scopes, outermost first (WGPUErrorFilter).
// The bundled wgpu-native predates the internal filter (it panics on it).
var scopeFilters = [...]C.uint32_t{0 /* validation */, 1 /* out-of-memory */}

// errorScopeTypes names WGPUErrorType values.
var errorScopeTypes = map[C.uint32_t]string{1: "validation", 2: "out-of-memory", 3: "internal", 4: "unknown", 5: "device-lost"}

// errorScopes keeps one catch-all scope per filter open on the device, so
// that no error reaches wgpu-native's default handler (which aborts).
type errorScopes struct{ dev C.WGPUDevice }

func newErrorScopes(dev *wgpu.Device) errorScopes {
	s := errorScopes{dev: rawDevice(dev)}
	s.push()
	return s
}

func (s errorScopes) push() {
	for _, f := range scopeFilters {
		C.wgpuDevicePushErrorScope(s.dev, f)
	}
}

// pop pops the catch-all scopes and returns what they caught.
func (s errorScopes) pop() error {
	var errs []error
	for range scopeFilters {
		var r C.scopeResult
		C.popScope(s.dev, &r)
		switch {
		case r.kind == 0xffffffff:
			errs = append(errs, errors.New("error scope popped without an answer"))
		case r.kind != 0:
			msg := "(no message)"
			if r.message != nil {
				msg = C.GoString(r.message)
				C.free(unsafe.Pointer(r.message))
			}
			errs = append(errs, fmt.Errorf("%s error: %s", errorScopeTypes[r.kind], msg))
		}
	}
	return errors.Join(errs...)
}

// check returns the errors caught since the last check, leaving fresh
// scopes open.
// checksEachSubmit: natively a submission's errors are checked at once
// (wgpu-native raises them synchronously).
const checksEachSubmit = true

// lostErr is the device's loss without popping the scopes; natively
// Device.lost holds it.
func (s errorScopes) lostErr() error { return nil }

func (s errorScopes) check() error {
	err := s.pop()
	s.push()
	return err
}

// close pops the scopes before the device goes away.
func (s errorScopes) close() { s.pop() }
