package soak

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"webdraft/internal/svgplot"
)

// Limits of a healthy soak, checked by Problems.
const (
	// MaxGrowth bounds how much the server's memory may grow. The live Go
	// heap (a leak in Go) is judged where load cannot move it: at the
	// first garbage collection after the clients left and the server's
	// work drained (Report.Final), against the soak's start — under load
	// the heap a collection marks holds the requests in flight and what
	// they allocate while it marks, tens of MiB from one second to the
	// next. The resident memory outside the Go heap (a leak in the
	// engines' host memory, cgo or the driver) and the GPU buffers are
	// judged from early in the soak (the median of the samples between
	// 20 % and 40 % of it, after the warm-up) to its end (the median of
	// the last 20 %). A leak of a request's worth shows within minutes.
	// The resident memory as a whole is reported, not judged: it follows
	// the heap's high-water mark between collections, which still rises
	// in a short soak.
	MaxGrowth = 32 << 20
	// CollectionWait bounds the wait for a collection once the server is
	// idle: the runtime forces one two minutes after the last.
	CollectionWait = 150 * time.Second
	// MaxConnectionsLeft and MaxGoroutineGrowth bound what may be left
	// once the clients have gone: the sampler's own connection, and the
	// server's idle goroutines.
	MaxConnectionsLeft = 2
	MaxGoroutineGrowth = 16
)

// window is the median of field over the samples from fraction a to b of
// the soak.
func (r *Report) window(a, b float64, field func(Sample) int64) int64 {
	n := len(r.Samples)
	lo, hi := int(a*float64(n)), max(int(b*float64(n)), int(a*float64(n))+1)
	if n == 0 || lo >= n {
		return 0
	}
	vals := make([]int64, 0, hi-lo)
	for _, s := range r.Samples[lo:min(hi, n)] {
		vals = append(vals, field(s))
	}
	slices.Sort(vals)
	return vals[len(vals)/2]
}

// Early and Late are the medians Problems compares.
func (r *Report) Early(field func(Sample) int64) int64 { return r.window(0.2, 0.4, field) }
func (r *Report) Late(field func(Sample) int64) int64  { return r.window(0.8, 1, field) }

func rss(s Sample) int64  { return s.RSSAnon }
func heap(s Sample) int64 { return s.HeapInuse }
func live(s Sample) int64 { return s.HeapLive }
func gpu(s Sample) int64  { return s.GPUBytes }

// outside is the resident memory the Go heap does not account for: 0
// where the heap's retained pages exceed the resident memory (some are
// not resident).
func outside(s Sample) int64 { return max(0, s.RSSAnon-s.HeapRetained) }

// Problems lists what the soak shows wrong: failures, answers that
// differed, memory that grew, a prefix cache past its budget, requests,
// sessions or connections left behind.
func (r *Report) Problems() []string {
	var p []string
	for _, k := range sortedKeys(r.Failures) {
		p = append(p, fmt.Sprintf("%d × %s", r.Failures[k], k))
	}
	p = append(p, r.Examples...)
	if len(r.Differed) > 0 {
		p = append(p, fmt.Sprintf("%d of %d answers differed from the same request alone, e.g. %s", len(r.Differed), r.Replayed, r.Differed[0]))
	}
	if len(r.Samples) < 5 {
		return append(p, fmt.Sprintf("only %d samples: too short a soak to judge memory", len(r.Samples)))
	}
	f := r.Final
	drained := f.Running == 0 && f.Reserved == 0 && f.PageSessions == 0
	if start := r.Samples[0].HeapLive; r.Collected && f.HeapLive-start > MaxGrowth {
		p = append(p, fmt.Sprintf("live Go heap at the first collection after the clients left grew by %s from the start (from %s to %s), more than %s", mib(f.HeapLive-start), mib(start), mib(f.HeapLive), mib(MaxGrowth)))
	} else if drained && !r.Collected {
		p = append(p, fmt.Sprintf("the server completed no garbage collection within %s of its work draining: its live heap after the soak is not known", CollectionWait))
	}
	for _, m := range []struct {
		name  string
		field func(Sample) int64
	}{{"resident memory outside the Go heap", outside}, {"GPU buffers", gpu}} {
		if g := r.Late(m.field) - r.Early(m.field); g > MaxGrowth {
			p = append(p, fmt.Sprintf("%s grew by %s (from %s to %s), more than %s", m.name, mib(g), mib(r.Early(m.field)), mib(r.Late(m.field)), mib(MaxGrowth)))
		}
	}
	for _, s := range r.Samples {
		if s.CacheTokens+s.Reserved > s.CacheBudget {
			p = append(p, fmt.Sprintf("at %.0fs the prefix cache held %d + %d reserved positions, past its budget of %d", s.At.Seconds(), s.CacheTokens, s.Reserved, s.CacheBudget))
			break
		}
	}
	if !drained {
		p = append(p, fmt.Sprintf("after the clients left: %d requests running, %d positions reserved, %d page sessions open", f.Running, f.Reserved, f.PageSessions))
	}
	if f.Connections > MaxConnectionsLeft {
		p = append(p, fmt.Sprintf("after the clients left: %d connections open", f.Connections))
	}
	if g := f.Goroutines - r.Samples[0].Goroutines; g > MaxGoroutineGrowth {
		p = append(p, fmt.Sprintf("after the clients left: %d goroutines, %d more than at the start", f.Goroutines, g))
	}
	return p
}

// Markdown summarizes the soak for README's Reliability section.
func (r *Report) Markdown() string {
	var b strings.Builder
	first, last := r.Samples[0], r.Final
	fmt.Fprintf(&b, "Soak of %.0f s, %d clients (%s).\n\n", r.Duration.Seconds(), sum(r.Clients), joinCounts(r.Clients))
	fmt.Fprintf(&b, "| outcome | requests |\n| --- | ---: |\n")
	for _, k := range sortedKeys(r.Outcomes) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Outcomes[k])
	}
	fmt.Fprintf(&b, "| **failures** | **%d** |\n\n", sum(r.Failures))
	fmt.Fprintf(&b, "Well-formed requests served: %d; answers asked for again alone: %d, %d differed.\n\n", r.Served(), r.Replayed, len(r.Differed))
	fmt.Fprintf(&b, "| | start | early (20–40 %%) | late (80–100 %%) | after |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, m := range []struct {
		name  string
		field func(Sample) int64
	}{{"resident memory (anonymous)", rss}, {"Go heap in use", heap}, {"live Go heap", live}, {"resident outside the Go heap", outside}, {"GPU buffers", gpu}} {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", m.name, mib(m.field(first)), mib(r.Early(m.field)), mib(r.Late(m.field)), mib(m.field(last)))
	}
	if r.Collected {
		fmt.Fprintf(&b, "\nAfter: at %.0f s, the first garbage collection with nothing running (the live heap judged against the start).\n", last.At.Seconds())
	} else {
		fmt.Fprintf(&b, "\nAfter: at %.0f s, no garbage collection with nothing running yet.\n", last.At.Seconds())
	}
	peak := int64(0)
	for _, s := range r.Samples {
		peak = max(peak, s.CacheTokens+s.Reserved)
	}
	fmt.Fprintf(&b, "Prefix cache: at most %d of its %d positions (cached + reserved). Goroutines %d at the start, %d after; open files %d, %d.\n",
		peak, last.CacheBudget, first.Goroutines, last.Goroutines, first.OpenFDs, last.OpenFDs)
	return b.String()
}

// CSV is the samples, one a line, for plotting elsewhere.
func (r *Report) CSV() []byte {
	var b strings.Builder
	b.WriteString("seconds,rss_anon_bytes,heap_inuse_bytes,heap_live_bytes,heap_retained_bytes,gpu_buffer_bytes,cache_tokens,reserved_tokens,cache_budget_tokens,running,connections,page_sessions,goroutines,open_fds\n")
	for _, s := range append(slices.Clone(r.Samples), r.Final) {
		fmt.Fprintf(&b, "%.1f,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d\n", s.At.Seconds(), s.RSSAnon, s.HeapInuse, s.HeapLive, s.HeapRetained, s.GPUBytes, s.CacheTokens, s.Reserved, s.CacheBudget,
			s.Running, s.Connections, s.PageSessions, s.Goroutines, s.OpenFDs)
	}
	return []byte(b.String())
}

// Plot draws the server's memory over the soak.
func (r *Report) Plot() []byte {
	series := func(name, dash string, field func(Sample) int64) svgplot.Series {
		s := svgplot.Series{Name: name, Dash: dash}
		for _, smp := range r.Samples {
			s.X = append(s.X, smp.At.Seconds())
			s.Y = append(s.Y, float64(field(smp))/(1<<20))
		}
		return s
	}
	lines := []svgplot.Series{series("resident (anonymous)", "", rss), series("Go heap in use", "6 3", heap), series("live Go heap", "1 3", live)}
	if r.Final.GPUBytes > 0 {
		lines = append(lines, series("GPU buffers", "2 2", gpu))
	}
	return svgplot.Lines{
		Title:    "webdraft serve under the soak: memory over time",
		Subtitle: fmt.Sprintf("%d clients, %d requests served, %d failures", sum(r.Clients), r.Served(), sum(r.Failures)),
		XLabel:   "seconds", YLabel: "MiB", Series: lines,
	}.SVG()
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func joinCounts(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
