package listener_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/publisher"
)

// exampleURL is $AMQP_URL, or the local broker.
func exampleURL() string {
	if url := os.Getenv("AMQP_URL"); url != "" {
		return url
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// exampleQueue declares a classic queue for an example and returns what
// deletes it.
func exampleQueue(url, name string) (remove func(), err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return func() { _, _ = ch.QueueDelete(name, false, false, false); _ = conn.Close() }, nil
}

// An exclusive consumer, tagged so that rabbitmqctl list_consumers says
// whose it is: while it consumes, the broker refuses any other consumer of
// the queue, and a second listener's Run ends at once with the reason.
func ExampleWithExclusive() {
	url, queue := exampleURL(), "amqpretry-example.exclusive"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	remove, err := exampleQueue(url, queue)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer remove()
	handle := func(context.Context, *amqp.Delivery) error { return nil }

	owner, err := listener.New(queue, nil, handle, listener.WithURL(url), listener.WithLogger(quiet),
		listener.WithExclusive(), listener.WithConsumerTagPrefix("billing-export"))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- owner.Run(ctx) }()
	if err := owner.WaitReady(ctx); err != nil {
		fmt.Println(err)
	}

	second, err := listener.New(queue, nil, handle, listener.WithURL(url), listener.WithLogger(quiet))
	if err != nil {
		fmt.Println(err)
		return
	}
	err = second.Run(ctx) // returns at once
	var refused *listener.ConsumeRefusedError
	if errors.Is(err, listener.ErrConsumeRefused) && errors.As(err, &refused) {
		fmt.Println("the second listener was refused:", refused.Err.Code)
	}
	cancel()
	fmt.Println("the owner's Run returned", <-done)
	// Output:
	// the second listener was refused: 403
	// the owner's Run returned <nil>
}

// A primary and a hot spare on one queue: the broker gives every message
// to the consumer with the highest priority while it has room in its
// prefetch, and to the spare, at priority -1, only what the primary cannot
// take.
func ExampleWithConsumerPriority() {
	url, queue := exampleURL(), "amqpretry-example.priority"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	remove, err := exampleQueue(url, queue)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer remove()
	got := make(chan string, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs []chan error
	for _, who := range []struct {
		name     string
		priority int
	}{{"spare", -1}, {"primary", 10}} {
		l, err := listener.New(queue, nil, func(_ context.Context, d *amqp.Delivery) error {
			got <- who.name + " handled " + string(d.Body)
			return nil
		}, listener.WithURL(url), listener.WithLogger(quiet), listener.WithConsumerPriority(who.priority))
		if err != nil {
			fmt.Println(err)
			return
		}
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()
		runs = append(runs, done)
		if err := l.WaitReady(ctx); err != nil {
			fmt.Println(err)
		}
	}
	pub, err := publisher.New(url, publisher.WithLogger(quiet))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	for _, body := range []string{"order 1", "order 2", "order 3"} {
		_ = pub.Publish(ctx, "", queue, amqp.Publishing{Body: []byte(body)})
		fmt.Println(<-got)
	}
	cancel()
	for _, done := range runs {
		<-done
	}
	// Output:
	// primary handled order 1
	// primary handled order 2
	// primary handled order 3
}
