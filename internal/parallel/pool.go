package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool runs one function on a fixed team of workers at once, SPMD style:
// every worker runs the same code on its own share of each loop
// (Split) and they meet at barriers (Barrier) between phases that read
// what the others wrote. The workers are goroutines started once; between
// Runs each spins a little (a forward pass's next one usually follows at
// once) and then parks, so a Run costs neither a goroutine nor, mostly, a
// wake-up.
//
// A Pool runs one Run at a time; Run is not reentrant.
type Pool struct {
	n       int
	helpers []helper // workers 1 … n-1
	task    func(w int)
	epoch   atomic.Uint64 // one more for each Run: the helpers' signal
	closed  atomic.Bool
	barrier barrier
	mu      sync.Mutex // one Run at a time
}

// helper is a worker's parking place.
type helper struct {
	parked atomic.Bool
	wake   chan struct{} // one token: a Run that found it parked
}

// spinRounds is how long a helper looks for the next Run before it parks:
// rounds of 64 loads and a yield, some tens of microseconds.
const spinRounds = 256

// NewPool starts a pool of n workers (n < 1: GOMAXPROCS). The caller of
// Run is worker 0, so n-1 goroutines wait between Runs. Close stops them.
func NewPool(n int) *Pool {
	if n < 1 {
		n = runtime.GOMAXPROCS(0)
	}
	p := &Pool{n: n, helpers: make([]helper, n-1)}
	p.barrier.n = int32(n)
	p.barrier.wake.L = &p.barrier.mu
	for i := range p.helpers {
		p.helpers[i].wake = make(chan struct{}, 1)
		go p.serve(i)
	}
	return p
}

// serve is helper i's loop: wait for a Run (spinning, then parked), run
// its task as worker i+1, and meet the others at the Run's end.
func (p *Pool) serve(i int) {
	h := &p.helpers[i]
	var seen uint64
	for {
		e := p.epoch.Load()
		for rounds := 0; e == seen; rounds++ {
			if rounds < spinRounds {
				for range 64 {
					if e = p.epoch.Load(); e != seen {
						break
					}
				}
				runtime.Gosched()
				continue
			}
			h.parked.Store(true)
			if e = p.epoch.Load(); e == seen {
				<-h.wake
			}
			h.parked.Store(false)
			e, rounds = p.epoch.Load(), 0
		}
		if p.closed.Load() {
			return
		}
		seen = e
		p.task(i + 1)
		p.barrier.wait() // the Run's end
	}
}

// Workers is the number of workers a Run runs on.
func (p *Pool) Workers() int { return p.n }

// Run calls fn(w) for every worker w in [0, Workers()) concurrently — fn(0)
// on the calling goroutine — and returns when all have returned. Every
// worker must reach the same Barriers, in the same order.
func (p *Pool) Run(fn func(w int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.task = fn
	p.epoch.Add(1) // publishes task to the helpers
	p.wakeParked()
	fn(0)
	if p.n > 1 {
		p.barrier.wait() // every helper is done with fn
	}
}

// wakeParked hands a token to every parked helper (a helper that parks
// after this sees the new epoch first, and a spare token only makes it
// look once more).
func (p *Pool) wakeParked() {
	for i := range p.helpers {
		if h := &p.helpers[i]; h.parked.Load() {
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
	}
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
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Swap(true) {
		return
	}
	p.epoch.Add(1)
	p.wakeParked()
}

// barrier is a reusable barrier: the last of n arrivals resets the count
// and starts a new generation, the others wait for it. Phases of a forward
// pass are microseconds long, so a waiter first spins (yielding to other
// goroutines now and then); past barrierSpin it sleeps on a condition
// variable, so that a worker the system has descheduled — the machine
// shared with another program — gets the waiter's core rather than
// waiting for it.
type barrier struct {
	n        int32
	count    atomic.Int32
	gen      atomic.Uint32
	sleepers atomic.Int32
	mu       sync.Mutex
	wake     sync.Cond // on mu: a new generation, for the sleepers
}

// barrierSpin is how long a waiter spins before it sleeps: far longer
// than a phase's imbalance (a sleeper's wake-up costs tens of
// microseconds, which every phase would pay), far shorter than the
// scheduler's time slice a descheduled worker waits out.
const barrierSpin = 500 * time.Microsecond

func (b *barrier) wait() {
	g := b.gen.Load()
	if b.count.Add(1) == b.n {
		b.count.Store(0)
		b.gen.Add(1)
		if b.sleepers.Load() > 0 {
			b.mu.Lock()
			b.wake.Broadcast()
			b.mu.Unlock()
		}
		return
	}
	var deadline time.Time
	for i := 1; ; i++ {
		if b.gen.Load() != g {
			return
		}
		if i&63 == 0 {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(barrierSpin)
			} else if now.After(deadline) {
				break
			}
			runtime.Gosched()
		}
	}
	b.mu.Lock()
	b.sleepers.Add(1)
	for b.gen.Load() == g {
		b.wake.Wait()
	}
	b.sleepers.Add(-1)
	b.mu.Unlock()
}
