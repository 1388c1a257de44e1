//go:build !js

package gpu

/*
#include <stdint.h>

// wgpu.CreateInstance (v0.23.0) mallocs its WGPUInstanceExtras and leaves
// `flags` and `gles3MinorVersion` uninitialized: once malloc hands back
// dirty memory (any second Open in a process), wgpu-native meets an invalid
// enum and aborts the process (conv.rs:191). createInstance builds the same
// descriptor zeroed. The layouts are those of the bundled wgpu.h.
typedef struct WGPUInstanceImpl* WGPUInstance;
typedef struct chainedStruct { struct chainedStruct const *next; uint32_t sType; } chainedStruct;
typedef struct {
	chainedStruct chain;
	uint32_t backends;           // WGPUInstanceBackendFlags
	uint32_t flags;              // WGPUInstanceFlags
	uint32_t dx12ShaderCompiler; // WGPUDx12Compiler
	uint32_t gles3MinorVersion;  // WGPUGles3MinorVersion
	const char *dxilPath;
	const char *dxcPath;
} instanceExtras;
typedef struct { chainedStruct const *nextInChain; } instanceDescriptor;
WGPUInstance wgpuCreateInstance(instanceDescriptor const *descriptor);

static WGPUInstance createInstance(uint32_t backends) {
	instanceExtras extras = {0};
	extras.chain.sType = 0x00030006; // WGPUSType_InstanceExtras
	extras.backends = backends;
	instanceDescriptor desc = { &extras.chain };
	return wgpuCreateInstance(&desc);
}
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// wgpu.Instance (v0.23.0, native) is struct{ ref C.WGPUInstance }: this
// fails to compile if that ever changes.
var _ = [1]struct{}{}[unsafe.Sizeof(wgpu.Instance{})-unsafe.Sizeof(uintptr(0))]

// newInstance creates a wgpu instance for the given backends with a fully
// initialized descriptor.
func newInstance(backends wgpu.InstanceBackend) (*wgpu.Instance, error) {
	ref := C.createInstance(C.uint32_t(backends))
	if ref == nil {
		return nil, errors.New("gpu: wgpu-native could not create an instance")
	}
	inst := new(wgpu.Instance)
	*(*C.WGPUInstance)(unsafe.Pointer(inst)) = ref
	return inst, nil
}
