package speculative

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"webdraft/engine"
	"webdraft/sampling"
)

// Remote drafts one generation outside the generator: edge drafting, where
// the browser's drafter proposes and the server's target verifies over a
// websocket. The generator then holds no drafter sequence for it: each
// step it asks (Ask, which must not block) for a draft of up to K tokens
// after the tokens the remote has been sent so far and the new ones in the
// ask, and the generation waits — without holding up the others — until
// Answer brings it, Close ends it, or Timeout passes (the generation then
// fails with ErrRemoteTimeout). The target verifies whatever comes, so the
// output is the target's whatever the remote drafts; a draft is cut at its
// first token outside the vocabulary.
type Remote struct {
	ask     func(DraftAsk)
	timeout time.Duration
	// features: the remote drafts with an EAGLE-3 head, and each ask
	// carries the target's features of the positions it fed since the
	// ask before (NewHeadRemote).
	features bool

	mu       sync.Mutex
	last     int       // the id of the last ask (at first, the last id of any Remote before)
	asked    *DraftAsk // the ask not answered yet; nil when none
	askedAt  time.Time
	answer   *DraftAnswer
	answerAt time.Time
	closed   error
	wake     func() // set by the loop: wakes it when it waits
}

// askIDs numbers the asks of every Remote in the process, so that an
// answer meant for an earlier Remote (a run a page ended, whose draft was
// on its way) is known for stale by any later one.
var askIDs atomic.Int64

// DraftAsk is a request for a draft; its ID is unique in the process, and
// increases. Tokens extend the context the remote
// was sent before (Reset: they are the whole context, a new generation's
// prompt); the remote drafts up to K tokens after it: its greedy tokens,
// or coupled draws where Coupled is set. A remote keeps its own KV cache
// in step by keeping the longest prefix of what it fed that the new
// context shares (its accepted draft tokens).
type DraftAsk struct {
	ID     int
	Tokens []int
	Reset  bool
	K      int
	// Coupled, for a keyed sampled generation (Generator.Keyed), asks for
	// coupled draws: draft i (from 0) the Gumbel-max draw from the
	// remote's distribution at Coupled.Sampling under
	// Coupled.Keys.At(n + i), n the context's length — the key the
	// target's row for that position draws under, so that the two agree
	// about as often as the distributions overlap. Nil: greedy drafts.
	Coupled *Coupling
	// Features are, for a remote that drafts with an EAGLE-3 head
	// (NewHeadRemote), the target's features of the positions it has
	// fed since the last ask; nil for a remote that reads text alone.
	Features *FeatureRows
}

// Coupling is what a remote drafts coupled draws by: the generation's keys
// and its sampling.
type Coupling struct {
	Keys     sampling.Keys
	Sampling sampling.Params
}

// FeatureRows are the target's features of positions From … From+n−1
// (engine.FeatureReader): Rows holds n rows of Width floats. A remote
// holding positions from From on drops them first: what the target fed
// past the context the remote was sent (a rejected draft's) it never
// keeps. The target has fed every token of the context but the last by
// the time a head drafts, so the rows reach the context's last token but
// one.
type FeatureRows struct {
	From, Width int
	Rows        []float32
}

// DraftAnswer is a remote's draft for the ask of the same ID. DraftTime is
// the remote's own time on it (the rest of the round trip is the
// network's).
type DraftAnswer struct {
	ID        int
	Tokens    []int
	DraftTime time.Duration
	// Err, when set, says the remote could not draft: the generation ends
	// with it.
	Err error
}

// DefaultRemoteTimeout bounds the wait for a remote's draft.
const DefaultRemoteTimeout = 30 * time.Second

var (
	// ErrRemoteTimeout: the remote sent no draft in time.
	ErrRemoteTimeout = errors.New("the remote drafter sent no draft in time")
	// ErrStaleDraft: an answer to an ask that is no longer waited for (one
	// the generation gave up on, or of a generation that has ended).
	ErrStaleDraft = errors.New("a draft nobody waits for")
)

// NewRemote is a remote drafter that asks through ask (called from the
// loop's goroutine: it must not block) and is waited for at most timeout
// (0: DefaultRemoteTimeout) each step.
func NewRemote(ask func(DraftAsk), timeout time.Duration) *Remote {
	if timeout <= 0 {
		timeout = DefaultRemoteTimeout
	}
	return &Remote{ask: ask, timeout: timeout, last: int(askIDs.Load())}
}

// NewHeadRemote is NewRemote for a remote that drafts with an EAGLE-3
// head over the target's features: each ask carries the rows the target
// computed since the one before (DraftAsk.Features), and none is made
// before the target has fed the context but its last token. The
// generator's target must keep the head's features
// (engine.FeatureReader).
func NewHeadRemote(ask func(DraftAsk), timeout time.Duration) *Remote {
	r := NewRemote(ask, timeout)
	r.features = true
	return r
}

// ReadsFeatures reports whether the remote drafts with an EAGLE-3 head
// over the target's features (NewHeadRemote).
func (r *Remote) ReadsFeatures() bool { return r.features }

// Pending is the ask waiting for its answer, if any.
func (r *Remote) Pending() (DraftAsk, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked == nil || r.answer != nil {
		return DraftAsk{}, false
	}
	return *r.asked, true
}

// Answer hands the loop a draft. It fails — and the draft is dropped —
// for an id that was never asked (or is answered already), with
// ErrStaleDraft for an earlier ask (this Remote's or an earlier one's), or
// a draft longer than the ask's K.
func (r *Remote) Answer(a DraftAnswer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	pending := r.asked != nil && r.answer == nil
	switch {
	case a.ID <= 0:
		return fmt.Errorf("draft id %d: no such draft was asked for (ids start at 1)", a.ID)
	case r.closed != nil:
		return fmt.Errorf("%w: the generation has ended", ErrStaleDraft)
	case r.asked != nil && a.ID == r.asked.ID && r.answer != nil:
		return fmt.Errorf("draft id %d is answered already", a.ID)
	case pending && a.ID < r.asked.ID || !pending && a.ID <= r.last:
		return fmt.Errorf("%w: draft id %d", ErrStaleDraft, a.ID)
	case !pending || a.ID > r.asked.ID:
		return fmt.Errorf("draft id %d: no such draft was asked for", a.ID)
	case a.Err == nil && len(a.Tokens) > r.asked.K:
		return fmt.Errorf("draft id %d: %d tokens, more than the %d asked for", a.ID, len(a.Tokens), r.asked.K)
	}
	a.Tokens = append([]int(nil), a.Tokens...)
	r.answer, r.answerAt = &a, time.Now()
	if r.wake != nil {
		r.wake()
	}
	return nil
}

// Close ends the generation at the loop's next turn with err (the socket
// closed, say); later answers are stale.
func (r *Remote) Close(err error) {
	if err == nil {
		err = errors.New("the remote drafter closed")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed == nil {
		r.closed = err
	}
	if r.wake != nil {
		r.wake()
	}
}

// remoteDraft is a generation's remote drafting state, the loop's alone.
type remoteDraft struct {
	*Remote
	sent     int // context tokens the remote has been sent
	featSent int // positions of the target's features the remote has been sent
}

// poll is the loop's turn at a remote generation that needs a draft of
// k tokens (coupled draws with coupled, else greedy): the draft when it
// has come, else asks for one if none is asked — with the target's
// features of positions from … held−1 where the remote reads them
// (features reads them) —; err ends the generation (closed, timed out,
// failed). deadline is when the wait ends.
func (rd *remoteDraft) poll(context []int, k int, coupled *Coupling, vocab int, now time.Time, held int, features func(from, to int) ([]float32, int, error)) (draft []engine.Token, ok bool, deadline time.Time, rtt, own time.Duration, err error) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.closed != nil {
		return nil, false, time.Time{}, 0, 0, rd.closed
	}
	if rd.asked == nil {
		a := DraftAsk{ID: int(askIDs.Add(1)), Tokens: append(make([]int, 0, len(context)-rd.sent), context[rd.sent:]...), Reset: rd.sent == 0, K: k, Coupled: coupled}
		if rd.features {
			if a.Reset {
				rd.featSent = 0
			}
			from := min(rd.featSent, held)
			rd.mu.Unlock() // a read from the GPU: Answer and Close need not wait for it (only the loop asks)
			rows, width, err := features(from, held)
			rd.mu.Lock()
			if err != nil && rd.closed == nil {
				rd.closed = fmt.Errorf("the target's features for the remote head: %w", err)
			}
			if rd.closed != nil {
				return nil, false, time.Time{}, 0, 0, rd.closed
			}
			a.Features = &FeatureRows{From: from, Width: width, Rows: rows}
			rd.featSent = held
		}
		rd.last = a.ID
		rd.sent = len(context)
		rd.asked, rd.askedAt = &a, now
		rd.mu.Unlock()
		rd.ask(a) // outside the lock: it may answer at once
		rd.mu.Lock()
		if rd.answer == nil {
			return nil, false, now.Add(rd.timeout), 0, 0, nil
		}
	}
	if rd.answer == nil {
		deadline = rd.askedAt.Add(rd.timeout)
		if !now.Before(deadline) {
			rd.closed = fmt.Errorf("%w (%v)", ErrRemoteTimeout, rd.timeout)
			return nil, false, time.Time{}, 0, 0, rd.closed
		}
		return nil, false, deadline, 0, 0, nil
	}
	a := rd.answer
	rtt = rd.answerAt.Sub(rd.askedAt)
	rd.asked, rd.answer = nil, nil
	if a.Err != nil {
		rd.closed = fmt.Errorf("the remote drafter: %w", a.Err)
		return nil, false, time.Time{}, 0, 0, rd.closed
	}
	for _, id := range a.Tokens[:min(len(a.Tokens), k)] {
		if id < 0 || id >= vocab {
			break
		}
		draft = append(draft, engine.Token{ID: id, Logprob: float32(math.Inf(-1))})
	}
	return draft, true, time.Time{}, rtt, min(max(a.DraftTime, 0), rtt), nil
}
