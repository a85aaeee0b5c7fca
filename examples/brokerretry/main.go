// Command brokerretry shows retries too long to hold in memory. A failing
// message gets three quick local attempts (100ms, 200ms apart); the next wait
// would be longer than HandOffAfter allows, so it is parked on the broker: in
// a 10-second tier, then a 1-minute tier (queues with a TTL that send it back),
// and then, still failing, on the DLQ. Nothing waits in the process between
// tiers, so a restart loses nothing and consumer_timeout never fires. It exits
// by itself after about 70 seconds; -tiers 2s,5s makes it quicker.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
)

func main() {
	tiers := flag.String("tiers", "10s,1m", "broker-side retry delays")
	flag.Parse()
	var delays []time.Duration
	for _, s := range strings.Split(*tiers, ",") {
		d, err := time.ParseDuration(s)
		if err != nil {
			log.Fatalf("-tiers: %v", err)
		}
		delays = append(delays, d)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, exampleutil.URL(), delays); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, url string, delays []time.Duration) error {
	tl := exampleutil.NewTimeline(out)
	topo := dlx.Topology{Queue: exampleutil.Name("amqpretry.brokerretry"), RetryDelays: delays}
	if err := declare(url, topo); err != nil {
		return err
	}
	defer func() { _ = exampleutil.DeleteTopology(url, topo) }()
	tl.Say("declared %s, its tiers %s and %s", topo.Queue, strings.Join(tierQueues(topo), ", "), topo.DLQ())
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()

	chain := middleware.Chain(
		middleware.Retry(10, middleware.WithInitialInterval(100*time.Millisecond), middleware.HandOffAfter(300*time.Millisecond)),
		middleware.Recover(topo.Tiers(pub)),
	)
	work, err := listener.New(topo.Queue, chain, func(ctx context.Context, d *amqp.Delivery) error {
		tl.Say("attempt %d (broker retries so far: %d)", middleware.Attempt(ctx), dlx.RetryCount(d))
		return errors.New("payment provider down")
	}, listener.WithURL(url), listener.WithDeclare(topo.Declare), exampleutil.Quiet)
	if err != nil {
		return err
	}
	dead := make(chan struct{}, 1)
	dlq, err := listener.New(topo.DLQ(), nil, func(_ context.Context, d *amqp.Delivery) error {
		tl.Say("on the DLQ after %d broker retries: %v", dlx.RetryCount(d), d.Headers["x-exception-message"])
		dead <- struct{}{}
		return nil
	}, listener.WithURL(url), exampleutil.Quiet)
	if err != nil {
		return err
	}
	running := exampleutil.Start(ctx, work, dlq)
	defer running.Stop()

	if err := pub.Publish(ctx, "", topo.Queue, amqp.Publishing{MessageId: "charge-42", Body: []byte("charge 42"), DeliveryMode: amqp.Persistent}); err != nil {
		return err
	}
	tl.Say("published charge-42")
	var total time.Duration
	for _, d := range delays {
		total += d
	}
	select {
	case <-dead:
		return nil
	case err := <-running.Errs():
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(total + 30*time.Second):
		return errors.New("the message did not reach the DLQ in time")
	}
}

func tierQueues(t dlx.Topology) []string {
	var names []string
	for _, d := range t.RetryDelays {
		names = append(names, t.RetryQueue(d))
	}
	return names
}

// declare declares the topology now, so that the first publish finds the
// queue.
func declare(url string, t dlx.Topology) error {
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	return t.Declare(ch)
}
