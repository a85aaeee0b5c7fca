package middleware

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Handler processes one delivery. It returns nil when the message is handled,
// an error to have it retried, or Permanent(err) when retrying cannot help.
// A Handler never acks or rejects the delivery itself: the listener settles it
// from the error (see the package doc, "What a handler returns").
type Handler func(ctx context.Context, d *amqp.Delivery) error

// Middleware wraps a Handler with behaviour that runs around it.
type Middleware func(next Handler) Handler

// Chain composes middlewares so that the first is the outermost:
// Chain(a, b)(h) == a(b(h)). Chain() is the identity. It panics if a
// middleware is nil, since the mistake would otherwise surface only when the
// first message arrives.
func Chain(mws ...Middleware) Middleware {
	for i, mw := range mws {
		if mw == nil {
			panic(fmt.Sprintf("middleware: Chain expects non-nil middlewares, got nil at index %d", i))
		}
	}
	mws = append([]Middleware(nil), mws...) // the caller may reuse its slice
	return func(next Handler) Handler {
		for i := len(mws) - 1; i >= 0; i-- {
			next = mws[i](next)
		}
		return next
	}
}
