package listener_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// A message whose headers amqp091-go cannot parse closes the listener's
// connection as it arrives, and on redial it is first again: the listener
// must not hammer the broker while it blocks every message behind it. After
// the first such loss it reads through a guard that replaces the headers
// it cannot read, rejects that message without requeue (the queue's
// dead-letter exchange gets it as it was sent), says so, and handles the
// healthy ones behind it.
func TestUnreadableHeadersDoNotBlockTheQueue(t *testing.T) {
	for _, quorum := range []bool{false, true} {
		t.Run(fmt.Sprintf("quorum=%v", quorum), func(t *testing.T) {
			q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
			brokertest.Queue(t, dlq, nil)
			args := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
			if quorum {
				args["x-queue-type"] = "quorum"
			}
			brokertest.Queue(t, q, args)
			msgs := []amqp.Publishing{{MessageId: "unreadable", Headers: amqp.Table{"deep": brokertest.HeadersTooDeep()}}}
			for i := range 5 {
				msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint("ok-", i), Headers: amqp.Table{"n": int64(i)}})
			}
			brokertest.Publish(t, q, msgs...)
			var handled atomic.Int32
			var log testlog.Buffer
			r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { handled.Add(1); return nil }, listener.WithLogger(log.Logger()))
			brokertest.Eventually(t, 20*time.Second, "the five healthy messages handled", func() bool { return handled.Load() == 5 })
			brokertest.Eventually(t, 10*time.Second, "the unreadable one on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
			r.Stop(t)
			if n := log.Count("connection problem; redialing"); n > 1 {
				t.Errorf("%d redials: the listener kept meeting the message", n)
			}
			if log.Count("message_id=unreadable") == 0 || log.Count("cannot read its headers") == 0 {
				t.Errorf("the log does not name the message it rejected:\n%s", log.String())
			}
			if st := r.Stats(); st.Rejected != 1 || st.LastConnectionError == "" {
				t.Errorf("Stats: %d rejected, last connection error %q; want 1 and the frame error", st.Rejected, st.LastConnectionError)
			}
		})
	}
}
