package listener_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// The broker closes the listener's connection while deliveries are in
// flight: the listener redials, and every message is handled. Handlers past
// the 500th are held until the cut is done, so the cut always lands in the
// middle of the run however fast the machine is (rabbitmqctl alone can take
// longer than the whole run would).
func TestConnectionKilledByTheBrokerResumes(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 3000)
	name := brokertest.Name(t, "listener")
	s := newSeen()
	cut := make(chan struct{})
	var calls, held atomic.Int64
	r := start(t, q, middleware.Chain(middleware.Retry(3), requeueExhausted()), func(ctx context.Context, d *amqp.Delivery) error {
		if calls.Add(1) > 500 {
			held.Add(1)
			select {
			case <-cut:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		time.Sleep(2 * time.Millisecond)
		s.add(d.MessageId)
		return nil
	}, listener.WithConcurrentConsumers(2), listener.WithConnectionName(name), listener.WithPrefetch(50))

	brokertest.Eventually(t, 20*time.Second, "500 handled and the next held", func() bool { return s.distinct() >= 500 && held.Load() > 0 })
	if n := brokertest.CloseConnections(t, name); n != 1 {
		t.Fatalf("closed %d connections, want the listener's one", n)
	}
	atCut := s.distinct()
	close(cut)
	if atCut >= 3000 {
		t.Fatal("every message was handled before the cut: the test proves nothing")
	}
	brokertest.Eventually(t, 30*time.Second, "all 3000 handled after the redial", func() bool { return s.distinct() == 3000 })
	brokertest.Eventually(t, 10*time.Second, "the queue empty and acked", func() bool {
		return brokertest.Depth(t, q) == 0 && r.Stats().InFlight == 0
	})
	t.Logf("cut after %d of 3000; duplicates (in flight when the connection died, redelivered): %d", atCut, s.duplicates())
	brokertest.Eventually(t, 5*time.Second, "2 consumers after the redial", func() bool { return brokertest.Consumers(t, q) == 2 })
}

func TestQueueDeletedWhileConsuming(t *testing.T) {
	q := brokertest.Name(t, "q")
	t.Cleanup(func() { brokertest.DeleteQueue(t, q) })
	declare := func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		return err
	}
	s := newSeen()
	start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil }, listener.WithDeclare(declare))
	brokertest.Eventually(t, 5*time.Second, "consuming", func() bool { return brokertest.QueueExists(t, q) && brokertest.Consumers(t, q) == 1 })
	brokertest.DeleteQueue(t, q) // the broker cancels the consumer
	brokertest.Eventually(t, 10*time.Second, "the queue declared again and consumed", func() bool {
		return brokertest.QueueExists(t, q) && brokertest.Consumers(t, q) == 1
	})
	publishN(t, q, 10)
	brokertest.Eventually(t, 5*time.Second, "messages after the deletion handled", func() bool { return s.distinct() == 10 })
}

// A channel exception on a consumer's channel (here the handler acks the
// delivery itself, so the listener's ack is a second one: 406 unknown
// delivery tag) closes that channel: the consumer is replaced, the deliveries
// it held go back to the queue, and everything is handled.
func TestConsumerChannelClosedIsReplaced(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "rogue"})
	publishN(t, q, 200)
	s := newSeen()
	var rogue atomic.Bool
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "rogue" && rogue.CompareAndSwap(false, true) {
			_ = d.Ack(false)
		}
		s.add(d.MessageId)
		time.Sleep(time.Millisecond)
		return nil
	}, listener.WithPrefetch(20))
	brokertest.Eventually(t, 20*time.Second, "all messages handled", func() bool { return s.distinct() == 201 })
	brokertest.Eventually(t, 5*time.Second, "one consumer again", func() bool { return r.Stats().Consumers == 1 && brokertest.Consumers(t, q) == 1 })
	if n := brokertest.Depth(t, q); n != 0 {
		t.Errorf("queue holds %d", n)
	}
	t.Logf("redelivered after the channel closed: %d", s.duplicates())
}

// A connection that freezes (the broker's host stops answering; nothing is
// reset) just before shutdown: Run must not wait for close-ok replies that
// never come, until the heartbeat gives up (15 s by default). With no
// handler running and a 1 s shutdown timeout it returns within a few
// seconds, and does not blame a handler.
func TestShutdownOnAFrozenConnectionIsBounded(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	var log testlog.Buffer
	s := newSeen()
	l, err := listener.New(q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
		listener.WithURL(url), listener.WithShutdownTimeout(time.Second), listener.WithConcurrentConsumers(2), listener.WithLogger(log.Logger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	publishN(t, q, 5)
	brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return s.distinct() == 5 })
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	stopsWithin(t, cancel, done, 4*time.Second, "on a frozen connection")
	if n := log.Count("a handler ignores its cancelled context"); n > 0 {
		t.Errorf("the log blames a handler %d times, though none ran:\n%s", n, log.String())
	}
}

// The same when the connection freezes while the listener is opening a
// consumer (a channel, its qos, its basic.consume: each waits for the
// broker's reply): Run returns within a few seconds rather than when the
// heartbeat gives up. It waited 15 s (found under make test's load, when the
// freeze came as the second channel opened).
func TestShutdownWhileOpeningAConsumerOnAFrozenConnectionIsBounded(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	defer proxy.Blackhole(false)
	frozen := make(chan struct{})
	var once sync.Once
	l, err := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(url), listener.WithShutdownTimeout(time.Second), listener.WithConcurrentConsumers(2),
		logTo(t, false), listener.WithDeclare(func(*amqp.Channel) error {
			// Declared: the consumers open next, on a connection that no
			// longer answers.
			proxy.Blackhole(true)
			once.Do(func() { close(frozen) })
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-frozen
	time.Sleep(200 * time.Millisecond) // the listener waits for its first channel now
	stopsWithin(t, cancel, done, 4*time.Second, "while opening a consumer on a frozen connection")
}

// stopsWithin cancels Run's context and checks that Run returns within
// bound; Run's result goes back on done for the test's deferred wait.
func stopsWithin(t *testing.T, cancel context.CancelFunc, done chan error, bound time.Duration, when string) {
	t.Helper()
	begin := time.Now()
	cancel()
	select {
	case err := <-done:
		done <- err
		if took := time.Since(begin); took > bound {
			t.Errorf("Run took %v to return %s, want a few seconds", took.Round(time.Millisecond), when)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s")
	}
}

// A handler that ends its goroutine with runtime.Goexit (t.FailNow in a
// test helper, say) instead of returning: the listener says so, hands the
// message back, and goes on consuming; before, the consumer died silently
// with its prefetched deliveries unacked.
func TestHandlerThatCallsGoexitDoesNotKillItsConsumer(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var log testlog.Buffer
	s := newSeen()
	var exited atomic.Bool
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "0" && exited.CompareAndSwap(false, true) {
			runtime.Goexit()
		}
		s.add(d.MessageId)
		return nil
	}, listener.WithLogger(log.Logger()), listener.WithRequeueDelay(0, 0))
	publishN(t, q, 10)
	brokertest.Eventually(t, 10*time.Second, "every message handled, the one whose handler exited again", func() bool {
		return s.distinct() == 10
	})
	r.Stop(t)
	if log.Count("runtime.Goexit") == 0 {
		t.Errorf("the log does not say a handler called runtime.Goexit:\n%s", log.String())
	}
	if n := brokertest.Depth(t, q); n != 0 {
		t.Errorf("the queue still holds %d", n)
	}
}
