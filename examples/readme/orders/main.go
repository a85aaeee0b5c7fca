// Command orders consumes "orders": a failing message is tried five times, 1s, 2s,
// 4s and 8s apart, then parked on "orders.dlq" with the reason in its headers.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log"
	"os"
	"os/signal"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func handle(ctx context.Context, d *amqp.Delivery) error {
	var o struct{ ID, Items string }
	if err := json.Unmarshal(d.Body, &o); err != nil {
		return middleware.Permanent(err) // no retry fixes bad JSON: to the DLQ at once
	}
	if o.Items == "" {
		return errors.New("order has no items yet") // retried, then to the DLQ
	}
	log.Printf("order %s: %s", o.ID, o.Items)
	return nil
}

func main() {
	// Ctrl-C and SIGTERM (a Kubernetes pod stop) end ctx: the listener stops
	// consuming, lets handlers finish and requeues what is left.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, url string) error {
	topo := dlx.Topology{Queue: "orders"} // orders, orders.dlx and orders.dlq
	// Publish returns once the broker has confirmed: a failed message is
	// acked only after its copy is on the DLQ.
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()

	l, err := listener.New(topo.Queue,
		middleware.Chain(
			middleware.Retry(5),
			middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())),
		),
		handle,
		listener.WithURL(url),
		listener.WithDeclare(topo.Declare), // on every connection
		listener.WithConcurrentConsumers(2),
		listener.WithMaxConcurrentConsumers(10),
	)
	if err != nil {
		return err // an invalid option, named with its value
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	if err := l.WaitReady(ctx); err != nil { // declared and consuming
		return <-done // Run ended first: its error, or nil on a signal
	}
	for _, body := range []string{`{"id":"1","items":"3 books"}`, `{"id":"2"}`, `not json`} {
		msg := amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body)}
		if err := pub.Publish(ctx, "", topo.Queue, msg); err != nil {
			return err
		}
	}
	return <-done // nil after a graceful shutdown
}
