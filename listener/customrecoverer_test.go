package listener_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// A service's own recoverer (a table of failures, a DLQ of its own) puts
// the message somewhere safe as Republish does: the listener counts it,
// logs it and tells the metric, whether or not the recoverer says where.
// One that says it handed the message to another try is a recovery, not a
// dead letter.
func TestCustomRecoverersAreCountedAndLogged(t *testing.T) {
	for _, c := range []struct {
		name             string
		tell             func(ctx context.Context)
		deadLettered     uint64
		logged, loggedTo string
	}{
		{"silent", func(context.Context) {}, 1, "message dead-lettered", "to=\"(not said by the recoverer"},
		{"dead letter", func(ctx context.Context) { middleware.DeadLettered(ctx, "failures table") }, 1, "message dead-lettered", "to=\"failures table\""},
		{"retry", func(ctx context.Context) { middleware.RetryScheduled(ctx, "the scheduler") }, 0, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, nil)
			var mu sync.Mutex
			var stored []string
			rec := middleware.RecovererFunc(func(ctx context.Context, d *amqp.Delivery, cause error) error {
				mu.Lock()
				stored = append(stored, d.MessageId)
				mu.Unlock()
				c.tell(ctx)
				return nil
			})
			handle := func(_ context.Context, d *amqp.Delivery) error {
				if d.MessageId == "bad" {
					return errors.New("no such customer")
				}
				return nil
			}
			var log testlog.Buffer
			o := observe(t)
			chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)), middleware.Recover(rec))
			r := start(t, q, chain, handle, append(o.options(), listener.WithLogger(log.Logger()))...)
			brokertest.Publish(t, q, amqp.Publishing{MessageId: "bad"}, amqp.Publishing{MessageId: "good"})
			brokertest.Eventually(t, 10*time.Second, "both settled", func() bool { return r.Stats().Handled == 2 })
			r.Stop(t)
			s := r.Stats()
			if s.Recovered != 1 || s.DeadLettered != c.deadLettered {
				t.Errorf("Stats: %d recovered, %d dead-lettered; want 1 and %d", s.Recovered, s.DeadLettered, c.deadLettered)
			}
			if n := o.sum(t, "amqpretry.dead_lettered"); n != int64(c.deadLettered) {
				t.Errorf("amqpretry.dead_lettered = %d, want %d", n, c.deadLettered)
			}
			if c.logged != "" {
				for _, want := range []string{c.logged, c.loggedTo, "message_id=bad", "attempts=2", "no such customer"} {
					if log.Count(want) != 1 {
						t.Errorf("the log lacks %s once:\n%s", want, log.String())
					}
				}
			}
		})
	}
}
