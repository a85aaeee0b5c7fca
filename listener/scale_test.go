package listener_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// With the default scaling settings and a 20ms handler: from 1 to 8
// handlers at a time within 3s of a 3000-message backlog (counted in the
// handler), and back to 1 within 30s of the queue draining, as Stats counts
// them; the broker sees the listener's two channels throughout.
func TestScalesUpAndDownWithDefaults(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 3000)

	s := newSeen()
	var at concurrency
	begin := time.Now()
	r := start(t, q, middleware.Chain(middleware.Retry(3), requeueExhausted()), func(_ context.Context, d *amqp.Delivery) error {
		defer at.enter()()
		time.Sleep(20 * time.Millisecond)
		s.add(d.MessageId)
		return nil
	}, listener.WithConcurrentConsumers(1), listener.WithMaxConcurrentConsumers(8), logTo(t, true))

	brokertest.Eventually(t, 10*time.Second, "8 handlers at a time", func() bool { return at.peak() == 8 })
	up := time.Since(begin)
	t.Logf("1 → 8 handlers at a time in %v", up)
	if up > 3*time.Second {
		t.Errorf("scaling up took %v, want under 3s", up)
	}
	if n := r.Stats().Consumers; n != 8 {
		t.Errorf("Stats().Consumers = %d with 8 handlers running, want 8", n)
	}
	if n := brokertest.Consumers(t, q); n != 2 {
		t.Errorf("the broker counts %d consumers, want the listener's 2 channels", n)
	}

	brokertest.Eventually(t, 60*time.Second, "the backlog drained", func() bool { return s.distinct() == 3000 })
	drained := time.Now()
	brokertest.Eventually(t, 40*time.Second, "back to 1 handler", func() bool { return r.Stats().Consumers == 1 })
	down := time.Since(drained)
	t.Logf("drained in %v; back to 1 handler %v later", drained.Sub(begin), down)
	if down > 30*time.Second {
		t.Errorf("scaling down took %v, want under 30s", down)
	}
	if d := s.duplicates(); d != 0 {
		t.Errorf("%d duplicates while scaling", d)
	}
}

func TestNeverAboveMaxNorBelowMin(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 600)
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
		time.Sleep(20 * time.Millisecond)
		s.add(d.MessageId)
		return nil
	}, listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(3), listener.WithPrefetch(10), listener.WithIdleTimeout(500*time.Millisecond))
	brokertest.Eventually(t, 5*time.Second, "the 2 initial consumers", func() bool { return r.Stats().Consumers >= 2 })
	peak := 0
	for s.distinct() < 600 {
		peak = max(peak, r.Stats().Consumers)
		if n := r.Stats().Consumers; n < 2 && s.distinct() < 600 {
			t.Fatalf("%d consumers, below the minimum of 2", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if peak != 3 {
		t.Errorf("peak of %d consumers, want the maximum 3 under a backlog", peak)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := r.Stats().Consumers; n != 2 {
		t.Errorf("%d consumers when idle, want the minimum 2", n)
	}
}

// A delivery that waits for a handler grows the pool at once, but what the
// listener learns from the broker it learns at its looks, every
// WithScaleInterval, the first of which only takes a baseline: at prefetch 1
// each channel holds one delivery, so past the two channels it starts with
// the handlers grow only as the scaler opens channels for the messages
// ready at the broker, at the second look, two intervals after the start.
func TestScaleInterval(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 2000)
	var at concurrency
	begin := time.Now()
	start(t, q, nil, func(context.Context, *amqp.Delivery) error {
		defer at.enter()()
		time.Sleep(20 * time.Millisecond)
		return nil
	}, listener.WithConcurrentConsumers(1), listener.WithMaxConcurrentConsumers(4), listener.WithPrefetch(1), listener.WithScaleInterval(time.Second))
	brokertest.Eventually(t, 10*time.Second, "more than 2 handlers at a time", func() bool { return at.peak() > 2 })
	grew := time.Since(begin)
	t.Logf("more than 2 handlers at a time after %v", grew)
	if grew < 1900*time.Millisecond {
		t.Errorf("the handlers grew past the 2 channels after %v, before the second look at 2s", grew)
	}
}
