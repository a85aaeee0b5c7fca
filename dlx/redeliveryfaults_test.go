package dlx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/faultproxy"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// redeliveryRig is a DelayedRedelivery topology on RabbitMQ 4.3 with one
// broker redelivery, a listener and a publisher each behind a fault proxy,
// and a handler that always fails.
type redeliveryRig struct {
	topo            dlx.Topology
	lproxy, pproxy  *faultproxy.Proxy
	lurl            string
	pub             *faultAt
	on              map[int]func() // run by the handler on the message's delivery n (1 for the first)
	shutdownTimeout time.Duration
	background      func(func())
}

func newRedeliveryRig(t *testing.T) *redeliveryRig {
	if !brokertest.AtLeast(t, 4, 3) {
		t.Skip("RabbitMQ 4.3's delayed retry; older brokers run the tiers, tested by TestTiersUnderFaults")
	}
	r := &redeliveryRig{shutdownTimeout: 10 * time.Second}
	r.topo = topology(t, dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 1, Min: 100 * time.Millisecond}})
	if err := r.topo.DeclareOn(brokertest.Dial(t)); err != nil {
		t.Fatal(err)
	}
	r.lproxy, r.lurl = brokertest.Proxy(t)
	var purl string
	r.pproxy, purl = brokertest.Proxy(t)
	p, err := publisher.New(purl, publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	r.pub = &faultAt{Publisher: p, n: 1}
	r.background = background(t)
	return r
}

// run starts a listener; the returned stop ends it and waits.
func (r *redeliveryRig) run(t *testing.T) (stop func()) {
	chain := middleware.Recover(r.topo.Redeliver(r.pub, dlx.WithRepublishOptions(recoverer.WithPublishTimeout(time.Second))))
	return runListener(t, r.topo, chain, func(ctx context.Context, d *amqp.Delivery) error {
		if f := r.on[dlx.Deliveries(d)]; f != nil {
			f()
		}
		return errors.New("boom")
	}, listener.WithURL(r.lurl), listener.WithLogger(quiet), // the proxy's URL, after runListener's
		listener.WithRequeueDelay(50*time.Millisecond, 200*time.Millisecond), listener.WithShutdownTimeout(r.shutdownTimeout))
}

// deadLetters waits for the message to have left the work queue for the
// DLQ, and for what is still on its way, and takes the DLQ's copies.
func (r *redeliveryRig) deadLetters(t *testing.T) []amqp.Delivery {
	t.Helper()
	brokertest.Eventually(t, 20*time.Second, "the message on the DLQ only", func() bool {
		return brokertest.Depth(t, r.topo.DLQ()) > 0 && brokertest.Depth(t, r.topo.Queue) == 0
	})
	time.Sleep(2 * time.Second) // a copy still on its way would show now
	dead := drain(t, r.topo.DLQ())
	for _, d := range dead {
		t.Logf("on the DLQ: x-exception-message %v, x-first-death-reason %v", d.Headers[recoverer.HeaderExceptionMessage], d.Headers["x-first-death-reason"])
	}
	if n := brokertest.Depth(t, r.topo.Queue); n != 0 {
		t.Errorf("%d left on the work queue", n)
	}
	return dead
}

func withFaultHeaders(dead []amqp.Delivery) (n int) {
	for _, d := range dead {
		if d.Headers[recoverer.HeaderExceptionMessage] == "boom" {
			n++
		}
	}
	return n
}

// A shutdown while the last delivery's publish to the DLQ hangs: the
// message goes back uncounted (a nack), the next listener publishes it
// with its fault headers.
func TestShutdownDuringTheLastRedeliverysPublish(t *testing.T) {
	r := newRedeliveryRig(t)
	r.shutdownTimeout = 200 * time.Millisecond
	publishing := make(chan struct{})
	r.pub.before = func() { r.pproxy.Blackhole(true); close(publishing) }
	r.pub.after = func() { r.pproxy.Blackhole(false) }
	stop := r.run(t)
	brokertest.Publish(t, r.topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	<-publishing
	stop()
	defer r.run(t)()
	dead := r.deadLetters(t)
	if withFaultHeaders(dead) != len(dead) {
		t.Errorf("%d of %d copies on the DLQ have no fault headers: the shutdown used up the last delivery", len(dead)-withFaultHeaders(dead), len(dead))
	}
}

// The listener's connection dies after the last delivery's dead letter is
// confirmed, before the ack: the broker counts the return and dead-letters
// the message itself. Nothing is lost; the DLQ holds it twice, once
// without fault headers (at least once, not avoidable: the ack is lost).
func TestLastRedeliveryCutBeforeTheAck(t *testing.T) {
	r := newRedeliveryRig(t)
	r.pub.after = func() { r.lproxy.CutAll() }
	defer r.run(t)()
	brokertest.Publish(t, r.topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	dead := r.deadLetters(t)
	if withFaultHeaders(dead) < 1 || len(dead) > 2 {
		t.Errorf("%d copies on the DLQ, %d with fault headers: want 1 or 2, one with them", len(dead), withFaultHeaders(dead))
	}
}

// The process dies on the last delivery (here its connection is cut as the
// handler runs): the broker counts the return and dead-letters the message,
// at least once, without fault headers: nothing is lost.
func TestCrashOnTheLastRedelivery(t *testing.T) {
	r := newRedeliveryRig(t)
	r.on = map[int]func(){2: func() {
		r.lproxy.CutAll()
		time.Sleep(100 * time.Millisecond)
	}}
	defer r.run(t)()
	brokertest.Publish(t, r.topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	dead := r.deadLetters(t)
	if len(dead) != 1 {
		t.Errorf("%d copies on the DLQ, want 1", len(dead))
	}
}

// The process dies on the first delivery: the broker counts the return, so
// the next delivery is the last, and the recoverer publishes it to the DLQ
// with its fault headers and x-retry-count 1.
func TestCrashBeforeTheLastRedelivery(t *testing.T) {
	r := newRedeliveryRig(t)
	r.on = map[int]func(){1: func() {
		r.lproxy.CutAll()
		time.Sleep(100 * time.Millisecond)
	}}
	defer r.run(t)()
	brokertest.Publish(t, r.topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	dead := r.deadLetters(t)
	if len(dead) != 1 || withFaultHeaders(dead) != 1 || dead[0].Headers[dlx.RetryCountHeader] != int64(1) {
		t.Errorf("%d copies on the DLQ, %d with fault headers: want 1 with them and x-retry-count 1", len(dead), withFaultHeaders(dead))
	}
}
