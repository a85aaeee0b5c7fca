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

// With the default scaling settings and a 20ms handler: from 1 to 8 consumers
// within 3s of a 3000-message backlog, and back to 1 within 30s of the queue
// draining, as the broker counts consumers.
func TestScalesUpAndDownWithDefaults(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 3000)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	consumers := func() int {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return info.Consumers
	}

	s := newSeen()
	begin := time.Now()
	r := start(t, q, middleware.Chain(middleware.Retry(3), requeueExhausted()), func(_ context.Context, d *amqp.Delivery) error {
		time.Sleep(20 * time.Millisecond)
		s.add(d.MessageId)
		return nil
	}, listener.WithConcurrentConsumers(1), listener.WithMaxConcurrentConsumers(8), logTo(t, true))

	brokertest.Eventually(t, 10*time.Second, "8 consumers", func() bool { return consumers() == 8 })
	up := time.Since(begin)
	t.Logf("1 → 8 consumers in %v", up)
	if up > 3*time.Second {
		t.Errorf("scaling up took %v, want under 3s", up)
	}
	// The broker counts a consumer at consume-ok, a moment before the
	// listener records it.
	brokertest.Eventually(t, time.Second, "Stats to show the 8 consumers", func() bool { return r.Stats().Consumers == 8 })

	brokertest.Eventually(t, 60*time.Second, "the backlog drained", func() bool { return s.distinct() == 3000 })
	drained := time.Now()
	brokertest.Eventually(t, 40*time.Second, "back to 1 consumer", func() bool { return consumers() == 1 })
	down := time.Since(drained)
	t.Logf("drained in %v; back to 1 consumer %v later", drained.Sub(begin), down)
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

// The listener looks at its load every WithScaleInterval; the first look only
// takes a baseline, so a backlog grows the consumers at the second look, two
// intervals after the start.
func TestScaleInterval(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 2000)
	begin := time.Now()
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error {
		time.Sleep(20 * time.Millisecond)
		return nil
	}, listener.WithConcurrentConsumers(1), listener.WithMaxConcurrentConsumers(4), listener.WithScaleInterval(time.Second))
	brokertest.Eventually(t, 10*time.Second, "more than 1 consumer", func() bool { return r.Stats().Consumers > 1 })
	grew := time.Since(begin)
	t.Logf("first growth after %v", grew)
	if grew < 1900*time.Millisecond {
		t.Errorf("the consumers grew after %v, before the second look at 2s", grew)
	}
}
