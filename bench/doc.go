// Package bench measures a WebGPU device and the engine on it, for
// `webdraft bench engine`: the yardsticks every figure is compared with
// (copy bandwidth, the f32 multiply-add rate, a dispatch's fixed cost), int4
// matrix × vector at a model's shapes, decode steps and prefill, the GPU
// time per kernel, and the floor of a batch-1 decode step — its dependent
// passes reduced to reading their bytes. Its two kernels (fma.wgsl,
// stream_read.wgsl) measure the device and are no part of a model.
package bench
