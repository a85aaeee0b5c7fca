// Command outage shows a downstream outage with and without the listener's
// kill switch. 1000 messages wait in the queue; a moment after consuming
// starts, the "database" the handler needs goes down for 10 seconds
// (-outage). Each run retries three times, then dead-letters. Without the
// kill switch, what arrives during the outage ends on the DLQ; with it, the
// listener stops consuming after a few failures, probes until the database
// is back, and handles everything. The two runs are printed side by side.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/examples/internal/exampleutil"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

const queue = "amqpretry.outage"

func main() {
	outage := flag.Duration("outage", 10*time.Second, "how long the database is down")
	n := flag.Int("messages", 1000, "messages in the queue")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, exampleutil.URL(), *n, *outage); err != nil {
		log.Fatal(err)
	}
}

// result is one run's outcome.
type result struct {
	handled, dead int
	trips         int
	backAfter     time.Duration // from the database's recovery to consuming at full speed again
	total         time.Duration
}

func run(ctx context.Context, out io.Writer, url string, messages int, outage time.Duration) error {
	var results [2]result
	for i, withSwitch := range []bool{false, true} {
		r, err := once(ctx, out, url, messages, outage, withSwitch)
		if err != nil {
			return err
		}
		results[i] = r
	}
	fmt.Fprintf(out, "\n%-40s %14s %14s\n", fmt.Sprintf("outage of %v, %d messages", outage, messages), "without", "with kill switch")
	row := func(name string, f func(result) string) {
		fmt.Fprintf(out, "%-40s %14s %14s\n", name, f(results[0]), f(results[1]))
	}
	row("handled", func(r result) string { return fmt.Sprint(r.handled) })
	row("on the DLQ", func(r result) string { return fmt.Sprint(r.dead) })
	row("trips", func(r result) string { return fmt.Sprint(r.trips) })
	row("full speed again after the recovery", func(r result) string {
		if r.backAfter == 0 {
			return "-"
		}
		return r.backAfter.Round(10 * time.Millisecond).String()
	})
	row("all settled after", func(r result) string { return r.total.Round(100 * time.Millisecond).String() })
	return nil
}

func once(ctx context.Context, out io.Writer, url string, messages int, outage time.Duration, withSwitch bool) (result, error) {
	name := map[bool]string{false: "without", true: "with kill switch"}[withSwitch]
	q, dlq := exampleutil.Name(queue)+"."+map[bool]string{false: "without", true: "with"}[withSwitch], exampleutil.Name(queue)+".dlq"
	tl := exampleutil.NewTimeline(out)
	conn, ch, err := exampleutil.Connect(url)
	if err != nil {
		return result{}, err
	}
	defer conn.Close()
	defer func() { _ = exampleutil.DeleteQueues(ch, q, dlq) }()
	for _, name := range []string{q, dlq} {
		if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			return result{}, err
		}
	}
	pub, err := publisher.New(url)
	if err != nil {
		return result{}, err
	}
	defer pub.Close()
	for i := range messages {
		if err := pub.Publish(ctx, "", q, amqp.Publishing{Body: []byte(fmt.Sprint(i))}); err != nil {
			return result{}, err
		}
	}

	var down atomic.Bool
	handle := func(ctx context.Context, _ *amqp.Delivery) error {
		if down.Load() {
			return errors.New("database unavailable")
		}
		time.Sleep(5 * time.Millisecond) // the work
		return nil
	}
	chain := middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(100*time.Millisecond)),
		middleware.Recover(recoverer.Republish(pub, "", dlq)))
	opts := []listener.Option{listener.WithURL(url), listener.WithConcurrentConsumers(2), listener.WithPrefetch(50), exampleutil.Quiet}
	if withSwitch {
		// MassTransit's thresholds (15% of at least 10 in a minute), a
		// shorter restart timeout than its minute, to keep the example short.
		opts = append(opts, listener.WithKillSwitch(listener.KillSwitch{RestartTimeout: time.Second, MaxRestartTimeout: 4 * time.Second}))
	}
	l, err := listener.New(q, chain, handle, opts...)
	if err != nil {
		return result{}, err
	}
	tl.Say("%s: %d messages waiting", name, messages)
	began := time.Now()
	running := exampleutil.Start(ctx, l)
	defer running.Stop()

	var res result
	var recovered time.Time
	lastState := ""
	for tick := time.NewTicker(20 * time.Millisecond); ; {
		select {
		case <-tick.C:
		case err := <-running.Errs():
			return res, err
		case <-ctx.Done():
			return res, ctx.Err()
		}
		elapsed := time.Since(began)
		switch {
		case !down.Load() && recovered.IsZero() && elapsed >= 300*time.Millisecond && elapsed < 300*time.Millisecond+outage:
			down.Store(true)
			tl.Say("%s: the database goes down for %v", name, outage)
		case down.Load() && elapsed >= 300*time.Millisecond+outage:
			down.Store(false)
			recovered = time.Now()
			tl.Say("%s: the database is back", name)
		}
		st := l.Stats()
		if st.KillSwitch != lastState && st.KillSwitch != "" {
			if st.KillSwitch == "tripped" {
				res.trips++
			}
			tl.Say("%s: kill switch %s; %d handled so far", name, st.KillSwitch, st.Handled)
			lastState = st.KillSwitch
		}
		if withSwitch && res.backAfter == 0 && !recovered.IsZero() && st.Consumers == 2 && st.KillSwitch == "closed" {
			res.backAfter = time.Since(recovered)
		}
		info, err := ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
		if err != nil {
			return res, err
		}
		res.dead = info.Messages
		res.handled = int(st.Handled) - res.dead // Handled counts the recovered ones too
		if !recovered.IsZero() && int(st.Handled) == messages {
			res.total = time.Since(began)
			tl.Say("%s: all %d settled: %d handled, %d on the DLQ", name, messages, res.handled, res.dead)
			return res, nil
		}
	}
}
