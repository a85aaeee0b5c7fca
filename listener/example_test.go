package listener_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// A consumer of the orders queue: three attempts a message, then the
// dead-letter queue, with the topology declared on every (re)connection.
// It runs against the broker at $AMQP_URL.
func ExampleNew() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	topo := dlx.Topology{Queue: "amqpretry-example.orders"}
	defer deleteTopology(url, topo)

	pub, err := publisher.New(url, publisher.WithLogger(quiet))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()

	handled := make(chan struct{})
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		fmt.Printf("attempt %d: %s\n", middleware.Attempt(ctx), d.Body)
		if middleware.Attempt(ctx) < 2 {
			return errors.New("database busy")
		}
		close(handled)
		return nil
	}
	l, err := listener.New(topo.Queue,
		middleware.Chain(
			middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond)),
			middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())),
		),
		handle,
		listener.WithURL(url),
		listener.WithDeclare(topo.Declare),
		listener.WithLogger(quiet),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()

	// Once the listener has declared the queue, a message for it.
	for err := errors.New("not yet"); err != nil; time.Sleep(20 * time.Millisecond) {
		err = pub.Publish(ctx, "", topo.Queue, amqp.Publishing{Body: []byte("order 42")})
	}
	<-handled
	cancel() // a graceful shutdown: in-flight messages finish or go back
	fmt.Println("Run returned", <-done)
	// Output:
	// attempt 1: order 42
	// attempt 2: order 42
	// Run returned <nil>
}

// deleteTopology removes the queues and the exchange an example declared.
func deleteTopology(url string, topo dlx.Topology) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, name := range []string{topo.Queue, topo.DLQ()} {
		_, _ = ch.QueueDelete(name, false, false, false)
	}
	_ = ch.ExchangeDelete(topo.DLX(), false, false)
}

// Two queues on one connection, started, made ready and stopped together:
// a service's listeners in a Group, with WaitReady for its readiness probe
// instead of polling.
func ExampleGroup() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	orders, refunds := dlx.Topology{Queue: "amqpretry-example.group.orders"}, dlx.Topology{Queue: "amqpretry-example.group.refunds"}
	defer deleteTopology(url, orders)
	defer deleteTopology(url, refunds)

	got := make(chan string, 2)
	handle := func(_ context.Context, d *amqp.Delivery) error { got <- string(d.Body); return nil }
	var listeners []*listener.Listener
	for _, topo := range []dlx.Topology{orders, refunds} {
		l, err := listener.New(topo.Queue, nil, handle, listener.WithDeclare(topo.Declare), listener.WithLogger(quiet))
		if err != nil {
			fmt.Println(err)
			return
		}
		listeners = append(listeners, l)
	}
	g, err := listener.NewGroup(listeners, listener.WithURL(url), listener.WithLogger(quiet))
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	if err := g.WaitReady(ctx); err != nil {
		fmt.Println(err)
	}
	_ = pub.Publish(ctx, "", orders.Queue, amqp.Publishing{Body: []byte("order 42")})
	fmt.Println(<-got)
	_ = pub.Publish(ctx, "", refunds.Queue, amqp.Publishing{Body: []byte("refund 7")})
	fmt.Println(<-got)
	cancel()
	fmt.Println("Run returned", <-done)
	// Output:
	// order 42
	// refund 7
	// Run returned <nil>
}

// A listener that acks its handled deliveries together: one multiple ack
// per 62 of them, or per 20ms from the first one waiting; a graceful
// shutdown writes those still waiting. Stats().Handled counts the acks
// written.
func ExampleWithAckCoalescing() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	topo := dlx.Topology{Queue: "amqpretry-example.coalesced"}
	defer deleteTopology(url, topo)

	const n = 100
	var handled atomic.Int64
	all := make(chan struct{})
	handle := func(context.Context, *amqp.Delivery) error {
		if handled.Add(1) == n {
			close(all)
		}
		return nil
	}
	l, err := listener.New(topo.Queue, nil, handle,
		listener.WithURL(url),
		listener.WithDeclare(topo.Declare),
		listener.WithAckCoalescing(62, 20*time.Millisecond),
		listener.WithLogger(quiet),
	)
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	if err := l.WaitReady(ctx); err != nil {
		fmt.Println(err)
	}
	for i := range n {
		_ = pub.Publish(ctx, "", topo.Queue, amqp.Publishing{Body: []byte(fmt.Sprint("order ", i))})
	}
	<-all
	cancel()
	fmt.Println("Run returned", <-done)
	fmt.Println("handled", handled.Load(), "acked", l.Stats().Handled)
	// Output:
	// Run returned <nil>
	// handled 100 acked 100
}
