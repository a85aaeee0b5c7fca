package listener_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// logTo sends the listener's log to the test log (Warn and above, or Debug
// when verbose is true).
func logTo(t *testing.T, verbose bool) listener.Option {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelDebug
	}
	return listener.WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level})))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// requeueExhausted is the Recover of a test's chain whose point is not
// where an exhausted message goes: it goes back to its queue, on purpose
// (New refuses a Retry with nowhere to put what it exhausts).
func requeueExhausted() middleware.Middleware { return middleware.Recover(recoverer.Requeue()) }

// rejectExhausted sends what a test's chain exhausts, or fails for good, to
// the queue's own dead-letter exchange.
func rejectExhausted() middleware.Middleware { return middleware.Recover(recoverer.Reject()) }

// requeueUnlessPermanent is what a chain without a Recover did before New
// refused it: a Permanent error to the queue's own dead-letter exchange, an
// exhausted one back to the queue.
func requeueUnlessPermanent() middleware.Middleware {
	permanent := middleware.ErrorFunc("permanent", middleware.IsPermanent)
	return middleware.Recover(recoverer.ByError(recoverer.Requeue(), recoverer.When(permanent, recoverer.Reject())))
}

// running is a Listener started by start.
type running struct {
	*listener.Listener
	cancel context.CancelFunc
	done   chan error
}

// start runs a listener on queue until the test ends or Stop is called.
func start(t *testing.T, queue string, mw middleware.Middleware, h middleware.Handler, opts ...listener.Option) *running {
	t.Helper()
	brokertest.Dial(t)
	opts = append([]listener.Option{listener.WithURL(brokertest.URL()), logTo(t, false)}, opts...)
	l, err := listener.New(queue, mw, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Listener: l, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- l.Run(ctx) }()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Stop cancels Run and waits for it; Run must return nil within 30s.
func (r *running) Stop(t *testing.T) time.Duration {
	t.Helper()
	begin := time.Now()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run returned %v, want nil after a shutdown", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its context being cancelled")
	}
	return time.Since(begin)
}

// seen counts how often each message id was handled.
type seen struct {
	mu    sync.Mutex
	count map[string]int
	order []string
}

func newSeen() *seen { return &seen{count: map[string]int{}} }

func (s *seen) add(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count[id]++
	s.order = append(s.order, id)
	return s.count[id]
}

func (s *seen) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.count)
}

func (s *seen) duplicates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := 0
	for _, n := range s.count {
		d += n - 1
	}
	return d
}

func (s *seen) indexOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.order {
		if x == id {
			return i
		}
	}
	return -1
}

func publishN(t *testing.T, queue string, n int) {
	t.Helper()
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		id := fmt.Sprint(i)
		msgs[i] = amqp.Publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent}
	}
	brokertest.Publish(t, queue, msgs...)
}

// concurrency counts handlers running at once: defer c.enter()() in a
// handler.
type concurrency struct {
	now, most atomic.Int64
}

func (c *concurrency) enter() (leave func()) {
	n := c.now.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	return func() { c.now.Add(-1) }
}

// peak is the most handlers that ran at once so far.
func (c *concurrency) peak() int { return int(c.most.Load()) }
