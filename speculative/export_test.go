package speculative

import "time"

// SetAloneSpan sets the time a chained step of the target alone aims for
// (aloneSpan) until the returned function restores it.
func SetAloneSpan(d time.Duration) (restore func()) {
	old := aloneSpan
	aloneSpan = d
	return func() { aloneSpan = old }
}

// SetAdaptRetry sets how many tokens an adaptive generation runs alone
// before it speculates again (adaptRetry) until the returned function
// restores it.
func SetAdaptRetry(n int) (restore func()) {
	old := adaptRetry
	adaptRetry = n
	return func() { adaptRetry = old }
}

// GumbelTop is gumbelTop: a keyed tree node's children and their scores.
var GumbelTop = gumbelTop
