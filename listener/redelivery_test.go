package listener_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// Without a Recover in the chain, a delivery at the limit is rejected
// without requeue before the handler runs: here a quorum queue dead-letters
// it to its DLQ. Requeues after failures count as deliveries too, so the
// limit also ends a requeue loop. The process span records why.
func TestRedeliveryLimitWithoutRecovererRejects(t *testing.T) {
	o := observe(t)
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	var calls atomic.Int64
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { calls.Add(1); return errors.New("down") },
		append(o.options(), listener.WithRedeliveryLimit(2), listener.WithRequeueDelay(0, 0))...)
	publishN(t, q, 1)
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	r.Stop(t)
	if got := calls.Load(); got != 2 {
		t.Errorf("the handler ran %d times, want 2: the third delivery (x-delivery-count 2) must not reach it", got)
	}
	var found bool
	for _, s := range o.named("process " + q) {
		for _, e := range s.Events() {
			if e.Name != listener.EventRedeliveryLimit {
				continue
			}
			found = true
			for _, kv := range e.Attributes {
				if (string(kv.Key) == listener.AttrDeliveryCount || string(kv.Key) == listener.AttrRedeliveryLimit) && kv.Value.AsInt64() != 2 {
					t.Errorf("event attribute %s = %v, want 2", kv.Key, kv.Value.AsInt64())
				}
			}
			if want := "*listener.RedeliveryLimitError"; attr(s, "error.type").AsString() != want {
				t.Errorf("error.type = %q, want %q", attr(s, "error.type").AsString(), want)
			}
			if got := s.Status().Description; !strings.Contains(got, "redelivery limit reached") {
				t.Errorf("span status %q does not say why", got)
			}
		}
	}
	if !found {
		t.Errorf("no process span has a %q event", listener.EventRedeliveryLimit)
	}
}

// Classic queues report no x-delivery-count: the limit cannot act, the
// handler runs, and the log says so once.
func TestRedeliveryLimitOnAClassicQueueSaysItCannotAct(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var log testlog.Buffer
	var calls atomic.Int64
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error {
		if calls.Add(1) < 4 {
			return errors.New("not yet")
		}
		return nil
	}, listener.WithRedeliveryLimit(1), listener.WithRequeueDelay(0, 0), listener.WithLogger(log.Logger()))
	publishN(t, q, 1)
	brokertest.Eventually(t, 10*time.Second, "the message handled", func() bool { return r.Stats().Handled == 1 })
	r.Stop(t)
	if n := log.Count("WithRedeliveryLimit cannot act on this queue"); n != 1 {
		t.Errorf("the log says %d times that the limit cannot act, want once:\n%s", n, log.String())
	}
}

// The careful start ends after a second with no handler running: a
// delivery waiting between its retries is not running, and does not hold
// the careful consumer open until its last retry (3 s, then 6 s here).
// Fresh messages behind it are handled within a few seconds.
func TestCarefulStartEndsWhileADeliveryWaitsBetweenRetries(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
	first := make(chan time.Time, 1)
	var once atomic.Bool
	handle := func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "0" {
			return errors.New("fails every time")
		}
		if once.CompareAndSwap(false, true) {
			first <- time.Now()
		}
		return nil
	}
	publishN(t, q, 6) // "0" fails and waits between its retries; 1 to 5 are fresh
	begin := time.Now()
	start(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(3*time.Second))), handle,
		listener.WithRedeliveryLimit(5), listener.WithConsumerTimeout(time.Hour))
	select {
	case at := <-first:
		if took := at.Sub(begin); took > 4*time.Second {
			t.Errorf("the first fresh message was handled %v after the start, want under 4s (the careful start ends a second after the last handler ran)", took.Round(time.Millisecond))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no fresh message handled within 15s")
	}
}
