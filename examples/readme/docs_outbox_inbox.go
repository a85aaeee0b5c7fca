package readme

import (
	"context"
	"database/sql"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/outbox/inbox"
	"github.com/amqpretry/amqpretry/publisher"
)

// PlaceOrder is docs/outbox-inbox.md's producer: the order and its message
// in one transaction.
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

// RunRelay is docs/outbox-inbox.md's relay.
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

// Shipping is docs/outbox-inbox.md's consumer through the inbox.
func Shipping(ctx context.Context, db *sql.DB, url string, toDLQ middleware.Recoverer) error {
	ib, err := inbox.New(db) // table amqpretry_inbox; Migrate it once, as the outbox
	if err != nil {
		return err
	}
	ship := ib.Handler(func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		// Runs at most once per MessageId: the id is recorded in tx, with this write.
		_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_json) VALUES ($1)`, d.Body)
		return err
	})
	l, err := listener.New("shipping", middleware.Chain(middleware.Retry(5), middleware.Recover(toDLQ)), ship,
		listener.WithURL(url))
	if err != nil {
		return err
	}
	return l.Run(ctx)
}
