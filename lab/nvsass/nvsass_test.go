package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// container builds a decompressed pipeline container as the H200's driver
// lays it out: header, registers 16 bytes before the code, code, trailer.
func container(code []byte, regs uint32) []byte {
	const codeAt = 0x198
	c := make([]byte, codeAt+len(code)+64)
	copy(c, pipelineMagic)
	binary.LittleEndian.PutUint32(c[0x4c:], uint32(len(code)))
	binary.LittleEndian.PutUint32(c[0x50:], codeAt-8)
	binary.LittleEndian.PutUint32(c[codeAt-16:], regs)
	copy(c[codeAt:], code)
	return c
}

func compress(t *testing.T, data []byte, opts ...zstd.EOption) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(data, nil)
}

func TestFrameLen(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 5000)
	for i := range random {
		random[i] = byte(r.IntN(256))
	}
	for _, tc := range []struct {
		name string
		data []byte
		opts []zstd.EOption
	}{
		{"compressible", bytes.Repeat([]byte("webdraft "), 3000), nil},
		{"random (raw blocks)", random, nil},
		{"checksum", bytes.Repeat([]byte{7}, 100000), []zstd.EOption{zstd.WithEncoderCRC(true)}},
		{"no checksum", bytes.Repeat([]byte("ab"), 70000), []zstd.EOption{zstd.WithEncoderCRC(false)}},
		{"empty", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frame := compress(t, tc.data, tc.opts...)
			// Followed by bookkeeping bytes, as in a cache file.
			n, err := frameLen(append(append([]byte{}, frame...), 0xde, 0xad, 0xbe, 0xef, 1, 2, 3))
			if err != nil {
				t.Fatal(err)
			}
			if n != len(frame) {
				t.Fatalf("frameLen = %d, want %d", n, len(frame))
			}
			if _, err := frameLen(frame[:len(frame)-1]); err == nil && len(frame) > 9 {
				t.Error("a truncated frame gave no error")
			}
		})
	}
	if _, err := frameLen([]byte("not zstd at all")); err == nil {
		t.Error("garbage gave no error")
	}
}

func TestCarve(t *testing.T) {
	code1 := bytes.Repeat([]byte{0x19, 0x79, 0, 0, 0, 0, 0, 0, 0, 0x21, 0, 0, 0, 0x22, 0x0e, 0}, 40)
	code2 := bytes.Repeat([]byte{0x02, 0x7a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 7)
	var file bytes.Buffer
	file.WriteString("CDVN\x00\x00\x03\x00")                            // the file's own header
	file.Write(compress(t, []byte("\x98\x03\x00\x00\x7fELF metadata"))) // a frame that is no pipeline
	file.Write(compress(t, container(code1, 128)))
	file.Write([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xff}) // the magic inside other bytes
	file.Write(compress(t, container(code2, 17)))
	file.WriteString("trailer")

	pipes, err := carve(file.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(pipes) != 2 {
		t.Fatalf("carved %d pipelines, want 2", len(pipes))
	}
	for i, want := range []pipeline{{code1, 128}, {code2, 17}} {
		if !bytes.Equal(pipes[i].Code, want.Code) || pipes[i].Registers != want.Registers {
			t.Errorf("pipeline %d: %d bytes, %d registers; want %d bytes, %d registers",
				i, len(pipes[i].Code), pipes[i].Registers, len(want.Code), want.Registers)
		}
	}
}

func TestCarveBadContainer(t *testing.T) {
	c := container(make([]byte, 64), 32)
	binary.LittleEndian.PutUint32(c[0x4c:], 1<<20) // code past the end
	if _, err := carve(compress(t, c)); err == nil {
		t.Error("a container whose code runs past its end gave no error")
	}
	if _, err := carve(compress(t, pipelineMagic)); err == nil {
		t.Error("a container without a header gave no error")
	}
}

// A loop of nvdisasm's output: three FFMA of six instructions, branching
// back from 0x50 to 0x10, inside a longer one from 0x0.
const sassText = `	.headerflags	@"EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   S2R R80, SR_TID.X ;
        /*0010*/                   LDS.128 R28, [R28+0x480] ;
        /*0020*/                   FFMA.FTZ R59, R67.reuse, R28.reuse, R59 ;
        /*0030*/                   FFMA.FTZ R54, R67, R29.reuse, R54 ;
        /*0040*/                   FFMA.FTZ R69, R120.reuse, R28, R69 ;
        /*0050*/               @!P1 BRA 0x10 ;
        /*0060*/                   VIADDMNMX.U32 R28, R21.reuse, 0x4, R24, PT ;
        /*0070*/                   BRA 0x0 ;
        /*0080*/                   EXIT ;
`

func TestSummarize(t *testing.T) {
	ins := parseSASS(sassText)
	if len(ins) != 9 {
		t.Fatalf("parsed %d instructions, want 9", len(ins))
	}
	if ins[5].Op != "BRA" || !ins[5].Branch || ins[5].Target != 0x10 {
		t.Errorf("predicated branch parsed as %+v", ins[5])
	}
	ls := loops(ins, 1)
	if len(ls) != 2 || ls[0].From != 0 || ls[0].N != 8 || ls[1].From != 0x10 || ls[1].N != 5 {
		t.Fatalf("loops = %+v", ls)
	}
	if ls[1].Ops["FFMA.FTZ"] != 3 || ls[1].Ops["LDS.128"] != 1 {
		t.Errorf("inner loop's ops = %v", ls[1].Ops)
	}
	got := summarize(ins)
	if !strings.Contains(got, "9 instructions") || strings.Contains(got, "loop") {
		t.Errorf("summary (loops of 40 and more only):\n%s", got)
	}
	// A 40-instruction loop: 30 FFMA (two spellings), 10 others.
	var long strings.Builder
	for i := 0; i < 40; i++ {
		op := [4]string{"FFMA.FTZ R1, R2, R3, R1", "FFMA R4, R5, R6, R4", "FFMA.SAT R7, R8, R9, R7", "LDS.128 R8, [R9+0x10]"}[i%4]
		if i == 39 {
			op = "BRA 0x0"
		}
		fmt.Fprintf(&long, "        /*%04x*/                   %s ;\n", 16*i, op)
	}
	if got := summarize(parseSASS(long.String())); !strings.Contains(got, "40 instructions, 75 % FFMA") {
		t.Errorf("summary of a 40-instruction loop:\n%s", got)
	}
	if got := topOps(ls[1].Ops, 2); got != "FFMA.FTZ 3, BRA 1" {
		t.Errorf("topOps = %q", got)
	}
}

// TestRun runs the command on a cache folder with a stand-in disassembler.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	cache := filepath.Join(dir, "GLCache", "ee77", "a9ab")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	blob := compress(t, container(bytes.Repeat([]byte{1}, 32), 96))
	if err := os.WriteFile(filepath.Join(cache, "20b0.bin"), blob, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "20b0.toc"), []byte("toc"), 0o644); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(dir, "nvdisasm")
	script := fmt.Sprintf("#!/bin/sh\ncat <<'EOF'\n%sEOF\n", sassText)
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var stdout bytes.Buffer
	if err := run([]string{"-out", out, "-nvdisasm", fake, filepath.Join(dir, "GLCache")}, &stdout); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "96 registers") || !strings.Contains(stdout.String(), "9 instructions") {
		t.Errorf("output:\n%s", stdout.String())
	}
	code, err := os.ReadFile(filepath.Join(out, "20b0_0.code"))
	if err != nil || len(code) != 32 {
		t.Errorf("20b0_0.code: %d bytes, %v", len(code), err)
	}
	if err := run([]string{"-out", out, "-nvdisasm", fake, filepath.Join(dir, "missing")}, &stdout); err == nil {
		t.Error("a missing folder gave no error")
	}
	if err := run([]string{"-out", out, "-nvdisasm", filepath.Join(dir, "no-such-tool"), filepath.Join(dir, "GLCache")}, &stdout); err == nil {
		t.Error("a missing disassembler gave no error")
	}
	if err := run(nil, &stdout); err == nil {
		t.Error("no arguments gave no error")
	}
}

// TestCarveH200 carves a cache file the H200 machine's driver wrote while
// running BenchmarkMatMulKernels/o_2048x2048/T2/matvec-batch: one pipeline,
// matvec_batch_int4.wgsl's, 1,128 instructions (nvdisasm took all of them)
// at 63 registers a thread.
func TestCarveH200(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "h200-matvec-batch.bin"))
	if err != nil {
		t.Fatal(err)
	}
	pipes, err := carve(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(pipes) != 1 {
		t.Fatalf("carved %d pipelines, want 1", len(pipes))
	}
	p := pipes[0]
	if len(p.Code) != 1128*16 || p.Registers != 63 {
		t.Errorf("%d instructions at %d registers, want 1128 at 63", len(p.Code)/16, p.Registers)
	}
	// It opens as every compute kernel here does: S2R, reading the
	// thread's index (opcode 0x919 in the low bits of the first word).
	if op := binary.LittleEndian.Uint16(p.Code) & 0xfff; op != 0x919 {
		t.Errorf("first instruction's opcode %#x, want S2R's 0x919", op)
	}
}
