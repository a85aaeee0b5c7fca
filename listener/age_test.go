package listener_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

const nearTimeout = "a delivery has been unsettled for most of the broker's consumer_timeout"

// New checks what it can know, a Retry's waits (2s here, under the consumer
// timeout of 3s). The rest is only known at run time: the listener warns,
// once per delivery, when a delivery in flight reaches 80% of the timeout,
// whether it is parked between attempts or in its handler, and Stats shows
// the oldest one's age.
func TestWarnsWhenADeliveryNearsTheConsumerTimeout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		mw     middleware.Middleware
		handle middleware.Handler
		oldest time.Duration
	}{
		{"retry waits plus handler time", middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(2*time.Second)), requeueExhausted()),
			func(ctx context.Context, d *amqp.Delivery) error {
				time.Sleep(600 * time.Millisecond)
				if middleware.Attempt(ctx) == 1 {
					return errors.New("not yet")
				}
				return nil
			}, 2 * time.Second},
		{"a slow handler", nil, func(context.Context, *amqp.Delivery) error {
			time.Sleep(2700 * time.Millisecond)
			return nil
		}, 2 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, nil)
			brokertest.Publish(t, q, amqp.Publishing{MessageId: "slow"})
			var logs testlog.Buffer
			oldest := time.Duration(0)
			r := start(t, q, tt.mw, tt.handle, listener.WithConsumerTimeout(3*time.Second), listener.WithLogger(logs.Logger()))
			brokertest.Eventually(t, 10*time.Second, "handled", func() bool {
				oldest = max(oldest, r.Stats().OldestInFlight)
				return r.Stats().Handled == 1
			})
			r.Stop(t)
			if n := logs.Count(nearTimeout); n != 1 {
				t.Fatalf("the warning was logged %d times, want once:\n%s", n, logs.String())
			}
			for _, want := range []string{"queue=" + q, "message_id=slow", "consumer_timeout=3s"} {
				if logs.Count(want) == 0 {
					t.Errorf("the log does not name %q:\n%s", want, logs.String())
				}
			}
			if oldest < tt.oldest {
				t.Errorf("Stats().OldestInFlight peaked at %v, want at least %v", oldest, tt.oldest)
			}
			if r.Stats().OldestInFlight != 0 {
				t.Errorf("OldestInFlight = %v with nothing in flight, want 0", r.Stats().OldestInFlight)
			}
		})
	}
}

// The last deliveries of a full prefetch wait in the client for the
// handlers of all the others: prefetch 10 × 300 ms is 3 s, the whole
// consumer timeout. The listener warns about that, once, from the handlers'
// mean time; and since a delivery's age runs from its arrival (the broker's
// timer starts then), the last ones are reported old as they near it, the
// first ones, done within 1.5 s, not.
func TestWarnsWhenThePrefetchAloneOutlastsTheConsumerTimeout(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 10)
	var logs testlog.Buffer
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { time.Sleep(300 * time.Millisecond); return nil },
		listener.WithPrefetch(10), listener.WithConsumerTimeout(3*time.Second), listener.WithLogger(logs.Logger()))
	brokertest.Eventually(t, 10*time.Second, "handled", func() bool { return r.Stats().Handled == 10 })
	r.Stop(t)
	const warning = "the last delivery of a full prefetch waits most of the broker's consumer_timeout"
	if n := logs.Count(warning); n != 1 {
		t.Fatalf("the prefetch warning was logged %d times, want once:\n%s", n, logs.String())
	}
	for _, want := range []string{"prefetch=10", "mean_handler_time=3", "consumer_timeout=3s"} {
		if logs.Count(want) == 0 {
			t.Errorf("the log does not name %q:\n%s", want, logs.String())
		}
	}
	if n := logs.Count(nearTimeout); n == 0 {
		t.Errorf("no delivery was reported old; the last ones waited 2.4s or more since they arrived:\n%s", logs.String())
	}
	for id := range 5 {
		if logs.Count(fmt.Sprintf("message_id=%d ", id)) != 0 {
			t.Errorf("message %d was reported old, done within 1.5s of its arrival:\n%s", id, logs.String())
		}
	}
}
