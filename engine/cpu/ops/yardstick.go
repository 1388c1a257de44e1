package ops

import (
	"sync"
	"time"
)

// FMARate measures the f32 multiply-adds per second the kernels' vector
// units reach from registers alone, on threads goroutines at once for
// about d: the ceiling of a matrix product bound by arithmetic (a
// verification's rows), as memory bandwidth is the ceiling of one bound
// by its bytes (a one-token step).
func FMARate(threads int, d time.Duration) float64 {
	const rounds = 1 << 16
	var mu sync.Mutex
	var total float64
	start := time.Now()
	var wg sync.WaitGroup
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var done float64
			for time.Since(start) < d {
				done += fmaLoop(rounds)
			}
			mu.Lock()
			total += done
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total / time.Since(start).Seconds()
}
