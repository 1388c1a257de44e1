//go:build !js

package gpu

// SetSpinPoll switches how Read waits for the GPU (see spinPoll) and
// returns the previous setting, for benchmarks.
func SetSpinPoll(spin bool) bool {
	old := spinPoll
	spinPoll = spin
	return old
}
