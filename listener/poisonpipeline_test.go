package listener_test

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// poisonFlood starts a listener on a queue whose messages all fail for
// good, dead-lettered by recoverer.Republish to a DLQ through a publisher
// whose connection goes through a fault proxy.
func poisonFlood(t *testing.T, prefetch int, publishTimeout time.Duration) (r *running, q, dlq string, pproxy *faultproxy.Proxy) {
	t.Helper()
	return poisonFloodTo(t, poisonSetup{prefetch: prefetch, publishTimeout: publishTimeout})
}

type poisonSetup struct {
	prefetch       int
	publishTimeout time.Duration
	dlqArgs        amqp.Table    // the DLQ's arguments
	key            string        // the copies' routing key on the default exchange; "" the DLQ's name
	heartbeat      time.Duration // the publisher's; 0: 1 s, so that a frozen connection is given up quickly
	opts           []listener.Option
}

func poisonFloodTo(t *testing.T, ps poisonSetup) (r *running, q, dlq string, pproxy *faultproxy.Proxy) {
	t.Helper()
	q, dlq = brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, ps.dlqArgs)
	proxy, url := brokertest.Proxy(t)
	p, err := publisher.New(url, publisher.WithLogger(slog.New(slog.DiscardHandler)), publisher.WithHeartbeat(cmp.Or(ps.heartbeat, time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	key := cmp.Or(ps.key, dlq)
	rec := recoverer.Republish(p, "", key, recoverer.WithPublishTimeout(ps.publishTimeout))
	opts := append([]listener.Option{listener.WithPrefetch(ps.prefetch), listener.WithRequeueDelay(10*time.Millisecond, 50*time.Millisecond)}, ps.opts...)
	r = start(t, q, middleware.Recover(rec), func(context.Context, *amqp.Delivery) error {
		return middleware.Permanent(errors.New("poison"))
	}, opts...)
	return r, q, dlq, proxy
}

// The poison path is pipelined: a listener republishing dead letters does
// not park a goroutine per message on its own confirm (it used to: a
// delivery's goroutine waited for its copy's confirm, 300 of them with a
// prefetch of 300). With every confirm held back, all 300 copies are in
// flight at once while the reader goes on; each original is acked when its
// copy's confirm arrives.
func TestPoisonRepublishesArePipelined(t *testing.T) {
	const n = 300
	before := runtime.NumGoroutine()
	// A heartbeat long enough that holding the connection does not end it.
	r, q, dlq, proxy := poisonFloodTo(t, poisonSetup{prefetch: n, publishTimeout: 30 * time.Second, heartbeat: 10 * time.Second})
	proxy.Blackhole(true)
	publishN(t, q, n)
	brokertest.Eventually(t, 20*time.Second, "every copy in flight, none confirmed", func() bool { return r.Stats().Parked == n })
	peak := 0
	for range 20 {
		peak = max(peak, runtime.NumGoroutine())
		time.Sleep(5 * time.Millisecond)
	}
	proxy.Blackhole(false)
	brokertest.Eventually(t, 30*time.Second, "every original acked", func() bool {
		st := r.Stats()
		return st.InFlight == 0 && st.DeadLettered == n
	})
	t.Logf("%d dead letters waiting for their confirms at once: %d goroutines, %d before the listener started", n, peak, before)
	if extra := peak - before; extra > 40 {
		t.Errorf("%d goroutines more than before the listener started with %d copies awaiting their confirms: one waits per copy", extra, n)
	}
	if d := brokertest.Depth(t, dlq); d != n {
		t.Errorf("the DLQ holds %d, want %d", d, n)
	}
	if d := brokertest.Depth(t, q); d != 0 {
		t.Errorf("the queue holds %d, want 0", d)
	}
}

// An original is acked only after its copy's confirm: with the publisher's
// connection frozen, none is, however long the listener runs on; each stays
// unacked until its publish times out, then goes back to the queue, and
// reaches the DLQ once the connection thaws.
func TestPoisonOriginalsWaitForTheirCopiesConfirm(t *testing.T) {
	t.Parallel()
	const n = 40
	r, q, dlq, proxy := poisonFlood(t, n, 2*time.Second)
	proxy.Blackhole(true)
	publishN(t, q, n)
	brokertest.Eventually(t, 10*time.Second, "every delivery waiting for its copy's confirm", func() bool {
		return r.Stats().Parked == n
	})
	time.Sleep(500 * time.Millisecond)
	if st := r.Stats(); st.Handled != 0 || st.DeadLettered != 0 {
		t.Errorf("with no confirm, Stats says %d handled and %d dead-lettered; want none acked", st.Handled, st.DeadLettered)
	}
	if u := brokertest.Unacked(t, q); u != n {
		t.Errorf("the broker counts %d unacked, want all %d", u, n)
	}
	brokertest.Eventually(t, 10*time.Second, "the publishes timed out and the originals went back", func() bool {
		return r.Stats().Requeued >= n
	})
	proxy.Blackhole(false)
	brokertest.Eventually(t, 30*time.Second, "every message on the DLQ, none left", func() bool {
		return brokertest.Depth(t, dlq) >= n && r.Stats().InFlight == 0 && brokertest.Depth(t, q) == 0
	})
	seen := drained(t, dlq)
	if seen.distinct() != n {
		t.Errorf("%d distinct messages on the DLQ, want %d", seen.distinct(), n)
	}
	t.Logf("%d on the DLQ (%d duplicates: copies stored before their confirm was lost)", n+seen.duplicates(), seen.duplicates())
}

// A shutdown in the middle of a pipelined poison flood loses nothing: what
// was not confirmed goes back to the queue.
func TestPoisonFloodShutdownLosesNothing(t *testing.T) {
	t.Parallel()
	const n = 200
	r, q, dlq, proxy := poisonFloodTo(t, poisonSetup{prefetch: 50, publishTimeout: 30 * time.Second, heartbeat: 10 * time.Second})
	// Every confirm held until a prefetch of copies is in flight, then let
	// go as the shutdown begins: it meets copies in every state.
	proxy.Blackhole(true)
	publishN(t, q, n)
	// At least a prefetch: the scaler may have opened a second channel
	// (and its prefetch) by then.
	brokertest.Eventually(t, 20*time.Second, "copies in flight", func() bool { return r.Stats().Parked >= 50 })
	proxy.Blackhole(false)
	r.Stop(t)
	seen := drained(t, dlq, q)
	if seen.distinct() != n {
		t.Errorf("%d of %d messages are on the queue or the DLQ after a shutdown mid-flood", seen.distinct(), n)
	}
	t.Logf("after the shutdown: %d distinct, %d duplicated (a copy confirmed as its channel closed)", seen.distinct(), seen.duplicates())
}

// The pipelined poison path under faults: a copy nacked or returned sends
// its original back, alone, and it is not lost; a cut connection, the
// publisher's or the listener's, in the middle of a flood loses nothing.
func TestPoisonFloodUnderFaults(t *testing.T) {
	t.Parallel()
	t.Run("copies nacked", func(t *testing.T) {
		t.Parallel()
		// The DLQ takes 10 and nacks every publish past them.
		r, q, dlq, _ := poisonFloodTo(t, poisonSetup{prefetch: 50, publishTimeout: 5 * time.Second,
			dlqArgs: amqp.Table{"x-max-length": int64(10), "x-overflow": "reject-publish"}})
		publishN(t, q, 50)
		brokertest.Eventually(t, 20*time.Second, "10 dead-lettered, the rest back to the queue again and again", func() bool {
			st := r.Stats()
			return st.DeadLettered == 10 && st.Requeued >= 80
		})
		r.Stop(t)
		if d := brokertest.Depth(t, dlq); d != 10 {
			t.Errorf("the DLQ holds %d, want the 10 it takes", d)
		}
		if d := brokertest.Depth(t, q); d != 40 {
			t.Errorf("the queue holds %d after the stop, want the 40 the DLQ refused", d)
		}
	})
	t.Run("copies returned", func(t *testing.T) {
		t.Parallel()
		// No queue has the name the copies are published to.
		r, q, dlq, _ := poisonFloodTo(t, poisonSetup{prefetch: 50, publishTimeout: 5 * time.Second, key: brokertest.Name(t, "nowhere")})
		publishN(t, q, 50)
		brokertest.Eventually(t, 20*time.Second, "every message back to the queue, twice", func() bool { return r.Stats().Requeued >= 100 })
		r.Stop(t)
		if st := r.Stats(); st.DeadLettered != 0 || st.Handled != 0 {
			t.Errorf("Stats: %d dead-lettered, %d handled with every copy returned; want none", st.DeadLettered, st.Handled)
		}
		if d, dq := brokertest.Depth(t, q), brokertest.Depth(t, dlq); d != 50 || dq != 0 {
			t.Errorf("the queue holds %d and the DLQ %d, want 50 and 0", d, dq)
		}
	})
	t.Run("publisher's connection cut", func(t *testing.T) {
		t.Parallel()
		const n = 300
		r, q, dlq, proxy := poisonFloodTo(t, poisonSetup{prefetch: n, publishTimeout: 30 * time.Second, heartbeat: 10 * time.Second})
		// Every copy in flight, then the confirms let go and the
		// connection cut as they come.
		proxy.Blackhole(true)
		publishN(t, q, n)
		brokertest.Eventually(t, 20*time.Second, "every copy in flight", func() bool { return r.Stats().Parked == n })
		proxy.Blackhole(false)
		proxy.CutAll()
		brokertest.Eventually(t, 60*time.Second, "every message dead-lettered", func() bool {
			return r.Stats().InFlight == 0 && brokertest.Depth(t, q) == 0 && brokertest.Depth(t, dlq) >= n
		})
		seen := drained(t, dlq)
		if seen.distinct() != n {
			t.Errorf("%d distinct messages on the DLQ, want %d", seen.distinct(), n)
		}
		t.Logf("cut mid-flood: %d on the DLQ, %d of them duplicates (copies re-sent after the cut)", n+seen.duplicates(), seen.duplicates())
	})
	t.Run("listener's connection cut", func(t *testing.T) {
		t.Parallel()
		const n = 300
		name := brokertest.Name(t, "listener")
		// A heartbeat long enough that holding the confirms back does not
		// end the publisher's connection before every copy is in flight.
		r, q, dlq, proxy := poisonFloodTo(t, poisonSetup{prefetch: n, publishTimeout: 30 * time.Second, heartbeat: 10 * time.Second,
			opts: []listener.Option{listener.WithConnectionName(name)}})
		// No confirm comes until the cut is done (rabbitmqctl alone can
		// take longer than the flood): every original is unacked at the cut.
		proxy.Blackhole(true)
		publishN(t, q, n)
		brokertest.Eventually(t, 20*time.Second, "every copy in flight", func() bool { return r.Stats().Parked == n })
		if c := brokertest.CloseConnections(t, name); c != 1 {
			t.Fatalf("closed %d connections, want the listener's one", c)
		}
		proxy.Blackhole(false)
		brokertest.Eventually(t, 60*time.Second, "every message dead-lettered", func() bool {
			return r.Stats().InFlight == 0 && brokertest.Depth(t, q) == 0 && brokertest.Depth(t, dlq) >= n
		})
		seen := drained(t, dlq)
		if seen.distinct() != n {
			t.Errorf("%d distinct messages on the DLQ, want %d", seen.distinct(), n)
		}
		t.Logf("listener cut mid-flood: %d on the DLQ, %d of them duplicates (originals the cut handed back, dead-lettered again)", n+seen.duplicates(), seen.duplicates())
	})
}

// drained takes every message off the queues and counts their ids.
func drained(t *testing.T, queues ...string) *seen {
	t.Helper()
	s := newSeen()
	for _, q := range queues {
		for _, id := range drain(t, q) {
			s.add(id)
		}
	}
	return s
}
