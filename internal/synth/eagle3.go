package synth

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"webdraft/eagle3"
	"webdraft/qwen3"
	"webdraft/safetensors"
)

// Eagle3Options shape a random EAGLE-3 head; a zero size takes the
// target's (its layer's, for the attention and MLP sizes).
type Eagle3Options struct {
	Seed              uint64
	Std               float64           // weight standard deviation; default 0.02
	DType             safetensors.DType // BF16 (default), F16 or F32
	HiddenSize        int               // hidden_size (the target's: a head takes its target's embedding)
	IntermediateSize  int               // intermediate_size
	NumAttentionHeads int               // num_attention_heads
	NumKeyValueHeads  int               // num_key_value_heads
	HeadDim           int               // head_dim
	DraftVocabSize    int               // draft_vocab_size; default min(vocab_size, 32768)
	// AuxLayerIDs, when set, is eagle_config.eagle_aux_hidden_state_layer_ids
	// (the target layers whose outputs the head reads, as trainers write
	// them); nil leaves eagle_config out, for the engines' default.
	AuxLayerIDs []int
	// Embedding writes the head's own embed_tokens.weight (vocab, H); a head
	// without one takes its target's.
	Embedding bool
	Tweak     func(map[string]any) // edits config.json before it is written
}

// DefaultDraftVocab is the largest draft vocabulary WriteEagle3 gives a head
// by default, the size published heads use.
const DefaultDraftVocab = 32768

// WriteEagle3 writes a random EAGLE-3 head for target into dir, in the
// public layout LoadEagle3 reads (config.json of LlamaForCausalLMEagle3,
// one model.safetensors): fc, the midlayer, norm and lm_head of small
// random values (norm weights near one), d2t mapping the draft vocabulary to
// a random sorted subset of the target's (I64 offsets), t2d its mask (BOOL).
// The same options give the same files.
func WriteEagle3(dir string, target qwen3.Config, opts Eagle3Options) error {
	if opts.Std == 0 {
		opts.Std = 0.02
	}
	if opts.DType == "" {
		opts.DType = safetensors.BF16
	}
	switch opts.DType {
	case safetensors.BF16, safetensors.F16, safetensors.F32:
	default:
		return fmt.Errorf("synth: dtype %s: want BF16, F16 or F32", opts.DType)
	}
	cfg := Eagle3Config(target, opts)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("synth: EAGLE-3 head: %w", err)
	}
	if opts.AuxLayerIDs != nil && len(opts.AuxLayerIDs) != 3 {
		return fmt.Errorf("synth: EAGLE-3 head: aux layer ids %v: want three", opts.AuxLayerIDs)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeEagle3Config(dir, cfg, opts); err != nil {
		return err
	}

	// The draft vocabulary: its own stream, so the weights do not depend on it.
	ids := rand.New(rand.NewPCG(opts.Seed, 0xd27)).Perm(cfg.VocabSize)[:cfg.DraftVocabSize]
	slices.Sort(ids)
	d2t := make([]byte, 0, 8*len(ids))
	t2d := make([]byte, cfg.VocabSize)
	for d, id := range ids {
		d2t = binary.LittleEndian.AppendUint64(d2t, uint64(int64(id-d)))
		t2d[id] = 1
	}
	w := &eagle3.Weights{}
	slots := w.Slots(&cfg)
	if opts.Embedding {
		slots = append(slots, qwen3.Slot{Name: eagle3.EmbedName, Shape: []int{cfg.VocabSize, cfg.HiddenSize}, Matrix: &w.EmbedTokens})
	}
	head := []raw{{safetensors.Spec{Name: eagle3.D2TName, DType: safetensors.I64, Shape: []int{len(ids)}}, d2t}}
	tail := []raw{{safetensors.Spec{Name: eagle3.T2DName, DType: safetensors.BOOL, Shape: []int{cfg.VocabSize}}, t2d}}
	rng := rand.New(rand.NewPCG(opts.Seed, 0xea9e3))
	return writeShard(filepath.Join(dir, safetensors.SingleFile), head, slots, tail, Options{Std: opts.Std, DType: opts.DType}, rng)
}

// Eagle3Config is the config of the head WriteEagle3 writes for target
// with opts: each size opts leaves zero the target's (its layer's, for the
// attention and MLP), the draft vocabulary at most DefaultDraftVocab.
func Eagle3Config(target qwen3.Config, opts Eagle3Options) eagle3.Config {
	or := func(v, def int) int {
		if v != 0 {
			return v
		}
		return def
	}
	return eagle3.Config{
		HiddenSize:            or(opts.HiddenSize, target.HiddenSize),
		IntermediateSize:      or(opts.IntermediateSize, target.IntermediateSize),
		NumAttentionHeads:     or(opts.NumAttentionHeads, target.NumAttentionHeads),
		NumKeyValueHeads:      or(opts.NumKeyValueHeads, target.NumKeyValueHeads),
		HeadDim:               or(opts.HeadDim, target.HeadDim),
		RMSNormEps:            target.RMSNormEps,
		RopeTheta:             target.RopeTheta,
		MaxPositionEmbeddings: target.MaxPositionEmbeddings,
		VocabSize:             target.VocabSize,
		DraftVocabSize:        or(opts.DraftVocabSize, min(target.VocabSize, DefaultDraftVocab)),
		TargetHiddenSize:      target.HiddenSize,
	}
}

func writeEagle3Config(dir string, c eagle3.Config, opts Eagle3Options) error {
	dtype := map[safetensors.DType]string{safetensors.BF16: "bfloat16", safetensors.F16: "float16", safetensors.F32: "float32"}[opts.DType]
	m := map[string]any{
		"architectures":           []string{eagle3.Architecture},
		"model_type":              "llama",
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       1,
		"num_attention_heads":     c.NumAttentionHeads,
		"num_key_value_heads":     c.NumKeyValueHeads,
		"head_dim":                c.HeadDim,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_theta":              c.RopeTheta,
		"rope_scaling":            nil,
		"max_position_embeddings": c.MaxPositionEmbeddings,
		"vocab_size":              c.VocabSize,
		"draft_vocab_size":        c.DraftVocabSize,
		"target_hidden_size":      c.TargetHiddenSize,
		"hidden_act":              "silu",
		"tie_word_embeddings":     false,
		"torch_dtype":             dtype,
	}
	if opts.AuxLayerIDs != nil {
		m["eagle_config"] = map[string]any{"use_aux_hidden_state": true, "eagle_aux_hidden_state_layer_ids": opts.AuxLayerIDs}
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
