package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"webdraft/scheduler"
)

// metrics are the server's Prometheus series, in a registry of its own.
type metrics struct {
	registry      *prometheus.Registry
	requests      *prometheus.CounterVec // by HTTP status code and error code
	draftTokens   prometheus.Counter
	prefillTokens prometheus.Counter
	cachedTokens  prometheus.Counter
	batchSeqs     prometheus.Histogram
	batchTokens   prometheus.Histogram
	stepSeconds   prometheus.Histogram
	phaseSeconds  *prometheus.HistogramVec // queue, prefill, decode
}

func newMetrics() *metrics {
	latency := prometheus.ExponentialBuckets(0.0005, 2, 16) // 0.5 ms … 16 s
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "webdraft_requests_total", Help: "POST /draft requests by HTTP status and error code.",
		}, []string{"status", "code"}),
		draftTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "webdraft_draft_tokens_total", Help: "Tokens drafted.",
		}),
		prefillTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "webdraft_prefill_tokens_total", Help: "Context tokens computed (not found in the prefix cache).",
		}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "webdraft_cached_tokens_total", Help: "Context tokens reused from the prefix cache.",
		}),
		batchSeqs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "webdraft_batch_sequences", Help: "Sequences per forward pass.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		batchTokens: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "webdraft_batch_tokens", Help: "Tokens per forward pass.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		stepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "webdraft_step_seconds", Help: "Duration of one forward pass.", Buckets: latency,
		}),
		phaseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "webdraft_request_phase_seconds", Help: "Time a request spent queued, prefilling (to its first draft token) and decoding.",
			Buckets: latency,
		}, []string{"phase"}),
	}
	m.registry.MustRegister(m.requests, m.draftTokens, m.prefillTokens, m.cachedTokens,
		m.batchSeqs, m.batchTokens, m.stepSeconds, m.phaseSeconds,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// watch exports a scheduler's gauges.
func (m *metrics) watch(s *scheduler.Scheduler) {
	gauge := func(name, help string, read func(scheduler.Gauges) int64) {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(read(s.Gauges())) }))
	}
	gauge("webdraft_queue_depth", "Requests waiting to start.", func(g scheduler.Gauges) int64 { return g.Waiting })
	gauge("webdraft_running_requests", "Requests being prefilled or decoded.", func(g scheduler.Gauges) int64 { return g.Running })
	gauge("webdraft_cache_sequences", "Idle sequences kept in the prefix cache.", func(g scheduler.Gauges) int64 { return g.CachedSequences })
	gauge("webdraft_cache_tokens", "Positions held by the prefix cache.", func(g scheduler.Gauges) int64 { return g.CachedTokens })
	gauge("webdraft_reserved_tokens", "KV positions reserved by running requests.", func(g scheduler.Gauges) int64 { return g.ReservedTokens })
}

// onStep records one forward pass.
func (m *metrics) onStep(st scheduler.StepStats) {
	m.batchSeqs.Observe(float64(st.Sequences))
	m.batchTokens.Observe(float64(st.Tokens))
	m.stepSeconds.Observe(st.Duration.Seconds())
}

func (m *metrics) request(status int, code string) {
	m.requests.WithLabelValues(strconv.Itoa(status), code).Inc()
}

func (m *metrics) result(r scheduler.Result) {
	m.draftTokens.Add(float64(len(r.Draft)))
	m.prefillTokens.Add(float64(r.PrefillTokens))
	m.cachedTokens.Add(float64(r.CachedTokens))
	m.phaseSeconds.WithLabelValues("queue").Observe(r.Queue.Seconds())
	m.phaseSeconds.WithLabelValues("prefill").Observe(r.Prefill.Seconds())
	m.phaseSeconds.WithLabelValues("decode").Observe(r.Decode.Seconds())
}
