// Package synth writes random Qwen3 checkpoints in Hugging Face's layout
// (config.json as transformers 5.x writes it, bf16 safetensors, optionally
// sharded), and random EAGLE-3 heads for them in the public layout, for
// tests and benchmarks: real shapes without real weights.
package synth

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"webdraft/qwen3"
	"webdraft/safetensors"
	"webdraft/tensor"
)

// Shapes are published Qwen3 sizes (docs/reference.md, "Model folders") and a tiny one.
var Shapes = map[string]qwen3.Config{
	"qwen3-0.6b": {VocabSize: 151936, HiddenSize: 1024, IntermediateSize: 3072, NumHiddenLayers: 28,
		NumAttentionHeads: 16, NumKeyValueHeads: 8, HeadDim: 128, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 40960, TieWordEmbeddings: true},
	"qwen3-1.7b": {VocabSize: 151936, HiddenSize: 2048, IntermediateSize: 6144, NumHiddenLayers: 28,
		NumAttentionHeads: 16, NumKeyValueHeads: 8, HeadDim: 128, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 40960, TieWordEmbeddings: true},
	"qwen3-8b": {VocabSize: 151936, HiddenSize: 4096, IntermediateSize: 12288, NumHiddenLayers: 36,
		NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 40960, TieWordEmbeddings: false},
	"qwen3-4b": {VocabSize: 151936, HiddenSize: 2560, IntermediateSize: 9728, NumHiddenLayers: 36,
		NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 40960, TieWordEmbeddings: true},
	"tiny": {VocabSize: 256, HiddenSize: 64, IntermediateSize: 96, NumHiddenLayers: 2,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32, RMSNormEps: 1e-6, RopeTheta: 10000,
		MaxPositionEmbeddings: 128, TieWordEmbeddings: false},
}

// Options shape the written checkpoint.
type Options struct {
	Seed   uint64
	Std    float64              // weight standard deviation; default 0.02
	DType  safetensors.DType    // BF16 (default), F16 or F32
	Shards int                  // >1 writes model-0000k-of-0000n.safetensors and an index
	Tweak  func(map[string]any) // edits config.json before it is written
	// HeadTokens > 0 gives the model a head over that many tokens of the
	// vocabulary, chosen at random (lm_head.token_ids, I32, first in the
	// first shard). The weights are those of the same Seed without it; two
	// models of one Seed and hidden size share their embedding.
	HeadTokens int
}

// Write writes a random checkpoint for cfg into dir.
func Write(dir string, cfg qwen3.Config, opts Options) error {
	if opts.Std == 0 {
		opts.Std = 0.02
	}
	if opts.DType == "" {
		opts.DType = safetensors.BF16
	}
	if opts.Shards < 1 {
		opts.Shards = 1
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeConfig(dir, cfg, opts); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x5eed))
	w, _ := qwen3.NewWeights(&cfg)
	if opts.HeadTokens > 0 { // their own stream: the weights do not depend on them
		for _, t := range rand.New(rand.NewPCG(opts.Seed, 0x4ead)).Perm(cfg.VocabSize)[:opts.HeadTokens] {
			w.HeadTokens = append(w.HeadTokens, int32(t))
		}
	}
	slots := w.Slots(&cfg)
	per := (len(slots) + opts.Shards - 1) / opts.Shards
	weightMap := map[string]string{}
	for shard := 0; shard*per < len(slots); shard++ {
		part := slots[shard*per : min((shard+1)*per, len(slots))]
		name := safetensors.SingleFile
		if opts.Shards > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", shard+1, opts.Shards)
		}
		var head []raw
		if shard == 0 && w.HeadTokens != nil {
			b := make([]byte, 0, 4*len(w.HeadTokens))
			for _, t := range w.HeadTokens {
				b = binary.LittleEndian.AppendUint32(b, uint32(t))
			}
			head = append(head, raw{safetensors.Spec{Name: qwen3.HeadTokensName, DType: safetensors.I32, Shape: []int{len(w.HeadTokens)}}, b})
		}
		if err := writeShard(filepath.Join(dir, name), head, part, nil, opts, rng); err != nil {
			return err
		}
		for _, s := range part {
			weightMap[s.Name] = name
		}
		if head != nil {
			weightMap[qwen3.HeadTokensName] = name
		}
	}
	if opts.Shards > 1 {
		idx, err := json.MarshalIndent(map[string]any{"metadata": map[string]any{}, "weight_map": weightMap}, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, safetensors.IndexFile), idx, 0o644)
	}
	return nil
}

// raw is a tensor written as given: its little-endian bytes.
type raw struct {
	spec safetensors.Spec
	data []byte
}

// writeShard writes one safetensors file: the head tensors, the slots'
// random values (drawn from rng in slot order) and the tail tensors.
func writeShard(path string, head []raw, slots []qwen3.Slot, tail []raw, opts Options, rng *rand.Rand) error {
	var specs []safetensors.Spec
	buf := make([]byte, 0, 1<<16)
	for _, r := range head {
		specs = append(specs, r.spec)
		buf = append(buf, r.data...)
	}
	for _, s := range slots {
		specs = append(specs, safetensors.Spec{Name: s.Name, DType: opts.DType, Shape: s.Shape})
	}
	for _, r := range tail {
		specs = append(specs, r.spec)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	w, err := safetensors.NewWriter(bw, specs, map[string]string{"format": "pt"})
	if err != nil {
		f.Close()
		return err
	}
	for _, s := range slots {
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		for i := 0; i < n; i++ {
			v := float32(rng.NormFloat64() * opts.Std)
			if s.Vector != nil { // norm weights near one, as trained models have
				v += 1
			}
			buf = appendValue(buf, v, opts.DType)
			if len(buf) >= 1<<16-8 {
				if _, err := w.Write(buf); err != nil {
					f.Close()
					return err
				}
				buf = buf[:0]
			}
		}
	}
	for _, r := range tail {
		buf = append(buf, r.data...)
	}
	if _, err := w.Write(buf); err != nil {
		f.Close()
		return err
	}
	if err := w.Close(); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func appendValue(b []byte, v float32, dt safetensors.DType) []byte {
	switch dt {
	case safetensors.F32:
		return binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	case safetensors.F16:
		return binary.LittleEndian.AppendUint16(b, tensor.F32ToF16(v))
	default: // BF16, round to nearest even
		u := math.Float32bits(v)
		u += 0x7fff + (u>>16)&1
		return binary.LittleEndian.AppendUint16(b, uint16(u>>16))
	}
}

func writeConfig(dir string, c qwen3.Config, opts Options) error {
	dtype := map[safetensors.DType]string{safetensors.BF16: "bfloat16", safetensors.F16: "float16", safetensors.F32: "float32"}[opts.DType]
	m := map[string]any{
		"architectures":           []string{"Qwen3ForCausalLM"},
		"model_type":              "qwen3",
		"vocab_size":              c.VocabSize,
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       c.NumHiddenLayers,
		"num_attention_heads":     c.NumAttentionHeads,
		"num_key_value_heads":     c.NumKeyValueHeads,
		"head_dim":                c.HeadDim,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_parameters":         map[string]any{"rope_theta": c.RopeTheta, "rope_type": "default"},
		"max_position_embeddings": c.MaxPositionEmbeddings,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"hidden_act":              "silu",
		"attention_bias":          false,
		"use_sliding_window":      false,
		"dtype":                   dtype,
	}
	if opts.Tweak != nil {
		opts.Tweak(m)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644)
}
