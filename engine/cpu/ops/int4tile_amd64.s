//go:build goexperiment.simd && amd64

#include "textflag.h"

// The int4 matrix kernels: groups × 4 consecutive weight rows, each
// dotted with N = 4, 2 or 1 input rows (int4Rows4x4, int4Rows4x2,
// int4Rows4x1), for weights in groups of 32 columns (one f16 scale a
// block):
//
// func int4Rows4xN(codes *byte, rowBytes int, scales *uint16, blocks int, groups int, x *[4]*float32, levels *[16]float32, scratch *float32, out *float32, ldBytes int, add int, inputs int)
//
// codes:   row r's block b at codes + r·rowBytes + 16·b (two codes a byte,
//          the even column in the low nibble); rowBytes = 16·blocks
// scales:  row r's block b at scales + 2·(r·blocks + b) (f16)
// x[i]:    input i's block b at x[i] + 128·b: its 16 even columns, then
//          its 16 odd ones (ops' blocked layout)
// scratch: 4·blocks floats: a group's scales widened to f32 (blocks even)
// out:     input i's result for row r of group g at
//          out + i·ldBytes + 4·(4g + r), stored, or added with add ≠ 0,
//          for the first inputs inputs (the four-input kernel also serves
//          three: its fourth input repeats the third, and is not written)
//
// Each block widens each of the four weight rows once — codes → (code −
// 8)·s by VPERMPS from the block's 16 values, the scale an embedded
// broadcast — and multiplies it with the N inputs' block, held in
// registers: 8·N multiply-adds into 4·N accumulators. The sums are reduced
// four rows at a time (the horizontal adds shared) and written as four
// floats an input.
//
// Registers: Z0–Z15 accumulators, Z16–Z23 the inputs' block (even, odd
// for each input), Z24–Z28 a row's codes and weights, Z31 levels.
// SI codes, R8 the widened scales, R9/R10 1 and 3 rows of codes, R11/R12
// 1 and 3 rows of widened scales, R13 the inputs' offset, R14 the f16
// scales, R15 out, AX blocks left, DI/BX/CX/DX the inputs.

// PROLOGUE loads what every group shares.
#define PROLOGUE \
	MOVQ levels+48(FP), R12  \
	VMOVUPS (R12), Z31       \
	MOVQ x+40(FP), R13       \
	MOVQ 0(R13), DI          \
	MOVQ 8(R13), BX          \
	MOVQ 16(R13), CX         \
	MOVQ 24(R13), DX         \
	MOVQ codes+0(FP), SI     \
	MOVQ scales+16(FP), R14  \
	MOVQ out+64(FP), R15     \
	MOVQ groups+32(FP), AX   \
	MOVQ AX, left-8(SP)

// GROUP asks for the codes of the group three ahead (prefetch), widens
// the group's scales into scratch (R14 moves on to the next group's) and
// sets up the block loop's registers.
#define GROUP \
	MOVQ rowBytes+8(FP), R10 \
	LEAQ (R10)(R10*2), R9    \
	LEAQ (SI)(R9*4), R9      \
	SHLQ $2, R10             \
	ADDQ R9, R10             \
prefetch:                    \
	PREFETCHT0 (R9)          \
	ADDQ $64, R9             \
	CMPQ R9, R10             \
	JLT  prefetch            \
	MOVQ scratch+56(FP), R12 \
	MOVQ blocks+24(FP), R10  \
	SHLQ $3, R10             \
	XORQ R9, R9              \
convert:                     \
	CMPQ R9, R10             \
	JGE  converted           \
	VCVTPH2PS (R14)(R9*1), Y26 \
	VMOVUPS Y26, (R12)(R9*2) \
	ADDQ $16, R9             \
	JMP  convert             \
converted:                   \
	ADDQ R10, R14            \
	MOVQ R12, R8             \
	MOVQ blocks+24(FP), R11  \
	SHLQ $2, R11             \
	LEAQ (R11)(R11*2), R12   \
	MOVQ rowBytes+8(FP), R9  \
	LEAQ (R9)(R9*2), R10     \
	XORQ R13, R13            \
	MOVQ blocks+24(FP), AX

// WIDEN widens one weight row's block (its codes at CODES, its f32 scale
// at SCALE) into Z27 (even columns) and Z28 (odd).
#define WIDEN(CODES, SCALE) \
	VPMOVZXBD   CODES, Z24       \
	VPSRLD      $4, Z24, Z25     \
	VMULPS.BCST SCALE, Z31, Z26  \
	VPERMPS     Z26, Z24, Z27    \
	VPERMPS     Z26, Z25, Z28

// NEXT advances to the next block, and loops.
#define NEXT(LOOP) \
	ADDQ $16, SI   \
	ADDQ $4, R8    \
	ADDQ $128, R13 \
	DECQ AX        \
	JNZ  LOOP

// SUM4 reduces four accumulators (rows 0–3 of one input) to XA: the four
// rows' sums.
#define SUM4(A, B, C, D, YA, YB, YC, YD, XA) \
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
	VADDPS        X24, XA, XA

// PUT stores (or with add, adds) XA's four sums at ADDR.
#define PUT(XA, ADDR) \
	CMPQ add+80(FP), $0 \
	JEQ  2(PC)          \
	VADDPS ADDR, XA, XA \
	VMOVUPS XA, ADDR

// EPILOGUE moves to the next group: codes past the group's four rows,
// out past its four sums.
#define EPILOGUE(GROUPLOOP) \
	ADDQ R10, SI          \
	ADDQ $16, R15         \
	DECQ left-8(SP)       \
	JMP  GROUPLOOP

#define ZERO(Z) VPXORD Z, Z, Z

TEXT ·int4Rows4x4(SB), NOSPLIT, $8-96
	PROLOGUE
group4:
	CMPQ left-8(SP), $0
	JEQ  done4
	GROUP
	ZERO(Z0); ZERO(Z1); ZERO(Z2); ZERO(Z3); ZERO(Z4); ZERO(Z5); ZERO(Z6); ZERO(Z7)
	ZERO(Z8); ZERO(Z9); ZERO(Z10); ZERO(Z11); ZERO(Z12); ZERO(Z13); ZERO(Z14); ZERO(Z15)

#define FMA4(A0, A1, A2, A3) \
	VFMADD231PS Z16, Z27, A0 \
	VFMADD231PS Z18, Z27, A1 \
	VFMADD231PS Z20, Z27, A2 \
	VFMADD231PS Z22, Z27, A3 \
	VFMADD231PS Z17, Z28, A0 \
	VFMADD231PS Z19, Z28, A1 \
	VFMADD231PS Z21, Z28, A2 \
	VFMADD231PS Z23, Z28, A3

loop4:
	VMOVUPS (DI)(R13*1), Z16
	VMOVUPS 64(DI)(R13*1), Z17
	VMOVUPS (BX)(R13*1), Z18
	VMOVUPS 64(BX)(R13*1), Z19
	VMOVUPS (CX)(R13*1), Z20
	VMOVUPS 64(CX)(R13*1), Z21
	VMOVUPS (DX)(R13*1), Z22
	VMOVUPS 64(DX)(R13*1), Z23
	WIDEN((SI), (R8))
	FMA4(Z0, Z1, Z2, Z3)
	WIDEN((SI)(R9*1), (R8)(R11*1))
	FMA4(Z4, Z5, Z6, Z7)
	WIDEN((SI)(R9*2), (R8)(R11*2))
	FMA4(Z8, Z9, Z10, Z11)
	WIDEN((SI)(R10*1), (R8)(R12*1))
	FMA4(Z12, Z13, Z14, Z15)
	NEXT(loop4)

	SUM4(Z0, Z4, Z8, Z12, Y0, Y4, Y8, Y12, X0)
	SUM4(Z1, Z5, Z9, Z13, Y1, Y5, Y9, Y13, X1)
	SUM4(Z2, Z6, Z10, Z14, Y2, Y6, Y10, Y14, X2)
	SUM4(Z3, Z7, Z11, Z15, Y3, Y7, Y11, Y15, X3)
	MOVQ ldBytes+72(FP), R9
	LEAQ (R9)(R9*2), R11
	PUT(X0, (R15))
	PUT(X1, (R15)(R9*1))
	PUT(X2, (R15)(R9*2))
	CMPQ inputs+88(FP), $4
	JLT  skip4
	PUT(X3, (R15)(R11*1))
skip4:
	EPILOGUE(group4)
done4:
	VZEROUPPER
	RET

TEXT ·int4Rows4x2(SB), NOSPLIT, $8-96
	PROLOGUE
group2:
	CMPQ left-8(SP), $0
	JEQ  done2
	GROUP
	ZERO(Z0); ZERO(Z1); ZERO(Z2); ZERO(Z3); ZERO(Z4); ZERO(Z5); ZERO(Z6); ZERO(Z7)

#define FMA2(A0, A1) \
	VFMADD231PS Z16, Z27, A0 \
	VFMADD231PS Z18, Z27, A1 \
	VFMADD231PS Z17, Z28, A0 \
	VFMADD231PS Z19, Z28, A1

loop2:
	VMOVUPS (DI)(R13*1), Z16
	VMOVUPS 64(DI)(R13*1), Z17
	VMOVUPS (BX)(R13*1), Z18
	VMOVUPS 64(BX)(R13*1), Z19
	WIDEN((SI), (R8))
	FMA2(Z0, Z1)
	WIDEN((SI)(R9*1), (R8)(R11*1))
	FMA2(Z2, Z3)
	WIDEN((SI)(R9*2), (R8)(R11*2))
	FMA2(Z4, Z5)
	WIDEN((SI)(R10*1), (R8)(R12*1))
	FMA2(Z6, Z7)
	NEXT(loop2)

	SUM4(Z0, Z2, Z4, Z6, Y0, Y2, Y4, Y6, X0)
	SUM4(Z1, Z3, Z5, Z7, Y1, Y3, Y5, Y7, X1)
	MOVQ ldBytes+72(FP), R9
	PUT(X0, (R15))
	PUT(X1, (R15)(R9*1))
	EPILOGUE(group2)
done2:
	VZEROUPPER
	RET

// The one-input kernel keeps the even and the odd columns in
// accumulators of their own (Z0–Z3, Z4–Z7): eight chains of one
// multiply-add a block.
TEXT ·int4Rows4x1(SB), NOSPLIT, $8-96
	PROLOGUE
group1:
	CMPQ left-8(SP), $0
	JEQ  done1
	GROUP
	ZERO(Z0); ZERO(Z1); ZERO(Z2); ZERO(Z3); ZERO(Z4); ZERO(Z5); ZERO(Z6); ZERO(Z7)

#define FMA1(E, O) \
	VFMADD231PS Z16, Z27, E \
	VFMADD231PS Z17, Z28, O

loop1:
	VMOVUPS (DI)(R13*1), Z16
	VMOVUPS 64(DI)(R13*1), Z17
	WIDEN((SI), (R8))
	FMA1(Z0, Z4)
	WIDEN((SI)(R9*1), (R8)(R11*1))
	FMA1(Z1, Z5)
	WIDEN((SI)(R9*2), (R8)(R11*2))
	FMA1(Z2, Z6)
	WIDEN((SI)(R10*1), (R8)(R12*1))
	FMA1(Z3, Z7)
	NEXT(loop1)

	VADDPS Z4, Z0, Z0
	VADDPS Z5, Z1, Z1
	VADDPS Z6, Z2, Z2
	VADDPS Z7, Z3, Z3
	SUM4(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0)
	PUT(X0, (R15))
	EPILOGUE(group1)
done1:
	VZEROUPPER
	RET
