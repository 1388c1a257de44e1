package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Pool runs one function on a fixed team of workers at once, SPMD style:
// every worker runs the same code on its own share of each loop
// (Split) and they meet at barriers (Barrier) between phases that read
// what the others wrote. The workers are goroutines started once, so a
// Run costs a wake-up of each, not a goroutine or an allocation.
//
// A Pool runs one Run at a time; Run is not reentrant.
type Pool struct {
	n       int
	start   []chan func(w int) // one per helper (workers 1 … n-1)
	done    sync.WaitGroup
	barrier barrier
	mu      sync.Mutex // one Run at a time
}

// NewPool starts a pool of n workers (n < 1: GOMAXPROCS). The caller of
// Run is worker 0, so n-1 goroutines wait between Runs. Close stops them.
func NewPool(n int) *Pool {
	if n < 1 {
		n = runtime.GOMAXPROCS(0)
	}
	p := &Pool{n: n, start: make([]chan func(int), n-1)}
	p.barrier.n = int32(n)
	for i := range p.start {
		ch := make(chan func(int))
		p.start[i] = ch
		go func() {
			for fn := range ch {
				fn(i + 1)
				p.done.Done()
			}
		}()
	}
	return p
}

// Workers is the number of workers a Run runs on.
func (p *Pool) Workers() int { return p.n }

// Run calls fn(w) for every worker w in [0, Workers()) concurrently — fn(0)
// on the calling goroutine — and returns when all have returned. Every
// worker must reach the same Barriers, in the same order.
func (p *Pool) Run(fn func(w int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done.Add(len(p.start))
	for _, ch := range p.start {
		ch <- fn
	}
	fn(0)
	p.done.Wait()
}

// Barrier returns once every worker of the Run has called it (each
// worker's writes before it are then visible to every worker after it).
func (p *Pool) Barrier() {
	if p.n > 1 {
		p.barrier.wait()
	}
}

// Split is worker w's share [lo, hi) of n items: contiguous ranges, their
// sizes within one of each other.
func (p *Pool) Split(n, w int) (lo, hi int) {
	return n * w / p.n, n * (w + 1) / p.n
}

// Close stops the workers; the pool must not be used afterwards.
func (p *Pool) Close() {
	for _, ch := range p.start {
		close(ch)
	}
	p.start = nil
}

// barrier is a reusable spinning barrier: the last of n arrivals resets
// the count and starts a new generation, the others wait for it. Phases
// of a forward pass are microseconds long, so waiters spin, yielding the
// processor now and then rather than parking.
type barrier struct {
	n     int32
	count atomic.Int32
	gen   atomic.Uint32
}

func (b *barrier) wait() {
	g := b.gen.Load()
	if b.count.Add(1) == b.n {
		b.count.Store(0)
		b.gen.Add(1)
		return
	}
	for i := 0; b.gen.Load() == g; i++ {
		if i&63 == 63 {
			runtime.Gosched()
		}
	}
}
