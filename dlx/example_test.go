package dlx_test

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
)

// OriginalMessage turns a dead letter back into the message its producer sent: the
// body and properties stay, the fault, retry and death headers go.
func ExampleOriginalMessage() {
	dead := &amqp.Delivery{
		MessageId:   "order-7",
		ContentType: "application/json",
		Body:        []byte(`{"id":7}`),
		Headers: amqp.Table{
			"tenant":                     "acme",
			"x-exception-message":        "payment gateway down",
			"x-amqpretry-original-queue": "orders",
			"x-amqpretry-attempts":       int64(5),
			dlx.RetryCountHeader:         int64(3),
			"x-death":                    []any{amqp.Table{"queue": "orders.retry.10s", "count": int64(3)}},
			"x-first-death-queue":        "orders.retry.10s",
		},
	}
	msg := dlx.OriginalMessage(dead)
	fmt.Println(msg.MessageId, msg.ContentType, string(msg.Body))
	fmt.Println(msg.Headers)
	// Output:
	// order-7 application/json {"id":7}
	// map[tenant:acme]
}
