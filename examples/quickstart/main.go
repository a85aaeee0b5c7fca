// Command quickstart is the Spring AMQP article's scenario in Go: a message
// whose handler keeps failing is retried after 1 s, 2 s, 4 s and 8 s, then
// republished to a dead-letter exchange, confirmed by the broker, and only
// then acked. Run it with `make demo`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

const (
	queue = "amqpretry.quickstart"
	dlx   = "amqpretry.quickstart.dlx"
	dlq   = "amqpretry.quickstart.dlq"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, url, middleware.DefaultInitialInterval); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, url string, initial time.Duration) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect (is the broker up? run scripts/broker.sh): %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := declare(ch); err != nil {
		return err
	}

	// The dead-letter copy is acked by the broker before the original is:
	// the Publisher waits for the confirm, and Republish annotates the copy.
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()
	toDLQ := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		if err := recoverer.Republish(pub, dlx, "").Recover(ctx, d, cause); err != nil {
			return err
		}
		say("republished %s to %s, confirmed", d.Body, dlx)
		return nil
	})

	chain := middleware.Chain(
		middleware.Retry(5,
			middleware.WithInitialInterval(initial),
			middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) {
				say("attempt %d failed (%v); retrying in %v", e.Attempt, e.Err, e.Delay)
			})),
		middleware.Recover(toDLQ),
	)
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		say("attempt %d: handling %s", middleware.Attempt(ctx), d.Body)
		return errors.New("user service unavailable")
	}

	if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("msg1"), DeliveryMode: amqp.Persistent}); err != nil {
		return err
	}
	say("published msg1 to %s", queue)

	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	var d amqp.Delivery
	select {
	case d = <-deliveries:
	case <-ctx.Done():
		return ctx.Err()
	}
	result := chain(handle)(ctx, &d)
	settled, err := middleware.Settle(&d, result)
	if err != nil {
		return err
	}
	say("settled %s: %s", d.Body, settled)

	dead, ok, err := ch.Get(dlq, true)
	if err != nil || !ok {
		return fmt.Errorf("nothing on %s (ok=%v): %v", dlq, ok, err)
	}
	say("got dead message %s (x-exception-message: %v, attempts: %v)", dead.Body, dead.Headers["x-exception-message"], dead.Headers["x-amqpretry-attempts"])
	return nil
}

func declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(dlx, "fanout", true, false, false, false, nil); err != nil {
		return err
	}
	for _, q := range []string{queue, dlq} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueuePurge(q, false); err != nil {
			return err
		}
	}
	return ch.QueueBind(dlq, "", dlx, false, nil)
}
