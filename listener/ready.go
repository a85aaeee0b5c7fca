package listener

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrStopped: Run has returned, so the listener will not become ready.
var ErrStopped = errors.New("listener: Run has returned")

// readiness is the listener's connection state, for Stats and WaitReady.
type readiness struct {
	mu             sync.Mutex
	ready          bool          // consuming with at least its concurrent consumers
	changed        chan struct{} // closed and replaced on every change
	connectedSince time.Time     // zero while not connected
	lastErr        error         // the last connection or consume problem
	stopped        bool
	runErr         error
}

func newReadiness() *readiness { return &readiness{changed: make(chan struct{})} }

// set changes the state under mu and wakes the waiters.
func (r *readiness) set(change func(*readiness)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	change(r)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *readiness) connected() { r.set(func(r *readiness) { r.connectedSince = time.Now() }) }

// consuming records whether the listener consumes with its concurrent
// consumers. It runs on every scaling tick, so it wakes the waiters only
// when that changes.
func (r *readiness) consuming(ok bool) {
	r.mu.Lock()
	same := r.ready == ok
	r.mu.Unlock()
	if !same {
		r.set(func(r *readiness) { r.ready = ok })
	}
}
func (r *readiness) lost(err error) {
	r.set(func(r *readiness) {
		r.ready, r.connectedSince = false, time.Time{}
		if err != nil {
			r.lastErr = err
		}
	})
}

func (r *readiness) stop(err error) {
	r.set(func(r *readiness) {
		r.ready, r.connectedSince, r.stopped, r.runErr = false, time.Time{}, true, err
	})
}

// WaitReady blocks until the listener consumes with its concurrent
// consumers (the broker shows them), and returns nil; or until ctx ends
// (ctx's error), or Run returns (ErrStopped, or Run's error). A listener
// that lost its connection is not ready until it consumes again. Call it
// beside Run, for a readiness probe or a test that must not publish too
// early; Stats().Ready says the same without waiting.
func (l *Listener) WaitReady(ctx context.Context) error {
	for {
		l.ready.mu.Lock()
		ready, stopped, runErr, changed := l.ready.ready, l.ready.stopped, l.ready.runErr, l.ready.changed
		l.ready.mu.Unlock()
		switch {
		case ready:
			return nil
		case stopped && runErr != nil:
			return runErr
		case stopped:
			return ErrStopped
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
