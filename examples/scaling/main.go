// Command scaling shows the listener sizing itself to the load: 3000
// messages wait in the queue, each takes 20ms to handle, and the listener may
// run 1 to 8 consumers. It prints the consumer count (as the broker counts
// them too) while the backlog drains, and after, until the listener is back
// to one consumer. It exits by itself in about 15 seconds.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/publisher"
)

func main() {
	n := flag.Int("messages", 3000, "backlog size")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, exampleutil.URL(), *n, 20*time.Millisecond); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, url string, messages int, work time.Duration) error {
	tl := exampleutil.NewTimeline(out)
	queue := exampleutil.Name("amqpretry.scaling")
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	defer func() { _ = exampleutil.DeleteQueues(ch, queue) }()
	pub, err := publisher.New(url)
	if err != nil {
		return err
	}
	defer pub.Close()
	for i := range messages {
		if err := pub.Publish(ctx, "", queue, amqp.Publishing{Body: []byte(fmt.Sprint(i))}); err != nil {
			return err
		}
	}
	tl.Say("%d messages waiting; each takes %v to handle", messages, work)

	l, err := listener.New(queue, nil, func(context.Context, *amqp.Delivery) error {
		time.Sleep(work)
		return nil
	}, listener.WithURL(url), listener.WithConcurrentConsumers(1), listener.WithMaxConcurrentConsumers(8),
		listener.WithPrefetch(50), listener.WithIdleTimeout(3*time.Second), exampleutil.Quiet)
	if err != nil {
		return err
	}
	running := exampleutil.Start(ctx, l)
	defer running.Stop()

	drained, peak := false, 0
	for tick := time.NewTicker(500 * time.Millisecond); ; {
		select {
		case <-tick.C:
		case err := <-running.Errs():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return err
		}
		st := l.Stats()
		peak = max(peak, st.Consumers)
		tl.Say("%-16s %2d consumers (broker: %d)  handled %4d  waiting %4d", strings.Repeat("█", st.Consumers), st.Consumers, q.Consumers, st.Handled, q.Messages)
		if !drained && st.Handled == uint64(messages) {
			drained = true
			tl.Say("backlog drained with up to %d consumers; idle ones stop after 3s", peak)
		}
		if drained && st.Consumers == 1 {
			tl.Say("back to one consumer")
			return nil
		}
	}
}
