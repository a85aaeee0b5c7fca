package dlx_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The last delivery's publish to the DLQ times out (the publisher's
// connection stalls for its publish timeout): the listener hands the message
// back uncounted (a nack, not the reject that would use up the last
// delivery), so the next delivery is the last again and publishes the dead
// letter with its fault headers, rather than the broker dead-lettering it
// bare past its x-delivery-limit.
func TestLastRedeliverysFailedPublishIsTriedAgain(t *testing.T) {
	r := newRedeliveryRig(t)
	r.pub.n = 1
	r.pub.before = func() { r.pproxy.Blackhole(true) }
	r.pub.after = func() { r.pproxy.Blackhole(false) }
	defer r.run(t)()
	brokertest.Publish(t, r.topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	dead := r.deadLetters(t)
	// The publish that timed out may still land (its confirm came late):
	// then the DLQ holds that copy too, with its headers as well.
	if len(dead) == 0 || len(dead) > 2 || withFaultHeaders(dead) != len(dead) {
		t.Errorf("%d copies on the DLQ, %d with fault headers: want every copy with them (a bare one: the failed publish used up the last delivery)", len(dead), withFaultHeaders(dead))
	}
	if got := r.pub.calls.Load(); got < 2 {
		t.Errorf("%d publishes to the DLQ, want the failed one and the one after it", got)
	}
}

// A message whose per-message TTL would run out while it waits in the
// broker's delay is dead-lettered now, by the recoverer, with its fault
// headers, rather than delivered once and then expiring inside the delay
// onto the DLQ as "expired", without them and without a word.
func TestShortTTLMessageIsDeadLetteredBeforeTheDelay(t *testing.T) {
	if !brokertest.AtLeast(t, 4, 3) {
		t.Skip("RabbitMQ 4.3's delayed retry; the tiers move the expiration aside")
	}
	topo := topology(t, dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 3, Min: 2 * time.Second}})
	pub, err := publisher.New(brokertest.URL(), publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var calls atomic.Int32
	stop := runListener(t, topo, middleware.Recover(topo.Redeliver(pub)), func(context.Context, *amqp.Delivery) error {
		calls.Add(1)
		return errors.New("boom")
	}, listener.WithLogger(quiet))
	defer stop()
	brokertest.Eventually(t, 10*time.Second, "the work queue declared", func() bool { return brokertest.QueueExists(t, topo.Queue) })
	brokertest.Publish(t, topo.Queue,
		amqp.Publishing{MessageId: "short", Expiration: "500", DeliveryMode: amqp.Persistent},
		amqp.Publishing{MessageId: "long", Expiration: "600000", DeliveryMode: amqp.Persistent})
	brokertest.Eventually(t, 10*time.Second, "the short-lived message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) >= 1 })
	dead := drain(t, topo.DLQ())
	if len(dead) != 1 || dead[0].MessageId != "short" || dead[0].Headers[recoverer.HeaderExceptionMessage] != "boom" {
		for _, d := range dead {
			t.Logf("on the DLQ: %s, x-exception-message %v, x-first-death-reason %v", d.MessageId, d.Headers[recoverer.HeaderExceptionMessage], d.Headers["x-first-death-reason"])
		}
		t.Fatalf("the DLQ holds %d messages; want the short-lived one alone, with its fault headers", len(dead))
	}
	// The long-lived one waits in the broker's delay (not counted as
	// ready): delivered once, not dead-lettered.
	if n := calls.Load(); n != 2 {
		t.Errorf("the handler ran %d times, want twice: each message once", n)
	}
}
