package listener_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// Orders written to a database in batches of up to 100, or whatever came
// within 200ms: one multi-row INSERT per batch. An order the batch could not
// write is retried alone, then goes to the dead-letter queue; the others
// are acked. It runs against the broker at $AMQP_URL.
func ExampleNewBatch() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	topo := dlx.Topology{Queue: "amqpretry-example.batch.orders"}
	defer deleteTopology(url, topo)

	pub, err := publisher.New(url, publisher.WithLogger(quiet))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	// Three orders wait on the queue before the listener starts.
	if err := declare(url, topo); err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, order := range []string{"order 1", "order 2", "order 3"} {
		if err := pub.Publish(ctx, "", topo.Queue, amqp.Publishing{Body: []byte(order)}); err != nil {
			fmt.Println(err)
			return
		}
	}

	insert := func(ctx context.Context, batch []*amqp.Delivery) error {
		rows := make([]string, len(batch))
		errs := make([]error, len(batch))
		for i, d := range batch {
			rows[i] = string(d.Body)
			if rows[i] == "order 2" && len(batch) > 1 {
				errs[i] = errors.New("deadlock detected") // this row only; the others are written
			}
		}
		fmt.Printf("INSERT %d rows: %s\n", len(batch), strings.Join(rows, ", "))
		return listener.PerMessage(errs)
	}
	l, err := listener.NewBatch(topo.Queue,
		middleware.Chain(
			middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond)),
			middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())),
		),
		insert, 100, 200*time.Millisecond,
		listener.WithURL(url),
		listener.WithDeclare(topo.Declare),
		listener.WithLogger(quiet),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	for l.Stats().Handled < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	fmt.Println("Run returned", <-done)
	// Output:
	// INSERT 3 rows: order 1, order 2, order 3
	// INSERT 1 rows: order 2
	// Run returned <nil>
}

// declare declares topo on a connection of its own.
func declare(url string, topo dlx.Topology) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return topo.Declare(ch)
}
