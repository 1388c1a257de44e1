// Package kernelplan measures the kernels' variants on one adapter, the
// figures behind a plan of package kernels (kernels/plan.go): it builds
// package kernels' test binary and runs its benchmarks (BenchmarkMatMulKernels,
// BenchmarkAttentionDecode, BenchmarkDecodeLayer) round after round — in
// headless Chromium on SwiftShader, the test binary compiled to wasm and
// run in a page, or natively (-kernelplan.native: lavapipe here) — and
// writes each benchmark's median over the rounds. Rounds rather than
// -test.count, so that whatever else loads the machine spreads over every
// variant alike. It is a measurement, not a test: it runs only when asked,
//
//	go test ./lab/kernelplan -run TestKernelPlan -v -timeout 2h -args \
//	  -kernelplan.bench 'MatMulKernels' -kernelplan.rounds 3 \
//	  -kernelplan.args '-benchshape=embedded -benchts=1,2,4,5,8,16,32,64'
//
// and writes its table to the log (and to -kernelplan.out).
package kernelplan

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"webdraft/internal/browsertest"
)

var (
	bench     = flag.String("kernelplan.bench", "", "the benchmarks to run, a -test.bench pattern of package kernels (empty: do not run)")
	args      = flag.String("kernelplan.args", "", "more arguments for the kernels test binary (-benchshape=embedded, -benchts=1,16, …)")
	rounds    = flag.Int("kernelplan.rounds", 3, "rounds: each runs every benchmark once")
	benchtime = flag.String("kernelplan.benchtime", "1s", "-test.benchtime of each benchmark")
	native    = flag.Bool("kernelplan.native", false, "run natively (the default adapter: lavapipe here) rather than in Chromium")
	out       = flag.String("kernelplan.out", "", "also write the table here")
	raw       = flag.Bool("kernelplan.raw", false, "log what the test binary printed")
)

func TestKernelPlan(t *testing.T) {
	if *bench == "" {
		t.Skip("a measurement: -kernelplan.bench PATTERN runs it")
	}
	argv := []string{"-test.run", "^$", "-test.bench", *bench, "-test.benchtime", *benchtime}
	argv = append(argv, strings.Fields(*args)...)
	var run func(round int) []string
	if *native {
		run = nativeRunner(t, argv)
	} else {
		run = browserRunner(t, argv)
	}
	results := map[string][]float64{} // benchmark → its µs in each round
	units := map[string]string{}
	var order []string
	for round := range *rounds {
		start := time.Now()
		lines := run(round)
		if *raw {
			t.Logf("round %d:\n%s", round, strings.Join(lines, "\n"))
		}
		n := 0
		for _, line := range lines {
			name, v, unit, ok := parse(line)
			if !ok {
				continue
			}
			if _, seen := results[name]; !seen {
				order = append(order, name)
			}
			results[name], units[name] = append(results[name], v), unit
			n++
		}
		t.Logf("round %d: %d benchmarks in %.0f s", round, n, time.Since(start).Seconds())
		if n == 0 {
			t.Fatalf("round %d printed no benchmark:\n%s", round, strings.Join(lines, "\n"))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "kernels -test.bench %q %s, %d rounds (%s): median (min–max)\n\n", *bench, *args, *rounds, where())
	for _, name := range order {
		v := slices.Clone(results[name])
		slices.Sort(v)
		fmt.Fprintf(&b, "%-90s %10.1f %s (%.1f–%.1f)\n", name, median(v), units[name], v[0], v[len(v)-1])
	}
	t.Logf("\n%s", b.String())
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func where() string {
	if *native {
		return "natively"
	}
	return "in headless Chromium"
}

// benchLine is a benchmark's result line: its name, iterations, then
// value–unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+\d+\s+(.*)$`)

// parse returns a benchmark line's name and its time: the first metric in
// µs a thing (µs/matmul, µs/call, µs/layer). Natively the name loses its
// GOMAXPROCS suffix (in the browser it has none; kernel names such as
// gemm-2 end in digits too).
func parse(line string) (name string, v float64, unit string, ok bool) {
	m := benchLine.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		return "", 0, "", false
	}
	if m[2] != "" && (!*native || m[2] != fmt.Sprintf("-%d", runtime.GOMAXPROCS(0))) {
		m[1] += m[2]
	}
	f := strings.Fields(m[3])
	for i := 0; i+1 < len(f); i += 2 {
		if strings.HasPrefix(f[i+1], "µs/") {
			x, err := strconv.ParseFloat(f[i], 64)
			return m[1], x, f[i+1], err == nil
		}
	}
	return "", 0, "", false
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// nativeRunner builds the kernels test binary and runs it, a round a run.
func nativeRunner(t *testing.T, argv []string) func(int) []string {
	bin := filepath.Join(t.TempDir(), "kernels.test")
	build(t, nil, bin)
	return func(int) []string {
		cmd := exec.Command(bin, argv...)
		cmd.Dir = "../../kernels"
		outb, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kernels.test: %v\n%s", err, outb)
		}
		return strings.Split(string(outb), "\n")
	}
}

// browserRunner builds the kernels test binary for js/wasm and serves it
// with a page that runs it with argv; a round loads the page anew in the
// browser, and returns what the binary printed.
func browserRunner(t *testing.T, argv []string) func(int) []string {
	browsertest.Require(t, "the kernel plan measurement")
	site := t.TempDir()
	build(t, []string{"GOOS=js", "GOARCH=wasm"}, filepath.Join(site, "kernels.wasm"))
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	wasmExec, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(goroot)), "lib", "wasm", "wasm_exec.js"))
	if err != nil {
		t.Fatal(err)
	}
	argvJSON, _ := json.Marshal(append([]string{"kernels.test"}, argv...))
	page := strings.Replace(pageHTML, "ARGV", string(argvJSON), 1)
	for name, data := range map[string][]byte{"wasm_exec.js": wasmExec, "index.html": []byte(page)} {
		if err := os.WriteFile(filepath.Join(site, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files := http.FileServer(http.Dir(site))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Cross-origin isolated: performance.now() at 5 µs, not 100 µs.
		w.Header().Set("Cross-Origin-Opener-Policy", "same-origin")
		w.Header().Set("Cross-Origin-Embedder-Policy", "require-corp")
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ctx := browsertest.New(t, 4*time.Hour)
	return func(round int) []string {
		if err := chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/?round=%d", srv.URL, round))); err != nil {
			t.Fatal(err)
		}
		// What the binary printed so far, logged as it comes (a round may
		// take an hour).
		for seen := 0; ; {
			time.Sleep(5 * time.Second)
			raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify({lines: kp.lines.slice(`+strconv.Itoa(seen)+`), done: kp.done})`))
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			var p struct {
				Lines []string
				Done  bool
			}
			if err := json.Unmarshal([]byte(raw), &p); err != nil {
				t.Fatal(err)
			}
			for _, l := range p.Lines {
				if _, _, _, ok := parse(l); ok {
					t.Logf("round %d: %s", round, strings.Join(strings.Fields(l), " "))
				}
			}
			seen += len(p.Lines)
			if p.Done {
				break
			}
		}
		var r struct {
			Lines []string
			Code  *int
			Error string
		}
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify({lines: kp.lines, code: kp.code, error: kp.error})`))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatal(err)
		}
		if r.Error != "" || r.Code != nil && *r.Code != 0 {
			t.Fatalf("round %d: the test binary failed (%v, exit %v):\n%s", round, r.Error, r.Code, strings.Join(r.Lines, "\n"))
		}
		if !*native && round == 0 {
			for _, l := range r.Lines {
				if strings.HasPrefix(l, "gputest:") {
					t.Log(l)
				}
			}
		}
		return r.Lines
	}
}

// pageHTML runs kernels.wasm with ARGV, collecting what it prints in
// kp.lines (wasm_exec.js prints a line at a time through console.log).
const pageHTML = `<!doctype html>
<meta charset="utf-8">
<script src="wasm_exec.js"></script>
<script>
window.kp = {lines: [], done: false, code: null, error: ""};
console.log = (...a) => { for (const l of a.join(" ").split("\n")) kp.lines.push(l); };
(async () => {
  const go = new Go();
  go.argv = ARGV;
  go.exit = (code) => { kp.code = code; };
  const r = await WebAssembly.instantiateStreaming(fetch("kernels.wasm"), go.importObject);
  window.wasm = r; // the WebGPU binding reads Go memory through it
  await go.run(r.instance);
})().catch((e) => { kp.error = String(e); }).finally(() => { kp.done = true; });
</script>
`

// build compiles package kernels' tests into bin.
func build(t *testing.T, env []string, bin string) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("go", "test", "-c", "-o", bin, "./kernels")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), env...)
	if outb, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c ./kernels %v: %v\n%s", env, err, outb)
	}
	t.Logf("built %s in %.0f s", filepath.Base(bin), time.Since(start).Seconds())
}
