package engine_test

import (
	"testing"

	"webdraft/engine"
)

// sampler is an engine that samples drafts, its Dists in domain.
type sampler struct {
	engine.Engine
	domain any
}

func (s sampler) SamplesDrafts() bool { return true }
func (s sampler) DistDomain() any     { return s.domain }

// host samples drafts into host memory (no DistDomain).
type host struct{ engine.Engine }

func (host) SamplesDrafts() bool { return true }

// TestSampledPair: a target verifies a drafter's sampled drafts when both
// sample and the drafter's Dists are in host memory or the target's own
// domain.
func TestSampledPair(t *testing.T) {
	a, b := new(int), new(int)
	for _, c := range []struct {
		name            string
		drafter, target engine.Engine
		want            bool
	}{
		{"host to host", host{}, host{}, true},
		{"host to a device", host{}, sampler{domain: a}, true},
		{"one device", sampler{domain: a}, sampler{domain: a}, true},
		{"two devices", sampler{domain: a}, sampler{domain: b}, false},
		{"a device to host", sampler{domain: a}, host{}, false},
		{"a drafter that does not sample", struct{ engine.Engine }{}, host{}, false},
		{"a target that does not sample", host{}, struct{ engine.Engine }{}, false},
	} {
		if got := engine.SampledPair(c.drafter, c.target); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
