package dlx_test

import (
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
)

// A work queue with two broker-side retry tiers and a dead-letter queue,
// declared idempotently: run it at startup, or pass topo.Declare to
// listener.WithDeclare so it runs on every connection. It runs against the
// broker at $AMQP_URL.
func ExampleTopology() {
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
	topo := dlx.Topology{
		Queue:       "amqpretry-example.shipments",
		RetryDelays: []time.Duration{10 * time.Second, time.Minute},
	}
	if err := topo.Declare(ch); err != nil {
		fmt.Println(err)
		return
	}
	queues := []string{topo.Queue, topo.RetryQueue(10 * time.Second), topo.RetryQueue(time.Minute), topo.DLQ()}
	defer func() {
		for _, q := range queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
		_ = ch.ExchangeDelete(topo.DLX(), false, false)
	}()
	for _, q := range queues {
		fmt.Println("queue", q)
	}
	fmt.Println("dead-letter exchange", topo.DLX(), "routes", topo.DLQRoutingKey(), "to", topo.DLQ())
	// Output:
	// queue amqpretry-example.shipments
	// queue amqpretry-example.shipments.retry.10s
	// queue amqpretry-example.shipments.retry.1m
	// queue amqpretry-example.shipments.dlq
	// dead-letter exchange amqpretry-example.shipments.dlx routes amqpretry-example.shipments to amqpretry-example.shipments.dlq
}
