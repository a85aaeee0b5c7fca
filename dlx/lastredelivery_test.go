package dlx_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
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
