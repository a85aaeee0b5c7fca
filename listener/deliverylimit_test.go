package listener_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// What goes over the wire for each way a message goes back to its queue: a
// failure is basic.reject(requeue), which RabbitMQ 4.3 counts toward a quorum
// queue's delivery limit; a return that is not the message's fault (shutdown
// during a backoff, a wait for a worker, a delivery that arrives after the
// cancel) is basic.nack(requeue), which it does not count.
func TestFailuresAreRejectsAndReturnsAreNacks(t *testing.T) {
	t.Run("failure", func(t *testing.T) {
		q, proxy, url := recordedQueue(t)
		var calls atomic.Int64
		r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { calls.Add(1); return errors.New("boom") },
			listener.WithURL(url), listener.WithRequeueDelay(10*time.Minute, 10*time.Minute))
		publishN(t, q, 1)
		brokertest.Eventually(t, 10*time.Second, "the failure settled", func() bool { return proxy.Sent("basic.reject") == 1 })
		// The redelivery fails too and waits ten minutes before its requeue:
		// nothing else is settled until Stop, which may nack what it hands back.
		if n := proxy.Sent("basic.nack"); n != 0 {
			t.Errorf("%d nacks for a handler failure, want a reject", n)
		}
		r.Stop(t)
	})

	t.Run("shutdown", func(t *testing.T) {
		const n = 20
		q, proxy, url := recordedQueue(t)
		release := make(chan struct{})
		var calls atomic.Int64
		handle := func(ctx context.Context, d *amqp.Delivery) error {
			if calls.Add(1) == 1 {
				select { // holds the only worker until the shutdown cancels it
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return errors.New("fails, then waits ten minutes to retry")
		}
		chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Minute), middleware.WithMaxInterval(10*time.Minute)), requeueExhausted())
		r := start(t, q, chain, handle, listener.WithURL(url), listener.WithPrefetch(n),
			listener.WithShutdownTimeout(100*time.Millisecond))
		publishN(t, q, n)
		brokertest.Eventually(t, 10*time.Second, "the first handler running", func() bool { return calls.Load() == 1 })
		time.Sleep(100 * time.Millisecond) // the others arrive and wait for the worker
		r.Stop(t)
		close(release)
		brokertest.Eventually(t, 5*time.Second, "the frames through the proxy", func() bool { return proxy.Sent("basic.nack")+proxy.Sent("basic.reject") >= n })
		if got := proxy.Sent("basic.nack"); got != n {
			t.Errorf("%d nacks, want %d: every message went back through no fault of its own", got, n)
		}
		if got := proxy.Sent("basic.reject"); got != 0 {
			t.Errorf("%d rejects on shutdown, want none", got)
		}
		if got := brokertest.Depth(t, q); got != n {
			t.Errorf("queue holds %d, want all %d back", got, n)
		}
	})

	t.Run("shutdown during a backoff", func(t *testing.T) {
		const n = 5
		q, proxy, url := recordedQueue(t)
		var calls atomic.Int64
		chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Minute), middleware.WithMaxInterval(10*time.Minute)), requeueExhausted())
		r := start(t, q, chain, func(context.Context, *amqp.Delivery) error { calls.Add(1); return errors.New("boom") },
			listener.WithURL(url), listener.WithPrefetch(n))
		publishN(t, q, n)
		brokertest.Eventually(t, 10*time.Second, "every message in its backoff", func() bool { return calls.Load() == n })
		r.Stop(t)
		brokertest.Eventually(t, 5*time.Second, "the frames through the proxy", func() bool { return proxy.Sent("basic.nack")+proxy.Sent("basic.reject") >= n })
		if got, rejects := proxy.Sent("basic.nack"), proxy.Sent("basic.reject"); got != n || rejects != 0 {
			t.Errorf("%d nacks and %d rejects, want %d nacks: a backoff cut short by shutdown is not a failure", got, rejects, n)
		}
	})
}

// recordedQueue declares a queue and a fault proxy that counts the methods
// sent through it.
func recordedQueue(t *testing.T) (string, *faultproxy.Proxy, string) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	return q, proxy, url
}

// RabbitMQ 4 gives every quorum queue a delivery limit of 20 and counts each
// requeue (reject or, before 4.3, nack) as a delivery. A message that keeps
// failing without a recoverer is requeued until the broker gives up on it:
// with dlx.Topology it is dead-lettered to the DLQ, never dropped; on a
// quorum queue without a dead-letter exchange RabbitMQ 4 drops it. 3.10 has
// no default limit.
func TestRequeuedPastTheDeliveryLimit(t *testing.T) {
	major := brokertest.Major(t)
	type result struct {
		calls        int64
		work, dlq    int
		reason       any
		deadLettered bool
	}
	// run requeues one always-failing message until it leaves the work
	// queue, or until it has been delivered limit+5 times.
	run := func(t *testing.T, topo dlx.Topology, expect int) result {
		t.Cleanup(func() { brokertest.DeleteQueue(t, topo.Queue); brokertest.DeleteQueue(t, topo.DLQ()) })
		if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int64
		r := start(t, topo.Queue, nil, func(context.Context, *amqp.Delivery) error { calls.Add(1); return errors.New("always fails") },
			listener.WithRequeueDelay(0, 0))
		publishN(t, topo.Queue, 1)
		brokertest.Eventually(t, 30*time.Second, fmt.Sprintf("%d deliveries", expect), func() bool { return calls.Load() >= int64(expect) })
		time.Sleep(300 * time.Millisecond) // a further delivery would come now
		r.Stop(t)
		// A quorum queue counts the message Stop handed back a moment later:
		// read the depths once they show it, or after 5s whatever they say.
		var res result
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			res = result{calls: calls.Load(), work: brokertest.Depth(t, topo.Queue), dlq: brokertest.Depth(t, topo.DLQ())}
			if res.work+res.dlq > 0 || time.Now().After(deadline) {
				break
			}
		}
		if res.dlq == 1 {
			d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.DLQ())
			res.reason, res.deadLettered = d.Headers["x-first-death-reason"], true
		}
		return res
	}

	t.Run("explicit limit", func(t *testing.T) {
		topo := dlx.Topology{Queue: brokertest.Name(t, "work"), Type: dlx.Quorum, DeliveryLimit: 3}
		got := run(t, topo, 4)
		if got.calls != 4 || got.work != 0 || got.dlq != 1 || got.reason != "delivery_limit" {
			t.Fatalf("%+v; want 4 deliveries (the first and 3 requeues), then the message on the DLQ with reason delivery_limit", got)
		}
	})

	t.Run("default limit", func(t *testing.T) {
		topo := dlx.Topology{Queue: brokertest.Name(t, "work"), Type: dlx.Quorum}
		if major < 4 {
			got := run(t, topo, 25)
			if got.work != 1 || got.dlq != 0 {
				t.Fatalf("%+v; RabbitMQ 3 has no default delivery limit: the message should still be on the work queue", got)
			}
			return
		}
		got := run(t, topo, 21)
		if got.calls != 21 || got.work != 0 || got.dlq != 1 || got.reason != "delivery_limit" {
			t.Fatalf("%+v; want 21 deliveries, then the message on the DLQ with reason delivery_limit (RabbitMQ 4's default limit is 20)", got)
		}
	})

	t.Run("no dead-letter exchange", func(t *testing.T) {
		q := brokertest.Name(t, "q")
		brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
		var calls atomic.Int64
		r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { calls.Add(1); return errors.New("always fails") },
			listener.WithRequeueDelay(0, 0))
		publishN(t, q, 1)
		brokertest.Eventually(t, 30*time.Second, "21 deliveries", func() bool { return calls.Load() >= 21 })
		time.Sleep(300 * time.Millisecond)
		r.Stop(t)
		// The message Stop handed back shows on a quorum queue a moment
		// later: on 3.10 wait for it (5s at most).
		depth := brokertest.Depth(t, q)
		for deadline := time.Now().Add(5 * time.Second); major < 4 && depth == 0 && time.Now().Before(deadline); depth = brokertest.Depth(t, q) {
			time.Sleep(50 * time.Millisecond)
		}
		if major >= 4 && (calls.Load() != 21 || depth != 0) {
			t.Fatalf("%d deliveries, %d left: RabbitMQ 4 drops the message after 21 deliveries when the queue has no dead-letter exchange", calls.Load(), depth)
		}
		if major < 4 && depth != 1 {
			t.Fatalf("%d left on the queue: RabbitMQ 3 has no default limit and keeps it", depth)
		}
	})
}

// The requeue delay doubles with x-delivery-count, on RabbitMQ 4 as on 3.10:
// both leave it out of a consumer's first delivery and count from 1 after.
func TestRequeueDelayFollowsTheDeliveryCount(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
	var mu sync.Mutex
	var at []time.Time
	var counts []any
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		at, counts = append(at, time.Now()), append(counts, d.Headers["x-delivery-count"])
		return errors.New("fails")
	}, listener.WithRequeueDelay(50*time.Millisecond, 400*time.Millisecond))
	publishN(t, q, 1)
	brokertest.Eventually(t, 10*time.Second, "6 deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(at) >= 6 })
	r.Stop(t)
	mu.Lock()
	defer mu.Unlock()
	// The delay before a requeue follows the count of the delivery that
	// failed: none for the first (not redelivered), then 50, 100, 200, 400 ms.
	want := []time.Duration{0, 50, 100, 200, 400}
	for i, w := range want {
		gap := at[i+1].Sub(at[i])
		if gap < w*time.Millisecond {
			t.Errorf("delivery %d came %v after the one before, want at least %vms (x-delivery-count %v)", i+2, gap, w, counts[i])
		}
	}
	if gap := at[5].Sub(at[4]); gap > 2*time.Second {
		t.Errorf("the delay grew to %v; it is capped at 400ms", gap)
	}
	t.Logf("x-delivery-count by delivery: %v", counts)
}

// The listener cannot read a queue's delivery limit over AMQP; the first
// x-delivery-count it sees tells it the queue counts deliveries, and it says
// so once.
func TestQuorumQueueLogsThatItCountsDeliveries(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
	log := &testlog.Buffer{}
	var calls atomic.Int64
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error {
		if calls.Add(1) <= 3 {
			return errors.New("fails three times")
		}
		return nil
	}, listener.WithRequeueDelay(0, 0), listener.WithLogger(log.Logger()))
	publishN(t, q, 2)
	brokertest.Eventually(t, 10*time.Second, "both handled", func() bool { return r.Stats().Handled == 2 })
	r.Stop(t)
	if n := log.Count("counts deliveries"); n != 1 {
		t.Fatalf("logged %d times that the queue counts deliveries, want once:\n%s", n, log.String())
	}
}
