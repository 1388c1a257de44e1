package cluster

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"webdraft/loadgen"
)

// Options shape the experiment.
type Options struct {
	Cluster Config
	// Load is each run's load (its URL, session and served-by headers
	// are Run's); each run has a seed of its own, so that no run finds
	// the one before's conversations cached.
	Load loadgen.Options
	// KillAfter is the share of the kill run's requests after which one
	// replica is killed (0.4: when 40 % have finished).
	KillAfter float64
}

// Report is what Run saw.
type Report struct {
	Replicas   []string
	RoundRobin loadgen.Report // round-robin, every replica up
	Affinity   loadgen.Report // X-Session-ID hashed, every replica up
	Kill       loadgen.Report // X-Session-ID hashed, one replica killed on the way
	Killed     string         // the replica killed
	// KilledAt is when on Kill's clock the replica died; DownAfter how
	// long HAProxy took to take it out of both back ends.
	KilledAt, DownAfter time.Duration
	// Retried and Redispatched are the kill run's requests HAProxy sent
	// to the killed replica, saw fail and sent again: to it (before its
	// checks took it out) or to another replica.
	Retried, Redispatched int
	Load                  loadgen.Options
}

// Run starts the cluster, loads it round-robin and with affinity, then
// with affinity again while it kills the replica serving the most
// conversations, and stops it.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	l := o.Load
	switch {
	case l.Conversations < 1 || l.Concurrency < 1 || l.Turns < 1 || l.N < 1:
		return nil, fmt.Errorf("cluster: %d conversations, %d at a time, %d turns of %d tokens: want 1 at least of each", l.Conversations, l.Concurrency, l.Turns, l.N)
	case l.MinPrompt < 1 || l.MaxPrompt < l.MinPrompt:
		return nil, fmt.Errorf("cluster: first contexts of %d–%d tokens: want 1 ≤ min ≤ max", l.MinPrompt, l.MaxPrompt)
	case o.KillAfter <= 0 || o.KillAfter >= 1:
		return nil, fmt.Errorf("cluster: a kill after %g of the run: want a share between 0 and 1", o.KillAfter)
	}
	c, err := Start(ctx, o.Cluster)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	rep = &Report{Replicas: c.Replicas(), Load: o.Load}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Load.Concurrency}, Timeout: 2 * time.Minute}
	load := func(url string, seed uint64, progress func()) (loadgen.Report, error) {
		l := o.Load
		l.URL, l.Seed, l.SessionHeader, l.ServedByHeader, l.Progress = url, o.Load.Seed+seed, SessionHeader, ServedByHeader, progress
		return loadgen.Run(ctx, client, l)
	}
	if rep.RoundRobin, err = load(c.RoundRobinURL, 0, nil); err != nil {
		return nil, fmt.Errorf("cluster: the round-robin run: %w", err)
	}
	if rep.Affinity, err = load(c.AffinityURL, 1, nil); err != nil {
		return nil, fmt.Errorf("cluster: the affinity run: %w", err)
	}

	// The kill run: once KillAfter of its requests have finished, the
	// replica that served the most of its conversations so far dies.
	var (
		done     atomic.Int64
		killOnce sync.Once
		killed   = make(chan killResult, 1)
	)
	total := int64(o.Load.Conversations * o.Load.Turns)
	progress := func() { // called with loadgen's lock held: hand the kill off
		if float64(done.Add(1)) >= o.KillAfter*float64(total) {
			killOnce.Do(func() { go func() { killed <- c.killBusiest(ctx, rep) }() })
		}
	}
	var kr killResult
	rep.Kill, err = load(c.AffinityURL, 2, progress)
	if err != nil {
		return nil, fmt.Errorf("cluster: the kill run: %w", err)
	}
	select {
	case kr = <-killed:
	default:
		return nil, fmt.Errorf("cluster: the kill run ended before %.0f %% of its %d requests", 100*o.KillAfter, total)
	}
	if kr.err != nil {
		return nil, kr.err
	}
	rep.Killed, rep.KilledAt, rep.DownAfter = kr.name, kr.at.Sub(rep.Kill.Start), kr.down.Sub(kr.at)
	if rep.Retried, rep.Redispatched, err = c.Retries(ctx, "affinity", kr.name); err != nil {
		return nil, err
	}
	return rep, nil
}

type killResult struct {
	name     string
	at, down time.Time
	err      error
}

// killBusiest kills the replica the most of the kill run's conversations
// hash to, and waits for HAProxy to take it out.
func (c *Cluster) killBusiest(ctx context.Context, rep *Report) killResult {
	name, err := c.busiest(ctx, rep)
	if err != nil {
		return killResult{err: err}
	}
	at := time.Now()
	if err := c.Kill(name); err != nil {
		return killResult{err: err}
	}
	down, err := c.WaitDown(ctx, name, 30*time.Second)
	return killResult{name: name, at: at, down: down, err: err}
}

// busiest is the replica the most of the kill run's conversations hash
// to, asked of HAProxy with each conversation's key on /health.
func (c *Cluster) busiest(ctx context.Context, rep *Report) (string, error) {
	count := map[string]int{}
	for id := range rep.Load.Conversations {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.AffinityURL+"/health", nil)
		if err != nil {
			return "", err
		}
		req.Header.Set(SessionHeader, loadgen.SessionKey(rep.Load.Seed+2, id))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", fmt.Errorf("cluster: asking the hash: %w", err)
		}
		resp.Body.Close()
		count[resp.Header.Get(ServedByHeader)]++
	}
	best := ""
	for _, name := range c.Replicas() {
		if best == "" || count[name] > count[best] {
			best = name
		}
	}
	return best, nil
}
