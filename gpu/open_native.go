//go:build !js

package gpu

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cogentcore/webgpu/wgpu"
)

// Open picks the best adapter of the primary backends (Vulkan, Metal,
// D3D12) — a discrete GPU first, then integrated, then anything else (such
// as lavapipe, unless opts.HardwareOnly) — and opens a device on it with
// explicit limits and, unless opts.NoF16, shader-f16 where offered. wgpu's
// OpenGL backend is left out: its compute support is partial and its EGL
// start-up can abort the process.
func Open(opts Options) (*Device, error) {
	wgpu.SetLogLevel(wgpu.LogLevelOff) // errors reach us as Go errors instead
	quietWaylandProbe()
	inst, err := newInstance(wgpu.InstanceBackendPrimary)
	if err != nil {
		return nil, err
	}
	defer inst.Release()
	adapters := inst.EnumerateAdapters(nil)
	if len(adapters) == 0 {
		return nil, ErrNoAdapter
	}
	defer func() {
		for _, a := range adapters {
			a.Release()
		}
	}()
	best := slices.MinFunc(adapters, func(a, b *wgpu.Adapter) int {
		return cmp.Compare(typeRank(a.GetInfo().AdapterType), typeRank(b.GetInfo().AdapterType))
	})

	wi := best.GetInfo()
	info := AdapterInfo{Name: adapterName(wi), Type: wi.AdapterType.String(), Backend: wi.BackendType.String()}
	if opts.HardwareOnly && info.Software() {
		// The best is a software renderer: so are all the others.
		return nil, fmt.Errorf("%w (%s)", ErrNoHardwareAdapter, info)
	}
	for _, f := range best.EnumerateFeatures() {
		info.Features = append(info.Features, f.String())
	}
	f16 := !opts.NoF16 && best.HasFeature(wgpu.FeatureNameShaderF16)
	var features []wgpu.FeatureName
	if f16 {
		features = append(features, wgpu.FeatureNameShaderF16)
	}
	// Timestamp queries, where offered, let Batch profile dispatches.
	timestamps := best.HasFeature(wgpu.FeatureNameTimestampQuery)
	if timestamps {
		features = append(features, wgpu.FeatureNameTimestampQuery)
	}
	limits := fromWGPU(best.GetLimits().Limits).request(opts)

	// No DeviceLostCallback: the library passes it to C in a way cgo's
	// pointer checks reject (a panic). A lost device shows up natively as
	// the errors of the calls that follow it.
	dev, err := best.RequestDevice(&wgpu.DeviceDescriptor{
		Label:            "webdraft",
		RequiredFeatures: features,
		RequiredLimits:   &wgpu.RequiredLimits{Limits: limits.toWGPU()},
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: %s: requesting a device with limits %+v: %w", info, limits, err)
	}
	granted := fromWGPU(dev.GetLimits().Limits)
	d, err := newDevice(dev, info, granted, f16, newErrorScopes(dev))
	if err == nil {
		d.timestamps = timestamps
		// naga's SPIR-V for storageBarrier: OpControlBarrier(Workgroup,
		// Device, AcquireRelease | UniformMemory).
		d.deviceBarrier = wi.BackendType == wgpu.BackendTypeVulkan
	}
	return d, err
}

// adapterName returns the adapter's human name. The wgpu-native build inside
// the library fills AdapterInfo's fields one place off: the adapter's name
// arrives as DriverDescription and Name holds the device id ("0x0"). Take
// the first field that does not look like a hex id.
func adapterName(wi wgpu.AdapterInfo) string {
	for _, s := range []string{wi.Name, wi.DriverDescription, wi.VendorName} {
		if s != "" && !strings.HasPrefix(s, "0x") {
			return s
		}
	}
	return fmt.Sprintf("adapter %#x:%#x", wi.VendorId, wi.DeviceId)
}

// quietWaylandProbe keeps libwayland-client from printing "error:
// XDG_RUNTIME_DIR is invalid or not set in the environment." once for each
// of Mesa's Vulkan drivers: they look for a Wayland display when the
// instance starts, and a server or a CI job has no session directory. A
// compute device needs no display; with the variable pointing at the temp
// directory (where no Wayland socket is) the probe fails quietly. A set
// variable is left alone.
func quietWaylandProbe() {
	if dir := os.Getenv("XDG_RUNTIME_DIR"); !strings.HasPrefix(dir, "/") {
		os.Setenv("XDG_RUNTIME_DIR", os.TempDir())
	}
}

func typeRank(t wgpu.AdapterType) int {
	switch t {
	case wgpu.AdapterTypeDiscreteGPU:
		return 0
	case wgpu.AdapterTypeIntegratedGPU:
		return 1
	case wgpu.AdapterTypeCPU:
		return 3
	}
	return 2
}

func fromWGPU(l wgpu.Limits) Limits {
	return Limits{
		MaxBufferSize:                     l.MaxBufferSize,
		MaxStorageBufferBindingSize:       l.MaxStorageBufferBindingSize,
		MaxUniformBufferBindingSize:       l.MaxUniformBufferBindingSize,
		MaxStorageBuffersPerShaderStage:   l.MaxStorageBuffersPerShaderStage,
		MaxComputeWorkgroupStorageSize:    l.MaxComputeWorkgroupStorageSize,
		MaxComputeInvocationsPerWorkgroup: l.MaxComputeInvocationsPerWorkgroup,
		MaxComputeWorkgroupSizeX:          l.MaxComputeWorkgroupSizeX,
		MaxComputeWorkgroupsPerDimension:  l.MaxComputeWorkgroupsPerDimension,
		MinStorageBufferOffsetAlignment:   l.MinStorageBufferOffsetAlignment,
		MinUniformBufferOffsetAlignment:   l.MinUniformBufferOffsetAlignment,
	}
}

// toWGPU returns wgpu's limits with ours set and every other one left
// "undefined" (the WebGPU default).
func (l Limits) toWGPU() wgpu.Limits {
	w := wgpu.DefaultLimits()
	w.MaxBufferSize = l.MaxBufferSize
	w.MaxStorageBufferBindingSize = l.MaxStorageBufferBindingSize
	w.MaxUniformBufferBindingSize = l.MaxUniformBufferBindingSize
	w.MaxStorageBuffersPerShaderStage = l.MaxStorageBuffersPerShaderStage
	w.MaxComputeWorkgroupStorageSize = l.MaxComputeWorkgroupStorageSize
	w.MaxComputeInvocationsPerWorkgroup = l.MaxComputeInvocationsPerWorkgroup
	w.MaxComputeWorkgroupSizeX = l.MaxComputeWorkgroupSizeX
	w.MaxComputeWorkgroupsPerDimension = l.MaxComputeWorkgroupsPerDimension
	w.MinStorageBufferOffsetAlignment = l.MinStorageBufferOffsetAlignment
	w.MinUniformBufferOffsetAlignment = l.MinUniformBufferOffsetAlignment
	w.MaxPushConstantSize = 0
	return w
}
