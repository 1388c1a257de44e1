package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeDrainsOnShutdown: the embedded model is served; on SIGTERM (the
// context's end) a request already being received completes with 200 and
// serve exits 0.
func TestServeDrainsOnShutdown(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	var stderr strings.Builder
	go func() { exit <- run(ctx, []string{"serve", "--addr", addr, "--backend", "cpu"}, io.Discard, &stderr) }()

	ready := false
	for i := 0; i < 3000 && !ready; i++ {
		if resp, err := http.Get("http://" + addr + "/health"); err == nil {
			ready = resp.StatusCode == 200
			resp.Body.Close()
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !ready {
		t.Fatalf("never healthy: %s", stderr.String())
	}

	// Send the headers and half the body, shut down, then finish the body.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"tokens":[1,2,3,4],"n":8}`
	fmt.Fprintf(conn, "POST /draft HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
	time.Sleep(100 * time.Millisecond)
	cancel()
	time.Sleep(100 * time.Millisecond)
	if _, err := io.WriteString(conn, body[10:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("in-flight request: status %d", resp.StatusCode)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after shutdown")
	}
	if _, err := http.Get("http://" + addr + "/health"); err == nil {
		t.Error("still listening after shutdown")
	}
}

func TestServeUsage(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--cache-mb", "0"},
		{"serve", "--chain-steps", "0"},
		{"serve", "--k", "0"},
		{"serve", "--k", "65"},
		{"serve", "--backend", "quantum"},
	} {
		if code, _, _ := webdraft(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	// A pair whose vocabularies differ is refused in one line naming both.
	golden := filepath.Join("..", "..", "testdata", "golden", "untied")
	code, _, stderr := webdraft(t, "serve", "--addr", "127.0.0.1:0", "--backend", "cpu", "--target", golden)
	if last := lastLine(stderr); code != 1 || !strings.Contains(last, "embedded:drafter") || !strings.Contains(last, golden) || !strings.Contains(last, "vocabulary") {
		t.Errorf("a mismatched pair: exit %d, %q", code, last)
	}
	// An address in use is an error, not a hang.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if code, _, stderr := webdraft(t, "serve", "--addr", ln.Addr().String()); code != 1 || !strings.Contains(stderr, "address already in use") {
		t.Errorf("busy address: exit %d, %s", code, stderr)
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
