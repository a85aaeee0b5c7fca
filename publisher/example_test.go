package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/publisher"
)

// Publish returns once the broker has confirmed the message; a message no
// queue would receive is an error, never a silent drop. It runs against the
// broker at $AMQP_URL.
func ExampleNew() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	pub, err := publisher.New(url, publisher.WithConnectionName("orders-api"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()

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
	const queue = "amqpretry-example.invoices"
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg := amqp.Publishing{MessageId: "invoice-7", ContentType: "application/json", Body: []byte(`{"id":7}`)}
	if err := pub.Publish(ctx, "", queue, msg); err == nil {
		fmt.Println("confirmed by the broker")
	}
	err = pub.Publish(ctx, "", "amqpretry-example.nobody-listens", msg)
	fmt.Println("unroutable:", errors.Is(err, publisher.ErrUnroutable))
	// Output:
	// confirmed by the broker
	// unroutable: true
}

// PublishAsync keeps many messages in flight without a goroutine each: it
// returns once a message is sent, and done hears the broker's answer. An
// error from PublishAsync itself means nothing was sent, and done is then
// not called.
func ExamplePublisher_PublishAsync() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	pub, err := publisher.New(url, publisher.WithMaxInFlight(64))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 100
	outcomes := make(chan error, n) // done must not block: room for every outcome
	sent := 0
	for i := range n {
		msg := amqp.Publishing{MessageId: fmt.Sprintf("event-%d", i), Body: []byte("{}")}
		// Events nobody may be bound to yet: without mandatory, the broker
		// confirms what no queue takes.
		err := pub.PublishAsync(publisher.WithMandatoryContext(ctx, false), "amq.topic", "example.event", msg, func(err error) { outcomes <- err })
		if err != nil {
			fmt.Println("not sent:", err)
			continue
		}
		sent++
	}
	confirmed := 0
	for range sent {
		if err := <-outcomes; err == nil {
			confirmed++
		}
	}
	fmt.Println(confirmed, "confirmed by the broker")
	// Output:
	// 100 confirmed by the broker
}
