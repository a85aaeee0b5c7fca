package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // your program picks the PostgreSQL driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/outbox"
	"github.com/amqpretry/amqpretry/publisher"
)

// An order and its message in one transaction; a relay publishes what
// committed. It runs against PostgreSQL at $DATABASE_URL and the broker at
// $AMQP_URL.
func ExampleOutbox_Enqueue() {
	dsn, url := os.Getenv("DATABASE_URL"), os.Getenv("AMQP_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		fmt.Println(outbox.Redact(err.Error()))
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A schema and a queue of the example's own, removed at the end.
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	schema := "amqpretry_example_" + hex.EncodeToString(suffix)
	queue := "amqpretry-example.orders." + hex.EncodeToString(suffix)
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.orders (id text PRIMARY KEY)`); err != nil {
		fmt.Println(outbox.Redact(err.Error()))
		return
	}
	defer db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
	conn, err := amqp.Dial(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		fmt.Println(err)
		return
	}
	// Exclusive: the queue lives as long as this connection, which both
	// declares and consumes it, so nothing is left on the broker; the relay
	// publishes to it from its own connection, which an exclusive queue
	// allows. (A transient queue that is not exclusive is refused by brokers
	// that deny RabbitMQ's deprecated transient_nonexcl_queues.)
	if _, err := ch.QueueDeclare(queue, false, false, true, false, nil); err != nil {
		fmt.Println(err)
		return
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	ob, err := outbox.New(db, outbox.WithTable(schema+".outbox"))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := ob.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	placeOrder := func(id string, commit bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+schema+`.orders VALUES ($1)`, id); err != nil {
			return err
		}
		msg := amqp.Publishing{MessageId: id, ContentType: "text/plain", Body: []byte("order " + id)}
		if _, err := ob.Enqueue(ctx, tx, "", queue, msg); err != nil {
			return err
		}
		if !commit {
			return nil // rolled back: no order, no message
		}
		return tx.Commit()
	}
	if err := placeOrder("o-1", false); err != nil {
		fmt.Println(err)
	}
	if err := placeOrder("o-2", true); err != nil {
		fmt.Println(err)
	}

	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	relayCtx, stopRelay := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- ob.Relay(pub, outbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))).Run(relayCtx)
	}()

	select {
	case d := <-deliveries:
		fmt.Printf("received %s (MessageId %s)\n", d.Body, d.MessageId)
	case <-ctx.Done():
		fmt.Println("nothing received")
	}
	stopRelay()
	fmt.Println("relay stopped:", <-done)
	// Output:
	// received order o-2 (MessageId o-2)
	// relay stopped: <nil>
}
