package chainrun

import (
	"context"

	"github.com/amqpretry/amqpretry/internal/chainctx"
)

// WithQueue records the queue a delivery came from, which amqp.Delivery does
// not carry, for the recoverers of the chain (recoverer.Republish writes it
// into the fault headers). The listener does it for every delivery.
func WithQueue(ctx context.Context, queue string) context.Context {
	return chainctx.WithQueue(ctx, queue)
}

// Queue returns the queue the delivery came from, for a Recoverer of your
// own, or "" when nobody called WithQueue.
func Queue(ctx context.Context) string { return chainctx.Queue(ctx) }

// WithInterrupt returns a context under which middleware.Retry stops waiting
// as soon as interrupt is closed, returning a *middleware.InterruptedError
// (settled as a Release), while handlers that are running keep ctx and may
// finish. The listener does it for its graceful shutdown.
func WithInterrupt(ctx context.Context, interrupt <-chan struct{}) context.Context {
	return chainctx.WithInterrupt(ctx, interrupt)
}

// WillWait tells the listener that the delivery of ctx is about to wait for
// something other than its consumer's worker, so that the consumer goes on
// reading deliveries meanwhile. middleware.Retry calls it before each backoff
// and middleware.Recover before its recoverer runs; a middleware of yours
// that waits (a rate limiter, a lock) should call it too, or its wait holds
// up the deliveries behind it. A delivery that has called it counts as
// parked (listener.Stats.Parked). Calling it more than once, or outside a
// listener, is harmless.
func WillWait(ctx context.Context) { chainctx.WillWait(ctx) }
