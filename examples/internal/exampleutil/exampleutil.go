// Package exampleutil holds what the examples share: the broker URL, a
// timeline printer and running listeners until done.
package exampleutil

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/amqpretry/amqpretry/listener"
)

// URL is $AMQP_URL or the local broker.
func URL() string {
	if u := os.Getenv("AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
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
