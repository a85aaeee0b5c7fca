package listener_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// refusedPromptly runs l and wants Run to end within seconds with a
// *ConsumeRefusedError, 403, whose text says each of want.
func refusedPromptly(t *testing.T, l *listener.Listener, log *testlog.Buffer, want ...string) {
	t.Helper()
	took, returned, err := runFor(t, l, 20*time.Second)
	if !returned {
		t.Fatalf("Run did not return within 20s; it logged:\n%s", log.String())
	}
	var refused *listener.ConsumeRefusedError
	if !errors.Is(err, listener.ErrConsumeRefused) || !errors.As(err, &refused) || refused.Err.Code != amqp.AccessRefused {
		t.Fatalf("Run = %v, want a *ConsumeRefusedError with the broker's 403", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Run = %v\nwant it to say %q", err, w)
		}
	}
	if took > 5*time.Second || log.Count("retrying") > 0 {
		t.Errorf("Run took %v and retried %d times before giving up", took, log.Count("retrying"))
	}
}

// A listener WithExclusive holds a classic queue: another listener's
// consume is refused with 403 and its Run ends at once with an error that
// names the exclusive consumer, while the exclusive one goes on consuming.
// And a listener WithExclusive on a queue that has a consumer already is
// refused, with an error that names WithExclusive.
func TestExclusiveListenerRefusesOthers(t *testing.T) {
	ok := func(context.Context, *amqp.Delivery) error { return nil }
	t.Run("another listener", func(t *testing.T) {
		q := brokertest.Name(t, "q")
		brokertest.Queue(t, q, nil)
		s := newSeen()
		owner := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
			listener.WithExclusive(), listener.WithConsumerTagPrefix("exclusive-owner"))
		brokertest.Eventually(t, 10*time.Second, "the exclusive listener consuming", func() bool { return owner.Stats().Consumers == 1 })
		var log testlog.Buffer
		second, err := listener.New(q, nil, ok, listener.WithURL(brokertest.URL()), listener.WithLogger(log.Logger()))
		if err != nil {
			t.Fatal(err)
		}
		refusedPromptly(t, second, &log, "in exclusive use", "another consumer holds the queue exclusively", "WithExclusive", "rabbitmqctl list_consumers")
		publishN(t, q, 3)
		brokertest.Eventually(t, 10*time.Second, "the exclusive listener to go on", func() bool { return s.distinct() == 3 })
		brokertest.Eventually(t, 20*time.Second, "the broker to list the exclusive consumer alone", func() bool {
			rows := listConsumers(t, q)
			return len(rows) == 1 && strings.HasPrefix(rows[0].tag, "exclusive-owner-")
		})
	})
	t.Run("exclusive after another", func(t *testing.T) {
		q := brokertest.Name(t, "q")
		brokertest.Queue(t, q, nil)
		first := start(t, q, nil, ok)
		brokertest.Eventually(t, 10*time.Second, "the first listener consuming", func() bool { return first.Stats().Consumers == 1 })
		var log testlog.Buffer
		exclusive, err := listener.New(q, nil, ok, listener.WithURL(brokertest.URL()), listener.WithLogger(log.Logger()), listener.WithExclusive())
		if err != nil {
			t.Fatal(err)
		}
		refusedPromptly(t, exclusive, &log, "in exclusive use", "WithExclusive asks to be the queue's only consumer", "drop WithExclusive")
	})
}

// Quorum queues accept an exclusive consume and ignore the flag, on
// RabbitMQ 3.10, 4.0 and 4.3: a second listener consumes beside an
// exclusive one and gets messages. (WithExclusive says so; a test that
// fails when a version starts to honour it.)
func TestExclusiveIgnoredByQuorumQueues(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
	var a, b ids
	first := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
		a.add(d)
		time.Sleep(5 * time.Millisecond)
		return nil
	},
		listener.WithExclusive(), listener.WithPrefetch(1))
	brokertest.Eventually(t, 10*time.Second, "the exclusive listener consuming", func() bool { return first.Stats().Consumers == 1 })
	second := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
		b.add(d)
		time.Sleep(5 * time.Millisecond)
		return nil
	},
		listener.WithPrefetch(1))
	brokertest.Eventually(t, 10*time.Second, "the second listener consuming", func() bool { return second.Stats().Consumers == 1 })
	publishN(t, q, 40)
	brokertest.Eventually(t, 20*time.Second, "every message handled", func() bool { return a.len()+b.len() >= 40 })
	if a.len() == 0 || b.len() == 0 {
		t.Errorf("the exclusive listener handled %d and the other %d: a quorum queue that honours exclusive consumption?", a.len(), b.len())
	}
}

// The broker may hold a listener's exclusive consumer a while after the
// listener has lost its connection (until it notices: heartbeats, a node's
// net_ticktime), so that the redialled listener's consume is refused by its
// own former consumer. Here a consumer of the test's takes the queue
// exclusively while the listener is cut off, in its place; the listener,
// back, is refused, retries, and consumes once that consumer goes, instead
// of ending Run.
func TestExclusiveListenerRetriesRefusalAfterLostConnection(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	var log testlog.Buffer
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
		listener.WithURL(url), listener.WithExclusive(), listener.WithLogger(log.Logger()))
	brokertest.Eventually(t, 10*time.Second, "the listener consuming", func() bool { return brokertest.Consumers(t, q) == 1 })

	proxy.Refuse(true)
	proxy.CutAll()
	brokertest.Eventually(t, 10*time.Second, "the broker to drop the listener's consumer", func() bool { return brokertest.Consumers(t, q) == 0 })
	stand := brokertest.Channel(t, brokertest.Dial(t))
	if _, err := stand.Consume(q, "stand-in", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	proxy.Refuse(false)
	brokertest.Eventually(t, 30*time.Second, "the listener refused by the stand-in", func() bool {
		return log.Count("held by an exclusive consumer, perhaps this listener's own") > 0
	})
	select {
	case err := <-r.done:
		t.Fatalf("Run ended with %v while the refusal may be its own consumer's", err)
	default:
	}
	if err := stand.Cancel("stand-in", false); err != nil {
		t.Fatal(err)
	}
	brokertest.Eventually(t, 30*time.Second, "the listener consuming again", func() bool { return r.Stats().Consumers == 1 })
	publishN(t, q, 3)
	brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return s.distinct() == 3 })
}

// WithRedeliveryLimit starts each connection with a careful consumer at
// prefetch 1 and hands over to the usual one: with WithExclusive the new
// consumer must not be refused for good by the old one, whose cancel the
// broker may not have processed yet. Every message is handled and Run goes
// on.
func TestExclusiveListenerHandsOverAfterCarefulStart(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var log testlog.Buffer
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
		listener.WithExclusive(), listener.WithRedeliveryLimit(5), listener.WithLogger(log.Logger()))
	brokertest.Eventually(t, 10*time.Second, "the careful consumer", func() bool { return r.Stats().Consumers == 1 })
	publishN(t, q, 5)
	brokertest.Eventually(t, 10*time.Second, "the first messages handled", func() bool { return s.distinct() == 5 })
	time.Sleep(1100 * time.Millisecond) // the careful start lasts at least a second
	publishRange(t, q, 5, 50)
	brokertest.Eventually(t, 20*time.Second, "every message handled", func() bool { return s.distinct() == 50 })
	brokertest.Eventually(t, 10*time.Second, "consuming at full prefetch", func() bool { return log.Count("consuming at full prefetch") == 1 })
	brokertest.Eventually(t, 10*time.Second, "one consumer again", func() bool { return r.Stats().Consumers == 1 })
	select {
	case err := <-r.done:
		t.Fatalf("Run ended with %v", err)
	default:
	}
}
