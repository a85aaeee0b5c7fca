package middleware

import (
	"context"
	"sync"
	"time"
)

// FakeClock is a clock for tests: Wait returns at once and moves time forward,
// so schedules of minutes run in microseconds and are exact.
type FakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
}

func NewFakeClock() *FakeClock {
	return &FakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves time forward, as a slow handler would.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *FakeClock) Wait(ctx context.Context, interrupt <-chan struct{}, d time.Duration) error {
	if err := interrupted(ctx, interrupt); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.waits = append(c.waits, d)
	return nil
}

// Waits returns the waits made so far.
func (c *FakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// WithClock makes Retry use c instead of the system clock.
func WithClock(c *FakeClock) RetryOption {
	return func(o *retryOptions) { o.clock = c }
}
