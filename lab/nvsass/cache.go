package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// What nvsass reads of NVIDIA's shader disk cache (driver 5xx, Vulkan,
// Hopper), learned by taking one apart on the H200 machine and checked by
// disassembling what it yields:
//   - a cache file (GLCache/<hash>/<hash>/<hash>.bin) holds zstd frames
//     among its own bookkeeping;
//   - a frame whose content starts with "NVDANVVMNVuc" is one compiled
//     pipeline: at byte 0x4C a little-endian u32, the code's size in bytes;
//     at 0x50 one, its offset less 8; the u32 16 bytes before the code, the
//     registers a thread. The code is the SASS nvdisasm -b SM90 takes.
// Other frames (small ELF headers and the like) are skipped.

var (
	zstdMagic     = []byte{0x28, 0xb5, 0x2f, 0xfd}
	pipelineMagic = []byte("NVDANVVMNVuc")
)

// pipeline is one compiled compute pipeline from the cache.
type pipeline struct {
	Code      []byte // SASS, 16 bytes an instruction
	Registers uint32 // a thread
}

// carve returns the compiled pipelines in one cache file's data, in order.
func carve(data []byte) ([]pipeline, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	var pipes []pipeline
	for i := 0; ; i++ {
		at := bytes.Index(data[i:], zstdMagic)
		if at < 0 {
			return pipes, nil
		}
		i += at
		n, err := frameLen(data[i:])
		if err != nil {
			continue // the magic's bytes inside other data
		}
		content, err := dec.DecodeAll(data[i:i+n], nil)
		if err != nil || !bytes.HasPrefix(content, pipelineMagic) {
			continue
		}
		p, err := parsePipeline(content)
		if err != nil {
			return nil, fmt.Errorf("pipeline at byte %d: %w", i, err)
		}
		pipes = append(pipes, p)
		i += n - 1
	}
}

// parsePipeline reads a decompressed "NVDANVVMNVuc" container.
func parsePipeline(c []byte) (pipeline, error) {
	if len(c) < 0x54 {
		return pipeline{}, fmt.Errorf("%d bytes: too short for its header", len(c))
	}
	size := uint64(binary.LittleEndian.Uint32(c[0x4c:]))
	off := uint64(binary.LittleEndian.Uint32(c[0x50:])) + 8
	if off < 16 || off+size > uint64(len(c)) || size%16 != 0 {
		return pipeline{}, fmt.Errorf("code of %d bytes at %d does not fit its %d bytes", size, off, len(c))
	}
	return pipeline{
		Code:      c[off : off+size],
		Registers: binary.LittleEndian.Uint32(c[off-16:]),
	}, nil
}

// frameLen returns the length of the zstd frame that starts data
// (RFC 8878 §3.1.1): its header, its blocks and its checksum.
func frameLen(data []byte) (int, error) {
	if len(data) < 6 || !bytes.Equal(data[:4], zstdMagic) {
		return 0, errors.New("not a zstd frame")
	}
	fhd := data[4]
	n := 5
	if fhd&0x20 == 0 { // not single-segment: a window descriptor
		n++
	}
	n += [4]int{0, 1, 2, 4}[fhd&3] // dictionary ID
	fcs := [4]int{0, 2, 4, 8}[fhd>>6]
	if fhd>>6 == 0 && fhd&0x20 != 0 {
		fcs = 1
	}
	n += fcs
	for {
		if n+3 > len(data) {
			return 0, errors.New("truncated zstd frame")
		}
		h := uint32(data[n]) | uint32(data[n+1])<<8 | uint32(data[n+2])<<16
		n += 3
		last, kind, size := h&1 == 1, (h>>1)&3, int(h>>3)
		switch kind {
		case 0, 2: // raw, compressed
			n += size
		case 1: // RLE: one byte repeated
			n++
		default:
			return 0, errors.New("reserved zstd block type")
		}
		if n > len(data) {
			return 0, errors.New("truncated zstd frame")
		}
		if last {
			break
		}
	}
	if fhd&4 != 0 { // content checksum
		n += 4
	}
	if n > len(data) {
		return 0, errors.New("truncated zstd frame")
	}
	return n, nil
}
