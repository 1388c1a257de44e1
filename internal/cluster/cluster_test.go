package cluster

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"webdraft/loadgen"
)

var (
	conversations = flag.Int("cluster.conversations", 12, "conversations a run (task cluster: 48)")
	concurrency   = flag.Int("cluster.concurrency", 6, "conversations in flight (task cluster: 12)")
	turns         = flag.Int("cluster.turns", 8, "/draft calls a conversation (task cluster: 16)")
	out           = flag.String("cluster.out", "", "a folder for the report (report.md), the reuse plot (reuse.svg) and the processes' logs")
)

// TestCluster runs three replicas of `webdraft serve` (the embedded pair,
// reference engine) behind HAProxy on loopback, loads them round-robin and
// with X-Session-ID affinity, kills one in the middle of a third run,
// and checks Report.Problems: affinity reuses the prefix caches more, no
// conversation changes replica but the killed one's, nothing fails but
// requests the killed one was serving, and the moved conversations reuse
// their caches again.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster takes a minute")
	}
	if _, err := findHAProxy(""); errors.Is(err, ErrNoHAProxy) {
		if os.Getenv("CI") == "true" {
			t.Fatal(err) // go tool task test installs it
		}
		t.Skip(err)
	}
	dir := *out
	if dir == "" {
		dir = t.TempDir()
	}
	bin := filepath.Join(t.TempDir(), "webdraft")
	if b, err := exec.Command("go", "build", "-o", bin, "webdraft/cmd/webdraft").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	rep, err := Run(context.Background(), Options{
		// The reference engine: the kill at 40 % of the run is timed for
		// its pace; on the fast CPU engine the run can end first.
		Cluster: Config{Bin: bin, Replicas: 3, Args: []string{"--backend", "reference"}, Dir: filepath.Join(dir, "logs")},
		Load: loadgen.Options{Concurrency: *concurrency, Conversations: *conversations, Turns: *turns, N: 8,
			MinPrompt: 32, MaxPrompt: 256, Accept: 0.7, Seed: 1},
		KillAfter: 0.4,
	})
	if err != nil {
		t.Fatalf("%v (logs in %s)", err, filepath.Join(dir, "logs"))
	}
	md := rep.Markdown()
	t.Logf("\n%s", md)
	if *out != "" {
		for name, data := range map[string][]byte{"report.md": []byte(md), "reuse.svg": rep.Plot()} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("report, plot and logs in %s", dir)
	}
	for _, p := range rep.Problems() {
		t.Error(p)
	}
}
