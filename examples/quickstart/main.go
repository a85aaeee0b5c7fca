// Command quickstart is what `make demo` runs: a consumer whose handler
// keeps failing, as in Spring AMQP's stateless retry with a
// RepublishMessageRecoverer. Two messages, msg1 and msg2, reach it. With one
// consumer, Spring retries msg1 for 15 seconds before msg2 is even looked at
// (https://docs.spring.io/spring-amqp/reference/amqp/resilience-recovering-from-errors-and-broker-failures.html);
// here each message waits 1s, 2s, 4s and 8s between its attempts without
// holding the consumer, so the two retry side by side. When their attempts
// run out, both are republished to a dead-letter exchange, confirmed by the
// broker, and only then acked. They stay on the dead-letter queue
// amqpretry.quickstart.dlq, and the demo ends, in about 16 seconds, with the
// command that lists them:
//
//	go run ./cmd/amqpretry dlq list amqpretry.quickstart.dlq
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
	"strconv"
	"sync"
	"syscall"
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, url, topology, *initial); err != nil {
		log.Fatal(err)
	}
}

// topology: the work queue, its dead-letter exchange and queue.
var topology = dlx.Topology{Queue: "amqpretry.quickstart"}

// runHeader marks the messages of one run: the demo waits for its own two
// dead letters, whatever an earlier run left on the queues.
const runHeader = "x-quickstart-run"

func run(ctx context.Context, out io.Writer, url string, topology dlx.Topology, initial time.Duration) error {
	start := time.Now()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	quiet := listener.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

	if err := declare(url, topology); err != nil {
		return err
	}
	pub, err := publisher.New(url, publisher.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return err
	}
	defer pub.Close()

	// The recoverer republishes a message whose attempts ran out to the
	// dead-letter exchange and returns once the broker confirmed it; this
	// one also says so.
	runID := strconv.FormatInt(start.UnixNano(), 36)
	dead := make(chan string, 2)
	republish := recoverer.Republish(pub, topology.DLX(), topology.DLQRoutingKey())
	parked := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
		if err := republish.Recover(ctx, d, cause); err != nil {
			return err
		}
		say("%s: on %s after %d attempts (%v), confirmed; the listener acks it", d.Body, topology.DLQ(), recoverer.FailedAttempts(ctx, cause), cause)
		if d.Headers[runHeader] == runID {
			dead <- string(d.Body)
		}
		return nil
	})

	// The work listener: one consumer, the case where Spring's retry blocks.
	chain := middleware.Chain(
		middleware.Retry(5,
			middleware.WithInitialInterval(initial),
			middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) {
				say("%s: attempt %d failed; next in %v", e.Delivery.Body, e.Attempt, e.Delay)
			})),
		middleware.Recover(parked),
	)
	work, err := listener.New(topology.Queue, chain, func(ctx context.Context, d *amqp.Delivery) error {
		say("%s: attempt %d", d.Body, middleware.Attempt(ctx))
		return errors.New("user service unavailable")
	}, listener.WithURL(url), listener.WithConcurrentConsumers(1), quiet)
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() { errs <- work.Run(runCtx) }()
	stopped := false
	defer func() {
		if !stopped {
			stop()
			<-errs
		}
	}()

	for _, body := range []string{"msg1", "msg2"} {
		say("publishing %s", body)
		msg := amqp.Publishing{MessageId: body, Body: []byte(body), DeliveryMode: amqp.Persistent, Headers: amqp.Table{runHeader: runID}}
		if err := pub.Publish(ctx, "", topology.Queue, msg); err != nil {
			return err
		}
	}
	for range 2 {
		select {
		case <-dead:
		case err := <-errs:
			stopped = true
			return fmt.Errorf("the listener stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30*initial + 10*time.Second):
			return errors.New("the dead letters did not arrive in time")
		}
	}
	// Stopping lets the listener ack what it recovered.
	stop()
	stopped = true
	if err := <-errs; err != nil {
		return err
	}
	say("done: neither message waited for the other, and both are safe on %s", topology.DLQ())
	fmt.Fprintf(out, `
The dead letters stay on %[1]s. From the repository's root, list them:

    go run ./cmd/amqpretry dlq list %[1]s

show one in full (go run ./cmd/amqpretry dlq show %[1]s --id msg1), send them
back to %[2]s (dlq replay %[1]s), or delete them (dlq purge %[1]s --yes).
With the command installed (go install github.com/amqpretry/amqpretry/cmd/amqpretry@latest),
it is amqpretry dlq list %[1]s.
`, topology.DLQ(), topology.Queue)
	return nil
}

// declare declares the demo's topology, or finds it as an earlier run left
// it: the dead letters of earlier runs stay where they are.
func declare(url string, topology dlx.Topology) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect (is the broker up? run scripts/broker.sh): %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := topology.Declare(ch); err != nil {
		return fmt.Errorf("declare %s and its DLQ: %w (queues of that name declared otherwise, by an older version of the demo, are in the way: delete them with rabbitmqctl delete_queue)", topology.Queue, err)
	}
	return nil
}
