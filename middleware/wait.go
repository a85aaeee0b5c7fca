package middleware

import (
	"context"

	"github.com/amqpretry/amqpretry/internal/chainctx"
)

// WillWait tells the listener that the delivery of ctx is about to wait for
// something other than its consumer's worker, so that the consumer goes on
// reading deliveries meanwhile. Retry calls it before each backoff and
// Recover before its recoverer runs; a middleware of yours that waits (a rate
// limiter, a lock) should call it too, or its wait holds up the deliveries
// behind it. A delivery that has called it counts as parked (Stats.Parked).
// Calling it more than once, or outside a listener, is harmless.
func WillWait(ctx context.Context) { chainctx.WillWait(ctx) }

// WithInterrupt returns a context under which Retry stops waiting as soon as
// interrupt is closed, returning an *InterruptedError (settled as a Release),
// while handlers that are running keep ctx and may finish. The listener does
// it for graceful shutdown; call it when you run a chain on an amqp091
// consumer of your own.
func WithInterrupt(ctx context.Context, interrupt <-chan struct{}) context.Context {
	return chainctx.WithInterrupt(ctx, interrupt)
}
