package listener_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// In a pool of several slots, a reader whose handlers have been quick runs
// the next one itself, and a timer hands the reading on if a delivery stays
// on the reader (inlineWatch). A slow call among quick ones must not hold
// the channel's other deliveries back: while it blocks, the deliveries
// behind it on the same channel are all handled.
func TestASlowCallAmongQuickOnesHandsTheReadingOn(t *testing.T) {
	t.Parallel()
	const before, after = 200, 200
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	release := make(chan struct{})
	var released atomic.Bool
	defer func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}()
	var quick atomic.Int32
	r := start(t, q, middleware.Chain(), func(ctx context.Context, d *amqp.Delivery) error {
		if d.MessageId == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
		quick.Add(1)
		return nil
	}, listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(2), listener.WithPrefetch(before+after+1))
	msgs := make([]amqp.Publishing, 0, before+after+1)
	for range before {
		msgs = append(msgs, amqp.Publishing{MessageId: "quick"})
	}
	msgs = append(msgs, amqp.Publishing{MessageId: "slow"})
	for range after {
		msgs = append(msgs, amqp.Publishing{MessageId: "quick"})
	}
	brokertest.Publish(t, q, msgs...)
	brokertest.Eventually(t, 20*time.Second, "every quick message handled while the slow one blocks", func() bool {
		return quick.Load() == before+after
	})
	brokertest.Eventually(t, 5*time.Second, "only the slow one running", func() bool { return r.Stats().Running == 1 })
	released.Store(true)
	close(release)
	brokertest.Eventually(t, 10*time.Second, "the slow one handled too", func() bool { return r.Stats().Handled == before+after+1 })
}

// The timer that hands the reading on runs on a goroutine of its own, while
// the delivery's goroutine goes on through its chain, writing what the
// listener keeps of its recovery: the two must not race (go test -race).
// Quick successes keep the reader inline (a running mean of the handlers'
// time under 20 µs); every 30th message takes longer than the watch in its
// handler, so the timer fires, and then fails, so the chain goes on to its
// recoverer.
func TestTheInlineWatchDoesNotRaceTheChain(t *testing.T) {
	t.Parallel()
	const n, every = 2400, 30
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var recovered atomic.Int32
	counted := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error {
		recovered.Add(1)
		return nil // handled: acked
	})
	var i atomic.Int32
	r := start(t, q, middleware.Recover(counted), func(context.Context, *amqp.Delivery) error {
		if i.Add(1)%every == 0 {
			time.Sleep(2 * time.Millisecond) // past the watch's millisecond
			return errors.New("fails, slowly")
		}
		return nil
	}, listener.WithConcurrentConsumers(4), listener.WithMaxConcurrentConsumers(4))
	publishN(t, q, n)
	brokertest.Eventually(t, 30*time.Second, "every message settled", func() bool {
		st := r.Stats()
		return st.Handled == n && st.InFlight == 0
	})
	if recovered.Load() != n/every {
		t.Errorf("%d messages reached the recoverer, want %d", recovered.Load(), n/every)
	}
}
