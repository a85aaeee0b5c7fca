// Command quickstart is what `make demo` runs: Spring AMQP's stateless retry
// with a RepublishMessageRecoverer, in Go. Two messages, msg1 and msg2, reach
// a handler that keeps failing. With one consumer, Spring's retry holds the
// consumer thread while it waits, so msg2 is not looked at until msg1's
// attempts are over (https://docs.spring.io/spring-amqp/reference/amqp/resilience-recovering-from-errors-and-broker-failures.html);
// here each message waits 1s, 2s, 4s and 8s between its
// attempts without holding the consumer, so the two retry side by side. When
// their attempts run out, both are republished to a dead-letter exchange,
// confirmed by the broker, and only then acked; a listener on the DLQ prints
// "got dead message". It exits by itself in about 16 seconds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func main() {
	initial := flag.Duration("initial", middleware.DefaultInitialInterval, "first retry delay (doubles each time)")
	flag.Parse()
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, url, *initial); err != nil {
		log.Fatal(err)
	}
}

// topology: the work queue, its dead-letter exchange and queue.
var topology = dlx.Topology{Queue: "amqpretry.quickstart"}

func run(ctx context.Context, out io.Writer, url string, initial time.Duration) error {
	start := time.Now()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	quiet := listener.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

	if err := declare(url); err != nil {
		return err
	}
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()

	// The dead letters' listener: it only prints what arrives.
	dead := make(chan string, 2)
	dlq, err := listener.New(topology.DLQ(), nil, func(_ context.Context, d *amqp.Delivery) error {
		say("got dead message %s (%v, after %v attempts)", d.Body, d.Headers[recoverer.HeaderExceptionMessage], d.Headers["x-amqpretry-attempts"])
		dead <- string(d.Body)
		return nil
	}, listener.WithURL(url), quiet)
	if err != nil {
		return err
	}

	// The work listener: one consumer, the case where Spring's retry blocks.
	chain := middleware.Chain(
		middleware.Retry(5,
			middleware.WithInitialInterval(initial),
			middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) {
				say("%s: attempt %d failed; next in %v", e.Delivery.Body, e.Attempt, e.Delay)
			})),
		middleware.Recover(recoverer.Republish(pub, topology.DLX(), topology.DLQRoutingKey())),
	)
	work, err := listener.New(topology.Queue, chain, func(ctx context.Context, d *amqp.Delivery) error {
		say("%s: attempt %d", d.Body, middleware.Attempt(ctx))
		return errors.New("user service unavailable")
	}, listener.WithURL(url), listener.WithConcurrentConsumers(1), quiet)
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, l := range []*listener.Listener{work, dlq} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Run(runCtx); err != nil {
				errs <- err
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	for _, body := range []string{"msg1", "msg2"} {
		say("publishing %s", body)
		if err := pub.Publish(ctx, "", topology.Queue, amqp.Publishing{Body: []byte(body), DeliveryMode: amqp.Persistent}); err != nil {
			return err
		}
	}
	for range 2 {
		select {
		case <-dead:
		case err := <-errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30*initial + 10*time.Second):
			return errors.New("the dead letters did not arrive in time")
		}
	}
	say("done: neither message waited for the other, and both are safe on %s", topology.DLQ())
	return nil
}

// declare creates the demo's topology afresh: the demo owns these names, and
// an earlier run (or an older version of it) may have left them behind.
func declare(url string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect (is the broker up? run scripts/broker.sh): %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range []string{topology.Queue, topology.DLQ()} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	if err := ch.ExchangeDelete(topology.DLX(), false, false); err != nil {
		return err
	}
	return topology.Declare(ch)
}
