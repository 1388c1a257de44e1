//go:build goexperiment.simd && amd64

#include "textflag.h"

// The fixed-point int4 matrix kernel: weight rows sixteen at a time, each
// vector lane one row, against up to eight input rows in 24-bit fixed
// point, with AVX-512 VNNI's VPDPBUSD (64 byte products a instruction);
// and int4Screen16, the same to 16 bits of each input (at the end).
//
// func int4Fixed16(codes *byte, scales *uint16, groups, bps int, x *byte, stride int, T int, out *float32, ldBytes int, blocks16 int, mask int, addMask int)
//
// codes:  the weights in the layout of packFixed: per 16-row block, per
//         32-column block, four 64-byte words; word j's byte 4r+i holds
//         row r's column 8j+i in its low nibble and column 8j+4+i in its
//         high one (codes 0…15, the weight code+8)
// scales: per 16-row block, per group, the 16 rows' f16 scales
// groups, bps: a row's groups, and its 32-column blocks a group
// x:      input t at x + t·stride: per 32-column block 96 bytes (hi[32],
//         mid[32], lo[32], int8: value v = 65536·hi + 256·mid + lo), then
//         per block 12 bytes (its scale s as f32, −8·Σv and −8·Σ(v − lo)
//         as int32); the row's fixed-point value is s·v (Input's layout)
// T:      inputs, 1…8
// out:    input t's result for row i of the 16-row block b at
//         out + t·ldBytes + 4·(16b + i), for the rows in mask (bit i),
//         added to what is there for the rows in addMask
// blocks16: 16-row blocks, one after the other
//
// A block of codes widens into eight registers of bytes (two
// instructions a 64-byte word), which every input then multiplies: the
// hi, mid and lo parts of its block in three chains of eight VPDPBUSD,
// each four columns broadcast to the sixteen rows, combined as
// 65536·Σcode·hi + 256·Σcode·mid + Σcode·lo − 8·Σv = Σ(code−8)·v, exact
// in int32, then scaled by the row's weight scale times the input's
// block scale into the row's f32 sum.
//
// Registers: Z0–Z7 the inputs' f32 sums, Z16–Z23 a block's codes, Z24 the
// group's weight scales, Z25 0x0F bytes, Z26–Z30 working. DI the inputs'
// block, SI their block's scale and corrections, R8 0, R9/R10/R11/R12 1, 3,
// 5 and 7 strides, R13 codes, R14 scales, R15 out, AX groups left, BX
// blocks left in the group, CX T, DX 16-row blocks left.

// INPUT multiplies the block of codes with one input's block (its offset
// from DI and SI is IDX, a scaled index register) into F: three chains
// of eight VPDPBUSD, one a part.
#define INPUT(IDX, F) \
	VPXORD Z26, Z26, Z26                  \
	VPXORD Z27, Z27, Z27                  \
	VPXORD Z29, Z29, Z29                  \
	VPDPBUSD.BCST 0(DI)(IDX), Z16, Z26 \
	VPDPBUSD.BCST 32(DI)(IDX), Z16, Z27 \
	VPDPBUSD.BCST 64(DI)(IDX), Z16, Z29 \
	VPDPBUSD.BCST 4(DI)(IDX), Z17, Z26 \
	VPDPBUSD.BCST 36(DI)(IDX), Z17, Z27 \
	VPDPBUSD.BCST 68(DI)(IDX), Z17, Z29 \
	VPDPBUSD.BCST 8(DI)(IDX), Z18, Z26 \
	VPDPBUSD.BCST 40(DI)(IDX), Z18, Z27 \
	VPDPBUSD.BCST 72(DI)(IDX), Z18, Z29 \
	VPDPBUSD.BCST 12(DI)(IDX), Z19, Z26 \
	VPDPBUSD.BCST 44(DI)(IDX), Z19, Z27 \
	VPDPBUSD.BCST 76(DI)(IDX), Z19, Z29 \
	VPDPBUSD.BCST 16(DI)(IDX), Z20, Z26 \
	VPDPBUSD.BCST 48(DI)(IDX), Z20, Z27 \
	VPDPBUSD.BCST 80(DI)(IDX), Z20, Z29 \
	VPDPBUSD.BCST 20(DI)(IDX), Z21, Z26 \
	VPDPBUSD.BCST 52(DI)(IDX), Z21, Z27 \
	VPDPBUSD.BCST 84(DI)(IDX), Z21, Z29 \
	VPDPBUSD.BCST 24(DI)(IDX), Z22, Z26 \
	VPDPBUSD.BCST 56(DI)(IDX), Z22, Z27 \
	VPDPBUSD.BCST 88(DI)(IDX), Z22, Z29 \
	VPDPBUSD.BCST 28(DI)(IDX), Z23, Z26 \
	VPDPBUSD.BCST 60(DI)(IDX), Z23, Z27 \
	VPDPBUSD.BCST 92(DI)(IDX), Z23, Z29 \
	VPSLLD $8, Z26, Z26                   \
	VPADDD Z27, Z26, Z26                  \
	VPSLLD $8, Z26, Z26                   \
	VPADDD Z29, Z26, Z26                  \
	VPADDD.BCST 4(SI)(IDX), Z26, Z26      \
	VCVTDQ2PS Z26, Z26                    \
	VMULPS.BCST 0(SI)(IDX), Z24, Z28      \
	VFMADD231PS Z28, Z26, F

// WIDEN unpacks the 64-byte word at OFF(R13) into LO (its low nibbles)
// and HI (its high ones).
#define WIDEN(OFF, LO, HI) \
	VMOVDQU64 OFF(R13), Z29 \
	VPSRLW $4, Z29, Z30     \
	VPANDQ Z25, Z29, LO     \
	VPANDQ Z25, Z30, HI

// STORE writes F to the 16 rows at R15, added to what is there in the
// rows of K2, for the rows of K1.
#define STORE(F) \
	VMOVUPS.Z (R15), K2, Z28 \
	VADDPS Z28, F, F         \
	VMOVUPS F, K1, (R15)

// KERNEL is the kernel's body over inputs of BLOCKBYTES bytes a 32-column
// block, each block multiplied into its input's sums by INPUTM. DI walks
// the inputs' blocks; SI their scales and corrections, which follow a
// row's groups·bps blocks.
#define KERNEL(INPUTM, BLOCKBYTES) \
	MOVQ codes+0(FP), R13 \
	MOVQ scales+8(FP), R14 \
	MOVQ stride+40(FP), R9 \
	LEAQ (R9)(R9*2), R10 \
	LEAQ (R9)(R9*4), R11 \
	LEAQ (R10)(R9*4), R12 \
	XORQ R8, R8 \
	MOVQ T+48(FP), CX \
	MOVQ out+56(FP), R15 \
	MOVQ blocks16+72(FP), DX \
	MOVQ mask+80(FP), AX \
	KMOVW AX, K1 \
	MOVQ addMask+88(FP), AX \
	KMOVW AX, K2 \
	MOVL $0x0F0F0F0F, AX \
	VPBROADCASTD AX, Z25 \
 \
rows16: \
	VPXORD Z0, Z0, Z0 \
	VPXORD Z1, Z1, Z1 \
	VPXORD Z2, Z2, Z2 \
	VPXORD Z3, Z3, Z3 \
	VPXORD Z4, Z4, Z4 \
	VPXORD Z5, Z5, Z5 \
	VPXORD Z6, Z6, Z6 \
	VPXORD Z7, Z7, Z7 \
	MOVQ x+32(FP), DI \
	MOVQ groups+16(FP), AX \
	IMULQ bps+24(FP), AX \
	IMULQ $BLOCKBYTES, AX \
	LEAQ (DI)(AX*1), SI \
	MOVQ groups+16(FP), AX \
 \
group: \
	VCVTPH2PS (R14), Z24 \
	ADDQ $32, R14 \
	MOVQ bps+24(FP), BX \
 \
block: \
	PREFETCHT0 1024(R13) \
	PREFETCHT0 1088(R13) \
	PREFETCHT0 1152(R13) \
	PREFETCHT0 1216(R13) \
	WIDEN(0, Z16, Z17) \
	WIDEN(64, Z18, Z19) \
	WIDEN(128, Z20, Z21) \
	WIDEN(192, Z22, Z23) \
	ADDQ $256, R13 \
	INPUTM(R8*1, Z0) \
	CMPQ CX, $1 \
	JEQ  inputsDone \
	INPUTM(R9*1, Z1) \
	CMPQ CX, $2 \
	JEQ  inputsDone \
	INPUTM(R9*2, Z2) \
	CMPQ CX, $3 \
	JEQ  inputsDone \
	INPUTM(R10*1, Z3) \
	CMPQ CX, $4 \
	JEQ  inputsDone \
	INPUTM(R9*4, Z4) \
	CMPQ CX, $5 \
	JEQ  inputsDone \
	INPUTM(R11*1, Z5) \
	CMPQ CX, $6 \
	JEQ  inputsDone \
	INPUTM(R10*2, Z6) \
	CMPQ CX, $7 \
	JEQ  inputsDone \
	INPUTM(R12*1, Z7) \
 \
inputsDone: \
	ADDQ $BLOCKBYTES, DI \
	ADDQ $12, SI \
	DECQ BX \
	JNZ  block \
	DECQ AX \
	JNZ  group \
 \
	MOVQ R15, BX \
	MOVQ ldBytes+64(FP), AX \
	STORE(Z0) \
	CMPQ CX, $1 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z1) \
	CMPQ CX, $2 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z2) \
	CMPQ CX, $3 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z3) \
	CMPQ CX, $4 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z4) \
	CMPQ CX, $5 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z5) \
	CMPQ CX, $6 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z6) \
	CMPQ CX, $7 \
	JEQ  stored \
	ADDQ AX, R15 \
	STORE(Z7) \
 \
stored: \
	LEAQ 64(BX), R15 \
	DECQ DX \
	JNZ  rows16 \
	VZEROUPPER \
	RET


TEXT ·int4Fixed16(SB), NOSPLIT, $0-96
	KERNEL(INPUT, 96)

// INPUT16 multiplies the block of codes with one input's block as INPUT
// does, but only its hi and mid parts: two chains of eight VPDPBUSD,
// combined as 65536·Σcode·hi + 256·Σcode·mid − 8·Σ(v − lo) =
// Σ(code−8)·(v − lo), the input to 16 bits (|lo| ≤ 128 of 2²²).
#define INPUT16(IDX, F) \
	VPXORD Z26, Z26, Z26                  \
	VPXORD Z27, Z27, Z27                  \
	VPDPBUSD.BCST 0(DI)(IDX), Z16, Z26 \
	VPDPBUSD.BCST 32(DI)(IDX), Z16, Z27 \
	VPDPBUSD.BCST 4(DI)(IDX), Z17, Z26 \
	VPDPBUSD.BCST 36(DI)(IDX), Z17, Z27 \
	VPDPBUSD.BCST 8(DI)(IDX), Z18, Z26 \
	VPDPBUSD.BCST 40(DI)(IDX), Z18, Z27 \
	VPDPBUSD.BCST 12(DI)(IDX), Z19, Z26 \
	VPDPBUSD.BCST 44(DI)(IDX), Z19, Z27 \
	VPDPBUSD.BCST 16(DI)(IDX), Z20, Z26 \
	VPDPBUSD.BCST 48(DI)(IDX), Z20, Z27 \
	VPDPBUSD.BCST 20(DI)(IDX), Z21, Z26 \
	VPDPBUSD.BCST 52(DI)(IDX), Z21, Z27 \
	VPDPBUSD.BCST 24(DI)(IDX), Z22, Z26 \
	VPDPBUSD.BCST 56(DI)(IDX), Z22, Z27 \
	VPDPBUSD.BCST 28(DI)(IDX), Z23, Z26 \
	VPDPBUSD.BCST 60(DI)(IDX), Z23, Z27 \
	VPSLLD $8, Z26, Z26                   \
	VPADDD Z27, Z26, Z26                  \
	VPSLLD $8, Z26, Z26                   \
	VPADDD.BCST 8(SI)(IDX), Z26, Z26      \
	VCVTDQ2PS Z26, Z26                    \
	VMULPS.BCST 0(SI)(IDX), Z24, Z28      \
	VFMADD231PS Z28, Z26, F

// func int4Screen16(codes *byte, scales *uint16, groups, bps int, x *byte, stride int, T int, out *float32, ldBytes int, blocks16 int, mask int, addMask int)
//
// int4Fixed16 over the same inputs to 16 bits (screen.go): two chains a
// column block where int4Fixed16 has three.
TEXT ·int4Screen16(SB), NOSPLIT, $0-96
	KERNEL(INPUT16, 96)
