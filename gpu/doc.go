// Package gpu is webdraft's WebGPU runtime: it opens a device, uploads and
// reads back buffers, compiles and caches compute pipelines, records many
// dispatches into one compute pass (and captures them, to replay into
// later passes: Recording), and turns device errors into Go errors.
// It knows nothing of Qwen3; package kernels builds the model's operations
// on it.
//
// It runs on github.com/cogentcore/webgpu v0.23.0: natively through the
// wgpu-native static library it bundles (Vulkan, Metal, D3D12), and in the
// browser (GOOS=js) through navigator.gpu. Files ending in _native.go are the
// cgo side, files ending in _js.go the browser side; the rest is shared.
//
// # Things about the library that shape this package
//
//   - Bind-group and pipeline layouts are always explicit (the js backend has
//     no GetBindGroupLayout). A kernel declares its bindings in a Kernel: a
//     uniform params struct at binding 0, then its storage buffers at 1, 2, ….
//   - The WGSL compiler inside the bundled wgpu-native (naga, early 2024)
//     knows neither `override` declarations nor `enable f16`. Tuning constants
//     are therefore plain `const NAME: u32 = …;` declarations that Pipeline
//     can specialize (see Specialize) — the one rewriting step, keyed in the
//     pipeline cache like an override would be — and every shader reads f16
//     data as packed u32 pairs with unpack2x16float, which works with or
//     without the shader-f16 feature. Open still requests shader-f16 when the
//     adapter has it and reports it (Device.F16).
//   - WGSL has no synchronization across the workgroups of a dispatch, and
//     the specification gives storageBarrier workgroup scope only. naga,
//     though, compiles it to OpControlBarrier with Device memory scope
//     (MEMBAR.SC.GPU on an NVIDIA H200), so natively on Vulkan a dispatch's
//     last workgroup to arrive can finish the others' work: Device.
//     DeviceScopeBarrier says where, and CountedScratch keeps the arrival
//     counters. Elsewhere kernels take one more dispatch.
//   - wgpu-native aborts the process on an error that no error scope catches.
//     Open therefore keeps catch-all error scopes (validation and
//     out-of-memory; the browser also gets internal) open on the device for
//     its whole life; Batch.Submit, Buffer.Read, buffer and pipeline
//     creation pop them, turn what they caught into a Go error, and push
//     them again. The browser gets the same treatment through its
//     pushErrorScope/popErrorScope, so both report errors the same way. In
//     the browser a lost device is reported by every later call; natively it
//     shows as the errors of those calls (the library's device-lost callback
//     breaks cgo's pointer rules and cannot be used).
//
// # Concurrency
//
// A Device, its Buffers and its Batches must be used from one goroutine at a
// time: WebGPU error scopes are per device, so interleaved calls would blame
// each other's errors. The engine above owns one GPU goroutine. The one
// exception is Device.BuildAhead, whose workers compile pipelines at once
// while its caller waits.
package gpu
