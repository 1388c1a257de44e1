package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"webdraft/gpu"
)

// runAsWebdraft makes the test binary act as webdraft when
// WEBDRAFT_TEST_MAIN is set: the tests below run it as a child process, to
// see what reaches the process's own stderr (C libraries write there
// directly) and to give it an environment of its own.
func TestMain(m *testing.M) {
	if os.Getenv("WEBDRAFT_TEST_MAIN") == "1" {
		main() // exits
	}
	os.Exit(m.Run())
}

// webdraftProcess runs webdraft with args in a child process whose
// environment is the test's with env applied ("NAME=value" sets, "NAME="
// with an empty value unsets), and returns its exit code, stdout and
// stderr.
func webdraftProcess(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	vars := map[string]string{}
	for _, kv := range append(os.Environ(), append([]string{"WEBDRAFT_TEST_MAIN=1"}, env...)...) {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	for k, v := range vars {
		if v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// TestAutoBackend checks what --backend auto picks and says why: the CPU
// engine when there is no WebGPU adapter (the Vulkan loader pointed at no
// driver) and when the only adapter is a software renderer such as
// lavapipe; nothing but webdraft's own log lines on stderr, whatever the
// environment lacks (XDG_RUNTIME_DIR unset, as for a service).
func TestAutoBackend(t *testing.T) {
	draft := []string{"draft", "--model", goldenTied, "--ids", "1,2,3", "--n", "2"}
	cases := []struct {
		name string
		env  []string
		want string // in the engine's log line
	}{
		{"no adapter", []string{"VK_ICD_FILENAMES=/nonexistent/icd.json", "XDG_RUNTIME_DIR="}, `backend=cpu adapter="Go CPU engine`},
	}
	if d, err := gpu.Open(gpu.Options{}); err == nil {
		info := d.Info()
		d.Close()
		want := "backend=webgpu"
		if info.Software() {
			want = `backend=cpu adapter="Go CPU engine`
		}
		cases = append(cases, struct {
			name string
			env  []string
			want string
		}{"this machine: " + info.String(), []string{"XDG_RUNTIME_DIR="}, want})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := webdraftProcess(t, c.env, draft...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if len(draftOut(t, stdout)) != 2 {
				t.Errorf("stdout %q", stdout)
			}
			if !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "why=") {
				t.Errorf("stderr does not say %q and why:\n%s", c.want, stderr)
			}
			for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
				if !strings.HasPrefix(line, "time=") {
					t.Errorf("a line on stderr that is not webdraft's log: %q", line)
				}
			}
		})
	}
}

// TestServeStopsWithParent starts `webdraft serve` from a shell that then
// exits, as task does when it is stopped: the server must not run on as an
// orphan (on Linux it is sent SIGTERM and drains; elsewhere the test is
// skipped).
func TestServeStopsWithParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("stopping with the parent is Linux's PR_SET_PDEATHSIG")
	}
	log := filepath.Join(t.TempDir(), "serve.log")
	script := `"$0" serve --model "$1" --backend cpu --addr 127.0.0.1:0 >"$2" 2>&1 & echo $!; sleep 1`
	cmd := exec.Command("sh", "-c", script, os.Args[0], goldenTied, log)
	cmd.Env = append(os.Environ(), "WEBDRAFT_TEST_MAIN=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the shell printed %q", out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for syscall.Kill(pid, 0) == nil { // until the server's process is gone
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatal("the server still runs 20 s after its parent ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	logged, _ := os.ReadFile(log)
	if !strings.Contains(string(logged), "msg=stopped") {
		t.Errorf("the server did not drain and stop; its log:\n%s", logged)
	}
}
