package readme

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
	"github.com/amqpretry/amqpretry/typed"
)

// The errors and types docs/consumers.md's snippets name.
var (
	ErrUpstreamTimeout = errors.New("upstream timed out")
	ErrFraud           = errors.New("fraud suspected")
)

// ValidationError is a handler's refusal of a message's content.
type ValidationError struct{ Field string }

func (e *ValidationError) Error() string { return "invalid " + e.Field }

// Order is a typed handler's message.
type Order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

func save(context.Context, Order) error       { return nil }
func insertRow(context.Context, []byte) error { return nil }

// PerErrorChain is docs/consumers.md's per-error policies.
func PerErrorChain(pub recoverer.Publisher, topo dlx.Topology) middleware.Middleware {
	timeouts := middleware.ErrorIs("timeout", ErrUpstreamTimeout, context.DeadlineExceeded)
	invalid := middleware.ErrorAs[*ValidationError]("validation")
	fraud := middleware.ErrorIs("fraud", ErrFraud)
	chain := middleware.Chain(
		middleware.Retry(3,
			middleware.RetryOn(timeouts, 5, middleware.WithInitialInterval(100*time.Millisecond)),
			middleware.NoRetryOn(invalid), middleware.NoRetryOn(fraud)),
		middleware.Recover(recoverer.ByError(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()),
			recoverer.When(fraud, recoverer.Republish(pub, "", "orders.fraud")),
			recoverer.When(invalid, recoverer.Reject()))),
	)
	return chain
}

// TypedOrders is docs/consumers.md's typed handler.
func TypedOrders() middleware.Handler {
	handle := typed.Handler(func(ctx context.Context, o Order, d *amqp.Delivery) error {
		return save(ctx, o)
	})
	return handle
}

// Batches is docs/consumers.md's batch listener.
func Batches(url string, chain middleware.Middleware) (*listener.Listener, error) {
	batches, err := listener.NewBatch("orders", chain, func(ctx context.Context, batch []*amqp.Delivery) error {
		errs := make([]error, len(batch))
		for i, d := range batch {
			errs[i] = insertRow(ctx, d.Body)
		}
		return listener.PerMessage(errs)
	}, 100, 200*time.Millisecond, listener.WithURL(url), listener.WithPrefetch(250))
	return batches, err
}

// Ledger is docs/consumers.md's single-active-consumer listener.
func Ledger(url string, chain middleware.Middleware, handle middleware.Handler) (*listener.Listener, error) {
	topo := dlx.Topology{Queue: "ledger", Type: dlx.Quorum, SingleActiveConsumer: true}
	ledger, err := listener.New("ledger", chain, handle, listener.WithURL(url),
		listener.WithDeclare(topo.Declare), listener.WithPrefetch(1), listener.WithConsumerTagPrefix("ledger"))
	return ledger, err
}
