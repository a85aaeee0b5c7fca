package middleware

import "context"

// Parker is told when a delivery is about to wait for something other than
// its consumer's worker: a backoff between attempts, a recoverer's publish.
// The listener implements it to keep consuming while the delivery waits.
type Parker interface{ Park() }

// ParkerKey is the context key under which Park looks for the Parker, for a
// context type of your own that carries one without a WithParker allocation:
// its Value(ParkerKey()) returns the Parker.
func ParkerKey() any { return parkerKey }

// WithParker returns a context whose deliveries report waits to p.
func WithParker(ctx context.Context, p Parker) context.Context {
	return context.WithValue(ctx, parkerKey, p)
}

// Park tells the Parker in ctx, if any, that the delivery is about to wait
// without needing its worker. Retry calls it before each backoff and Recover
// before its recoverer runs; a middleware of yours that waits (a rate
// limiter, a lock) should call it too, so that its wait does not hold up the
// other deliveries of its consumer. Calling it more than once is harmless.
func Park(ctx context.Context) {
	if p, ok := ctx.Value(parkerKey).(Parker); ok {
		p.Park()
	}
}
