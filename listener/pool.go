package listener

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/amqpretry/amqpretry/middleware"
)

// workers is the listener's pool of handler slots: how many handler calls
// (a delivery's, or a batch's) run at once, across all its channels. It is
// what WithConcurrentConsumers and WithMaxConcurrentConsumers set: the
// limit starts at the concurrent count and moves between it and the
// maximum. A delivery takes a slot only while its handler runs: one that
// waits between retries holds none.
//
// The limit grows at once, by one, when a handler call finds every slot
// taken (work waits in the process), and the scaler grows it when every
// slot is taken and messages wait at the broker; it shrinks to what was in
// use once no call has found the pool full for the idle timeout.
//
// The ceiling caps the limit: 1 while the queue's order must hold (single
// active consumer, an exclusive consumer, a careful start, a kill switch
// probe, or while the listener has not yet seen two of its channels get
// messages at once), the maximum otherwise.
type workers struct {
	// tokens holds a token per free slot: len(tokens)+busy = limit+owed.
	tokens chan struct{}
	// owed: slots to take out of the pool as calls end (the limit was
	// lowered while they ran).
	owed atomic.Int32

	mu      sync.Mutex // for limit and ceiling changes
	limit   atomic.Int32
	ceiling atomic.Int32
	floor   int32 // WithConcurrentConsumers
	max     int32 // WithMaxConcurrentConsumers

	busy    atomic.Int32 // calls running
	waiting atomic.Int32 // calls waiting for a slot
	peak    atomic.Int32 // the most calls running at once since the scaler last looked
	// fullAt is the monotime when a call last found every slot taken.
	fullAt atomic.Int64
}

// holder is what one consumer's calls hold of the pool: how many slots,
// and whether the pool has forgiven them (forgive). Under the pool's mu.
type holder struct {
	n        int32
	forgiven bool
}

func newWorkers(floor, max int) *workers {
	w := &workers{tokens: make(chan struct{}, max), floor: int32(floor), max: int32(max)}
	w.ceiling.Store(1)
	w.limit.Store(1)
	w.tokens <- struct{}{}
	return w
}

// parallel reports whether more than one call may run at once now.
func (w *workers) parallel() bool { return w.ceiling.Load() > 1 }

// setCeiling caps the limit at n (1 to max): lowering it takes slots out
// (those in use as their calls end); raising it from 1 brings the limit to
// the concurrent count.
func (w *workers) setCeiling(n int) { w.setCeilingUnless(n, nil) }

// setCeilingUnless is setCeiling, unless not() holds, asked under the
// pool's lock, so that a ceiling raised from a reader's goroutine cannot
// undo one the scaler lowered meanwhile.
func (w *workers) setCeilingUnless(n int, not func() bool) {
	n32 := min(max(int32(n), 1), w.max)
	w.mu.Lock()
	defer w.mu.Unlock()
	if not != nil && not() {
		return
	}
	if w.ceiling.Swap(n32) == n32 {
		return
	}
	w.resize(min(max(w.limit.Load(), min(w.floor, n32)), n32))
}

// grow raises the limit by one, below the ceiling; it reports whether it
// did.
func (w *workers) grow() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	limit := w.limit.Load()
	if limit >= w.ceiling.Load() {
		return false
	}
	w.resize(limit + 1)
	return true
}

// shrinkTo lowers the limit to n, not below the concurrent count (or the
// ceiling, if lower).
func (w *workers) shrinkTo(n int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ceiling := w.ceiling.Load()
	n = min(max(n, min(w.floor, ceiling)), ceiling)
	if n < w.limit.Load() {
		w.resize(n)
	}
}

// resize sets the limit to n, under mu.
func (w *workers) resize(n int32) {
	diff := n - w.limit.Load()
	w.limit.Store(n)
	for ; diff > 0; diff-- {
		if o := w.owed.Load(); o > 0 && w.owed.CompareAndSwap(o, o-1) {
			continue // a slot about to be taken out stays instead
		}
		w.tokens <- struct{}{}
	}
	for ; diff < 0; diff++ {
		select {
		case <-w.tokens:
		default:
			w.owed.Add(1) // in use: taken out when its call ends
		}
	}
}

// enter takes a slot for a call; with every slot taken it grows the pool
// if the ceiling allows, or waits for a slot, the context or the
// interrupt. waitingHere counts the wait for the caller's own statistics.
func (w *workers) enter(ctx context.Context, interrupt <-chan struct{}, waitingHere *atomic.Int64) error {
	for took := false; !took; {
		select {
		case <-w.tokens: // free: the usual case, no select machinery
			took = true
		default:
			w.fullAt.Store(monotime())
			if !w.grow() { // (grown: try again, another call may take the new slot first)
				if err := w.wait(ctx, interrupt, waitingHere); err != nil {
					return err
				}
				took = true
			}
		}
	}
	busy := w.busy.Add(1)
	for p := w.peak.Load(); busy > p && !w.peak.CompareAndSwap(p, busy); p = w.peak.Load() {
	}
	if len(w.tokens) == 0 {
		w.fullAt.Store(monotime())
	}
	return nil
}

func (w *workers) wait(ctx context.Context, interrupt <-chan struct{}, waitingHere *atomic.Int64) error {
	w.waiting.Add(1)
	waitingHere.Add(1)
	defer w.waiting.Add(-1)
	defer waitingHere.Add(-1)
	select {
	case <-w.tokens:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-interrupt:
		return &middleware.InterruptedError{Attempt: middleware.Attempt(ctx), Reason: errShuttingDown}
	}
}

// hold counts, for h, the slot enter just took; if h's calls have been
// forgiven it gives the slot back and reports false.
func (w *workers) hold(h *holder) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.forgiven {
		w.free()
		return false
	}
	h.n++
	return true
}

// leave frees the slot of a call of h's that hold counted, unless the pool
// has forgiven h's calls already.
func (w *workers) leave(h *holder) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h.n--
	if !h.forgiven {
		w.free()
	}
}

// forgive frees at once the slots h's running calls hold, which then give
// nothing back as they end: their consumer's channel is gone (or the kill
// switch stopped it), and a handler that does not return must not keep a
// probe, a careful start or the next consumer of an ordered queue waiting
// for a slot. Those handlers run on beside the new ones.
func (w *workers) forgive(h *holder) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h.forgiven {
		return
	}
	h.forgiven = true
	for range h.n {
		w.free()
	}
}

// free returns a slot to the pool, or takes it out if the limit was
// lowered while it was in use. Under mu, as resize is: a free racing a
// resize could otherwise leave more slots owed than are in use, and let
// more calls run than the limit.
func (w *workers) free() {
	w.busy.Add(-1)
	if o := w.owed.Load(); o > 0 {
		w.owed.Store(o - 1) // the slot leaves the pool
		return
	}
	w.tokens <- struct{}{}
}

// look returns, for the scaler, the most calls that ran at once since its
// last look (starting the next window at the calls running now) and when a
// call last found every slot taken.
func (w *workers) look() (peak int32, fullAt int64) {
	return w.peak.Swap(w.busy.Load()), w.fullAt.Load()
}
