package loadgen_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"webdraft/checkpoint"
	"webdraft/engine"
	"webdraft/loadgen"
	"webdraft/server"
	"webdraft/tokenizer"
)

// TestAgainstServer runs a small load against a real server on the CPU
// engine: no failures, and a verifier-like workload reuses the cache.
func TestAgainstServer(t *testing.T) {
	m, err := checkpoint.Load(filepath.Join("..", "testdata", "golden", "tied"), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng, err := engine.NewReference(m.Config, m.Weights, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Default()
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		srv.Run(ctx, server.Config{Drafter: server.Model{Name: "tied", Engine: eng, Tokenizer: tok}})
		close(done)
	}()
	defer func() { cancel(); <-done }()
	for i := 0; i < 200; i++ {
		if resp, err := http.Get(ts.URL + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}

	progress := 0
	rep, err := loadgen.Run(context.Background(), http.DefaultClient, loadgen.Options{
		URL: ts.URL, Concurrency: 8, Conversations: 16, Turns: 6, N: 8,
		MinPrompt: 20, MaxPrompt: 60, Accept: 0.7, Seed: 1, Progress: func() { progress++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 16*6 || rep.Failures != 0 || progress != rep.Requests {
		t.Errorf("requests %d failures %d (%v) progress %d", rep.Requests, rep.Failures, rep.FailureCodes, progress)
	}
	if rep.DraftTokens != rep.Requests*8 || rep.P50 <= 0 || rep.P99 < rep.P50 {
		t.Errorf("report %+v", rep)
	}
	// Turns after the first reuse all but their last token or two.
	if rep.CacheReuse() < 0.6 {
		t.Errorf("cache reuse %.2f, want ≥ 0.6", rep.CacheReuse())
	}

	// Warm: the first turns are played but not reported, so every reported
	// call finds all but the verifier's last few tokens cached.
	progress = 0
	warm, err := loadgen.Run(context.Background(), http.DefaultClient, loadgen.Options{
		URL: ts.URL, Concurrency: 8, Conversations: 16, Turns: 6, N: 8,
		MinPrompt: 20, MaxPrompt: 60, Accept: 0.7, Seed: 2, Progress: func() { progress++ }, Warm: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if warm.Requests != 16*5 || warm.Failures != 0 || progress != 16*6 {
		t.Errorf("warm: requests %d failures %d (%v) progress %d", warm.Requests, warm.Failures, warm.FailureCodes, progress)
	}
	if min := 1 - 9.0/(20+8); warm.CacheReuse() < min {
		t.Errorf("warm: cache reuse %.2f, want ≥ %.2f (at most 9 new tokens a call on ≥ 20 cached)", warm.CacheReuse(), min)
	}
}
