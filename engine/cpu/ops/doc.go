// Package ops is the CPU engine's arithmetic: matrix products over int4
// weights read in place (no f32 copy of a model), attention, and the row
// reductions a read-out needs, vectorized where the machine allows.
//
// On amd64 with AVX-512, built with GOEXPERIMENT=simd, the kernels run on
// 512-bit vectors: the int4 matrix products in assembly
// (int4tile_amd64.s: four weight rows against one, two or four input
// rows, all 32 vector registers), the rest through simd/archsimd; anywhere
// else (arm64, an older amd64, a toolchain without the experiment) the
// same functions run as portable Go. Both are tested against package
// reference, the plain-Go oracle.
//
// Matrix products read their input rows in the blocked layout of
// Permute: each 32-column block as its 16 even columns, then its 16 odd
// ones — the order of an int4 word's low and high nibbles — so that a
// block of codes widens to two vectors whose lanes meet the input's in
// order. Permute is applied once to an input row and serves every weight
// row it meets.
package ops
