package listener_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
)

// A dead letter is visible where an operator looks: one warning per dead
// letter (queue, message id, error type and text, attempts, destination), a
// Stats counter apart from Handled, the amqpretry.dead_lettered metric, and
// the chain's OnRecover hook. A hop to a broker-side retry tier is a
// recovery, not a dead letter.
func TestDeadLettersAreLoggedCountedAndTold(t *testing.T) {
	topo := dlx.Topology{Queue: brokertest.Name(t, "orders"), RetryDelays: []time.Duration{50 * time.Millisecond}}
	t.Cleanup(func() {
		for _, q := range []string{topo.Queue, topo.DLQ(), topo.RetryQueue(50 * time.Millisecond)} {
			brokertest.DeleteQueue(t, q)
		}
	})
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var mu sync.Mutex
	var events []middleware.RecoverEvent
	chain := middleware.Chain(
		middleware.Retry(2, middleware.WithInitialInterval(time.Millisecond)),
		middleware.Recover(topo.Tiers(pub, dlx.MaxRetries(1)), middleware.OnRecover(func(_ context.Context, e middleware.RecoverEvent) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
		})))
	handle := func(_ context.Context, d *amqp.Delivery) error {
		if d.MessageId == "bad" {
			var v any
			return fmt.Errorf("decode order: %w", json.Unmarshal([]byte("{"), &v))
		}
		return nil
	}
	var log testlog.Buffer
	o := observe(t)
	r := start(t, topo.Queue, chain, handle, append(o.options(), listener.WithDeclare(topo.Declare), listener.WithLogger(log.Logger()))...)
	brokertest.Eventually(t, 10*time.Second, "the work queue declared", func() bool { return brokertest.QueueExists(t, topo.Queue) })
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "bad", Body: []byte("{")}, amqp.Publishing{MessageId: "good", Body: []byte("{}")})
	brokertest.Eventually(t, 10*time.Second, "the dead letter on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	brokertest.Eventually(t, 5*time.Second, "settled", func() bool { return r.Stats().Handled == 3 })
	r.Stop(t)

	s := r.Stats()
	if s.Recovered != 2 || s.DeadLettered != 1 {
		t.Errorf("Stats: %d recovered, %d dead-lettered; want 2 (the tier hop and the dead letter) and 1", s.Recovered, s.DeadLettered)
	}
	if n := log.Count("message dead-lettered"); n != 1 {
		t.Fatalf("the dead letter was logged %d times, want once:\n%s", n, log.String())
	}
	for _, want := range []string{"message_id=bad", "error_type=*json.SyntaxError", "attempts=2", topo.DLX() + ", routing key ", "decode order: unexpected end of JSON input"} {
		if log.Count(want) != 1 {
			t.Errorf("the dead-letter log line lacks %s:\n%s", want, log.String())
		}
	}
	if n := o.sum(t, "amqpretry.dead_lettered"); n != 1 {
		t.Errorf("amqpretry.dead_lettered = %d, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0].Outcome != "recovered" || events[1].Outcome != "recovered" || events[1].Attempt != 2 || events[1].Delivery.MessageId != "bad" {
		t.Errorf("OnRecover told %+v, want two recoveries of bad after 2 attempts each", events)
	}
}
