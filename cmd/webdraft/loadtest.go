package main

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/net/http/httpguts"

	"webdraft/loadgen"
)

func runLoadtest(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "loadtest", "--url URL [--concurrency 32] [--conversations 100] [--turns 20] [--n 16] [--warm] [--session-header X-Session-ID]")
	url := fs.String("url", "http://127.0.0.1:8080", "webdraft server to load")
	conc := fs.Int("concurrency", 32, "conversations in flight")
	convs := fs.Int("conversations", 100, "conversations in all")
	turns := fs.Int("turns", 20, "/draft calls per conversation")
	n := fs.Int("n", 16, "draft length per call")
	minPrompt := fs.Int("min-prompt", 32, "shortest first-turn context, in tokens")
	maxPrompt := fs.Int("max-prompt", 256, "longest first-turn context, in tokens")
	accept := fs.Float64("accept", 0.7, "chance the simulated verifier accepts each next draft token")
	seed := fs.Uint64("seed", 1, "random seed")
	session := fs.String("session-header", "X-Session-ID", "header that carries each conversation's session key, for a router that keeps a session on one replica (\"\": none)")
	warm := fs.Bool("warm", false, "play each conversation's first turn before timing and leave it out: figures for contexts already cached")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *conc < 1 || *convs < 1 || *turns < 1:
		return usagef("--concurrency, --conversations and --turns must be at least 1")
	case *n < 1 || *n > maxDraft:
		return usagef("--n %d: want 1…%d", *n, maxDraft)
	case *minPrompt < 1 || *maxPrompt < *minPrompt:
		return usagef("want 1 ≤ --min-prompt ≤ --max-prompt")
	case *accept < 0 || *accept > 1:
		return usagef("--accept %g: want 0…1", *accept)
	case *session != "" && !httpguts.ValidHeaderFieldName(*session):
		return usagef("--session-header %q: not a header name", *session)
	}
	opts := loadgen.Options{URL: strings.TrimRight(*url, "/"), Concurrency: *conc, Conversations: *convs, Turns: *turns,
		N: *n, MinPrompt: *minPrompt, MaxPrompt: *maxPrompt, Accept: *accept, Seed: *seed, Warm: *warm,
		SessionHeader: *session}
	if bar := newProgressBar(e, "requests"); bar != nil {
		bar.ChangeMax(*convs * *turns)
		progressbar.OptionShowBytes(false)(bar)
		opts.Progress = func() { bar.Add(1) }
		defer bar.Finish()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conc}, Timeout: time.Minute}
	rep, err := loadgen.Run(ctx, client, opts)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "requests\tfailures\tp50\tp99\tdraft tokens/s\tcache reuse\twall")
	fmt.Fprintf(tw, "%d\t%d\t%.1f ms\t%.1f ms\t%.0f\t%.1f %%\t%.1f s\n", rep.Requests, rep.Failures,
		float64(rep.P50.Microseconds())/1000, float64(rep.P99.Microseconds())/1000,
		rep.DraftTokensPerSecond(), 100*rep.CacheReuse(), rep.Wall.Seconds())
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.Failures > 0 {
		var kinds []string
		for k, v := range rep.FailureCodes {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, v))
		}
		sort.Strings(kinds)
		fmt.Fprintf(e.stdout, "failures: %s\n", strings.Join(kinds, ", "))
	}
	fmt.Fprintf(e.stdout, "\nreproduce: webdraft loadtest %s\n", strings.Join(args, " "))
	return nil
}
