package soak

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	duration = flag.Duration("soak.duration", time.Minute, "how long the soak's clients run (task soak: 10m)")
	out      = flag.String("soak.out", "", "a folder for the soak's report (report.md) and memory plot (memory.svg)")
	// The reference engine by default: the soak's checks (connections
	// left, the heap's growth) are calibrated at its pace; on the fast CPU
	// engine they still meet timing of their own (see BENCHMARKS.md).
	backend = flag.String("soak.backend", "reference", "the server's --backend")
)

// Server flags of the soak: short body and idle timeouts so that slow
// clients are refused within the soak, request and generation time limits
// that shed load within it when the machine is slow, a small KV budget so
// that the prefix cache evicts all the time.
const (
	bodyTimeout       = 3 * time.Second
	idleTimeout       = 5 * time.Second
	requestTimeout    = time.Minute
	generationTimeout = 2 * time.Minute
)

// TestSoak runs `webdraft serve` (the embedded pair) on loopback and soaks
// it: 64 clients for -soak.duration, then every check of Report.Problems.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak takes a minute at least")
	}
	bin := filepath.Join(t.TempDir(), "webdraft")
	build := exec.Command("go", "build", "-o", bin, "webdraft/cmd/webdraft")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	addr := freeAddr(t)
	srv := exec.Command(bin, "serve", "--addr", addr, "--backend", *backend, "--cache-mb", "32", "--max-queue", "48",
		"--body-timeout", bodyTimeout.String(), "--idle-timeout", idleTimeout.String(),
		"--request-timeout", requestTimeout.String(), "--generation-timeout", generationTimeout.String())
	logs, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	serverLog := make(chan string, 1)
	go func() {
		var tail []string
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			if tail = append(tail, sc.Text()); len(tail) > 40 {
				tail = tail[1:]
			}
		}
		serverLog <- strings.Join(tail, "\n")
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = srv.Process.Kill()
			_ = srv.Wait()
		}
	})
	url := "http://" + addr
	waitHealthy(t, url)

	rep, err := Run(context.Background(), Options{URL: url, PID: srv.Process.Pid, Duration: *duration,
		BodyTimeout: bodyTimeout, IdleTimeout: idleTimeout, GenerationTimeout: generationTimeout, Seed: uint64(time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	// The server still drains and stops cleanly on SIGTERM.
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitErr := srv.Wait()
	stopped = true
	tail := <-serverLog
	if waitErr != nil {
		t.Errorf("serve after SIGTERM: %v; its log's tail:\n%s", waitErr, tail)
	}

	md := rep.Markdown()
	t.Logf("\n%s", md)
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"report.md": []byte(md), "memory.svg": rep.Plot(), "samples.csv": rep.CSV()} {
			if err := os.WriteFile(filepath.Join(*out, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("report and plot in %s", *out)
	}
	if rep.Served() == 0 {
		t.Error("no well-formed request was served")
	}
	for _, p := range rep.Problems() {
		t.Error(p)
	}
	if t.Failed() {
		t.Logf("the server's log's tail:\n%s", tail)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHealthy(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/health")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal(fmt.Sprintf("%s never became healthy", url))
}
