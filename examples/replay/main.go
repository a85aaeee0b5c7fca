// Command replay puts failed messages back once the bug that failed them is
// fixed. A handler with a bug sends five orders to the DLQ; the bug
// is fixed; dlx.Replay moves the dead letters back to the work queue, each
// confirmed before it leaves the DLQ, with their fault headers removed; the
// fixed handler takes them. It exits by itself in about two seconds.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, exampleutil.URL()); err != nil {
		log.Fatal(err)
	}
}

const orders = 5

func run(ctx context.Context, out io.Writer, url string) error {
	tl := exampleutil.NewTimeline(out)
	topo := dlx.Topology{Queue: exampleutil.Name("amqpretry.replay")}
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := topo.Declare(ch); err != nil {
		return err
	}
	defer func() { _ = exampleutil.DeleteTopology(url, topo) }()
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()

	var fixed atomic.Bool
	var handled atomic.Int64
	handle := func(_ context.Context, d *amqp.Delivery) error {
		if !fixed.Load() {
			return errors.New("tax rate for region EU-7 is missing")
		}
		tl.Say("handled %s (headers now: %v)", d.MessageId, d.Headers)
		handled.Add(1)
		return nil
	}
	chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(50*time.Millisecond)),
		middleware.Recover(recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())))
	l, err := listener.New(topo.Queue, chain, handle, listener.WithURL(url), exampleutil.Quiet)
	if err != nil {
		return err
	}
	running := exampleutil.Start(ctx, l)
	defer running.Stop()

	for i := range orders {
		id := fmt.Sprintf("order-%d", i)
		if err := pub.Publish(ctx, "", topo.Queue, amqp.Publishing{MessageId: id, Body: []byte(id), Headers: amqp.Table{"region": "EU-7"}}); err != nil {
			return err
		}
	}
	if err := wait(ctx, func() bool { return depth(ch, topo.DLQ()) == orders }); err != nil {
		return err
	}
	tl.Say("%d orders failed and are on %s", orders, topo.DLQ())

	fixed.Store(true)
	tl.Say("bug fixed; replaying")
	stats, err := dlx.Replay(ctx, ch, pub, topo.DLQ())
	if err != nil {
		return err
	}
	tl.Say("replayed %d, skipped %d", stats.Replayed, stats.Skipped)
	if err := wait(ctx, func() bool { return handled.Load() == orders }); err != nil {
		return err
	}
	tl.Say("all %d handled; %s is empty: %v", orders, topo.DLQ(), depth(ch, topo.DLQ()) == 0)
	return nil
}

func depth(ch *amqp.Channel, q string) int {
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return info.Messages
}

func wait(ctx context.Context, done func() bool) error {
	for deadline := time.Now().Add(10 * time.Second); !done(); {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
