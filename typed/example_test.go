package typed_test

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/typed"
)

type Order struct {
	ID    string `json:"id" xml:"id"`
	Total int    `json:"total" xml:"total"`
}

// The handler takes the decoded order; a body that does not decode is
// Permanent, so Retry(5) does not retry it and Recover sends it to the
// dead-letter queue after one attempt, with the decoder's error.
func ExampleHandler() {
	handleOrder := func(ctx context.Context, o Order, d *amqp.Delivery) error {
		fmt.Printf("order %s: %d\n", o.ID, o.Total)
		return nil
	}
	dlq := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		n, _ := chainrun.AttemptsMade(cause)
		fmt.Printf("to the DLQ after %d attempt: %v\n", n, chainrun.HandlerError(cause))
		return nil
	})
	h := middleware.Chain(
		middleware.Recover(dlq),
		middleware.Retry(5, middleware.WithInitialInterval(time.Millisecond)),
	)(typed.Handler(handleOrder))

	for _, body := range []string{`{"id":"o-1","total":42}`, `{"id":"o-2","total":"lots"}`} {
		_ = h(context.Background(), &amqp.Delivery{ContentType: "application/json", Body: []byte(body)})
	}
	// Output:
	// order o-1: 42
	// to the DLQ after 1 attempt: typed: cannot decode the body (content type "application/json") into typed_test.Order: json: cannot unmarshal string into Go struct field Order.total of type int
}

// Decoders of your own, each for its content types, replace JSON.
func ExampleWithDecoder() {
	h := typed.Handler(func(ctx context.Context, o Order, d *amqp.Delivery) error {
		fmt.Printf("order %s: %d\n", o.ID, o.Total)
		return nil
	}, typed.WithDecoder(xml.Unmarshal, "application/xml", "+xml"))

	_ = h(context.Background(), &amqp.Delivery{ContentType: "application/xml", Body: []byte(`<order><id>o-1</id><total>42</total></order>`)})
	err := h(context.Background(), &amqp.Delivery{ContentType: "application/json", Body: []byte(`{"id":"o-2"}`)})
	fmt.Println(errors.Is(err, typed.ErrContentType), chainrun.SettlementFor(err))
	// Output:
	// order o-1: 42
	// true reject
}
