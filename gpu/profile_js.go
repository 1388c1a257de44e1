//go:build js

package gpu

// The library's browser side has no timestamp queries: profiling is native.
type profiler struct{}

// Profile reports that the browser build cannot profile.
func (b *Batch) Profile(max int) error { return errNoTimestamps(b.d) }

func (p *profiler) release() {}

func (b *Batch) beginDispatch(string) error { return nil }
func (b *Batch) endDispatch() error         { return nil }
func (b *Batch) resolveTimestamps() error   { return nil }

// Results reports that the browser build cannot profile.
func (b *Batch) Results() (Profile, error) { return Profile{}, errNoTimestamps(b.d) }
