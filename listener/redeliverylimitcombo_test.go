package listener_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
)

// WithRedeliveryLimit counts every delivery of the queue, and dlx's
// Redeliver hands each failure back to the broker, which counts it too: the
// limit would end the broker's redeliveries early and dead-letter a failing
// message as one that crashes the process. New refuses the pair, saying
// what to do.
func TestRedeliveryLimitWithDelayedRedeliveryIsRefused(t *testing.T) {
	topo := dlx.Topology{Queue: brokertest.Name(t, "orders"), Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 4, Min: 100 * time.Millisecond}}
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	chain := middleware.Chain(middleware.Retry(2), middleware.Recover(topo.Redeliver(pub)))
	handle := func(context.Context, *amqp.Delivery) error { return nil }
	_, err = listener.New(topo.Queue, chain, handle, listener.WithURL(brokertest.URL()), listener.WithRedeliveryLimit(3))
	if err == nil {
		t.Fatal("New accepted WithRedeliveryLimit with a chain that redelivers through the broker (dlx's Redeliver)")
	}
	for _, want := range []string{"WithRedeliveryLimit(3)", "DelayedRedelivery", "x-delivery-limit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New's error does not say %q: %v", want, err)
		}
	}
	// Without the limit, the same chain is fine.
	if _, err := listener.New(topo.Queue, chain, handle, listener.WithURL(brokertest.URL())); err != nil {
		t.Errorf("New refused the chain without WithRedeliveryLimit: %v", err)
	}
}
