package listener_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// With WithAckCoalescing the acks of handled deliveries go out as multiple
// acks, far fewer frames than messages; those that still wait when Run's
// context ends are written before the channels close, so that nothing
// handled goes back to the queue.
func TestAckCoalescingAcksTogetherAndFlushesAtShutdown(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	const n, maxAcks = 1001, 50 // odd: one of the two consumers ends with acks waiting
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil },
		listener.WithURL(url), listener.WithConcurrentConsumers(2), listener.WithAckCoalescing(maxAcks, time.Minute))
	publishN(t, q, n)
	brokertest.Eventually(t, 20*time.Second, "every message handled", func() bool { return s.distinct() == n })
	if got := r.Stats().Handled; got >= n {
		t.Errorf("Stats().Handled = %d before the shutdown, want less than %d: no ack waited", got, n)
	}
	r.Stop(t)
	if got := r.Stats().Handled; got != n {
		t.Errorf("Stats().Handled = %d after the shutdown, want %d", got, n)
	}
	if depth := brokertest.Depth(t, q); depth != 0 {
		t.Errorf("%d handled messages went back to the queue at the shutdown: their acks were not written", depth)
	}
	acks, multiple := proxy.Sent("basic.ack"), proxy.Sent("basic.ack multiple")
	t.Logf("%d messages, %d ack frames, %d of them multiple", n, acks, multiple)
	if limit := n/maxAcks + 2; acks > limit || multiple == 0 {
		t.Errorf("%d ack frames (%d multiple) for %d messages, want at most %d", acks, multiple, n, limit)
	}
	if s.duplicates() != 0 {
		t.Errorf("%d messages handled twice", s.duplicates())
	}
}

// Acks that wait fewer than maxDeliveries go out once the first has waited
// maxDelay, while the listener runs on.
func TestAckCoalescingDelayWritesWaitingAcks(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(url), listener.WithAckCoalescing(100, 50*time.Millisecond))
	publishN(t, q, 10)
	brokertest.Eventually(t, 10*time.Second, "the 10 acks written", func() bool { return r.Stats().Handled == 10 })
	// The proxy counts a frame as it passes it on, a moment after the
	// listener has written it.
	brokertest.Eventually(t, 5*time.Second, "the acks through the proxy", func() bool {
		return proxy.Sent("basic.ack multiple") > 0 || proxy.Sent("basic.ack") >= 10
	})
	if acks := proxy.Sent("basic.ack"); acks >= 10 || proxy.Sent("basic.ack multiple") == 0 {
		t.Errorf("%d ack frames (%d multiple) for 10 messages", acks, proxy.Sent("basic.ack multiple"))
	}
}

// The connection is cut while each of two consumers has handled 100
// deliveries, acked 64 of them with one multiple ack and holds the acks of
// the other 36: the broker redelivers those (at most maxDeliveries per
// channel), they are handled again, and nothing is lost. Every message is
// acked once in the end (Stats().Handled counts acks written).
func TestAckCoalescingConnectionCutRedeliversAtMostNPerChannel(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	const n, maxAcks, consumers, holdAfter = 3000, 64, 2, 100
	s := newSeen()
	var mu sync.Mutex
	perChannel := map[amqp.Acknowledger]int{}
	var cut atomic.Bool
	var held atomic.Int64
	// The hold is a middleware, outside the handler's slot of the pool: it
	// stops the channel's reader at the delivery past holdAfter, so that
	// the channel handles exactly holdAfter, and the held delivery takes no
	// slot the other channel needs to get there too.
	hold := func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			mu.Lock()
			perChannel[d.Acknowledger]++
			count := perChannel[d.Acknowledger]
			mu.Unlock()
			if count > holdAfter && !cut.Load() {
				held.Add(1)
				<-ctx.Done() // the listener cancels it as its channel dies
				return ctx.Err()
			}
			return next(ctx, d)
		}
	}
	r := start(t, q, hold, func(ctx context.Context, d *amqp.Delivery) error {
		s.add(d.MessageId)
		return nil
	}, listener.WithURL(url), listener.WithConcurrentConsumers(consumers), listener.WithPrefetch(200),
		listener.WithAckCoalescing(maxAcks, time.Minute))
	publishN(t, q, n)
	brokertest.Eventually(t, 20*time.Second, "each consumer's 101st delivery held", func() bool { return held.Load() == consumers })
	atCut := r.Stats().Handled
	if want := uint64(consumers * (holdAfter / maxAcks) * maxAcks); atCut != want {
		t.Errorf("Stats().Handled = %d with %d handled on each of %d consumers, want %d: one multiple ack of %d each, the rest waiting",
			atCut, holdAfter, consumers, want, maxAcks)
	}
	cut.Store(true)
	proxy.CutAll()
	brokertest.Eventually(t, 30*time.Second, "every message handled after the redial", func() bool { return s.distinct() == n })
	r.Stop(t) // writes the acks that wait

	dups := s.duplicates()
	t.Logf("acked %d before the cut; handled again after it: %d", atCut, dups)
	if dups > consumers*maxAcks {
		t.Errorf("%d messages handled twice, more than %d per channel", dups, maxAcks)
	}
	if dups == 0 {
		t.Errorf("no message handled twice: no ack was waiting at the cut, so the test proves nothing")
	}
	if got := r.Stats().Handled; got != n {
		t.Errorf("Stats().Handled = %d, want %d: each message acked once", got, n)
	}
	if depth := brokertest.Depth(t, q); depth != 0 {
		t.Errorf("the queue still holds %d", depth)
	}
}

// Deliveries complete out of order (a Retry parks one between attempts
// while those behind it go on) and fail in the middle of runs (rejected to
// the queue's DLX, requeued once): no multiple ack may cover one in flight
// or one already rejected, or the broker would close the channel (406
// unknown delivery tag) and redeliver everything on it. Every message ends
// where it should, handled once, with no channel lost.
func TestAckCoalescingWithFailuresAndRetriesOutOfOrder(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	brokertest.Queue(t, q, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	var log testlog.Buffer
	const n = 1000
	s := newSeen()
	var attempts sync.Map
	r := start(t, q, middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(5*time.Millisecond)), requeueUnlessPermanent()),
		func(_ context.Context, d *amqp.Delivery) error {
			i, _ := strconv.Atoi(d.MessageId)
			a, _ := attempts.LoadOrStore(d.MessageId, new(atomic.Int64))
			attempt := a.(*atomic.Int64).Add(1)
			switch {
			case i%7 == 0:
				return middleware.Permanent(errors.New("bad message"))
			case i%5 == 0 && attempt == 1: // parks, then succeeds after those behind it
				return errors.New("flaky")
			case i%11 == 0 && !d.Redelivered: // both attempts fail: requeued, handled on its redelivery
				return fmt.Errorf("down for %s", d.MessageId)
			}
			s.add(d.MessageId)
			return nil
		}, listener.WithURL(url), listener.WithConcurrentConsumers(2), listener.WithPrefetch(100),
		listener.WithAckCoalescing(16, 20*time.Millisecond), listener.WithRequeueDelay(0, 0), listener.WithLogger(log.Logger()))
	publishN(t, q, n)
	bad := (n + 6) / 7
	brokertest.Eventually(t, 30*time.Second, "every good message handled, every bad one dead-lettered", func() bool {
		return s.distinct() == n-bad && brokertest.Depth(t, dlq) == bad
	})
	brokertest.Eventually(t, 10*time.Second, "every handled one acked", func() bool { return r.Stats().Handled == uint64(n-bad) })
	if depth := brokertest.Depth(t, q); depth != 0 {
		t.Errorf("the queue still holds %d", depth)
	}
	if d := s.duplicates(); d != 0 {
		t.Errorf("%d messages handled twice: a channel was lost and its deliveries redelivered", d)
	}
	if c := log.Count("channel closed"); c != 0 {
		t.Errorf("a consumer channel closed (an ack the broker refused?):\n%s", log.String())
	}
	if r.Stats().Consumers != 2 {
		t.Errorf("%d consumers", r.Stats().Consumers)
	}
	t.Logf("%d ack frames (%d multiple), %d rejects, %d nacks for %d messages",
		proxy.Sent("basic.ack"), proxy.Sent("basic.ack multiple"), proxy.Sent("basic.reject"), proxy.Sent("basic.nack"), n)
	if proxy.Sent("basic.ack multiple") == 0 {
		t.Error("no multiple ack")
	}
}

func TestAckCoalescingOptionChecks(t *testing.T) {
	handle := func(context.Context, *amqp.Delivery) error { return nil }
	for _, tc := range []struct {
		opts []listener.Option
		want string
	}{
		{[]listener.Option{listener.WithAckCoalescing(1, time.Second)}, "WithAckCoalescing expects 2 to 65535 deliveries"},
		{[]listener.Option{listener.WithAckCoalescing(10, 0)}, "WithAckCoalescing expects a delay of 1ms to 1m0s, got 0s"},
		{[]listener.Option{listener.WithAckCoalescing(10, 2*time.Minute)}, "got 2m0s"},
		{[]listener.Option{listener.WithPrefetch(20), listener.WithAckCoalescing(30, time.Second)}, "WithAckCoalescing expects at most the prefetch (20) deliveries, got 30"},
		{[]listener.Option{listener.WithAckCoalescing(30, 30*time.Second), listener.WithConsumerTimeout(30 * time.Second)}, "WithAckCoalescing may hold its ack 30s more"},
	} {
		_, err := listener.New("q", nil, handle, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New = %v, want an error saying %q", err, tc.want)
		}
	}
	if _, err := listener.New("q", nil, handle, listener.WithAckCoalescing(62, 20*time.Millisecond)); err != nil {
		t.Errorf("New with WithAckCoalescing(62, 20ms) and the default prefetch: %v", err)
	}
}
