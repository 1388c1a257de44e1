// Package shaders holds webdraft's WGSL compute kernels, one per file. Each
// file opens with what it computes, its buffer layouts, its dispatch shape
// and why its workgroup size; package kernels owns the Go side of each
// (shape checks, params, dispatch arithmetic) and tests it against its
// plain-Go twin in package reference.
//
// The WGSL is written for two compilers: the one inside the wgpu-native
// library that github.com/cogentcore/webgpu v0.23.0 bundles (naga, early
// 2024) and the browsers'. Hence:
//   - no `override`: tuning constants are `const NAME: u32 = …;`
//     declarations that a pipeline may specialize (gpu.Specialize), and
//     sizes derived from them are consts too (array sizes must be a single
//     name or literal);
//   - no `enable f16`: f16 data is stored as u32 pairs and read with
//     unpack2x16float, which needs no shader-f16 feature;
//   - no subgroup operations: reductions go through workgroup memory;
//   - binding 0 is a uniform Params struct of u32/f32 fields padded to a
//     multiple of 16 bytes; storage buffers follow at bindings 1, 2, … in
//     the order package kernels declares them.
//
// And for speed: naga clamps every dynamic index into a workgroup or
// private array (min(i, len − 1)), which the driver cannot fold into a
// load's offset. In a hot loop, index workgroup arrays so that what varies
// from read to read is a constant inner index once the driver unrolls the
// loop (skinny_int4.wgsl's xs[octet][i][v], not xs[k·TV + v]), and give a
// loop whose loads should go out together a fixed count. lab/nvsass shows
// what the driver made of a kernel.
//
// And workgroup memory is occupancy: on the H200 NVIDIA's driver fits about
// 56 KB of it an SM (8 KB a workgroup: 6 an SM; 12 KB: 4; 28 KB or more: 1;
// gpu's TestResidentWorkgroups), so a kernel's arrays share one region
// where their lifetimes allow (matvec_int4.wgsl's shm).
package shaders

import _ "embed"

// MatMulInt4 is matmul_int4.wgsl: out (+)= x · Wᵀ for int4 W.
//
//go:embed matmul_int4.wgsl
var MatMulInt4 string

// MatVecInt4 is matvec_int4.wgsl: out (+)= x · Wᵀ for int4 W and T ≤ 4 rows.
//
//go:embed matvec_int4.wgsl
var MatVecInt4 string

// MatVecBatchInt4 is matvec_batch_int4.wgsl: out (+)= x · Wᵀ for int4 W and
// 2–4 rows, one weight row a thread.
//
//go:embed matvec_batch_int4.wgsl
var MatVecBatchInt4 string

// GEMMInt4 is gemm_int4.wgsl: out (+)= x · Wᵀ for int4 W and many rows,
// tiled in workgroup memory, optionally split along K.
//
//go:embed gemm_int4.wgsl
var GEMMInt4 string

// SkinnyInt4 is skinny_int4.wgsl: out (+)= x · Wᵀ for int4 W and a few
// to some tens of rows, weights in registers, optionally split along K.
//
//go:embed skinny_int4.wgsl
var SkinnyInt4 string

// MatMulReduce is matmul_reduce.wgsl: the sum of a split-K matmul's parts.
//
//go:embed matmul_reduce.wgsl
var MatMulReduce string

// MatMulDense is matmul_dense.wgsl: out (+)= x · Wᵀ for dense f16 or f32 W.
//
//go:embed matmul_dense.wgsl
var MatMulDense string

// EmbedInt4 is embed_int4.wgsl: embedding gather from an int4 table.
//
//go:embed embed_int4.wgsl
var EmbedInt4 string

// EmbedDense is embed_dense.wgsl: embedding gather from an f16 or f32 table.
//
//go:embed embed_dense.wgsl
var EmbedDense string

// RMSNorm is rmsnorm.wgsl: RMSNorm over rows (hidden or per head).
//
//go:embed rmsnorm.wgsl
var RMSNorm string

// Copy is copy.wgsl: a 16-byte-word copy, the bandwidth yardstick.
//
//go:embed copy.wgsl
var Copy string

// Argmax is argmax.wgsl: the index of each row's largest value.
//
//go:embed argmax.wgsl
var Argmax string

// AttentionDecode is attention_decode.wgsl: split attention of single query
// rows over the KV cache (flash-decoding).
//
//go:embed attention_decode.wgsl
var AttentionDecode string

// AttentionMerge is attention_merge.wgsl: merges AttentionDecode's splits.
//
//go:embed attention_merge.wgsl
var AttentionMerge string

// AttentionPrefill is attention_prefill.wgsl: tiled causal attention of a
// sequence's new rows over the KV cache.
//
//go:embed attention_prefill.wgsl
var AttentionPrefill string

// QKVRopeKV is qkv_rope_kv.wgsl: q/k norms and RoPE from the stacked q/k/v
// projection (its rows, or its split-K partial sums, reduced on the way),
// with the keys and values appended to the KV cache (its header documents
// the cache layout).
//
//go:embed qkv_rope_kv.wgsl
var QKVRopeKV string
