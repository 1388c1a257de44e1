//go:build goexperiment.simd && amd64

#include "textflag.h"

// func int4Tile4x4(codes *byte, rowBytes int, scales *uint16, _ int, blocks int, x *[4]*float32, levels *[16]float32, out *[16]float32, scratch *float32)
//
// The dot products of four consecutive int4 weight rows with four input
// rows, for weights in groups of 32 columns (one f16 scale a block): the
// register-blocked kernel of a verification's rows. Each block widens the
// four weight rows once (codes → (code − 8)·s through VPERMPS from the
// group's 16 values) and multiplies them with the four inputs' block held
// in registers: 32 multiply-adds into 16 accumulators, all in the 32
// vector registers.
//
// codes:  row r's block b at codes + r·rowBytes + 16·b (two codes a byte,
//         the even column in the low nibble)
// scales: row r's block b at scales + 2·(r·blocks + b) (f16), widened
//         first into scratch (4·blocks floats; blocks even)
// x[i]:   input i's block b at x[i] + 128·b: 16 even columns, then 16 odd
// out:    out[4·i + r] = Σ_c W[r][c]·x_i[c]
//
// Registers: Z0–Z15 accumulators (4·r + i), Z16–Z23 the inputs' block
// (even, odd per input), Z24–Z28 a row's codes and weights, Z31 levels.
// CONVERT_SCALES widens the four rows' f16 scales (one a block, the rows
// one after the other: 4·blocks of them at R8, blocks even) to f32 in
// scratch, and leaves R8 at scratch, R11 at a row of them in bytes
// (4·blocks) and R12 equal to it: the loop then takes each block's scale
// as an embedded broadcast.
#define CONVERT_SCALES \
	MOVQ scratch+64(FP), R12     \
	MOVQ AX, R11                 \
	SHRQ $1, R11                 \
	XORQ R10, R10                \
convert:                         \
	CMPQ R10, R11                \
	JGE  converted               \
	MOVQ R10, R9                 \
	SHLQ $4, R9                  \
	VCVTPH2PS (R8)(R9*1), Y26    \
	VMOVUPS Y26, (R12)(R9*2)     \
	INCQ R10                     \
	JMP  convert                 \
converted:                       \
	MOVQ R12, R8                 \
	MOVQ AX, R11                 \
	SHLQ $2, R11                 \
	MOVQ R11, R12                \
	MOVQ rowBytes+8(FP), R9

TEXT ·int4Tile4x4(SB), NOSPLIT, $0-72
	MOVQ codes+0(FP), SI
	MOVQ rowBytes+8(FP), R9
	MOVQ scales+16(FP), R8
	MOVQ blocks+32(FP), AX
	MOVQ x+40(FP), R13
	MOVQ levels+48(FP), R12
	VMOVUPS (R12), Z31
	CONVERT_SCALES
	MOVQ 0(R13), DI
	MOVQ 8(R13), BX
	MOVQ 16(R13), CX
	MOVQ 24(R13), DX
	LEAQ (R9)(R9*2), R10   // 3·rowBytes
	LEAQ (R12)(R12*2), R12 // 3 rows of f32 scales, bytes
	XORQ R13, R13          // byte offset into the inputs
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	TESTQ AX, AX
	JEQ   reduce

// ROW widens one weight row's block (its codes at CODES, its scale at
// SCALE) and adds its products with the four inputs into A0–A3.
#define ROW(CODES, SCALE, A0, A1, A2, A3) \
	VPMOVZXBD   CODES, Z24       \
	VPSRLD      $4, Z24, Z25     \
	VMULPS.BCST SCALE, Z31, Z26  \
	VPERMPS     Z26, Z24, Z27    \
	VPERMPS     Z26, Z25, Z28    \
	VFMADD231PS Z16, Z27, A0     \
	VFMADD231PS Z18, Z27, A1     \
	VFMADD231PS Z20, Z27, A2     \
	VFMADD231PS Z22, Z27, A3     \
	VFMADD231PS Z17, Z28, A0     \
	VFMADD231PS Z19, Z28, A1     \
	VFMADD231PS Z21, Z28, A2     \
	VFMADD231PS Z23, Z28, A3

loop:
	VMOVUPS (DI)(R13*1), Z16
	VMOVUPS 64(DI)(R13*1), Z17
	VMOVUPS (BX)(R13*1), Z18
	VMOVUPS 64(BX)(R13*1), Z19
	VMOVUPS (CX)(R13*1), Z20
	VMOVUPS 64(CX)(R13*1), Z21
	VMOVUPS (DX)(R13*1), Z22
	VMOVUPS 64(DX)(R13*1), Z23
	ROW((SI), (R8), Z0, Z1, Z2, Z3)
	ROW((SI)(R9*1), (R8)(R11*1), Z4, Z5, Z6, Z7)
	ROW((SI)(R9*2), (R8)(R11*2), Z8, Z9, Z10, Z11)
	ROW((SI)(R10*1), (R8)(R12*1), Z12, Z13, Z14, Z15)
	ADDQ $16, SI
	ADDQ $4, R8
	ADDQ $128, R13
	DECQ AX
	JNZ  loop

reduce:
	MOVQ out+56(FP), DI

// SUM4 stores input I's four sums (rows 0–3: A, B, C, D) at OFF(DI).
#define SUM4(A, B, C, D, YA, YB, YC, YD, XA, OFF) \
	VEXTRACTF64X4 $1, A, Y24       \
	VADDPS        Y24, YA, YA      \
	VEXTRACTF64X4 $1, B, Y25       \
	VADDPS        Y25, YB, YB      \
	VEXTRACTF64X4 $1, C, Y26       \
	VADDPS        Y26, YC, YC      \
	VEXTRACTF64X4 $1, D, Y27       \
	VADDPS        Y27, YD, YD      \
	VHADDPS       YB, YA, YA       \
	VHADDPS       YD, YC, YC       \
	VHADDPS       YC, YA, YA       \
	VEXTRACTF32X4 $1, YA, X24      \
	VADDPS        X24, XA, XA      \
	VMOVUPS       XA, OFF(DI)

	SUM4(Z0, Z4, Z8, Z12, Y0, Y4, Y8, Y12, X0, 0)
	SUM4(Z1, Z5, Z9, Z13, Y1, Y5, Y9, Y13, X1, 16)
	SUM4(Z2, Z6, Z10, Z14, Y2, Y6, Y10, Y14, X2, 32)
	SUM4(Z3, Z7, Z11, Z15, Y3, Y7, Y11, Y15, X3, 48)
	VZEROUPPER
	RET

// func int4Tile4x2(codes *byte, rowBytes int, scales *uint16, rowScales int, blocks int, x *[4]*float32, levels *[16]float32, out *[16]float32, scratch *float32)
//
// int4Tile4x4 for two inputs (x[0], x[1]): out[4·i + r] for i < 2.
// Registers: Z0–Z7 accumulators (2·r + i), Z16–Z19 the inputs' block.
TEXT ·int4Tile4x2(SB), NOSPLIT, $0-72
	MOVQ codes+0(FP), SI
	MOVQ rowBytes+8(FP), R9
	MOVQ scales+16(FP), R8
	MOVQ blocks+32(FP), AX
	MOVQ x+40(FP), R13
	MOVQ levels+48(FP), R12
	VMOVUPS (R12), Z31
	CONVERT_SCALES
	MOVQ 0(R13), DI
	MOVQ 8(R13), BX
	LEAQ (R9)(R9*2), R10
	LEAQ (R12)(R12*2), R12
	XORQ R13, R13
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	TESTQ AX, AX
	JEQ   reduce2

#define ROW2(CODES, SCALE, A0, A1) \
	VPMOVZXBD   CODES, Z24       \
	VPSRLD      $4, Z24, Z25     \
	VMULPS.BCST SCALE, Z31, Z26  \
	VPERMPS     Z26, Z24, Z27    \
	VPERMPS     Z26, Z25, Z28    \
	VFMADD231PS Z16, Z27, A0     \
	VFMADD231PS Z18, Z27, A1     \
	VFMADD231PS Z17, Z28, A0     \
	VFMADD231PS Z19, Z28, A1

loop2:
	VMOVUPS (DI)(R13*1), Z16
	VMOVUPS 64(DI)(R13*1), Z17
	VMOVUPS (BX)(R13*1), Z18
	VMOVUPS 64(BX)(R13*1), Z19
	ROW2((SI), (R8), Z0, Z1)
	ROW2((SI)(R9*1), (R8)(R11*1), Z2, Z3)
	ROW2((SI)(R9*2), (R8)(R11*2), Z4, Z5)
	ROW2((SI)(R10*1), (R8)(R12*1), Z6, Z7)
	ADDQ $16, SI
	ADDQ $4, R8
	ADDQ $128, R13
	DECQ AX
	JNZ  loop2

reduce2:
	MOVQ out+56(FP), DI
	SUM4(Z0, Z2, Z4, Z6, Y0, Y2, Y4, Y6, X0, 0)
	SUM4(Z1, Z3, Z5, Z7, Y1, Y3, Y5, Y7, X1, 16)
	VZEROUPPER
	RET

// func int4Tile4x1(codes *byte, rowBytes int, scales *uint16, rowScales int, blocks int, x *[4]*float32, levels *[16]float32, out *[16]float32, scratch *float32)
//
// int4Tile4x4 for one input (x[0]): out[r] for the four rows. The even and
// the odd columns have accumulators of their own (Z0–Z3, Z4–Z7), so that
// every multiply-add of a block starts a chain of its own.
TEXT ·int4Tile4x1(SB), NOSPLIT, $0-72
	MOVQ codes+0(FP), SI
	MOVQ rowBytes+8(FP), R9
	MOVQ scales+16(FP), R8
	MOVQ blocks+32(FP), AX
	MOVQ x+40(FP), R13
	MOVQ levels+48(FP), R12
	VMOVUPS (R12), Z31
	CONVERT_SCALES
	MOVQ 0(R13), DI
	LEAQ (R9)(R9*2), R10
	LEAQ (R12)(R12*2), R12
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	TESTQ AX, AX
	JEQ   reduce1

#define ROW1(CODES, SCALE, E, O) \
	VPMOVZXBD   CODES, Z24       \
	VPSRLD      $4, Z24, Z25     \
	VMULPS.BCST SCALE, Z31, Z26  \
	VPERMPS     Z26, Z24, Z27    \
	VPERMPS     Z26, Z25, Z28    \
	VFMADD231PS Z16, Z27, E      \
	VFMADD231PS Z17, Z28, O

loop1:
	VMOVUPS (DI), Z16
	VMOVUPS 64(DI), Z17
	ROW1((SI), (R8), Z0, Z4)
	ROW1((SI)(R9*1), (R8)(R11*1), Z1, Z5)
	ROW1((SI)(R9*2), (R8)(R11*2), Z2, Z6)
	ROW1((SI)(R10*1), (R8)(R12*1), Z3, Z7)
	ADDQ $16, SI
	ADDQ $4, R8
	ADDQ $128, DI
	DECQ AX
	JNZ  loop1

reduce1:
	MOVQ out+56(FP), DI
	VADDPS Z4, Z0, Z0
	VADDPS Z5, Z1, Z1
	VADDPS Z6, Z2, Z2
	VADDPS Z7, Z3, Z3
	SUM4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0, 0)
	VZEROUPPER
	RET
