package parallel

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestPool runs many Runs back to back and after pauses long enough for
// the helpers to park: every worker runs each task once, Split covers the
// items exactly, and a barrier orders the phases.
func TestPool(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		p := NewPool(n)
		for run := range 300 {
			if run%100 == 99 {
				time.Sleep(5 * time.Millisecond) // the helpers park
			}
			const items = 1000
			var ran atomic.Int32
			hits := make([]int32, items)
			phase1 := make([]int, n)
			var wrong atomic.Int32
			p.Run(func(w int) {
				ran.Add(1)
				lo, hi := p.Split(items, w)
				for i := lo; i < hi; i++ {
					hits[i]++
				}
				phase1[w] = run + 1
				p.Barrier()
				for o := range n { // every worker's first phase is done
					if phase1[o] != run+1 {
						wrong.Add(1)
					}
				}
			})
			if ran.Load() != int32(n) || wrong.Load() != 0 {
				t.Fatalf("%d workers, run %d: %d ran, %d saw an unfinished phase", n, run, ran.Load(), wrong.Load())
			}
			for i, h := range hits {
				if h != 1 {
					t.Fatalf("%d workers, run %d: item %d done %d times", n, run, i, h)
				}
			}
		}
		p.Close()
		p.Close() // twice is harmless
	}
}
