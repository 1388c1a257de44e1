package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"webdraft/checkpoint"
	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/cpu"
)

// headNote ends the help of a flag that names the drafter.
const headNote = "; or an EAGLE-3 draft head's folder (LlamaForCausalLMEagle3: public BF16/F16/F32, quantized to int4 on load, or webdraft convert's), which reads the target's hidden states (CPU engine)"

// isHead reports whether dir is an EAGLE-3 head's folder (its config.json
// names LlamaForCausalLMEagle3); a folder whose config.json cannot be read
// is not, and its loader says why.
func isHead(dir string) bool {
	if dir == "" || strings.HasPrefix(dir, "embedded:") {
		return false
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	return err == nil && eagle3.IsHead(data)
}

// headPair is a target engine that keeps the features an EAGLE-3 head
// reads, and the head drafting for it.
type headPair struct {
	target *cpu.Engine
	head   *cpu.Head
	model  *checkpoint.Eagle3
	name   string
}

func (p *headPair) close() {
	p.head.Close()
	p.target.Close()
	p.model.Close()
}

// openHeadPair loads the head in dir and starts the target on the CPU
// engine keeping the features the head reads, each with kvBytes of KV
// cache. A head runs on the CPU engine so far: --backend webgpu is
// refused, auto takes the CPU.
func openHeadPair(e *env, target *checkpoint.Model, targetName, dir string, b backendChoice, kvBytes int64) (*headPair, error) {
	switch b {
	case "webgpu", "reference":
		return nil, usagef("an EAGLE-3 head runs on the CPU engine: --backend %s is not supported with one (use auto or cpu)", b)
	}
	m, err := checkpoint.LoadEagle3(dir, checkpoint.LoadOptions{})
	if err != nil {
		return nil, fmt.Errorf("head: %w", err)
	}
	tc := target.Config
	if err := m.Config.Check(tc); err != nil {
		m.Close()
		return nil, fmt.Errorf("head %s does not fit target %s: %w", dir, targetName, err)
	}
	te, err := cpu.New(tc, target.Weights, cpu.Options{KVBytes: kvBytes, FeatureLayers: m.Config.Aux(tc.NumHiddenLayers)})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("target: %w", err)
	}
	he, err := cpu.NewHead(te, m.Config, m.Weights, cpu.HeadOptions{KVBytes: kvBytes})
	if err != nil {
		te.Close()
		m.Close()
		return nil, fmt.Errorf("head %s: %w", dir, err)
	}
	why := "an EAGLE-3 head runs on the CPU engine"
	logEngine(e, te, why)
	logEngine(e, he, why)
	return &headPair{target: te, head: he, model: m, name: dir}, nil
}

var _ engine.Head = (*cpu.Head)(nil)
