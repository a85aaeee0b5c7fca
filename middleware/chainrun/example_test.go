package chainrun_test

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// What the listener does with a chain's final error.
func ExampleSettlementFor() {
	for _, err := range []error{
		nil,
		errors.New("timeout"),
		middleware.Permanent(errors.New("invalid JSON")),
		&middleware.RecoveryError{Err: errors.New("DLX publish nacked"), Cause: errors.New("timeout")},
	} {
		fmt.Println(chainrun.SettlementFor(err))
	}
	// Output:
	// ack
	// requeue
	// reject
	// requeue
}

// A chain run on a consumer of your own: the queue for the recoverers, then
// each delivery settled from what the chain returns.
func ExampleSettle() {
	chain := middleware.Chain(middleware.Retry(1))
	handle := chain(func(ctx context.Context, d *amqp.Delivery) error {
		fmt.Println("handling", string(d.Body), "from", chainrun.Queue(ctx))
		return middleware.Permanent(errors.New("invalid JSON"))
	})
	ctx := chainrun.WithQueue(context.Background(), "orders")
	d := amqp.Delivery{Acknowledger: &fakeAcknowledger{}, DeliveryTag: 1, Body: []byte("{")}
	s, err := chainrun.Settle(&d, handle(ctx, &d))
	fmt.Println(s, err, d.Acknowledger.(*fakeAcknowledger).calls)
	// Output:
	// handling { from orders
	// reject <nil> [reject(1, requeue=false)]
}
