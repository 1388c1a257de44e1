//go:build js

package gpu

import (
	"errors"
	"fmt"
	"syscall/js"

	"github.com/cogentcore/webgpu/jsx"
	"github.com/cogentcore/webgpu/wgpu"
)

// Open asks navigator.gpu for a high-performance adapter and opens a device
// on it with explicit limits and, unless opts.NoF16, shader-f16 where
// offered. The browser picks among adapters; the library's js backend
// cannot set limits or error handlers, so this talks to navigator.gpu
// directly and hands the device to the library.
//
// The page must have set globalThis.wasm to the result of instantiating the
// Go program (WebAssembly.instantiate or instantiateStreaming): the
// library's queue writes read the Go memory through
// wasm.instance.exports.mem, without a copy.
func Open(opts Options) (*Device, error) {
	if err := checkWasmGlobal(); err != nil {
		return nil, err
	}
	navGPU := js.Global().Get("navigator").Get("gpu")
	if !navGPU.Truthy() {
		return nil, ErrNoAdapter
	}
	adapter, ok := jsx.Await(navGPU.Call("requestAdapter", map[string]any{"powerPreference": "high-performance"}))
	if !ok || !adapter.Truthy() {
		return nil, ErrNoAdapter
	}

	info := AdapterInfo{Backend: "webgpu", Name: "WebGPU adapter"}
	if ai := adapter.Get("info"); ai.Truthy() {
		for _, key := range []string{"description", "device", "architecture", "vendor"} {
			if s := ai.Get(key); s.Truthy() && s.String() != "" {
				info.Name = s.String()
				break
			}
		}
	}
	if opts.HardwareOnly && info.Software() {
		return nil, fmt.Errorf("%w (%s)", ErrNoHardwareAdapter, info)
	}
	info.Features = featureNames(adapter.Get("features"))
	f16 := !opts.NoF16 && adapter.Get("features").Call("has", "shader-f16").Bool()

	limits := jsLimits(adapter.Get("limits")).request(opts)
	features := []any{}
	if f16 {
		features = append(features, "shader-f16")
	}
	desc := map[string]any{
		"label":            "webdraft",
		"requiredFeatures": features,
		"requiredLimits": map[string]any{
			"maxBufferSize":                     float64(limits.MaxBufferSize),
			"maxStorageBufferBindingSize":       float64(limits.MaxStorageBufferBindingSize),
			"maxUniformBufferBindingSize":       float64(limits.MaxUniformBufferBindingSize),
			"maxStorageBuffersPerShaderStage":   limits.MaxStorageBuffersPerShaderStage,
			"maxComputeWorkgroupStorageSize":    limits.MaxComputeWorkgroupStorageSize,
			"maxComputeInvocationsPerWorkgroup": limits.MaxComputeInvocationsPerWorkgroup,
			"maxComputeWorkgroupSizeX":          limits.MaxComputeWorkgroupSizeX,
			"maxComputeWorkgroupsPerDimension":  limits.MaxComputeWorkgroupsPerDimension,
			"minStorageBufferOffsetAlignment":   limits.MinStorageBufferOffsetAlignment,
			"minUniformBufferOffsetAlignment":   limits.MinUniformBufferOffsetAlignment,
		},
	}
	jsDev, ok := jsx.Await(adapter.Call("requestDevice", desc))
	if !ok || !jsDev.Truthy() {
		return nil, fmt.Errorf("gpu: %s: requesting a device with limits %+v failed", info, limits)
	}
	dev := wgpu.NewDevice(jsDev)
	return newDevice(&dev, info, jsLimits(jsDev.Get("limits")), f16, newErrorScopes(jsDev))
}

// featureNames lists the entries of a GPUSupportedFeatures setlike through
// the JavaScript iterator protocol (Array.from), which every implementation
// has: browsers' setlike also has forEach, but Dawn's for Node (the npm
// package webgpu's dawn.node) has only has, keys, size and Symbol.iterator.
func featureNames(set js.Value) []string {
	arr := js.Global().Get("Array").Call("from", set)
	names := make([]string, arr.Length())
	for i := range names {
		names[i] = arr.Index(i).String()
	}
	return names
}

// jsLimits reads a GPUSupportedLimits object.
func jsLimits(l js.Value) Limits {
	return Limits{
		MaxBufferSize:                     uint64(l.Get("maxBufferSize").Float()),
		MaxStorageBufferBindingSize:       uint64(l.Get("maxStorageBufferBindingSize").Float()),
		MaxUniformBufferBindingSize:       uint64(l.Get("maxUniformBufferBindingSize").Float()),
		MaxStorageBuffersPerShaderStage:   uint32(l.Get("maxStorageBuffersPerShaderStage").Int()),
		MaxComputeWorkgroupStorageSize:    uint32(l.Get("maxComputeWorkgroupStorageSize").Int()),
		MaxComputeInvocationsPerWorkgroup: uint32(l.Get("maxComputeInvocationsPerWorkgroup").Int()),
		MaxComputeWorkgroupSizeX:          uint32(l.Get("maxComputeWorkgroupSizeX").Int()),
		MaxComputeWorkgroupsPerDimension:  uint32(l.Get("maxComputeWorkgroupsPerDimension").Int()),
		MinStorageBufferOffsetAlignment:   uint32(l.Get("minStorageBufferOffsetAlignment").Int()),
		MinUniformBufferOffsetAlignment:   uint32(l.Get("minUniformBufferOffsetAlignment").Int()),
	}
}

// checkWasmGlobal reports a page that did not set globalThis.wasm, which the
// library's queue writes need (see Open); without the check the first
// buffer write panics on an undefined value.
func checkWasmGlobal() error {
	v := js.Global()
	for _, key := range []string{"wasm", "instance", "exports", "mem"} {
		if v = v.Get(key); v.Type() != js.TypeObject {
			return errors.New("gpu: globalThis.wasm.instance.exports.mem is missing: set globalThis.wasm to the result of WebAssembly.instantiateStreaming for the Go program before it runs")
		}
	}
	return nil
}
