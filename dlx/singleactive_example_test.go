package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/publisher"
)

// Two instances of a service on a single-active-consumer queue, one
// listener with one consumer each: the first to start gets the messages,
// in order, and the other stands by; when the first stops, the other takes
// over. It runs against the broker at $AMQP_URL.
func ExampleTopology_singleActiveConsumer() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	topo := dlx.Topology{Queue: "amqpretry-example.ledger", Type: dlx.Quorum, SingleActiveConsumer: true}
	defer deleteExampleTopology(url, topo)

	got := make(chan string)
	type instance struct {
		stop context.CancelFunc
		done chan error
	}
	startInstance := func(name string) (instance, error) {
		l, err := listener.New(topo.Queue, nil, func(_ context.Context, d *amqp.Delivery) error {
			got <- name + " handled " + string(d.Body)
			return nil
		}, listener.WithURL(url), listener.WithLogger(quiet), listener.WithDeclare(topo.Declare), listener.WithPrefetch(1))
		if err != nil {
			return instance{}, err
		}
		ctx, stop := context.WithCancel(context.Background())
		in := instance{stop, make(chan error, 1)}
		go func() { in.done <- l.Run(ctx) }()
		return in, l.WaitReady(ctx)
	}
	first, err := startInstance("first")
	if err != nil {
		fmt.Println(err)
		return
	}
	second, err := startInstance("second")
	if err != nil {
		fmt.Println(err)
		return
	}
	pub, err := publisher.New(url, publisher.WithLogger(quiet))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	publish := func(body string) {
		if err := pub.Publish(context.Background(), "", topo.Queue, amqp.Publishing{Body: []byte(body)}); err != nil {
			fmt.Println(err)
		}
	}

	publish("entry 1")
	publish("entry 2")
	fmt.Println(<-got)
	fmt.Println(<-got)
	first.stop() // or its process dies: the broker notices the closed connection
	fmt.Println("first stopped:", <-first.done)
	publish("entry 3")
	select {
	case s := <-got:
		fmt.Println(s)
	case <-time.After(10 * time.Second):
		fmt.Println(errors.New("no takeover"))
	}
	second.stop()
	<-second.done
	// Output:
	// first handled entry 1
	// first handled entry 2
	// first stopped: <nil>
	// second handled entry 3
}

// deleteExampleTopology removes what an example declared.
func deleteExampleTopology(url string, topo dlx.Topology) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range []string{topo.Queue, topo.DLQ()} {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	_ = ch.ExchangeDelete(topo.DLX(), false, false)
}
