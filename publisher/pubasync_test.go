package publisher_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/pubasync"
	"github.com/amqpretry/amqpretry/publisher"
)

// The recoverers' async publish with a timeout of its own (pubasync): a copy
// whose confirm does not come fails at its timeout, as under a
// context.WithTimeout, even behind copies with a longer one on the same
// channel; the others still get theirs, and mandatory is as given.
func TestPublishAsyncWithItsOwnTimeout(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithChannels(1), publisher.WithConfirmTimeout(time.Minute))
	t.Cleanup(func() { proxy.Blackhole(false) })
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}

	proxy.Blackhole(true)
	long, short := make(chan error, 1), make(chan error, 1)
	ctx := context.Background()
	if err := pubasync.Publish(p, ctx, "", q, amqp.Publishing{Body: []byte("long")}, true, time.Minute, func(err error) { long <- err }); err != nil {
		t.Fatal(err)
	}
	if err := pubasync.Publish(p, ctx, "", q, amqp.Publishing{Body: []byte("short")}, true, 300*time.Millisecond, func(err error) { short <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-short:
		if !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the short one's done(%v), want ErrNotConfirmed and context.DeadlineExceeded", err)
		}
	case err := <-long:
		t.Fatalf("the long one's done(%v) came first", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the short one's done was not called: its timeout waited behind the long one's")
	}
	proxy.Blackhole(false)
	select {
	case err := <-long:
		if err != nil {
			t.Errorf("the long one's done(%v), want nil once the confirms flow again", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the long one's done was not called")
	}

	// mandatory as given: an unroutable copy is an error with true, not with false.
	for _, mandatory := range []bool{true, false} {
		got := make(chan error, 1)
		if err := pubasync.Publish(p, ctx, "", brokertest.Name(t, "nowhere"), amqp.Publishing{Body: []byte("x")}, mandatory, 10*time.Second,
			func(err error) { got <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-got; errors.Is(err, publisher.ErrUnroutable) != mandatory {
			t.Errorf("mandatory %v: done(%v)", mandatory, err)
		}
	}
}

// A context that ends still fails a copy with a timeout of its own at once.
func TestPublishAsyncWithItsOwnTimeoutCancelled(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithConfirmTimeout(time.Minute))
	t.Cleanup(func() { proxy.Blackhole(false) })
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	if err := pubasync.Publish(p, ctx, "", q, amqp.Publishing{Body: []byte("x")}, true, time.Minute, func(err error) { got <- err }); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, context.Canceled) {
			t.Errorf("done(%v), want ErrNotConfirmed and context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("done was not called")
	}
}
