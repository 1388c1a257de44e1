package jobqueue

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestQueue(t *testing.T) {
	q := New[int](2)
	if err := q.Push(1); err != nil {
		t.Fatal(err)
	}
	if err := q.Push(2); err != nil {
		t.Fatal(err)
	}
	if err := q.Push(3); !errors.Is(err, ErrFull) {
		t.Errorf("a third item in a queue of two: %v", err)
	}
	if got := q.Drain(nil); len(got) != 2 || got[0] != 1 || got[1] != 2 || q.Waiting() != 2 || q.Pending() {
		t.Errorf("drained %v, waiting %d", got, q.Waiting())
	}
	q.Started()
	if q.Waiting() != 1 {
		t.Errorf("waiting %d after one started", q.Waiting())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := q.Next(ctx); ok {
		t.Error("Next returned an item from an empty queue")
	}
	q.Stop()
	q.Stop()
	if err := q.Push(4); !errors.Is(err, ErrStopped) {
		t.Errorf("Push after Stop: %v", err)
	}
}

// TestQueueBoundsDrained: the bound counts the items the loop has drained
// into its own waiting list too, until it starts them — not only those in
// the hand-off channel (issue 26: the waiting list grew without bound).
func TestQueueBoundsDrained(t *testing.T) {
	q := New[int](2)
	var waiting []int
	for i := range 2 {
		if err := q.Push(i); err != nil {
			t.Fatal(err)
		}
		waiting = q.Drain(waiting) // the loop takes it, but does not start it
	}
	err := q.Push(2)
	var full *FullError
	if !errors.Is(err, ErrFull) || !errors.As(err, &full) || full.Size != 2 {
		t.Fatalf("a third item with two drained and not started: %v", err)
	}
	if !strings.Contains(err.Error(), "2 waiting") {
		t.Errorf("the error does not name the bound: %v", err)
	}
	q.Started() // one leaves the waiting list: one place frees
	if err := q.Push(3); err != nil {
		t.Errorf("after one started: %v", err)
	}
	if err := q.Push(4); !errors.Is(err, ErrFull) {
		t.Errorf("full again: %v", err)
	}
	if q.Waiting() != 2 {
		t.Errorf("waiting %d, want 2", q.Waiting())
	}
}

// TestQueueConcurrentPush: pushes racing from many goroutines never take
// more than the bound.
func TestQueueConcurrentPush(t *testing.T) {
	q := New[int](8)
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if q.Push(i) == nil {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 8 || q.Waiting() != 8 {
		t.Errorf("%d pushes taken, %d waiting; want 8", ok.Load(), q.Waiting())
	}
}

func TestTicket(t *testing.T) {
	stopped := make(chan struct{})
	tk := NewTicket[string]()
	go func() { tk.Result = "done"; tk.Finish(nil); tk.Finish(errors.New("late")) }()
	if r, err := tk.Wait(context.Background(), stopped); r != "done" || err != nil {
		t.Errorf("Wait: %q, %v", r, err)
	}
	// A canceled wait returns only after the loop finishes the job.
	tk = NewTicket[string]()
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan time.Time, 1)
	go func() {
		for !tk.Canceled() {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		finished <- time.Now()
		tk.Finish(context.Canceled)
	}()
	cancel()
	_, err := tk.Wait(ctx, stopped)
	if at := <-finished; !errors.Is(err, context.Canceled) || time.Now().Before(at) {
		t.Errorf("canceled Wait: %v, returned before the loop let go", err)
	}
	close(stopped)
	if _, err := NewTicket[int]().Wait(context.Background(), stopped); !errors.Is(err, ErrStopped) {
		t.Errorf("Wait on a stopped loop: %v", err)
	}
}
