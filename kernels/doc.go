// Package kernels is the Go side of webdraft's WGSL kernels (package
// shaders): one function per operation that checks its shapes, builds its
// params, works out its dispatch grid, and records it into a gpu.Batch the
// caller provides. Nothing is submitted here; the caller decides how many
// operations share a batch (about one forward pass).
//
// Shapes follow package reference: T is the number of activation rows
// (tokens), K a matrix's input features and N its output features, H
// hidden_size, D head_dim. Activations are row-major f32 buffers. Every
// function is tested against its plain-Go twin in package reference on
// random shapes.
//
// The files: kvcache.go the paged KV cache, which owns its pool, block
// tables and feature rows (kvmove.go moves a kept path's slots);
// plan.go the measured choices among kernels, a table per adapter
// class; matmul.go the matmul entry points, and a file per int4 matmul
// family (matmul_rowtile.go, matvec.go, matvec_batch.go, skinny.go,
// gemm.go, splitk.go); qkv.go, attention.go, embed.go, norm.go, argmax.go
// and copy.go the rest of a forward pass; gather.go rows moved by index
// (a target's features, an EAGLE-3 head's rows); matrix.go the weights on
// the device. Each kernel's params are a Go struct held to its WGSL twin by
// gpu.CheckParams.
package kernels
