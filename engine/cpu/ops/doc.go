// Package ops is the CPU engine's arithmetic: matrix products over int4
// weights read in place (no f32 copy of a model), attention, and the row
// reductions a read-out needs, vectorized where the machine allows.
//
// On amd64 with AVX-512, built with GOEXPERIMENT=simd, the kernels run on
// 512-bit vectors, the rest through simd/archsimd. The int4 matrix
// products are in assembly, in one of two forms:
//
//   - with AVX-512 VNNI (int4fixed_amd64.s): sixteen weight rows, one a
//     vector lane, against up to eight input rows in fixed point, by
//     VPDPBUSD's byte products summed exactly in int32. An input row is
//     held per 32-column block as a scale and 24-bit integers in three
//     int8 parts (Input), as precise as f32; the matrix is repacked once
//     at load (packFixed: the same int4 bytes in the kernel's order). The
//     same kernel over the two high parts alone (Linear.Screen) screens
//     a product to 16 bits of each input, with a bound on its distance
//     from the exact one (screen.go).
//   - without it (int4tile_amd64.s): four weight rows against one, two or
//     four input rows in f32, the codes read in place and widened by
//     VPERMPS. Those inputs are in the blocked layout of Permute: each
//     32-column block as its 16 even columns, then its 16 odd ones — the
//     order of an int4 word's low and high nibbles.
//
// Anywhere else (arm64, an older amd64, a toolchain without the
// experiment) the same functions run as portable Go. All are tested
// against package reference, the plain-Go oracle; an Input is prepared
// once for every matrix that reads it.
package ops
