package soak

import (
	"strings"
	"testing"
	"time"
)

// loaded is a soak's samples whose live heap swings as a loaded server's
// does (each collection marks the requests in flight: 40–150 MiB from one
// second to the next, the late window's median 38 MiB above the early
// one's, as in a CI run), with nothing leaked.
func loaded() *Report {
	r := &Report{}
	for i := range 60 {
		live := int64(40+(i*37)%70) << 20
		if i >= 48 {
			live += 40 << 20 // the late window mostly high
		}
		r.Samples = append(r.Samples, Sample{At: time.Duration(i) * time.Second, HeapLive: live, CacheBudget: 8192, Running: 30})
	}
	r.Samples[0].HeapLive = 45 << 20
	r.Final = Sample{At: 70 * time.Second, HeapLive: 40 << 20, CacheBudget: 8192}
	r.Collected = true
	return r
}

func memoryProblems(r *Report) []string {
	var out []string
	for _, p := range r.Problems() {
		if strings.Contains(p, "heap") || strings.Contains(p, "collection") {
			out = append(out, p)
		}
	}
	return out
}

func TestProblemsJudgeTheLiveHeapAtRest(t *testing.T) {
	if p := memoryProblems(loaded()); len(p) > 0 {
		t.Errorf("a heap that swings under load and ends where it started: %q", p)
	}

	leaked := loaded()
	leaked.Final.HeapLive = (45 + 33) << 20
	if p := memoryProblems(leaked); len(p) != 1 || !strings.Contains(p[0], "grew by 33.0 MiB") {
		t.Errorf("33 MiB kept after the clients left: %q, want one problem saying it grew by 33.0 MiB", p)
	}

	uncollected := loaded()
	uncollected.Collected = false
	if p := memoryProblems(uncollected); len(p) != 1 || !strings.Contains(p[0], "no garbage collection") {
		t.Errorf("no collection after the work drained: %q, want it said", p)
	}

	busy := loaded()
	busy.Collected, busy.Final.Running = false, 2
	if p := busy.Problems(); len(memoryProblems(busy)) > 0 || !strings.Contains(strings.Join(p, "\n"), "2 requests running") {
		t.Errorf("work that never drained: %q, want the running requests said and no claim about the heap", p)
	}
}
