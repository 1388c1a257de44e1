package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"webdraft/checkpoint"
	"webdraft/eagle3"
	"webdraft/engine"
	"webdraft/engine/cpu"
	"webdraft/engine/webgpu"
	"webdraft/gpu"
	"webdraft/weights"
)

// headNote ends the help of a flag that names the drafter.
const headNote = "; or an EAGLE-3 draft head's folder (LlamaForCausalLMEagle3: public BF16/F16/F32, quantized to int4 on load, or webdraft convert's), which reads the target's hidden states (WebGPU or the CPU engine)"

// embeddedHead names the embedded EAGLE-3 head where a flag takes a
// drafter (serve's and generate's --model, bench spec's --drafter).
const embeddedHead = "embedded:" + weights.HeadDir

// defaultDrafter is serve's and generate's --model when left out: the
// embedded EAGLE-3 head where the embedded target verifies (no --target)
// on an engine that runs heads (not --backend reference) and the binary
// carries it; else "", the embedded drafter.
func defaultDrafter(modelDir, targetDir string, b backendChoice) string {
	if modelDir == "" && targetDir == "" && b != "reference" && weights.Embedded() {
		return embeddedHead
	}
	return modelDir
}

// draftsWithHead reports whether the drafter dir names is an EAGLE-3 head:
// the embedded one, or a head's folder (isHead).
func draftsWithHead(dir string) bool { return dir == embeddedHead || isHead(dir) }

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
// reads, and the head drafting for it, on one device.
type headPair struct {
	target engine.Engine
	head   engine.Head
	model  *checkpoint.Eagle3
	reopen *enginePair // serve's: the pair reopened after a fault (reopener)
}

// reopener opens the pair again over the same models (target and p's
// head), on the engine b picks, the target with kvBytes of KV cache and
// the head with as many positions: the server's Reopen after a fault, the
// target's (0) and the head's (1).
func (p *headPair) reopener(target *checkpoint.Model, b backendChoice, kvBytes int64) *enginePair {
	return &enginePair{open: func(context.Context) ([]engine.Engine, error) {
		n, _, err := startHeadPair(target, p.model, b, kvBytes)
		if err != nil {
			return nil, err
		}
		return []engine.Engine{n.target, n.head}, nil
	}}
}

func (p *headPair) close() {
	p.head.Close()
	p.target.Close()
	p.model.Close()
}

// loadHead loads the EAGLE-3 head in dir, or the embedded one
// (embeddedHead).
func loadHead(dir string) (*checkpoint.Eagle3, error) {
	if dir != embeddedHead {
		return checkpoint.LoadEagle3(dir, checkpoint.LoadOptions{})
	}
	if !weights.Embedded() {
		return nil, errNoEmbedded
	}
	return checkpoint.LoadEagle3FS(weights.FS(), weights.HeadDir, checkpoint.LoadOptions{})
}

// openHeadPair loads the head in dir (or the embedded one) and starts the
// target keeping the features the head reads, with kvBytes of KV cache,
// and the head over it, holding as many positions, on the engine --backend
// picks as openEngines does: WebGPU (the head in the target's group) or the
// CPU engine. The reference engine runs no head.
func openHeadPair(e *env, target *checkpoint.Model, targetName, dir string, b backendChoice, kvBytes int64) (*headPair, error) {
	if b == "reference" {
		return nil, usagef("an EAGLE-3 head runs on WebGPU or the CPU engine: --backend reference is not supported with one")
	}
	m, err := loadHead(dir)
	if err != nil {
		return nil, fmt.Errorf("head %s: %w", dir, err)
	}
	tc := target.Config
	if err := m.Config.Check(tc); err != nil {
		m.Close()
		return nil, fmt.Errorf("head %s does not fit target %s: %w", dir, targetName, err)
	}
	hp, why, err := startHeadPair(target, m, b, kvBytes)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("head %s: %w", dir, err)
	}
	logEngine(e, hp.target, why)
	logEngine(e, hp.head, why)
	return hp, nil
}

// startHeadPair starts the target and the head on the engine b picks, and
// says why.
func startHeadPair(target *checkpoint.Model, m *checkpoint.Eagle3, b backendChoice, kvBytes int64) (*headPair, string, error) {
	tc := target.Config
	aux := m.Config.Aux(tc.NumHiddenLayers)
	why := "--backend " + string(b)
	if b != "cpu" {
		g, err := webgpu.OpenGroup(gpu.Options{HardwareOnly: b == "auto"})
		switch {
		case err == nil:
			defer g.Close() // the device closes with the last engine
			if b == "auto" {
				why = "a GPU was found"
			}
			te, err := g.New(tc, target.Weights, webgpu.Options{KVBytes: kvBytes, FeatureLayers: aux})
			if err != nil {
				return nil, "", fmt.Errorf("webgpu: %w", err)
			}
			he, err := webgpu.NewHead(te, m.Config, m.Weights, webgpu.HeadOptions{}) // as many positions as the target's
			if err != nil {
				te.Close()
				return nil, "", err
			}
			return &headPair{target: te, head: he, model: m}, why + "; the head shares the target's device", nil
		case b == "auto" && errors.Is(err, gpu.ErrNoHardwareAdapter):
			why = err.Error() + ": the CPU engine is faster than a software renderer (--backend webgpu takes it)"
		case b == "auto" && errors.Is(err, gpu.ErrNoAdapter):
			why = "no WebGPU adapter"
		default:
			return nil, "", fmt.Errorf("webgpu: %w", err)
		}
	}
	te, err := cpu.New(tc, target.Weights, cpu.Options{KVBytes: kvBytes, FeatureLayers: aux})
	if err != nil {
		return nil, "", err
	}
	he, err := cpu.NewHead(te, m.Config, m.Weights, cpu.HeadOptions{}) // as many positions as the target's
	if err != nil {
		te.Close()
		return nil, "", err
	}
	return &headPair{target: te, head: he, model: m}, why, nil
}
