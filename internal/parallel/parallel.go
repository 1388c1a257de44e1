// Package parallel splits loops over the machine's cores.
package parallel

import (
	"runtime"
	"sync"
)

// For calls fn on disjoint ranges [lo, hi) covering [0, n), concurrently on
// up to GOMAXPROCS goroutines, each range at least minChunk long (except the
// last), and returns when all are done.
func For(n, minChunk int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	workers := runtime.GOMAXPROCS(0)
	chunk := max(minChunk, (n+workers-1)/workers, 1)
	if chunk >= n {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}
