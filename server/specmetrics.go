package server

import (
	"fmt"

	"webdraft/speculative"
)

// SpecMetrics is how much of a generation's speculation its /v1/*
// response reports, in metrics.speculative_decoding: vLLM's
// --per-request-spec-decode-metrics and its names.
type SpecMetrics int

const (
	SpecMetricsNone     SpecMetrics = iota // nothing (the default)
	SpecMetricsSummary                     // the counts, rates and the acceptance histogram
	SpecMetricsDetailed                    // the summary, and each step's accepted and drafted tokens
)

// ParseSpecMetrics reads a level by vLLM's names: none, summary or
// detailed.
func ParseSpecMetrics(s string) (SpecMetrics, error) {
	switch s {
	case "none":
		return SpecMetricsNone, nil
	case "summary":
		return SpecMetricsSummary, nil
	case "detailed":
		return SpecMetricsDetailed, nil
	}
	return SpecMetricsNone, fmt.Errorf("%s: want none, summary or detailed", quote(s))
}

func (m SpecMetrics) String() string {
	switch m {
	case SpecMetricsSummary:
		return "summary"
	case SpecMetricsDetailed:
		return "detailed"
	}
	return "none"
}

// specTally counts a generation's verification steps as they come, for
// its metrics.speculative_decoding.
type specTally struct {
	k                 int   // the generation's draft length or tree depth (0: the target alone)
	detailed          bool  // report each step
	accepted, drafted []int // each step's draft tokens accepted, and drafted
	// acceptedAt[j] counts the steps that accepted draft position j: a
	// chain's (j+1)th token, a tree's node at depth j+1 on the accepted
	// path.
	acceptedAt []int
}

func (t *specTally) add(step speculative.Step) {
	t.accepted = append(t.accepted, step.Accepted)
	t.drafted = append(t.drafted, draftedBy(step))
	for len(t.acceptedAt) < step.Accepted {
		t.acceptedAt = append(t.acceptedAt, 0)
	}
	for j := range step.Accepted {
		t.acceptedAt[j]++
	}
}

// draftedBy is how many draft tokens the target verified in a step: a
// chain's draft, or the tree's nodes sent to the target (not those the
// drafter explored and the budget left out), as Stats.Drafted counts
// them.
func draftedBy(step speculative.Step) int {
	if step.Tree == nil {
		return len(step.Draft)
	}
	n := 0
	for _, nd := range step.Tree {
		if nd.Verified {
			n++
		}
	}
	return n
}

// speculativeDecoding is the tally in vLLM's names:
// num_spec_steps (verification steps), num_draft_tokens (a tree's:
// the nodes verified), num_accepted_draft_tokens, num_spec_tokens (the
// draft length k, a tree's depth), mean_acceptance_length (1 + the
// accepted tokens a step), draft_acceptance_rate (accepted / drafted),
// acceptance_histogram (at index j, the steps that accepted j draft
// tokens; k + 1 of them), num_accepted_tokens_per_pos (at index j, the
// steps that accepted draft position j — a tree's depth j+1 —; k of
// them, summing to the accepted tokens); when detailed, per_step_accepted
// and per_step_drafted. A rate of nothing is 0.
func (t *specTally) speculativeDecoding() map[string]any {
	hist := make([]int, t.k+1)
	accepted, drafted := 0, 0
	for i, a := range t.accepted {
		for a >= len(hist) { // a step's draft past k (none expected): the histogram grows
			hist = append(hist, 0)
		}
		hist[a]++
		accepted += a
		drafted += t.drafted[i]
	}
	perPos := make([]int, max(t.k, len(t.acceptedAt)))
	copy(perPos, t.acceptedAt)
	steps := len(t.accepted)
	var mean, rate float64
	if steps > 0 {
		mean = 1 + float64(accepted)/float64(steps)
	}
	if drafted > 0 {
		rate = float64(accepted) / float64(drafted)
	}
	m := map[string]any{
		"mean_acceptance_length": mean, "draft_acceptance_rate": rate, "acceptance_histogram": hist,
		"num_spec_steps": steps, "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted, "num_spec_tokens": t.k,
		"num_accepted_tokens_per_pos": perPos,
	}
	if t.detailed {
		m["per_step_accepted"], m["per_step_drafted"] = append([]int{}, t.accepted...), append([]int{}, t.drafted...)
	}
	return m
}
