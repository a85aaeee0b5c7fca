package listener

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
)

// Three calls hold the pool's three slots; two of them end while the
// ceiling drops to 1. The one still running is the pool's one slot: no new
// call may start until it ends, however the ends and the resize interleave
// (a free that raced the resize once left a slot owed twice and a token
// free, and two calls ran under a limit of 1).
func TestPoolShrinkRacingEndsAdmitsNoMore(t *testing.T) {
	var waiting atomic.Int64
	for range 20000 {
		w := newWorkers(1, 3)
		w.setCeiling(3)
		var h holder
		for range 3 {
			if err := w.enter(context.Background(), nil, &waiting); err != nil {
				t.Fatal(err)
			}
			if !w.hold(&h) {
				t.Fatal("hold refused")
			}
		}
		var wg sync.WaitGroup
		wg.Add(3)
		go func() { defer wg.Done(); w.leave(&h) }()
		go func() { defer wg.Done(); w.leave(&h) }()
		go func() { defer wg.Done(); w.setCeiling(1) }()
		wg.Wait()
		if n := len(w.tokens); n != 0 {
			t.Fatalf("%d slots free with 1 call running under a limit of %d (owed %d)", n, w.limit.Load(), w.owed.Load())
		}
		w.leave(&h)
		if n, limit := len(w.tokens), w.limit.Load(); int32(n) != limit || w.owed.Load() != 0 || w.busy.Load() != 0 {
			t.Fatalf("idle: %d free, limit %d, owed %d, busy %d", n, limit, w.owed.Load(), w.busy.Load())
		}
	}
}

// A consumer's calls forgiven (its channel is gone) free their slots at
// once and give nothing back as they end; a call of it that took a slot
// after that gives it back at once.
func TestPoolForgiveFreesSlotsOnce(t *testing.T) {
	var waiting atomic.Int64
	w := newWorkers(1, 1)
	var gone, next holder
	if err := w.enter(context.Background(), nil, &waiting); err != nil || !w.hold(&gone) {
		t.Fatal("first call refused")
	}
	w.forgive(&gone)
	if err := w.enter(context.Background(), nil, &waiting); err != nil || !w.hold(&next) {
		t.Fatal("a call of another consumer waits for the forgiven one")
	}
	w.leave(&gone) // the hung handler ends at last: nothing comes back
	if n := len(w.tokens); n != 0 {
		t.Fatalf("%d slots free while the one slot is in use", n)
	}
	w.leave(&next)
	if n := len(w.tokens); n != 1 || w.busy.Load() != 0 {
		t.Fatalf("idle: %d free, busy %d; want 1 and 0", n, w.busy.Load())
	}
	if err := w.enter(context.Background(), nil, &waiting); err != nil {
		t.Fatal(err)
	}
	if w.hold(&gone) {
		t.Fatal("a forgiven consumer's new call was counted")
	}
	if n := len(w.tokens); n != 1 {
		t.Fatalf("%d slots free after a forgiven consumer's call gave its slot back, want 1", n)
	}
}
