package listener_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
)

// slowHandler is a 100ms handler that counts the handlers running at once
// and the messages it has handled.
func slowHandler(at *concurrency, s *seen) func(context.Context, *amqp.Delivery) error {
	return func(_ context.Context, d *amqp.Delivery) error {
		defer at.enter()()
		time.Sleep(100 * time.Millisecond)
		s.add(d.MessageId)
		return nil
	}
}

// 240 messages of 100ms waiting when a 4..8 listener starts, with the
// default prefetch: the first channel to subscribe must not take the whole
// backlog and run it one at a time. At least 4 handlers run at once before
// a tenth of the backlog is through, and the pool grows to its 8.
func TestBacklogAtStartRunsOnEverySlot(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	const total = 240
	publishN(t, q, total)
	var at concurrency
	s := newSeen()
	r := start(t, q, nil, slowHandler(&at, s), listener.WithConcurrentConsumers(4), listener.WithMaxConcurrentConsumers(8))
	brokertest.Eventually(t, 30*time.Second, "a tenth of the backlog handled", func() bool { return s.distinct() >= total/10 })
	if p := at.peak(); p < 4 {
		t.Errorf("%d handlers at a time at most while the first %d messages ran, want at least the 4 concurrent consumers", p, s.distinct())
	}
	brokertest.Eventually(t, 60*time.Second, "the backlog drained", func() bool { return s.distinct() == total })
	if p := at.peak(); p != 8 {
		t.Errorf("%d handlers at a time at most on a backlog, want the maximum 8", p)
	}
	if d := s.duplicates(); d != 0 {
		t.Errorf("%d messages handled twice", d)
	}
	// The handler counts a message before it returns, Stats once its ack
	// is written: the last ack may still be on its way.
	brokertest.Eventually(t, 10*time.Second, "every message acked", func() bool { return r.Stats().Handled == total })
}

// A burst of 400 messages of 100ms while a 4..8 listener runs idle: the
// deliveries the channels prefetch wait in the process, not at the broker,
// and the pool must grow to its 8 all the same.
func TestBurstWhileRunningGrowsToMax(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var at concurrency
	s := newSeen()
	r := start(t, q, nil, slowHandler(&at, s), listener.WithConcurrentConsumers(4), listener.WithMaxConcurrentConsumers(8))
	brokertest.Eventually(t, 10*time.Second, "the listener ready", func() bool { return r.Stats().Ready })
	const total = 400
	publishN(t, q, total)
	brokertest.Eventually(t, 60*time.Second, "the burst handled", func() bool { return s.distinct() == total })
	if p := at.peak(); p != 8 {
		t.Errorf("%d handlers at a time at most during a burst, want the maximum 8", p)
	}
	if d := s.duplicates(); d != 0 {
		t.Errorf("%d messages handled twice", d)
	}
}

// Where the queue's order must hold, the listener runs one handler at a
// time and handles the messages in the order published: on a single
// active consumer queue (declared by the listener) though configured for
// 4..8 handlers, with an exclusive consumer, and with one handler at
// prefetch 1.
func TestOrderedModesHandleInQueueOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts func(q string) []listener.Option
		args amqp.Table
	}{
		{"single active consumer", func(q string) []listener.Option {
			topo := dlx.Topology{Queue: q, Type: dlx.Quorum, SingleActiveConsumer: true}
			t.Cleanup(func() { deleteTopology(brokertest.URL(), topo) })
			return []listener.Option{listener.WithDeclare(topo.Declare), listener.WithConcurrentConsumers(4), listener.WithMaxConcurrentConsumers(8)}
		}, nil},
		{"exclusive", func(string) []listener.Option {
			return []listener.Option{listener.WithExclusive()} // (New refuses it with more than one handler)
		}, amqp.Table{}},
		{"prefetch 1", func(string) []listener.Option {
			return []listener.Option{listener.WithPrefetch(1)}
		}, amqp.Table{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := brokertest.Name(t, "q")
			if tc.args != nil {
				brokertest.Queue(t, q, tc.args)
			}
			opts := tc.opts(q)
			var at concurrency
			s := newSeen()
			r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
				defer at.enter()()
				time.Sleep(2 * time.Millisecond)
				s.add(d.MessageId)
				return nil
			}, opts...)
			brokertest.Eventually(t, 10*time.Second, "the listener ready", func() bool { return r.Stats().Ready })
			const total = 300
			publishN(t, q, total)
			brokertest.Eventually(t, 60*time.Second, "every message handled", func() bool { return s.distinct() == total })
			if p := at.peak(); p != 1 {
				t.Errorf("%d handlers at a time, want 1 where the order must hold", p)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for i, id := range s.order {
				if id != strconv.Itoa(i) {
					t.Fatalf("message %s handled %dth: out of order", id, i)
				}
			}
		})
	}
}
