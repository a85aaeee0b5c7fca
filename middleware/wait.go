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
