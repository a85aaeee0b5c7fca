// Package exampleutil holds what the examples share: the broker URL, a
// connection for setting up, a timeline printer and running listeners until
// done.
package exampleutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/listener"
)

// URL is $AMQP_URL or the local broker.
func URL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// Connect dials url and opens a channel for an example's setup; closing the
// connection closes the channel too.
func Connect(url string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, fmt.Errorf("connect (is the broker up? run scripts/broker.sh): %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// runID tells this run's queues from any other's.
var runID = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// Name is base with a suffix of this run's own. An example names what it
// declares with it and deletes, when it ends, only that: it never purges or
// deletes a queue an earlier run, another example's test or anyone else on
// the broker declared.
func Name(base string) string { return base + "." + runID }

// DeleteQueues deletes queues this run declared (named with Name).
func DeleteQueues(ch *amqp.Channel, names ...string) error {
	for _, q := range names {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	return nil
}

// DeleteTopology deletes, on a connection of its own, what t.Declare
// declared in this run (t.Queue named with Name): the work, retry and
// dead-letter queues and the exchanges.
func DeleteTopology(url string, t dlx.Topology) error {
	conn, ch, err := Connect(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	queues := []string{t.DLQ()}
	if !t.SkipWorkQueue {
		queues = append(queues, t.Queue)
	}
	for _, d := range t.RetryDelays {
		queues = append(queues, t.RetryQueue(d))
	}
	if t.SingleRetryDelay > 0 {
		queues = append(queues, t.SingleRetryQueue())
	}
	err = DeleteQueues(ch, queues...)
	for _, x := range []string{t.DLX(), t.Exchange} {
		if x != "" {
			err = errors.Join(err, ch.ExchangeDelete(x, false, false))
		}
	}
	return err
}

// Timeline prints lines stamped with the time since it was made.
type Timeline struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
}

func NewTimeline(out io.Writer) *Timeline { return &Timeline{out: out, start: time.Now()} }

func (t *Timeline) Say(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "[%5.1fs] %s\n", time.Since(t.start).Seconds(), fmt.Sprintf(format, args...))
}

// Quiet is a logger option for examples whose output is their timeline.
var Quiet = listener.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// Running runs listeners until Stop.
type Running struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
}

// Start runs each listener in a goroutine of its own.
func Start(ctx context.Context, ls ...*listener.Listener) *Running {
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{cancel: cancel, errs: make(chan error, len(ls))}
	for _, l := range ls {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := l.Run(ctx); err != nil {
				r.errs <- err
			}
		}()
	}
	return r
}

// Errs reports a listener that stopped with an error.
func (r *Running) Errs() <-chan error { return r.errs }

// Stop shuts the listeners down and waits for them.
func (r *Running) Stop() {
	r.cancel()
	r.wg.Wait()
}
