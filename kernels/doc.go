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
package kernels
