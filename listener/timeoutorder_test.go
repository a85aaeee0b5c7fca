package listener_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// A Timeout around a Recover would loop: past its deadline the recoverer
// cannot run (its context has ended), so the message is requeued and runs
// again for ever. New refuses that order, naming it and the fix; the order
// it names (Timeout innermost) dead-letters a handler that always runs past
// the deadline, on the broker.
func TestTimeoutAroundRecoverIsRefused(t *testing.T) {
	q := brokertest.Name(t, "q")
	dlq := q + ".dlq"
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	republish := middleware.Recover(recoverer.Republish(pub, "", dlq))
	calls := make(chan struct{}, 100)
	slow := func(ctx context.Context, _ *amqp.Delivery) error {
		calls <- struct{}{}
		<-ctx.Done() // always past the deadline
		return ctx.Err()
	}
	retry := middleware.Retry(2, middleware.WithInitialInterval(10*time.Millisecond))
	for _, tt := range []struct {
		name string
		mw   middleware.Middleware
	}{
		{"around Retry and Recover", middleware.Chain(middleware.Timeout(300*time.Millisecond), retry, republish)},
		{"around Recover", middleware.Chain(middleware.Timeout(300*time.Millisecond), republish)},
		{"around a Chain that ends in Recover", middleware.Chain(middleware.Timeout(300*time.Millisecond), middleware.Chain(republish, retry))},
	} {
		_, err := listener.New(q, tt.mw, slow, listener.WithURL(brokertest.URL()))
		if err == nil {
			t.Errorf("%s: New succeeded, want the order refused", tt.name)
			continue
		}
		for _, want := range []string{"Timeout(300ms)", "Recover", "innermost"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: New = %v, want it to say %q", tt.name, err, want)
			}
		}
	}

	// The order New names: each attempt bounded, then the dead letter.
	r := start(t, q, middleware.Chain(retry, republish, middleware.Timeout(300*time.Millisecond)), slow)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "slow"})
	brokertest.Eventually(t, 10*time.Second, "the message dead-lettered", func() bool { return brokertest.Depth(t, dlq) == 1 })
	r.Stop(t)
	if n := len(calls); n != 2 {
		t.Errorf("the handler ran %d times, want 2 (Retry(2)) before the dead letter", n)
	}
	// A Timeout outside the Recover, bounding every attempt together, is a
	// choice New leaves alone.
	if _, err := listener.New(q, middleware.Chain(republish, middleware.Timeout(time.Second), retry), slow, listener.WithURL(brokertest.URL())); err != nil {
		t.Errorf("New(Recover, Timeout, Retry) = %v, want it accepted", err)
	}
}
