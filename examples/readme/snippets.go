// Package readme holds every Go code block of the README, so that they
// compile; readme_test.go checks the README still shows exactly these.
package readme

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/inbox"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

var errNotFound = errors.New("customer not found")

type order struct{ ID string }

func decode([]byte) (order, error)      { return order{}, nil }
func ship(context.Context, order) error { return nil }

// UsedBy is the README's opening snippet, verbatim: it shows the shape of
// the API and leaves out New's error check, which "A whole consumer" has.
func UsedBy(ctx context.Context, url string, handle middleware.Handler, dlx middleware.Recoverer) error {
	//lint:ignore SA4006 the README's two-line teaser skips New's error check on purpose
	l, err := listener.New("orders",
		middleware.Chain(middleware.Retry(5), middleware.Recover(dlx)), handle,
		listener.WithURL(url), listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(10))
	err = l.Run(ctx)
	return err
}

// Complete is the README's "A whole consumer" section.
func Complete(ctx context.Context, url string) error {
	// Declare orders, orders.dlx and orders.dlq (on every connection).
	topo := dlx.Topology{Queue: "orders"}

	// A publisher of its own, for the dead letters: it returns only once the
	// broker has confirmed the copy.
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()

	handle := func(ctx context.Context, d *amqp.Delivery) error {
		o, err := decode(d.Body)
		if err != nil {
			return middleware.Permanent(err) // no retry can fix bad JSON
		}
		return ship(ctx, o) // an error here is retried: 1s, 2s, 4s, 8s
	}

	l, err := listener.New("orders",
		middleware.Chain(
			middleware.Retry(5),
			middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())),
		),
		handle,
		listener.WithURL(url),
		listener.WithDeclare(topo.Declare),
		listener.WithConcurrentConsumers(2),
		listener.WithMaxConcurrentConsumers(10),
		listener.WithLogger(slog.Default()),
	)
	if err != nil {
		return err // invalid options, or retries longer than consumer_timeout
	}
	return l.Run(ctx) // until ctx is done; then a graceful shutdown
}

// Tiers is the README's broker-side retry section.
func Tiers(ctx context.Context, url string, pub *publisher.Publisher, handle middleware.Handler) error {
	topo := dlx.Topology{
		Queue:       "payments",
		RetryDelays: []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute},
	}
	chain := middleware.Chain(
		middleware.Retry(5, middleware.HandOffAfter(5*time.Second)), // 1s, 2s, 4s in memory
		middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(5))),      // then 10s, 1m, 10m, 10m, 10m
	)
	l, err := listener.New("payments", chain, handle, listener.WithURL(url), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// SingleDelay is the README's single-TTL layout: the chain that takes the
// last retry and Permanent errors out of the reject-to-retry loop.
func SingleDelay(ctx context.Context, url string, pub *publisher.Publisher, handle middleware.Handler) error {
	topo := dlx.Topology{Queue: "payments", SingleRetryDelay: 30 * time.Second}
	final := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	chain := middleware.Chain(middleware.Retry(3), middleware.Recover(topo.RejectToRetry(5, final)))
	l, err := listener.New("payments", chain, handle, listener.WithURL(url), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// Permanent is the README's error classification snippet.
func Permanent(ctx context.Context, d *amqp.Delivery) error {
	if errors.Is(ship(ctx, order{}), errNotFound) {
		return middleware.Permanent(errNotFound) // straight to the recoverer, no retry
	}
	return nil
}

// Cluster is the README's "Running on a cluster" section.
func Cluster(ctx context.Context, handle middleware.Handler) error {
	nodes := []string{"amqp://app:secret@rabbit-1:5672/", "amqp://app:secret@rabbit-2:5672/", "amqp://app:secret@rabbit-3:5672/"}
	pub, err := publisher.New(nodes[0], publisher.WithURLs(nodes...))
	if err != nil {
		return err
	}
	topo := dlx.Topology{Queue: "orders", Type: dlx.Quorum, AtLeastOnce: true, RetryDelays: []time.Duration{10 * time.Second, time.Minute}}
	l, err := listener.New("orders", middleware.Chain(middleware.Retry(3), middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(5)))), handle,
		listener.WithURLs(nodes...), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// PlaceOrder is the README's "Reliable publishing" producer: the order and
// its message in one transaction.
func PlaceOrder(ctx context.Context, db *sql.DB, ob *outbox.Outbox, id int64, body []byte) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, id); err != nil {
		return err
	}
	if _, err := ob.Enqueue(ctx, tx, "orders", "order.created", amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
	}); err != nil {
		return err
	}
	return tx.Commit() // the message exists if and only if the order does
}

// RunRelay is the README's "Reliable publishing" relay.
func RunRelay(ctx context.Context, db *sql.DB, url string) error {
	ob, err := outbox.New(db) // table amqpretry_outbox; outbox.WithTable for another
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil { // or let a DBA apply `amqpretry outbox schema`
		return err
	}
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()
	return ob.Relay(pub).Run(ctx) // in as many processes as you like
}

// Shipping is the README's "Reliable publishing" consumer.
func Shipping(ctx context.Context, db *sql.DB, url string, dlq middleware.Recoverer) error {
	ib, err := inbox.New(db) // table amqpretry_inbox; Migrate it once, as the outbox
	if err != nil {
		return err
	}
	ship := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		// Runs at most once per MessageId: the id is recorded in tx, with this write.
		_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_json) VALUES ($1)`, d.Body)
		return err
	})
	l, err := listener.New("shipping", middleware.Chain(middleware.Retry(5), middleware.Recover(dlq)), ship,
		listener.WithURL(url))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// RedeliveryLimit is the README's "A message that kills the process".
func RedeliveryLimit(ctx context.Context, url string, topo dlx.Topology, dlq middleware.Recoverer, handle middleware.Handler) error {
	l, err := listener.New("orders", middleware.Chain(middleware.Retry(5), middleware.Recover(dlq)), handle,
		listener.WithURL(url), listener.WithDeclare(topo.Declare), // topo.Type: dlx.Quorum
		listener.WithRedeliveryLimit(5))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// KillSwitch is the README's "A downstream outage: the kill switch".
func KillSwitch(ctx context.Context, url string, chain middleware.Middleware, handle middleware.Handler) error {
	l, err := listener.New("orders", chain, handle, listener.WithURL(url),
		listener.WithKillSwitch(listener.KillSwitch{}), // MassTransit's defaults: 15% of at least 10, restart after 1 min
	)
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// LongHandlers is the README's "Handlers that outlive consumer_timeout".
func LongHandlers(dlq middleware.Recoverer) middleware.Middleware {
	chain := middleware.Chain(middleware.Retry(3), middleware.Recover(dlq), middleware.Timeout(2*time.Minute))
	return chain
}

// DelayedRedelivery is the README's "The broker's own delayed retry".
func DelayedRedelivery(ctx context.Context, url string, pub *publisher.Publisher, handle middleware.Handler) error {
	topo := dlx.Topology{
		Queue: "payments", Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 5, Min: 10 * time.Second, Max: time.Minute},
	}
	chain := middleware.Chain(
		middleware.Retry(3),                     // 1s, 2s in memory
		middleware.Recover(topo.Redeliver(pub)), // then the broker: 10s, 20s, 30s, 40s, 50s, then the DLQ
	)
	l, err := listener.New("payments", chain, handle, listener.WithURL(url), listener.WithDeclare(topo.Declare))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// Group is the README's "Several queues in one service".
func Group(ctx context.Context, url string, chain middleware.Middleware, handleOrder, handleRefund middleware.Handler,
	ordersTopo, refundsTopo dlx.Topology, errc chan<- error) error {
	orders, _ := listener.New("orders", chain, handleOrder, listener.WithDeclare(ordersTopo.Declare))
	refunds, _ := listener.New("refunds", chain, handleRefund, listener.WithDeclare(refundsTopo.Declare))
	g, err := listener.NewGroup([]*listener.Listener{orders, refunds}, listener.WithURL(url), listener.WithFailFast())
	if err != nil {
		return err
	}
	go func() { errc <- g.Run(ctx) }()
	err = g.WaitReady(ctx) // consuming: the broker shows the consumers
	return err
}
