// Package dawn holds lab/dawn's test: the page's browser engine and the
// gpu and kernels packages' tests compiled to wasm, run by Node on Dawn
// (Chrome's WebGPU, the npm package webgpu's dawn.node) over SwiftShader's
// Vulkan driver, which Debian's chromium ships. The harness and the
// runners it drives are the .cjs files beside it (README.md).
package dawn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"webdraft/internal/syncbuf"
)

const (
	// swiftShaderICD is the Vulkan driver Dawn is pointed at: Dawn refuses
	// Mesa's lavapipe, but takes SwiftShader, which chromium carries.
	swiftShaderICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
	// dawnNode is where `go tool task deps:dawn` installs dawn.node.
	dawnNode = "node_modules/webgpu/dist/linux-x64/dawn.node"
	// kernelsRun is the kernels tests run through Dawn: all of them take
	// about 6 minutes on SwiftShader on 2 cores (alone; 11 beside other
	// work), these about 1 — a test of each kind of kernel: every int4
	// matmul kernel, attention with hidden keys, the KV cache's pool and
	// moves, embedding, norm, argmax, the fused MLP, copies, scatter and
	// gather, the params' layouts against the WGSL, proposals, tree drafts,
	// chained speculative steps' acceptance and rows.
	// Left out besides the slow ones (TestAttentionPrefill, TestMatMul,
	// TestMatMulUnsplit, TestSample, TestTreeWalk…), as they fail on
	// SwiftShader through Dawn: TestQKVRopeKV, TestQKVProjRopeKV and TestQKVFused (q off
	// by ~1e-4 relative against the tests' 1e-5; most likely SwiftShader's
	// sin and cos in the rotation, which WGSL allows 2^-11), and
	// TestMatMulRowBlocks's f32 cases and TestEmbedRowBlocks (the bindings
	// they choose hold too few rows at SwiftShader's 256-byte offset
	// alignment).
	kernelsRun = "^(TestAttentionHiddenKeys|TestAttentionDecodeShortMaxLen|TestKVCachePool|TestKVMove|TestMatMulEachKernel|" +
		"TestMatVecBatchChunk|TestEmbed|TestEmbedBadIDIsNaN|TestRMSNorm|TestRMSNormRows|TestArgmax|TestArgmaxOf|TestMLPFused|TestCopy|TestCopyTo|" +
		"TestScatter|TestGather|TestParamsMatchWGSL|TestPropose|TestTreeDraft|TestSpecAccept|TestSpecRows|TestSpecKeys)$"
)

// TestDawnSwiftShader runs, through Dawn on SwiftShader: the harness's
// engine mode on the golden models, every draft checked against native
// webdraft's (`webdraft draft --backend webgpu`, on the machine's own
// Vulkan driver: lavapipe in CI); then the gpu package's tests and a subset
// of the kernels package's (kernelsRun), compiled to wasm and run by
// gotest.cjs. It skips without Node, dawn.node or SwiftShader — unless
// CI is set: CI must run it.
func TestDawnSwiftShader(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs Node on Dawn on SwiftShader (a few minutes)")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository's root: %v", err)
	}
	node := prerequisites(t, root)
	dawn := filepath.Join(root, "lab", "dawn", dawnNode)
	wasmDir := filepath.Join(root, "wasm", "dist", "files")
	for _, f := range []string{"drafter.wasm", "wasm_exec.js"} {
		if _, err := os.Stat(filepath.Join(wasmDir, f)); err != nil {
			t.Fatalf("%v: run go tool task wasm first (go tool task test does)", err)
		}
	}
	env := append(os.Environ(), "DAWN_NODE="+dawn, "VK_ICD_FILENAMES="+swiftShaderICD)

	t.Run("engine", func(t *testing.T) {
		testEngine(t, root, node, wasmDir, env)
	})
	goroot := strings.TrimSpace(string(run(t, root, 2*time.Minute, nil, "go", "env", "GOROOT")))
	// The toolchain's wasm_exec.js, as the binaries were built by it.
	env = append(env, "WASM_EXEC="+filepath.Join(goroot, "lib", "wasm", "wasm_exec.js"))
	t.Run("gpu", func(t *testing.T) {
		testWasm(t, root, node, env, "gpu", "", 2*time.Minute)
	})
	t.Run("kernels", func(t *testing.T) {
		testWasm(t, root, node, env, "kernels", kernelsRun, 5*time.Minute)
	})
}

// prerequisites finds node, dawn.node and SwiftShader; it skips the test
// when one is missing, or fails it where CI is set. It gives node's path.
func prerequisites(t *testing.T, root string) string {
	t.Helper()
	var missing []string
	node, err := exec.LookPath("node")
	if err != nil {
		missing = append(missing, "node (Node.js 20: go tool task deps:dawn installs Debian's nodejs when it is missing)")
	}
	if _, err := os.Stat(filepath.Join(root, "lab", "dawn", dawnNode)); err != nil {
		missing = append(missing, "lab/dawn/"+dawnNode+" (the npm package webgpu@0.6.2: go tool task deps:dawn)")
	}
	if _, err := os.Stat(swiftShaderICD); err != nil {
		missing = append(missing, swiftShaderICD+" (SwiftShader's Vulkan driver: Debian's chromium, go tool task deps:test)")
	}
	if len(missing) == 0 {
		return node
	}
	msg := "missing: " + strings.Join(missing, "; ")
	if os.Getenv("CI") != "" {
		t.Fatalf("%s — CI must run this test (go tool task test installs them)", msg)
	}
	t.Skipf("SKIPPING Node + Dawn on SwiftShader: %s", msg)
	return ""
}

// engineReport is what the harness's engine mode writes with --out (the
// fields checked here).
type engineReport struct {
	Adapter           string `json:"adapter"`
	BootMS            any    `json:"boot_ms"`
	DraftsEqualNative *bool  `json:"drafts_equal_native"`
	Models            map[string]struct {
		Adapter       string `json:"adapter"`
		LoadMS        any    `json:"load_ms"`
		FirstDraftMS  any    `json:"first_draft_ms"`
		StepMS        any    `json:"step_ms"`
		StepGoMS      any    `json:"step_go_ms"`
		ChainedStepMS any    `json:"chained_step_ms"`
		Drafts        []struct {
			Draft  []int `json:"draft"`
			Native []int `json:"native"`
			Equal  bool  `json:"equal"`
		} `json:"drafts"`
	} `json:"models"`
}

func testEngine(t *testing.T, root, node, wasmDir string, env []string) {
	tmp := t.TempDir()
	native := nativeWebdraft(t, root, tmp)
	prompts := filepath.Join(tmp, "prompts.jsonl")
	const nPrompts = 2
	if err := os.WriteFile(prompts, []byte("{\"ids\": [1, 2, 3, 4, 5]}\n{\"ids\": [7, 3, 9, 12, 4, 4, 1]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "engine.json")
	// About 80 s here: the engine's boot and pipelines on SwiftShader,
	// and a native draft for each model and prompt.
	stdout := run(t, root, 6*time.Minute, env, node, "lab/dawn/harness.cjs", "engine",
		"--drafter", "testdata/golden/tied", "--target", "testdata/golden/untied", "--prompts", prompts,
		"--n", "8", "--steps", "4", "--chain", "8", "--rounds", "2", "--wasm", wasmDir,
		"--native", native, "--out", out)
	t.Logf("the harness's summary:\n%s", stdout)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r engineReport
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if r.DraftsEqualNative == nil || !*r.DraftsEqualNative {
		t.Errorf("drafts_equal_native is not true (the report: %s)", data)
	}
	if !strings.Contains(r.Adapter, "SwiftShader") {
		t.Errorf("the adapter is %q, want SwiftShader's", r.Adapter)
	}
	positive(t, "boot_ms", r.BootMS)
	for _, role := range []string{"drafter", "target"} {
		m, ok := r.Models[role]
		if !ok {
			t.Errorf("no %s in the report", role)
			continue
		}
		if !strings.Contains(m.Adapter, "SwiftShader") {
			t.Errorf("%s: the adapter is %q, want SwiftShader's", role, m.Adapter)
		}
		for name, v := range map[string]any{"load_ms": m.LoadMS, "first_draft_ms": m.FirstDraftMS, "step_ms": m.StepMS,
			"step_go_ms": m.StepGoMS, "chained_step_ms": m.ChainedStepMS} {
			positive(t, role+"."+name, v)
		}
		if len(m.Drafts) != nPrompts {
			t.Errorf("%s: %d drafts, want one for each of the %d prompts", role, len(m.Drafts), nPrompts)
		}
		for i, d := range m.Drafts {
			if len(d.Draft) != 8 || !d.Equal {
				t.Errorf("%s, prompt %d: draft %v, native %v (equal %v): want 8 tokens, equal", role, i+1, d.Draft, d.Native, d.Equal)
			}
		}
	}
}

// positive fails the test unless v (a JSON value) is a positive finite
// number.
func positive(t *testing.T, name string, v any) {
	t.Helper()
	x, ok := v.(float64)
	if !ok || !(x > 0) || math.IsInf(x, 0) {
		t.Errorf("%s is %v, want a positive number", name, v)
	}
}

// nativeWebdraft builds webdraft (with GOEXPERIMENT=simd where this test
// was built with it; without the embedded pair, which the harness does not
// use) and gives a wrapper that runs it without VK_ICD_FILENAMES: the
// harness passes its own environment, SwiftShader's, to the native runs,
// and native webdraft is to run on the machine's own Vulkan driver
// (lavapipe in CI), a second driver to check Dawn's drafts against.
func nativeWebdraft(t *testing.T, root, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "webdraft")
	env := os.Environ()
	if exp, ok := goexperiment(); ok {
		env = append(env, "GOEXPERIMENT="+exp)
		t.Logf("native webdraft: GOEXPERIMENT=%s, as this test was built", exp)
	}
	run(t, root, 8*time.Minute, env, "go", "build", "-tags", "webdraft_noembed", "-o", bin, "./cmd/webdraft")
	wrapper := filepath.Join(dir, "native.sh")
	script := fmt.Sprintf("#!/bin/sh\nunset VK_ICD_FILENAMES\nexec %q \"$@\"\n", bin)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

// goexperiment is the GOEXPERIMENT this test binary was built with, when
// its build information says (else the environment's goes to go build).
func goexperiment() (string, bool) {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "GOEXPERIMENT" {
				return s.Value, true
			}
		}
	}
	return "", false
}

// testWasm builds pkg's tests for the browser (GOOS=js GOARCH=wasm) and
// runs them through Dawn with gotest.cjs in the package's folder, as the
// go tool runs a test binary; runPattern, when not empty, is -test.run.
func testWasm(t *testing.T, root, node string, env []string, pkg, runPattern string, limit time.Duration) {
	bin := filepath.Join(t.TempDir(), pkg+".test.wasm")
	// The browser build is made without GOEXPERIMENT, as go tool task wasm makes it.
	build := append(os.Environ(), "GOOS=js", "GOARCH=wasm", "GOEXPERIMENT=")
	run(t, root, 5*time.Minute, build, "go", "test", "-c", "-o", bin, "./"+pkg)
	args := []string{filepath.Join(root, "lab", "dawn", "gotest.cjs"), bin, "-test.v",
		"-test.timeout", (limit - 10*time.Second).String()}
	if runPattern != "" {
		args = append(args, "-test.run", runPattern)
	}
	_, out := runBoth(t, filepath.Join(root, pkg), limit, env, node, args...)
	if !strings.Contains(string(out), "adapter SwiftShader") {
		t.Errorf("the tests did not run on SwiftShader (no \"adapter SwiftShader\" line):\n%s", tail(out))
	}
	var passed int
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "--- PASS") {
			passed++
		}
	}
	t.Logf("%s: %d tests passed as wasm through Dawn", pkg, passed)
}

// run runs name with args in dir (with env, or this process's when nil)
// within limit, and gives its standard output; on failure it fails the
// test with the tail of its output, standard error with it.
func run(t *testing.T, dir string, limit time.Duration, env []string, name string, args ...string) []byte {
	t.Helper()
	stdout, _ := runBoth(t, dir, limit, env, name, args...)
	return stdout
}

// runBoth is run, giving also standard output and error together.
func runBoth(t *testing.T, dir string, limit time.Duration, env []string, name string, args ...string) (stdout, both []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.WaitDelay = 10 * time.Second // the harness's native runs may hold its pipes
	var out bytes.Buffer
	all := &syncbuf.Buffer{}
	cmd.Stdout = io.MultiWriter(&out, all)
	cmd.Stderr = all
	start := time.Now()
	err := cmd.Run()
	what := name + " " + strings.Join(args, " ")
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w (stopped after %v)", err, limit)
		}
		t.Fatalf("%s: %v; its output's end:\n%s", what, err, tail(all.Bytes()))
	}
	t.Logf("%s: %.1f s", what, time.Since(start).Seconds())
	return out.Bytes(), all.Bytes()
}

// tail is the last lines of a command's output, less Dawn's
// "XDG_RUNTIME_DIR is invalid" (harmless) and go test's "=== RUN" lines.
func tail(out []byte) string {
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "XDG_RUNTIME_DIR") || strings.HasPrefix(l, "=== ") {
			continue
		}
		keep = append(keep, l)
	}
	if len(keep) > 80 {
		keep = append([]string{fmt.Sprintf("… (%d lines before)", len(keep)-80)}, keep[len(keep)-80:]...)
	}
	return strings.Join(keep, "\n")
}
