// Package loadgen drives a webdraft server the way a verifier does: many
// conversations at once, each calling POST /draft with its context, accepting
// a prefix of the draft plus one token of its own, and calling again with the
// grown context — so the prefix cache and batching are exercised as in use.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Options shape the load.
type Options struct {
	URL           string // server base URL, e.g. http://127.0.0.1:8080
	Concurrency   int    // conversations in flight
	Conversations int    // conversations in all
	Turns         int    // /draft calls per conversation (fewer if the context fills)
	N             int    // draft length per call
	MinPrompt     int    // first-turn context length, uniform in [MinPrompt, MaxPrompt]
	MaxPrompt     int
	Accept        float64 // probability the verifier accepts each next draft token
	Seed          uint64
	// SessionHeader, when set, names the header each request carries its
	// conversation's key in ("s<seed>-<conversation>"), as a verifier
	// sends its session's to a router that keeps a session on one replica
	// (X-Session-ID).
	SessionHeader string
	// ServedByHeader, when set, names the response header a router names
	// the replica that answered in (the cluster's X-Served-By); each
	// Event records it.
	ServedByHeader string
	// Warm plays every conversation's first turn before the clock starts
	// and leaves it out of the report: the figures are then those of
	// /draft on contexts the server has cached (given a cache that holds
	// them all), not of their first prefill.
	Warm bool
	// Progress, when set, is called after each request.
	Progress func()
}

// Report summarizes a run.
type Report struct {
	Requests      int
	Failures      int
	FailureCodes  map[string]int // "status 429", "transport" …
	Wall          time.Duration
	P50, P99      time.Duration
	DraftTokens   int
	CachedTokens  int
	PrefillTokens int
	// Start is when the timed run began (after Warm's turns); Events are
	// its requests, in the order they finished.
	Start  time.Time
	Events []Event
}

// Event is one timed request.
type Event struct {
	At            time.Duration // when it finished, from the start of the timed run
	Latency       time.Duration
	Conversation  int
	Failure       string // "" when it was answered
	CachedTokens  int
	PrefillTokens int
	ServedBy      string // Options.ServedByHeader's value
}

// DraftTokensPerSecond over the whole run.
func (r Report) DraftTokensPerSecond() float64 { return float64(r.DraftTokens) / r.Wall.Seconds() }

// CacheReuse is the share of context tokens the server found in its cache.
func (r Report) CacheReuse() float64 {
	if r.CachedTokens+r.PrefillTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.CachedTokens+r.PrefillTokens)
}

type health struct {
	Status     string `json:"status"`
	VocabSize  int    `json:"vocab_size"`
	MaxContext int    `json:"max_context"`
}

type draftResponse struct {
	Draft         []int `json:"draft"`
	CachedTokens  int   `json:"cached_tokens"`
	PrefillTokens int   `json:"prefill_tokens"`
	servedBy      string
}

// Run generates the load and waits for it to finish or ctx to end.
func Run(ctx context.Context, client *http.Client, o Options) (Report, error) {
	h, err := getHealth(ctx, client, o.URL)
	if err != nil {
		return Report{}, err
	}
	if o.MaxPrompt+o.N-1 > h.MaxContext {
		return Report{}, fmt.Errorf("prompts up to %d tokens with drafts of %d exceed the model's %d positions", o.MaxPrompt, o.N, h.MaxContext)
	}
	var (
		mu        sync.Mutex
		rep       = Report{FailureCodes: map[string]int{}}
		latencies []time.Duration
	)
	var start time.Time
	record := func(c *conversation, lat time.Duration, res *draftResponse, failure string) {
		mu.Lock()
		defer mu.Unlock()
		rep.Requests++
		ev := Event{At: time.Since(start), Latency: lat, Conversation: c.id, Failure: failure}
		if failure != "" {
			rep.Failures++
			rep.FailureCodes[failure]++
		} else {
			latencies = append(latencies, lat)
			rep.DraftTokens += len(res.Draft)
			rep.CachedTokens += res.CachedTokens
			rep.PrefillTokens += res.PrefillTokens
			ev.CachedTokens, ev.PrefillTokens, ev.ServedBy = res.CachedTokens, res.PrefillTokens, res.servedBy
		}
		rep.Events = append(rep.Events, ev)
		if o.Progress != nil {
			o.Progress()
		}
	}
	convs := make([]*conversation, o.Conversations)
	for id := range convs {
		convs[id] = newConversation(o, h, id)
	}
	if o.Warm {
		warm := func(*conversation, time.Duration, *draftResponse, string) {
			if o.Progress != nil {
				mu.Lock()
				o.Progress()
				mu.Unlock()
			}
		}
		play(ctx, o.Concurrency, convs, func(c *conversation) { c.turn(ctx, client, o, h, warm) })
	}
	start = time.Now()
	rep.Start = start
	play(ctx, o.Concurrency, convs, func(c *conversation) {
		for c.turn(ctx, client, o, h, record) {
		}
	})
	rep.Wall = time.Since(start)
	slices.Sort(latencies)
	if len(latencies) > 0 {
		rep.P50 = latencies[len(latencies)*50/100]
		rep.P99 = latencies[min(len(latencies)-1, len(latencies)*99/100)]
	}
	return rep, ctx.Err()
}

// play runs f on every conversation, concurrency at a time, until ctx ends.
func play(ctx context.Context, concurrency int, convs []*conversation, f func(*conversation)) {
	next := make(chan *conversation)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				f(c)
			}
		}()
	}
feed:
	for _, c := range convs {
		select {
		case next <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
}

// conversation is one simulated verifier's session: its context so far and
// the turns it has played.
type conversation struct {
	id     int
	key    string // its session key (Options.SessionHeader)
	rng    *rand.Rand
	tokens []int
	turns  int
	over   bool // a failure ended it
}

// SessionKey is the session key of conversation id in a run of seed.
func SessionKey(seed uint64, id int) string { return fmt.Sprintf("s%d-%d", seed, id) }

// newConversation starts conversation id with a random first-turn context.
func newConversation(o Options, h health, id int) *conversation {
	rng := rand.New(rand.NewPCG(o.Seed, uint64(id)))
	tokens := make([]int, o.MinPrompt+rng.IntN(o.MaxPrompt-o.MinPrompt+1))
	for i := range tokens {
		tokens[i] = rng.IntN(h.VocabSize)
	}
	return &conversation{id: id, key: SessionKey(o.Seed, id), rng: rng, tokens: tokens}
}

// turn plays the conversation's next /draft call, then verifies like a
// target would: it keeps the longest prefix the "target" agrees with, then
// one token of its own. It reports whether the conversation goes on.
func (c *conversation) turn(ctx context.Context, client *http.Client, o Options, h health, record func(*conversation, time.Duration, *draftResponse, string)) bool {
	if c.over || c.turns == o.Turns || ctx.Err() != nil || len(c.tokens)+o.N-1 > h.MaxContext {
		return false // done, failed, or the context is full
	}
	start := time.Now()
	res, failure := c.draft(ctx, client, o)
	record(c, time.Since(start), res, failure)
	c.turns++
	if failure != "" {
		c.over = true
		return false
	}
	k := 0
	for k < len(res.Draft) && c.rng.Float64() < o.Accept {
		k++
	}
	c.tokens = append(c.tokens, res.Draft[:k]...)
	c.tokens = append(c.tokens, c.rng.IntN(h.VocabSize))
	return true
}

// draft asks for a draft of o.N tokens after the conversation's context;
// the failure's kind when none comes.
func (c *conversation) draft(ctx context.Context, client *http.Client, o Options) (*draftResponse, string) {
	body, err := json.Marshal(map[string]any{"tokens": c.tokens, "n": o.N})
	if err != nil {
		return nil, "encode"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL+"/draft", bytes.NewReader(body))
	if err != nil {
		return nil, "request"
	}
	req.Header.Set("Content-Type", "application/json")
	if o.SessionHeader != "" {
		req.Header.Set(o.SessionHeader, c.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "transport"
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body) // drain for connection reuse
		return nil, fmt.Sprintf("status %d", resp.StatusCode)
	}
	var out draftResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Draft) != o.N {
		return nil, "bad response"
	}
	if o.ServedByHeader != "" {
		out.servedBy = resp.Header.Get(o.ServedByHeader)
	}
	return &out, ""
}

func getHealth(ctx context.Context, client *http.Client, url string) (health, error) {
	var h health
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return h, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return h, fmt.Errorf("health: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("health: %w", err)
	}
	if resp.StatusCode != http.StatusOK || h.VocabSize <= 0 || h.MaxContext <= 0 {
		return h, fmt.Errorf("health: status %d (%s): the server is not ready", resp.StatusCode, h.Status)
	}
	return h, nil
}
