// Package readme holds every Go code block of the README and of docs/, so
// that they compile: readme_test.go checks that the documents still show
// exactly these. snippets.go has the README's blocks (its complete program
// is the command in orders/), docs_NAME.go those of docs/NAME.md.
package readme

import (
	"context"
	"database/sql"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Opening is the README's opening snippet: the shape of the API, with the
// topology and the recoverer the complete program below it uses.
func Opening(ctx context.Context, url string, pub *publisher.Publisher, handle middleware.Handler) error {
	topo := dlx.Topology{Queue: "orders"} // declares orders, orders.dlx and orders.dlq
	toDLQ := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	l, err := listener.New("orders",
		middleware.Chain(middleware.Retry(5), middleware.Recover(toDLQ)), handle,
		listener.WithURL(url), listener.WithDeclare(topo.Declare),
		listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(10))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}

// Tiers is the README's broker-side retry through TTL tiers.
func Tiers(pub *publisher.Publisher) middleware.Middleware {
	topo := dlx.Topology{
		Queue:       "payments",
		RetryDelays: []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute},
	}
	chain := middleware.Chain(
		middleware.Retry(5, middleware.HandOffAfter(5*time.Second)), // 1s, 2s, 4s in memory
		middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(5))),      // then 10s, 1m, 10m, 10m, 10m
	)
	return chain
}

// DelayedRedelivery is the README's RabbitMQ 4.3 delayed redelivery.
func DelayedRedelivery(pub *publisher.Publisher) middleware.Middleware {
	topo := dlx.Topology{
		Queue: "payments", Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 5, Min: 10 * time.Second, Max: time.Minute},
	}
	chain := middleware.Chain(
		middleware.Retry(3),                     // 1s, 2s in memory
		middleware.Recover(topo.Redeliver(pub)), // then the broker: 10s, 20s, 30s, 40s, 50s, then the DLQ
	)
	return chain
}

// Enqueue is the README's outbox snippet: the message in the business
// transaction.
func Enqueue(ctx context.Context, ob *outbox.Outbox, tx *sql.Tx, body []byte) error {
	if _, err := ob.Enqueue(ctx, tx, "orders", "order.created", amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body,
	}); err != nil {
		return err
	}
	return tx.Commit() // the message exists if and only if the order does
}
