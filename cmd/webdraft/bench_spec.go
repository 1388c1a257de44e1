package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/sampling"
	"webdraft/specdec"
	"webdraft/speculative"
	"webdraft/textstats"
	"webdraft/weights"
)

func benchSpec(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "bench spec", "--prompts FILE [--target DIR] [--drafter DIR] [--k 16] [--new-tokens 128] [--svg FILE] | --live [--ks 1,2,4,8,16] [--trees 2x8,4x16] [--tree-depth 6] [--unfused] [--unchained] [--uncoupled] [--adaptive] [--p-mins 0.5,0.8] [--batch 1] [--temperature 0] [--top-p 1] [--top-n 0]")
	targetDir := fs.String("target", "", "target model folder (default: the embedded target)")
	drafterDir := fs.String("drafter", "", "drafter model folder (default: the embedded drafter; embedded:eagle3 the embedded EAGLE-3 head)"+headNote)
	promptsFile := fs.String("prompts", "", `prompts, one per line: {"text": "…"}, {"ids": [1,2,3]}, or plain text`)
	k := fs.Int("k", 16, "draft length per verification step")
	newTokens := fs.Int("new-tokens", 128, "tokens per prompt: the target's greedy continuation (with --live, each generation's length); the report gives their loop rate (the share in which a run of 12 tokens occurs 3 times without overlap) and distinct-4 (distinct 4-grams over 4-grams, the mean)")
	maxPrompts := fs.Int("max-prompts", 0, "use at most this many prompts (0: all)")
	batch := fs.Int("batch", 32, "prompts measured side by side (batched forward passes; the result does not depend on it)")
	backendFlag := fs.String("backend", "auto", backendUsage+"; for both models")
	svg := fs.String("svg", "", "also write the acceptance-length histogram as SVG to this file")
	live := fs.Bool("live", false, "run the real loop — the target verifying each draft — for each k of --ks, each tree of --trees and the target alone, greedy or at --temperature, and report wall-clock tokens/s, the speedup and the cost model; --batch is then how many prompts generate at once (default 1)")
	ksFlag := fs.String("ks", "1,2,4,8,16", "with --live: the draft lengths to measure")
	treesFlag := fs.String("trees", "", fmt.Sprintf("with --live: token trees to measure too, as b×N, comma-separated (2x8,4x16: b children a node, 2…%d; N nodes verified a step, 1…%d); default: none", speculative.MaxTopK, speculative.MaxTreeNodes))
	treeDepth := fs.Int("tree-depth", 6, fmt.Sprintf("with --live and --trees: the trees' depth, the drafter's passes a step (1…%d)", speculative.MaxK))
	unfused := fs.Bool("unfused", false, "with --live: measure each k of --ks and each tree of --trees also with the drafter's passes and the target's verification as separate calls, each read back, where the drafter and target share a device that runs a step as one submission (WebGPU)")
	uncoupled := fs.Bool("uncoupled", false, "with --live at a temperature: measure each k of --ks and each tree of --trees also uncoupled — each row by the standard rule from a seeded stream, greedy drafts (or proposals drawn one a pass on the CPU engines, held to the multi-draft rule; a tree's children such draws), steps not chained — against the coupled drafts of keyed rows, for comparing the two")
	unchained := fs.Bool("unchained", false, "with --live: measure each k of --ks, and the target alone, also with every step a call of its own, read back, where the engines chain steps on the device: fused steps each accepted there and the next planned from it (an EAGLE-3 head or a drafter on the target's WebGPU device), the target alone's each fed the token the one before chose")
	pMinsFlag := fs.String("p-mins", "", "with --live: measure each k of --ks also with each of these p_min values (comma-separated, each in (0, 1]), as the API's speculative.p_min asks: a draft ends before the first token whose probability under the drafter is below it")
	adaptive := fs.Bool("adaptive", false, "with --live: every speculative generation adaptive, as serve makes an API generation that sets no speculative.k: it runs the target alone where its speculative steps are measured not to pay (the output says how many did)")
	temperature := fs.Float64("temperature", 0, "with --live: 0 greedy; above, every generation samples at this temperature (0…2), prompt i with seed i, so that runs repeat")
	topP := fs.Float64("top-p", 1, "with --live and --temperature: the nucleus of top_p, (0, 1]")
	topN := fs.Int("top-n", 0, fmt.Sprintf("with --live: list each token's N most likely alternatives (0…%d), as the API's logprobs and the live page (5) ask, and each draft token's drafter alternatives too, to measure what listing costs", engine.MaxTopN))
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the run to this file")
	rounds := fs.Int("rounds", 1, "with --live: run the target alone, every k and every tree this many times over, in turn, and sum them (figures from a machine whose speed drifts)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	if *promptsFile == "" {
		return usagef("--prompts is required")
	}
	if !*live && (isSet(fs, "temperature") || isSet(fs, "top-p")) {
		return usagef("--temperature and --top-p take --live (the offline measure is greedy)")
	}
	if !*live && (isSet(fs, "trees") || isSet(fs, "tree-depth") || *unfused || *unchained || *uncoupled || *adaptive || isSet(fs, "top-n") || isSet(fs, "p-mins")) {
		return usagef("--trees, --tree-depth, --unfused, --unchained, --uncoupled, --p-mins, --adaptive and --top-n take --live (the offline measure drafts chains)")
	}
	pMins, err := parsePMins(*pMinsFlag)
	if err != nil {
		return err
	}
	if *topN < 0 || *topN > engine.MaxTopN {
		return usagef("--top-n %d: want 0…%d", *topN, engine.MaxTopN)
	}
	trees, err := parseTrees(*treesFlag)
	if err != nil {
		return err
	}
	if *treeDepth < 1 || *treeDepth > speculative.MaxK {
		return usagef("--tree-depth %d: want 1…%d", *treeDepth, speculative.MaxK)
	}
	if !(*temperature >= 0 && *temperature <= 2) || !(*topP > 0 && *topP <= 1) {
		return usagef("--temperature %v, --top-p %v: want 0…2 and a value in (0, 1]", *temperature, *topP)
	}
	if *live && !isSet(fs, "batch") {
		*batch = 1
	}
	if *rounds < 1 || *rounds > 100 {
		return usagef("--rounds %d: want 1…100", *rounds)
	}
	if *k < 1 || *k > maxDraft || *newTokens < 1 || *batch < 1 || *batch > 128 {
		return usagef("--k must be 1…%d, --new-tokens positive and --batch 1…128", maxDraft)
	}
	backend, err := parseBackend(*backendFlag)
	if err != nil {
		return err
	}
	load := func(dir, embedded string) (*checkpoint.Model, string, error) {
		if dir == "" {
			return loadEmbedded(embedded)
		}
		return loadModel(dir)
	}
	target, targetName, err := load(*targetDir, weights.TargetDir)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer target.Close()
	prompts, err := readPrompts(*promptsFile, target, *maxPrompts)
	if err != nil {
		return err
	}
	// KV memory for a batch of the longest prompt, its continuation and a
	// draft, f32, with a block of slack per sequence — twice over: an
	// engine whose cache holds back a block a sequence slot (WebGPU's)
	// keeps half of a small cache's blocks for its slots.
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p))
	}
	kvFor := func(m *checkpoint.Model) int64 {
		positions := int64(*batch) * int64(longest+*newTokens+max(*k, speculative.MaxK)+32)
		return 2 * positions * int64(engine.KVBytesPerToken(&m.Config, 4))
	}
	var te, de engine.Engine
	var drafterName string
	if draftsWithHead(*drafterDir) {
		hp, err := openHeadPair(e, target, targetName, *drafterDir, backend, kvFor(target))
		if err != nil {
			return err
		}
		defer hp.close()
		te, de, drafterName = hp.target, hp.head, "EAGLE-3 head "+*drafterDir
	} else {
		drafter, name, err := load(*drafterDir, weights.DrafterDir)
		if err != nil {
			return fmt.Errorf("drafter: %w", err)
		}
		defer drafter.Close()
		// One device for both (on WebGPU): sampled drafts verified on it.
		engs, err := openEngines(e, []*checkpoint.Model{target, drafter}, backend, []int64{kvFor(target), kvFor(drafter)}, *batch)
		if err != nil {
			return err
		}
		te, de, drafterName = engs[0], engs[1], name
		defer te.Close()
		defer de.Close()
	}

	if *live {
		ks, err := parseIDs(*ksFlag)
		if err != nil || slices.ContainsFunc(ks, func(k int) bool { return k < 1 || k > speculative.MaxK }) {
			return usagef("--ks %q: want draft lengths 1…%d, comma-separated", *ksFlag, speculative.MaxK)
		}
		return benchSpecLive(ctx, e, liveBench{
			drafter: de, target: te, drafterName: drafterName, targetName: targetName,
			prompts: prompts, ks: ks, trees: trees, treeDepth: *treeDepth, unfused: *unfused, unchained: *unchained, uncoupled: *uncoupled, pMins: pMins, adaptive: *adaptive, newTokens: *newTokens, batch: *batch, rounds: *rounds, topN: *topN, args: args,
			sampling: sampling.Params{Temperature: float32(*temperature), TopP: float32(*topP)},
		})
	}
	opts := specdec.Options{K: *k, NewTokens: *newTokens, Batch: *batch}
	if bar := newProgressBar(e, "prompts"); bar != nil {
		bar.ChangeMax(len(prompts))
		opts.Progress = func(done int) { bar.Set(done) }
		defer bar.Finish()
	}
	r, err := specdec.Run(ctx, te, de, prompts, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "target %s, drafter %s: %d prompts, k = %d, %d target tokens each\n", targetName, drafterName, r.Prompts, *k, *newTokens)
	fmt.Fprintf(e.stdout, "τ (mean tokens per verification step) = %.3f over %d steps\n", r.Tau(), r.Steps)
	fmt.Fprintf(e.stdout, "the target's continuations: %s\n\n", textSummary(textstats.Summarize(r.Continuations)))
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "accepted\tsteps\tshare\tdraft position\taccept rate")
	for a := range r.Hist {
		pos, rate := "", ""
		if a < *k {
			pos, rate = fmt.Sprint(a+1), fmt.Sprintf("%.3f", r.AcceptRate(a))
		}
		fmt.Fprintf(tw, "%d\t%d\t%.3f\t%s\t%s\n", a, r.Hist[a], float64(r.Hist[a])/float64(r.Steps), pos, rate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if *svg != "" {
		title := fmt.Sprintf("acceptance lengths: %s drafting for %s", drafterName, targetName)
		if err := os.WriteFile(*svg, r.HistogramSVG(title), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.stdout, "\nreproduce: webdraft bench spec %s\n", strings.Join(args, " "))
	return nil
}

// textSummary is the loop rate and distinct-4 of a set of continuations,
// for a report line.
func textSummary(s textstats.Summary) string {
	distinct := "n/a (none has 4 tokens)"
	if s.Measured > 0 {
		distinct = fmt.Sprintf("%.3f", s.Distinct)
	}
	return fmt.Sprintf("loop rate %.3f (%d of %d loop: a run of %d tokens %d times without overlap), distinct-%d %s (the mean over them)",
		s.LoopRate(), s.Looping, s.Sequences, textstats.LoopRun, textstats.LoopTimes, textstats.DistinctOrder, distinct)
}

// readPrompts reads a prompts file, tokenizing text with the model's tokenizer.
func readPrompts(path string, m *checkpoint.Model, limit int) ([][]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var prompts [][]int
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" {
			continue
		}
		var p struct {
			Text *string `json:"text"`
			IDs  []int   `json:"ids"`
		}
		if strings.HasPrefix(s, "{") {
			if err := json.Unmarshal([]byte(s), &p); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, err)
			}
		} else {
			p.Text = &s
		}
		ids := p.IDs
		if p.Text != nil {
			tok, err := modelTokenizer(m)
			if err != nil {
				return nil, err
			}
			ids = tok.Encode(*p.Text)
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("%s:%d: an empty prompt", path, line)
		}
		prompts = append(prompts, ids)
		if limit > 0 && len(prompts) == limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(prompts) == 0 {
		return nil, fmt.Errorf("%s: no prompts", path)
	}
	return prompts, nil
}
