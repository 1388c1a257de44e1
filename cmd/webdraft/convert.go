package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"

	"webdraft/checkpoint"
)

func runConvert(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "convert", "--in HF_DIR|HEAD_DIR --out DIR [--quant int4|f16|f32] [--group-size 32] [--embedding-from DIR] [--head-tokens N]")
	in := fs.String("in", "", "Hugging Face Qwen3 checkpoint folder (config.json, model.safetensors or shards), or an EAGLE-3 head folder (LlamaForCausalLMEagle3 in config.json; --embedding-from and --head-tokens do not apply)")
	out := fs.String("out", "", "output folder (created; its model.safetensors, config.json and tokenizer.json are replaced)")
	quant := fs.String("quant", "int4", "weight format: int4, f16 or f32")
	group := fs.Int("group-size", 32, "int4: input columns per f16 scale (a multiple of 8 dividing every matrix width)")
	embedFrom := fs.String("embedding-from", "", "a converted folder whose embedding the output uses, in that folder's format, instead of its own: a drafter trained on its target's frozen embedding; the output records the folder's relative path and hash")
	headTokens := fs.Int("head-tokens", 0, "keep the first N tokens of the input's frequency-ranked lm_head.token_ids: a head over the most used tokens only (0: all it lists)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return usagef("--in and --out are required")
	}
	q, err := checkpoint.ParseQuant(*quant)
	if err != nil {
		return usagef("--quant: %v", err)
	}
	if *group <= 0 || *group%8 != 0 {
		return usagef("--group-size %d: want a positive multiple of 8", *group)
	}
	if *headTokens < 0 {
		return usagef("--head-tokens %d: want a positive count, or 0 for all", *headTokens)
	}
	opts := checkpoint.ConvertOptions{Quant: q, GroupSize: *group, EmbeddingFrom: *embedFrom, HeadTokens: *headTokens}
	if bar := newProgressBar(e, "converting"); bar != nil {
		opts.Progress = func(done, total int64) {
			bar.ChangeMax64(total)
			bar.Set64(done)
		}
		defer bar.Finish()
	}
	convert, what := checkpoint.Convert, "model"
	if isHead(*in) {
		convert, what = checkpoint.ConvertEagle3, "EAGLE-3 head"
	}
	start := time.Now()
	stats, err := convert(ctx, *in, *out, opts)
	if err != nil {
		return err
	}
	for _, n := range stats.Ignored {
		e.log.Warn("tensor not part of the model, skipped", "tensor", n)
	}
	e.log.Info("converted", "what", what, "in", *in, "out", *out, "quant", q, "tensors", stats.Tensors,
		"source_mb", stats.SourceBytes>>20, "output_mb", stats.OutputBytes>>20, "seconds", fmt.Sprintf("%.1f", time.Since(start).Seconds()))
	return nil
}

// newProgressBar returns a byte progress bar on stderr when stderr is a
// terminal, else nil.
func newProgressBar(e *env, what string) *progressbar.ProgressBar {
	f, ok := e.stderr.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(f),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowBytes(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}
