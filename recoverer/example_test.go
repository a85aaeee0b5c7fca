package recoverer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// A message whose handler failed is republished to the dead-letter exchange
// with Spring's fault headers; Recover returns nil only once the broker has
// confirmed the copy, and then the listener acks the original. It runs
// against the broker at $AMQP_URL.
func ExampleRepublish() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
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
	topo := dlx.Topology{Queue: "amqpretry-example.payments"}
	if err := topo.Declare(ch); err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		_, _ = ch.QueueDelete(topo.Queue, false, false, false)
		_, _ = ch.QueueDelete(topo.DLQ(), false, false, false)
		_ = ch.ExchangeDelete(topo.DLX(), false, false)
	}()
	pub, err := publisher.New(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()

	rep := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	failing := func(context.Context, *amqp.Delivery) error { return errors.New("card declined") }
	d := &amqp.Delivery{MessageId: "payment-9", RoutingKey: topo.Queue, Body: []byte("payment 9")}
	err = middleware.Recover(rep)(failing)(context.Background(), d)
	fmt.Println("recovered:", err == nil)

	dead, ok, err := ch.Get(topo.DLQ(), true)
	if err != nil || !ok {
		fmt.Println("nothing on the DLQ", err)
		return
	}
	fmt.Printf("%s: %v (routing key %v)\n", dead.Body, dead.Headers[recoverer.HeaderExceptionMessage], dead.Headers["x-original-routingKey"])
	// Output:
	// recovered: true
	// payment 9: card declined (routing key amqpretry-example.payments)
}

// Failures go where their class says: a fraud to its own queue, a
// validation error to the queue's own DLX, the rest to the DLQ.
func ExampleByError() {
	errFraud := errors.New("card reported stolen")
	errInvalid := errors.New("no such customer")
	fraud := middleware.ErrorIs("fraud", errFraud)
	invalid := middleware.ErrorIs("validation", errInvalid)
	// In production these are recoverer.Republish(pub, exchange, key).
	queue := func(name string) middleware.Recoverer {
		return middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
			fmt.Printf("%s → %s (rule %s)\n", d.Body, name, middleware.RuleApplied(ctx, cause))
			return nil
		})
	}
	chain := middleware.Chain(
		middleware.Retry(3, middleware.WithInitialInterval(time.Millisecond), middleware.NoRetryOn(fraud), middleware.NoRetryOn(invalid)),
		middleware.Recover(recoverer.ByError(queue("orders.dlq"),
			recoverer.When(fraud, queue("orders.fraud")),
			recoverer.When(invalid, recoverer.Reject()),
		)),
	)
	for i, err := range []error{errFraud, errInvalid, errors.New("database down")} {
		d := &amqp.Delivery{Body: []byte(fmt.Sprintf("order %d", i+1))}
		result := chain(func(context.Context, *amqp.Delivery) error { return err })(context.Background(), d)
		fmt.Printf("%s: %v\n", d.Body, chainrun.SettlementFor(result))
	}
	// Output:
	// order 1 → orders.fraud (rule fraud)
	// order 1: ack
	// order 2: reject
	// order 3 → orders.dlq (rule default)
	// order 3: ack
}
