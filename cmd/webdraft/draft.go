package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/engine/webgpu"
	"webdraft/gpu"
	"webdraft/speculative"
	"webdraft/tokenizer"
	"webdraft/weights"
)

// maxDraft bounds --n as the HTTP API bounds "n".
const maxDraft = 64

func runDraft(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "draft", "[--model DIR] (--ids 1,2,3 | --text \"…\") [--n 16] [--backend auto|webgpu|cpu|reference]")
	modelDir := fs.String("model", "", "model folder (webdraft convert output, or an HF checkpoint quantized on load); default: the embedded drafter")
	idsFlag := fs.String("ids", "", "input token ids, comma-separated")
	text := fs.String("text", "", "input text (tokenized with the model's tokenizer)")
	n := fs.Int("n", 16, fmt.Sprintf("number of tokens to draft (1…%d)", maxDraft))
	backendFlag := fs.String("backend", "auto", backendUsage)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*idsFlag == "") == (*text == "") {
		return usagef("give exactly one of --ids and --text")
	}
	if *n < 1 || *n > maxDraft {
		return usagef("--n %d: want 1…%d", *n, maxDraft)
	}
	backend, err := parseBackend(*backendFlag)
	if err != nil {
		return err
	}

	model, name, err := loadModel(*modelDir)
	if err != nil {
		return err
	}
	defer model.Close()
	tok, err := modelTokenizer(model)
	switch {
	case errors.Is(err, tokenizer.ErrNoTokenizer) && *text != "":
		return fmt.Errorf("--text: %w (give --ids)", err)
	case err != nil && !errors.Is(err, tokenizer.ErrNoTokenizer):
		return err // --ids need no tokenizer, but a broken one is an error
	}
	var ids []int
	input := "--ids"
	if *idsFlag != "" {
		if ids, err = parseIDs(*idsFlag); err != nil {
			return usagef("--ids: %v", err)
		}
	} else {
		input = "--text"
		if ids = tok.Encode(*text); len(ids) == 0 {
			return usagef("--text: no tokens")
		}
	}
	for i, id := range ids {
		if id < 0 || id >= model.Config.VocabSize {
			return fmt.Errorf("%s: token %d at index %d is outside the model's vocabulary [0, %d)", input, id, i, model.Config.VocabSize)
		}
	}

	eng, err := openEngine(e, model, backend, draftKVBytes, 1)
	if err != nil {
		return err
	}
	defer eng.Close()
	seq, err := eng.NewSequence()
	if err != nil {
		return err
	}
	defer seq.Release()
	e.log.Info("drafting", "model", name, "tokens", len(ids), "n", *n)
	tokens, err := engine.Draft(ctx, eng, seq, ids, *n)
	if err != nil {
		return err
	}
	draft := engine.IDs(tokens)
	out := struct {
		Draft []int   `json:"draft"`
		Text  *string `json:"text,omitempty"` // when the model has a tokenizer
	}{Draft: draft}
	if tok != nil {
		s, err := tok.Decode(draft)
		if err != nil {
			s = "" // ids past the tokenizer's vocabulary, as the server answers
		}
		out.Text = &s
	}
	return writeJSON(e, out)
}

// backendUsage is the --backend flag's help.
const backendUsage = "auto (WebGPU on a GPU, else the CPU engine; a software renderer such as lavapipe only with webgpu), webgpu, cpu (the fast CPU engine) or reference (the plain-Go oracle: slow)"

// backendChoice is a --backend value.
type backendChoice string

func parseBackend(s string) (backendChoice, error) {
	switch s {
	case "auto", "cpu", "webgpu", "reference":
		return backendChoice(s), nil
	}
	return "", usagef("--backend %q: want auto, webgpu, cpu or reference", s)
}

// defaultK is the draft length serve, generate and the live page take when
// --k is left out: the one measured best for the engine the target runs on
// (BENCHMARKS.md, "Speculative decoding" and "The CPU engine"): 4 through
// WebGPU on the H200 (a step drafted and verified in one submission; a
// small model's 5 rows verified as cheaply as 4), 1 on the CPU engine,
// where each position a verification adds costs the target a share of a
// step's arithmetic (a 2-row verification about 1.4 steps, 3 rows 2); the
// reference engine keeps the 8 it always had (it is the oracle, not
// measured for speed).
func defaultK(backend string) int {
	switch backend {
	case "webgpu":
		return gpuDefaultK
	case "reference":
		return 8
	}
	return cpuDefaultK
}

// gpuDefaultK and cpuDefaultK are defaultK through WebGPU and on the CPU
// engines.
const (
	gpuDefaultK = 4
	cpuDefaultK = 1
)

// kUsage is the --k flag's help in serve and generate.
var kUsage = fmt.Sprintf("draft tokens per verification step, 1…%d (with --spec-topk above 1, the token tree's depth); left out, the best measured for the target's engine (%d on a GPU, %d on the CPU engine, 8 on the reference engine)", speculative.MaxK, gpuDefaultK, cpuDefaultK)

// treeFlags are --spec-topk and --spec-draft-tokens, serve's and
// generate's: the shape of the token tree drafted each step (SGLang's
// --speculative-eagle-topk and --speculative-num-draft-tokens), its depth
// being --k.
type treeFlags struct {
	topK, nodes *int
}

// treeFlagsVar defines the tree flags on fs, with speculative.Options'
// defaults (a chain; speculative.DefaultTreeNodes nodes); perRequest
// says that a request's speculative fields override them (serve).
func treeFlagsVar(fs *flag.FlagSet, perRequest bool) treeFlags {
	overrides := func(field string) string {
		if perRequest {
			return " (a request's speculative." + field + " overrides it)"
		}
		return ""
	}
	return treeFlags{
		topK:  fs.Int("spec-topk", 1, fmt.Sprintf("children of each node of the draft, 1…%d: 1 drafts a chain of --k tokens; above 1, a token tree --k levels deep%s", speculative.MaxTopK, overrides("topk"))),
		nodes: fs.Int("spec-draft-tokens", speculative.DefaultTreeNodes, fmt.Sprintf("with --spec-topk above 1: the tree's nodes the target verifies each step, 1…%d%s", speculative.MaxTreeNodes, overrides("draft_tokens"))),
	}
}

// check refuses values outside speculative's bounds.
func (t treeFlags) check() error {
	if *t.topK < 1 || *t.topK > speculative.MaxTopK {
		return usagef("--spec-topk %d: want 1…%d (1: a chain)", *t.topK, speculative.MaxTopK)
	}
	if *t.nodes < 1 || *t.nodes > speculative.MaxTreeNodes {
		return usagef("--spec-draft-tokens %d: want 1…%d", *t.nodes, speculative.MaxTreeNodes)
	}
	return nil
}

// draftKVBytes is the KV memory `webdraft draft` gives its one sequence.
const draftKVBytes = 256 << 20

// openEngine starts the engine --backend asks for, with kvBytes of KV
// cache for up to seqs sequences at once (0: the engine's default), and
// logs what it runs on and why. auto takes a GPU when there is one and
// otherwise the CPU engine: a software WebGPU renderer (lavapipe) is slower
// than the CPU engine on the same cores, so auto leaves it to --backend
// webgpu.
func openEngine(e *env, m *checkpoint.Model, b backendChoice, kvBytes int64, seqs int) (engine.Engine, error) {
	engs, err := openEngines(e, []*checkpoint.Model{m}, b, []int64{kvBytes}, seqs)
	if err != nil {
		return nil, err
	}
	return engs[0], nil
}

// openEngines starts an engine for each of models (a drafter and its
// target) as openEngine does, kvBytes[i] of KV cache for models[i]. On
// WebGPU they share one device, in one webgpu.Group: a sampled
// generation's drafter then keeps the distributions it proposes from on
// the device, where the target verifies them (engine.SamplesDrafts), and
// a fault of either breaks both (reopen them together: enginePair).
func openEngines(e *env, models []*checkpoint.Model, b backendChoice, kvBytes []int64, seqs int) ([]engine.Engine, error) {
	why := "--backend " + string(b)
	var engs []engine.Engine
	fail := func(err error) ([]engine.Engine, error) {
		for _, eng := range engs {
			eng.Close()
		}
		return nil, err
	}
	if b == "reference" {
		for i, m := range models {
			eng, err := engine.NewReference(m.Config, m.Weights, kvBytes[i])
			if err != nil {
				return fail(err)
			}
			engs = append(engs, logEngine(e, eng, why))
		}
		return engs, nil
	}
	if b != "cpu" {
		g, err := webgpu.OpenGroup(gpu.Options{HardwareOnly: b == "auto"})
		switch {
		case err == nil:
			defer g.Close() // the device closes with the last engine
			if b == "auto" {
				why = "a GPU was found"
			}
			if len(models) > 1 {
				why += "; the models share it"
			}
			for i, m := range models {
				eng, err := g.New(m.Config, m.Weights, webgpu.Options{KVBytes: kvBytes[i], MaxSequences: seqs})
				if err != nil {
					return fail(fmt.Errorf("webgpu: %w", err))
				}
				engs = append(engs, logEngine(e, eng, why))
			}
			return engs, nil
		case b == "auto" && errors.Is(err, gpu.ErrNoHardwareAdapter):
			why = err.Error() + ": the CPU engine is faster than a software renderer (--backend webgpu takes it)"
		case b == "auto" && errors.Is(err, gpu.ErrNoAdapter):
			why = "no WebGPU adapter"
		default:
			return nil, fmt.Errorf("webgpu: %w", err)
		}
	}
	for i, m := range models {
		eng, err := cpu.New(m.Config, m.Weights, cpu.Options{KVBytes: kvBytes[i]})
		if err != nil {
			return fail(err)
		}
		engs = append(engs, logEngine(e, eng, why))
	}
	return engs, nil
}

// logEngine logs which engine runs and why, and returns it.
func logEngine(e *env, eng engine.Engine, why string) engine.Engine {
	info := eng.Info()
	e.log.Info("engine", "backend", info.Backend, "adapter", info.Adapter, "why", why)
	return eng
}

// loadModel loads the model folder dir, or the embedded drafter when dir is
// "". The name is what logs and /health call it.
func loadModel(dir string) (*checkpoint.Model, string, error) {
	return loadModelOr(dir, weights.DrafterDir)
}

// loadModelOr loads the model in dir, or with dir "" the embedded one
// named embedded (weights.DrafterDir or weights.TargetDir).
func loadModelOr(dir, embedded string) (*checkpoint.Model, string, error) {
	if dir == "" {
		return loadEmbedded(embedded)
	}
	if name, ok := strings.CutPrefix(dir, "embedded:"); ok {
		switch name {
		case weights.DrafterDir, weights.TargetDir:
			return loadEmbedded(name)
		case weights.HeadDir:
			return nil, "", usagef("%s is an EAGLE-3 head: it drafts only beside the target whose hidden states it reads (serve, generate, bench spec)", dir)
		}
	}
	m, err := checkpoint.Load(dir, checkpoint.LoadOptions{})
	return m, dir, err
}

// errNoEmbedded is the error of a binary built without the embedded
// models asked for one.
var errNoEmbedded = errors.New("this webdraft was built without the embedded models (tag webdraft_noembed): name a model folder")

// loadEmbedded loads a model of the embedded pair (weights.DrafterDir or
// weights.TargetDir).
func loadEmbedded(name string) (*checkpoint.Model, string, error) {
	if !weights.Embedded() {
		return nil, "", errNoEmbedded
	}
	m, err := checkpoint.LoadFS(weights.FS(), name, checkpoint.LoadOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("embedded %s: %w", name, err)
	}
	return m, "embedded:" + name, nil
}

// modelTokenizer returns the model folder's tokenizer, or the embedded Qwen3
// tokenizer when the folder has none and its vocabulary holds the embedded
// one's ids (tokenizer.ForModel; tokenizer.ErrNoTokenizer otherwise).
func modelTokenizer(m *checkpoint.Model) (*tokenizer.Tokenizer, error) {
	data, _, err := m.TokenizerJSON()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Dir, err)
	}
	return tokenizer.ForModel(m.Dir, data, m.Config.VocabSize)
}
