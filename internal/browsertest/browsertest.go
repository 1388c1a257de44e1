// Package browsertest gives a test headless Chromium, driven by chromedp:
// Debian's chromium (it ships SwiftShader, a CPU WebGPU adapter; a test
// tool's own browser download cannot work here), with a fresh profile, the
// page's console in the test's log.
package browsertest

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium is Debian's browser (`apt-get install chromium`; `go tool task
// deps:test` installs it).
const Chromium = "/usr/bin/chromium"

// flags give headless Chromium a WebGPU adapter on SwiftShader.
var flags = []string{
	"headless", "no-sandbox", "enable-unsafe-webgpu", "use-webgpu-adapter=swiftshader",
	"disable-background-networking", "disable-component-update", "disable-sync", "no-first-run", "disable-quic",
}

// Require skips the test without Chromium — or fails it, where CI must
// run it — and with -short.
func Require(t *testing.T, what string) {
	t.Helper()
	if _, err := os.Stat(Chromium); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (CI installs it with `go tool task deps:test`): %v", Chromium, err)
		}
		t.Skipf("SKIPPING %s: %s is missing (apt-get install chromium): %v", what, Chromium, err)
	}
	if testing.Short() {
		t.Skipf("-short: %s runs a browser", what)
	}
}

// New starts the browser, for at most timeout, and returns its first
// tab's context (chromedp.NewContext of it opens more tabs); it logs the
// browser and the pages' console until the test ends.
func New(t *testing.T, timeout time.Duration) context.Context {
	return start(t, timeout, false)
}

// NewStrict is New, and a console error or an uncaught exception fails
// the test: for a page that promises to work, where either is a bug.
func NewStrict(t *testing.T, timeout time.Duration) context.Context {
	return start(t, timeout, true)
}

func start(t *testing.T, timeout time.Duration, strict bool) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(Chromium), chromedp.UserDataDir(t.TempDir())}
	for _, f := range flags {
		name, value, ok := strings.Cut(f, "=")
		if ok {
			opts = append(opts, chromedp.Flag(name, value))
		} else {
			opts = append(opts, chromedp.Flag(name, true))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancel()
		wg.Wait()
	})
	// The first Run starts the browser; the console is read after it.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v", Chromium, err)
	}
	ua, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.userAgent`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("browser: %s", ua)
	console(t, ctx, &wg, strict)
	return ctx
}

// console logs a tab's console messages until its context ends; with
// strict an error or an uncaught exception fails the test.
func console(t *testing.T, ctx context.Context, wg *sync.WaitGroup, strict bool) {
	wg.Go(func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if strict && (m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException) {
				t.Errorf("console %s", m)
			} else {
				t.Logf("console %s", m)
			}
		}
	})
}

// Eval evaluates a script in the page, awaiting a promise it returns.
func Eval[T any](script string) chromedp.Action[T] {
	return chromedp.Evaluate[T](script, chromedp.EvalAwaitPromise)
}
