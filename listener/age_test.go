package listener_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// New checks what it can know, the Retry's waits (2s here, under the
// consumer timeout of 3s). The handler's time on every attempt comes on top
// and is only known at run time: the listener warns, once, when the oldest
// delivery in flight reaches 80% of the timeout, and Stats shows its age.
func TestWarnsWhenADeliveryNearsTheConsumerTimeout(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "slow"})
	var logs logBuffer
	oldest := time.Duration(0)
	r := start(t, q, middleware.Retry(2, middleware.WithInitialInterval(2*time.Second)),
		func(ctx context.Context, d *amqp.Delivery) error {
			time.Sleep(600 * time.Millisecond)
			if middleware.Attempt(ctx) == 1 {
				return errors.New("not yet")
			}
			return nil
		},
		listener.WithConsumerTimeout(3*time.Second), listener.WithLogger(logs.logger()))
	brokertest.Eventually(t, 10*time.Second, "handled on the second attempt", func() bool {
		oldest = max(oldest, r.Stats().OldestInFlight)
		return r.Stats().Handled == 1
	})
	r.Stop(t)
	const warning = "a delivery has been unsettled for most of the broker's consumer_timeout"
	if n := logs.count(warning); n != 1 {
		t.Fatalf("the warning was logged %d times, want once:\n%s", n, logs.String())
	}
	for _, want := range []string{"queue=" + q, "message_id=slow", "consumer_timeout=3s"} {
		if logs.count(want) == 0 {
			t.Errorf("the log does not name %q:\n%s", want, logs.String())
		}
	}
	if oldest < 2*time.Second {
		t.Errorf("Stats().OldestInFlight peaked at %v, want at least the 2s wait", oldest)
	}
	if r.Stats().OldestInFlight != 0 {
		t.Errorf("OldestInFlight = %v with nothing in flight, want 0", r.Stats().OldestInFlight)
	}
}
