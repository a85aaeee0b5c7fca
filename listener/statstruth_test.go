package listener_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Stats says what the listener holds from the broker: with a backlog, two
// slow handlers and a prefetch of 20 on each of its two channels, the broker
// counts 40 messages unacknowledged, and so must Stats: 2 running and 38
// prefetched, the oldest of those waiting since the listener started. Before
// the read-ahead, Stats counted only the deliveries taken in (2), and their
// age from when they were taken in.
func TestStatsAgreeWithTheBrokersUnackedCount(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 100)
	release := make(chan struct{})
	begin := time.Now()
	r := start(t, q, nil, func(ctx context.Context, _ *amqp.Delivery) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(2), listener.WithPrefetch(20))
	t.Cleanup(func() { close(release) }) // before the listener's stop, which waits for the handlers

	// The broker's count comes from rabbitmqctl, which takes seconds a call
	// on RabbitMQ 4.3 under make test's load: 10 s allowed two polls there.
	var st listener.Stats
	var unacked int
	agreed := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st, unacked = r.Stats(), brokertest.Unacked(t, q); unacked == 40 && st.InFlight == 40 {
			agreed = true
			break
		}
	}
	if !agreed {
		t.Fatalf("after 30s the broker counts %d unacked and Stats %d in flight, want 40 both: %+v", unacked, st.InFlight, st)
	}
	time.Sleep(300 * time.Millisecond) // the prefetched ones age
	st = r.Stats()
	waited := time.Since(begin)
	t.Logf("broker: %d unacked; Stats: %+v", unacked, st)
	if st.InFlight != 40 || st.Running != 2 || st.Prefetched != 38 || st.Parked != 0 {
		t.Errorf("Stats: InFlight %d, Running %d, Prefetched %d, Parked %d; want 40, 2, 38, 0 (the broker counts %d unacked)",
			st.InFlight, st.Running, st.Prefetched, st.Parked, unacked)
	}
	if st.InFlight != st.Prefetched+st.Running+st.Parked {
		t.Errorf("InFlight %d is not Prefetched %d + Running %d + Parked %d", st.InFlight, st.Prefetched, st.Running, st.Parked)
	}
	if st.OldestPrefetched < 300*time.Millisecond || st.OldestPrefetched > waited {
		t.Errorf("OldestPrefetched = %v, want between 300ms and the %v since the listener started", st.OldestPrefetched, waited)
	}
	if st.OldestRunning < 300*time.Millisecond || st.OldestRunning > waited {
		t.Errorf("OldestRunning = %v, want between 300ms and %v", st.OldestRunning, waited)
	}
	if st.OldestInFlight < max(st.OldestPrefetched, st.OldestRunning) {
		t.Errorf("OldestInFlight = %v, younger than OldestPrefetched %v or OldestRunning %v", st.OldestInFlight, st.OldestPrefetched, st.OldestRunning)
	}
	if st.OldestParked != 0 {
		t.Errorf("OldestParked = %v with nothing parked, want 0", st.OldestParked)
	}
}

// A delivery waiting between retries is Parked, and its age OldestParked;
// with acks coalesced, a handled delivery whose ack waits is AcksPending,
// which the broker still counts unacked.
func TestStatsCountParkedAndPendingAcks(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "fails"}, amqp.Publishing{MessageId: "ok"})
	r := start(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(5*time.Second)), requeueExhausted()), func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "fails" {
			return errors.New("boom")
		}
		return nil
	}, listener.WithAckCoalescing(10, time.Minute), listener.WithPrefetch(40))

	var st listener.Stats
	brokertest.Eventually(t, 10*time.Second, "one parked, one handled", func() bool {
		st = r.Stats()
		return st.Parked == 1 && st.Handled == 0 && st.AcksPending == 1
	})
	time.Sleep(200 * time.Millisecond)
	st = r.Stats()
	if unacked := brokertest.Unacked(t, q); unacked != st.InFlight+st.AcksPending {
		t.Errorf("the broker counts %d unacked; Stats InFlight %d + AcksPending %d", unacked, st.InFlight, st.AcksPending)
	}
	if st.OldestParked < 200*time.Millisecond || st.Running != 0 || st.Prefetched != 0 || st.OldestRunning != 0 {
		t.Errorf("Stats = %s, want the parked one 200ms old or more, nothing running or prefetched", fmt.Sprintf("%+v", st))
	}
}
