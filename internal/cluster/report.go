package cluster

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"webdraft/internal/svgplot"
	"webdraft/loadgen"
)

// Kill is what the kill run shows about the replica that died.
type Kill struct {
	// Moved are the conversations the killed replica served before it
	// died and another served after; To counts them by new replica.
	Moved int
	To    map[string]int
	// Strays are conversations that changed replica without being the
	// killed one's: consistent hashing promises none.
	Strays int
	// InFlight are the requests that failed, of conversations the killed
	// replica was serving, from its death on; Other every other failure.
	InFlight, Other []loadgen.Event
	// Recovered is how long after the death the last moved conversation
	// had its context cached again (an answer on its new replica reusing
	// the cache: its second there); Unrecovered the moved conversations
	// that ended before that.
	Recovered   time.Duration
	Unrecovered int
	// Before and After are the cache reuse of the answers before the
	// death and after Recovered.
	Before, After float64
}

// Analyze reads the kill run's events.
func (r *Report) Analyze() Kill {
	k := Kill{To: map[string]int{}}
	last := map[int]string{}    // conversation → the replica that answered it last
	recovered := map[int]bool{} // a moved conversation → whether its cache came back
	var before, after [2]int    // cached, prefill
	for _, e := range r.Kill.Events {
		if e.Failure != "" {
			if last[e.Conversation] == r.Killed && e.At >= r.KilledAt {
				k.InFlight = append(k.InFlight, e)
			} else {
				k.Other = append(k.Other, e)
			}
			continue
		}
		prev, seen := last[e.Conversation]
		switch {
		case seen && prev != e.ServedBy && prev == r.Killed && e.At >= r.KilledAt:
			k.Moved++
			k.To[e.ServedBy]++
			recovered[e.Conversation] = false
		case seen && prev != e.ServedBy:
			k.Strays++
		default:
			if done, moved := recovered[e.Conversation]; moved && !done && e.CachedTokens > 0 {
				recovered[e.Conversation] = true
				k.Recovered = max(k.Recovered, e.At-r.KilledAt)
			}
		}
		last[e.Conversation] = e.ServedBy
	}
	for _, done := range recovered {
		if !done {
			k.Unrecovered++
		}
	}
	for _, e := range r.Kill.Events {
		switch {
		case e.Failure != "":
		case e.At < r.KilledAt:
			before[0], before[1] = before[0]+e.CachedTokens, before[1]+e.PrefillTokens
		case e.At > r.KilledAt+k.Recovered:
			after[0], after[1] = after[0]+e.CachedTokens, after[1]+e.PrefillTokens
		}
	}
	k.Before, k.After = share(before), share(after)
	return k
}

func share(t [2]int) float64 {
	if t[0]+t[1] == 0 {
		return 0
	}
	return float64(t[0]) / float64(t[0]+t[1])
}

// Problems lists what the runs show wrong: affinity that does not beat
// round-robin, a conversation that changed replica with every replica up
// or without its replica dying, a failure beyond the killed replica's
// requests in flight, a moved conversation whose cache never came back.
func (r *Report) Problems() []string {
	var p []string
	if r.Affinity.CacheReuse() <= r.RoundRobin.CacheReuse() {
		p = append(p, fmt.Sprintf("cache reuse with affinity %.1f %% is no better than round-robin's %.1f %%", 100*r.Affinity.CacheReuse(), 100*r.RoundRobin.CacheReuse()))
	}
	for _, run := range []struct {
		name string
		rep  loadgen.Report
	}{{"round-robin", r.RoundRobin}, {"affinity", r.Affinity}} {
		if run.rep.Failures > 0 {
			p = append(p, fmt.Sprintf("the %s run had %d failures (%v) with every replica up", run.name, run.rep.Failures, run.rep.FailureCodes))
		}
	}
	if n := switched(r.Affinity.Events); n > 0 {
		p = append(p, fmt.Sprintf("with every replica up, %d conversations changed replica under affinity", n))
	}
	k := r.Analyze()
	if k.Strays > 0 {
		p = append(p, fmt.Sprintf("%d conversations not on %s changed replica when it died", k.Strays, r.Killed))
	}
	if len(k.Other) > 0 {
		p = append(p, fmt.Sprintf("%d requests failed that %s was not serving, e.g. %+v", len(k.Other), r.Killed, k.Other[0]))
	}
	if k.Moved == 0 {
		p = append(p, fmt.Sprintf("no conversation moved off %s", r.Killed))
	} else if k.Recovered == 0 && k.Unrecovered == k.Moved {
		p = append(p, "no moved conversation reused its cache on its new replica")
	}
	return p
}

// switched counts the conversations answered by more than one replica.
func switched(events []loadgen.Event) int {
	by := map[int]string{}
	n := map[int]bool{}
	for _, e := range events {
		if e.Failure != "" {
			continue
		}
		if s, ok := by[e.Conversation]; ok && s != e.ServedBy {
			n[e.Conversation] = true
		}
		by[e.Conversation] = e.ServedBy
	}
	return len(n)
}

// Markdown summarizes the runs for README's scale-out section.
func (r *Report) Markdown() string {
	var b strings.Builder
	l := r.Load
	fmt.Fprintf(&b, "%d replicas (%s) behind HAProxy; each run %d conversations, %d at a time, %d turns of `/draft` (n = %d, first context %d–%d tokens, a new seed a run).\n\n",
		len(r.Replicas), strings.Join(r.Replicas, ", "), l.Conversations, l.Concurrency, l.Turns, l.N, l.MinPrompt, l.MaxPrompt)
	fmt.Fprintf(&b, "| routing | requests | failed | cache reuse | context tokens computed | p50 | p99 | draft tokens/s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, run := range []struct {
		name string
		rep  loadgen.Report
	}{{"round-robin", r.RoundRobin}, {"X-Session-ID, consistent hash", r.Affinity}, {fmt.Sprintf("the same, %s killed mid-run", r.Killed), r.Kill}} {
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f %% | %d | %s | %s | %.0f |\n", run.name, run.rep.Requests, run.rep.Failures, 100*run.rep.CacheReuse(),
			run.rep.PrefillTokens, ms(run.rep.P50), ms(run.rep.P99), run.rep.DraftTokensPerSecond())
	}
	k := r.Analyze()
	var to []string
	for _, name := range slices.Sorted(maps.Keys(k.To)) {
		to = append(to, fmt.Sprintf("%d to %s", k.To[name], name))
	}
	fmt.Fprintf(&b, "\n%s was killed (SIGKILL) at %.1f s of the kill run; HAProxy's checks took it out %.2f s later. ", r.Killed, r.KilledAt.Seconds(), r.DownAfter.Seconds())
	fmt.Fprintf(&b, "Its conversations moved: %d (%s); other conversations that changed replica: %d. ", k.Moved, strings.Join(to, ", "), k.Strays)
	fmt.Fprintf(&b, "Requests failed: %d of those %s was serving, %d others; HAProxy retried %d times on %s's failures (refused or closed before an answer), sending %d requests to another replica. ",
		len(k.InFlight), r.Killed, len(k.Other), r.Retried, r.Killed, r.Redispatched)
	fmt.Fprintf(&b, "Cache reuse %.1f %% before the kill; every moved conversation reused its cache again %.1f s after it (%d ended first); reuse after that %.1f %%.\n",
		100*k.Before, k.Recovered.Seconds(), k.Unrecovered, 100*k.After)
	return b.String()
}

// Plot draws each run's cache reuse over time, in bins, and the kill.
func (r *Report) Plot() []byte {
	kill := svgplot.Series{Name: r.Killed + " killed", Dash: "2 3", X: []float64{r.KilledAt.Seconds(), r.KilledAt.Seconds()}, Y: []float64{0, 100}}
	return svgplot.Lines{
		Title:    "webdraft replicas behind HAProxy: prefix-cache reuse over each run",
		Subtitle: fmt.Sprintf("%d replicas; each run on its own clock; %s killed at %.0f s of the kill run", len(r.Replicas), r.Killed, r.KilledAt.Seconds()),
		XLabel:   "seconds", YLabel: "% of context tokens cached",
		Series: []svgplot.Series{
			reuseSeries("hashed, "+r.Killed+" killed", "", r.Kill.Events),
			reuseSeries("hashed, all up", "6 3", r.Affinity.Events),
			reuseSeries("round-robin", "1 2", r.RoundRobin.Events),
			kill,
		},
	}.SVG()
}

// reuseSeries is the share of context tokens cached, in 30 bins of a
// run's time.
func reuseSeries(name, dash string, events []loadgen.Event) svgplot.Series {
	const bins = 30
	end := time.Duration(0)
	for _, e := range events {
		end = max(end, e.At)
	}
	width := max(end/bins, time.Millisecond)
	var tok [bins + 1][2]int
	for _, e := range events {
		if e.Failure == "" {
			i := min(int(e.At/width), bins)
			tok[i][0] += e.CachedTokens
			tok[i][1] += e.PrefillTokens
		}
	}
	s := svgplot.Series{Name: name, Dash: dash}
	for i, t := range tok {
		if t[0]+t[1] > 0 {
			s.X = append(s.X, (time.Duration(i)*width + width/2).Seconds())
			s.Y = append(s.Y, 100*share(t))
		}
	}
	return s
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
