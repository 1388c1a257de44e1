// Package jobqueue is what stands between the goroutines that submit work
// and the one loop that runs it on an engine (the drafting scheduler's, the
// speculative generator's): a bounded queue the loop drains between its
// steps, its stopped signal, and a ticket a submitter waits on.
package jobqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

var (
	// ErrFull: the queue is full; try again shortly. Push returns it as a
	// *FullError, which names the bound.
	ErrFull = errors.New("too many requests waiting")
	// ErrStopped: the loop has stopped.
	ErrStopped = errors.New("stopped")
)

// FullError is ErrFull with the bound that was reached.
type FullError struct{ Size int }

func (e *FullError) Error() string {
	return fmt.Sprintf("%v: %d waiting, the most the queue holds", ErrFull, e.Size)
}

// Is makes errors.Is(err, ErrFull) hold.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// Queue holds submitted items from Push until the loop has started them
// (Started). The bound counts every item in between — in the hand-off
// channel or in the loop's own waiting list, which Drain fills — so that
// no more than size items ever wait. Push, Waiting and Stopped may be
// called from any goroutine; the rest by the loop.
type Queue[T any] struct {
	ch      chan T
	size    int
	stopped chan struct{}
	once    sync.Once
	waiting atomic.Int64 // pushed, not yet started
}

// New returns a queue of at most size waiting items.
func New[T any](size int) *Queue[T] {
	return &Queue[T]{ch: make(chan T, size), size: size, stopped: make(chan struct{})}
}

// Push queues t: ErrStopped once the loop has stopped, a *FullError when
// size items wait (pushed and not started, wherever they are).
func (q *Queue[T]) Push(t T) error {
	select {
	case <-q.stopped:
		return ErrStopped
	default:
	}
	for {
		n := q.waiting.Load()
		if n >= int64(q.size) {
			return &FullError{q.size}
		}
		if q.waiting.CompareAndSwap(n, n+1) {
			break
		}
	}
	select {
	case q.ch <- t: // never full: it holds size items, and fewer than size wait
		return nil
	default:
		q.waiting.Add(-1)
		return &FullError{q.size}
	}
}

// Next waits for an item, or for ctx's end (false).
func (q *Queue[T]) Next(ctx context.Context) (T, bool) {
	select {
	case t := <-q.ch:
		return t, true
	case <-ctx.Done():
		var zero T
		return zero, false
	}
}

// C is the channel items arrive on, for a loop that waits on other things
// too: an item received from it is the loop's, as Next's is.
func (q *Queue[T]) C() <-chan T { return q.ch }

// Drain appends to into every item queued now.
func (q *Queue[T]) Drain(into []T) []T {
	for {
		select {
		case t := <-q.ch:
			into = append(into, t)
		default:
			return into
		}
	}
}

// Pending reports whether items are queued that no Drain has taken.
func (q *Queue[T]) Pending() bool { return len(q.ch) > 0 }

// Started records that an item taken earlier has started (or was dropped):
// it no longer counts as waiting, and frees its place for a Push.
func (q *Queue[T]) Started() { q.waiting.Add(-1) }

// Waiting is how many pushed items have not started.
func (q *Queue[T]) Waiting() int64 { return q.waiting.Load() }

// Stop marks the loop stopped: Push refuses from then on, and Stopped is
// closed.
func (q *Queue[T]) Stop() { q.once.Do(func() { close(q.stopped) }) }

// Stopped is closed once the loop has stopped.
func (q *Queue[T]) Stopped() <-chan struct{} { return q.stopped }

// Ticket is a submitted job's outcome: the loop fills Result and calls
// Finish once; the submitter Waits.
type Ticket[R any] struct {
	Result   R
	err      error
	done     chan struct{}
	once     sync.Once
	canceled atomic.Bool
	onCancel func()
}

// OnCancel has f called once the submitter stops waiting (after Canceled
// holds): a loop that sleeps can wake to notice. Set it before the ticket
// is pushed.
func (t *Ticket[R]) OnCancel(f func()) { t.onCancel = f }

// NewTicket returns a ticket not finished yet.
func NewTicket[R any]() *Ticket[R] { return &Ticket[R]{done: make(chan struct{})} }

// Finish ends the job with err (nil: Result holds its outcome); only the
// first call counts.
func (t *Ticket[R]) Finish(err error) {
	t.once.Do(func() {
		t.err = err
		close(t.done)
	})
}

// Canceled reports whether the submitter has stopped waiting.
func (t *Ticket[R]) Canceled() bool { return t.canceled.Load() }

// Wait waits for Finish, ctx's end, or the loop's stop (ErrStopped). When
// ctx ends first it marks the ticket canceled and returns once the loop
// has finished the job or stopped, so that the loop calls nothing of the
// job's (a callback, say) after Wait returns.
func (t *Ticket[R]) Wait(ctx context.Context, stopped <-chan struct{}) (R, error) {
	var zero R
	select {
	case <-t.done:
		if t.err != nil {
			return zero, t.err
		}
		return t.Result, nil
	case <-ctx.Done():
		t.canceled.Store(true)
		if t.onCancel != nil {
			t.onCancel()
		}
		select {
		case <-t.done:
		case <-stopped:
		}
		return zero, ctx.Err()
	case <-stopped:
		return zero, ErrStopped
	}
}

// StopError is what the work a loop leaves unfinished gets when it stops:
// fault, the error that stopped it, when set; else the cause its context
// was cancelled with (context.WithCancelCause), when there is one; else
// ErrStopped.
func StopError(ctx context.Context, fault error) error {
	if fault != nil {
		return fault
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return ErrStopped
}
