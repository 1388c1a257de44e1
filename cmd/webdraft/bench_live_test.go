package main

import (
	"slices"
	"testing"
	"time"

	"webdraft/speculative"
)

// TestLiveRunRecord: a pass that fed prompts only (no sequence drafted in
// it) counts no step; its times join the next step's, as a prompt fed
// with a first draft does, so that a head's runs (its target fed each
// prompt first) and a drafter's compare.
func TestLiveRunRecord(t *testing.T) {
	var r liveRun
	ms := time.Millisecond
	r.record(speculative.StepStats{Sequences: 0, Draft: 1 * ms, Verify: 10 * ms})
	r.record(speculative.StepStats{Sequences: 0, Verify: 5 * ms})
	r.record(speculative.StepStats{Sequences: 1, Draft: 2 * ms, Verify: 3 * ms})
	r.record(speculative.StepStats{Sequences: 1, Verify: 4 * ms, Fused: true})
	if !slices.Equal(r.draft, []time.Duration{3 * ms, 0}) || !slices.Equal(r.verify, []time.Duration{18 * ms, 4 * ms}) || r.fused != 1 {
		t.Errorf("draft %v, verify %v, fused %d; want [3ms 0s], [18ms 4ms], 1", r.draft, r.verify, r.fused)
	}
}
