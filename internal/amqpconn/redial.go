package amqpconn

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Redialer spaces out the dials after a lost connection: 100ms, growing ×1.5
// up to 10s (the listener's pacing since its first release), each drawn ±50%
// so that clients cut off together do not come back in step; it never gives up (the owner stops when its context ends). It is
// not safe for concurrent use: one per connection owner.
type Redialer struct{ b *backoff.ExponentialBackOff }

// NewRedialer returns a Redialer at its first, shortest pause.
func NewRedialer() *Redialer {
	return &Redialer{b: backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMultiplier(1.5),
		backoff.WithMaxInterval(10*time.Second),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0), // backoff/v4 would stop after 15 minutes
	)}
}

// AtOnceEvery is how often an owner with several addresses may redial at
// once, without the Redialer's pause, after losing a connection: once per
// node failure, not in a loop against a flapping broker.
const AtOnceEvery = 30 * time.Second

// Next returns the pause before the next dial.
func (r *Redialer) Next() time.Duration { return r.b.NextBackOff() }

// Reset starts the pauses over: call it once a connection works.
func (r *Redialer) Reset() { r.b.Reset() }

// Sleep waits d, or until ctx is done and then returns ctx.Err().
func Sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
