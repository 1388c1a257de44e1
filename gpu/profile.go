package gpu

import (
	"fmt"
	"sort"
)

// Profile is the GPU time of a profiled batch's dispatches, by pipeline.
type Profile struct {
	Ticks map[string]uint64 // "module:entry" → summed timestamp ticks
	Count map[string]int    // "module:entry" → dispatches
}

// Total is the summed ticks of every dispatch.
func (p Profile) Total() uint64 {
	var t uint64
	for _, v := range p.Ticks {
		t += v
	}
	return t
}

// Names lists the pipelines, most time first.
func (p Profile) Names() []string {
	names := make([]string, 0, len(p.Ticks))
	for n := range p.Ticks {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return p.Ticks[names[i]] > p.Ticks[names[j]] })
	return names
}

// Add sums q into p.
func (p *Profile) Add(q Profile) {
	if p.Ticks == nil {
		p.Ticks, p.Count = map[string]uint64{}, map[string]int{}
	}
	for n, t := range q.Ticks {
		p.Ticks[n] += t
		p.Count[n] += q.Count[n]
	}
}

// Timestamps reports whether batches can be profiled on this device.
func (d *Device) Timestamps() bool { return d.timestamps }

// errNoTimestamps is Profile's answer where timestamp queries are missing.
func errNoTimestamps(d *Device) error {
	return fmt.Errorf("gpu: %s offers no timestamp queries: cannot profile", d.info)
}
