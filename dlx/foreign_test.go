package dlx_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/framecheck"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// guardedChannel is a channel on a connection whose socket framecheck
// guards, as the CLI dials.
func guardedChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	brokertest.Dial(t)
	conn, err := amqp.DialConfig(brokertest.URL(), amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		return framecheck.Guard(c), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return brokertest.Channel(t, conn)
}

// A dead letter amqp091-go cannot read in the middle of a DLQ: Replay moves
// the others and leaves it where it is, as the broker holds it, counted as
// unreadable (issue 41, item 3). It must not publish the copy it was shown,
// whose headers are only the guard's note.
func TestReplayCarriesOnPastAnUnreadableDeadLetter(t *testing.T) {
	work, dlq := brokertest.Name(t, "work"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, work, nil)
	brokertest.Queue(t, dlq, nil)
	brokertest.Publish(t, dlq,
		amqp.Publishing{MessageId: "before"},
		amqp.Publishing{MessageId: "unreadable", Headers: amqp.Table{"deep": brokertest.HeadersTooDeep()}},
		amqp.Publishing{MessageId: "after"})

	// ReplayTo: a destination that does not depend on the headers.
	stats, err := dlx.Replay(context.Background(), guardedChannel(t), newPublisher(t), dlq, dlx.ReplayTo(work))
	if err != nil || stats.Scanned != 3 || stats.Replayed != 2 || stats.Skipped != 1 || stats.Unreadable != 1 {
		t.Fatalf("stats %+v, err %v; want 2 replayed and 1 unreadable left", stats, err)
	}
	back := drain(t, work)
	if len(back) != 2 || back[0].MessageId != "before" || back[1].MessageId != "after" {
		t.Fatalf("work queue holds %d messages, want before and after", len(back))
	}
	ch := guardedChannel(t)
	d, ok, err := ch.Get(dlq, false)
	if err != nil || !ok || d.MessageId != "unreadable" || d.Headers[amqphdr.UnreadableHeaders] == nil {
		t.Fatalf("the DLQ's message: ok=%v err=%v id %q headers %v", ok, err, d.MessageId, d.Headers)
	}
	_ = d.Nack(false, true)
}

// Without the guard the connection closes on such a message: Replay says
// why, and what reads past it.
func TestReplayExplainsAnUnreadableDeadLetter(t *testing.T) {
	work, dlq := brokertest.Name(t, "work"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, work, nil)
	brokertest.Queue(t, dlq, nil)
	brokertest.Publish(t, dlq, amqp.Publishing{MessageId: "unreadable", Headers: amqp.Table{"deep": brokertest.HeadersTooDeep()}})
	_, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), dlq, dlx.ReplayTo(work))
	if err == nil || !strings.Contains(err.Error(), "amqp091-go cannot read") || !strings.Contains(err.Error(), "amqpretry dlq replay") {
		t.Fatalf("err = %v, want it to say the headers cannot be read and what reads past them", err)
	}
	// The broker requeues what the closed connection held a little after
	// the client has seen it close: under load, later than a first look.
	brokertest.Eventually(t, 10*time.Second, "the message back on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
}

// A message published with a CC header (amqplib's CC: [audit]) reaches the
// audit queue once. The tiers and Replay republish it through the default
// exchange, where the broker would follow the CC again and hand the audit
// queue a copy per hop (issue 41, item 7): they drop CC and BCC, as
// RabbitMQ's own dead-lettering does, and keep CC under original-cc.
func TestCCIsNotFollowedOnEveryHop(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{time.Minute}})
	declare(t, topo)
	ex, audit := brokertest.Name(t, "orders"), brokertest.Name(t, "audit")
	brokertest.Exchange(t, ex, "direct")
	brokertest.Queue(t, audit, nil)
	brokertest.Bind(t, topo.Queue, ex, "order.created")
	brokertest.Bind(t, audit, ex, audit)
	pubCh := brokertest.Channel(t, brokertest.Dial(t))
	if err := pubCh.Publish(ex, "order.created", true, false, amqp.Publishing{MessageId: "m",
		Headers: amqp.Table{"CC": []any{audit}, "BCC": []any{audit}, "tenant": "acme"}}); err != nil {
		t.Fatal(err)
	}
	brokertest.Eventually(t, 5*time.Second, "the message on the work queue", func() bool { return brokertest.Depth(t, topo.Queue) == 1 })
	if n := brokertest.Depth(t, audit); n != 1 {
		t.Fatalf("audit holds %d after the publish, want 1 (CC and BCC name the same queue)", n)
	}
	pub := newPublisher(t)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	ctx := chainrun.WithQueue(context.Background(), topo.Queue)
	hop := func(from string, r middleware.Recoverer) amqp.Delivery {
		t.Helper()
		d, ok, err := ch.Get(from, false)
		if err != nil || !ok {
			t.Fatalf("get from %s: %v %v", from, ok, err)
		}
		if err := r.Recover(ctx, &d, errors.New("boom")); err != nil {
			t.Fatal(err)
		}
		_ = d.Ack(false)
		return d
	}
	hop(topo.Queue, topo.Tiers(pub))                                      // to the 1m tier
	hop(topo.RetryQueue(time.Minute), topo.Tiers(pub, dlx.MaxRetries(0))) // to the DLQ
	if n := brokertest.Depth(t, audit); n != 1 {
		t.Errorf("audit holds %d after a tier hop and a dead-lettering, want 1", n)
	}
	d, ok, err := ch.Get(topo.DLQ(), false)
	if err != nil || !ok {
		t.Fatalf("get from the DLQ: %v %v", ok, err)
	}
	if _, has := d.Headers["CC"]; has || d.Headers["BCC"] != nil {
		t.Errorf("the dead letter carries CC or BCC: %v", d.Headers)
	}
	if cc, _ := d.Headers["x-amqpretry-original-cc"].([]any); len(cc) != 1 || cc[0] != audit {
		t.Errorf("x-amqpretry-original-cc = %#v, want [%s]", d.Headers["x-amqpretry-original-cc"], audit)
	}
	_ = d.Nack(false, true)

	stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), pub, topo.DLQ())
	if err != nil || stats.Replayed != 1 {
		t.Fatalf("replay: %+v, %v", stats, err)
	}
	if n := brokertest.Depth(t, audit); n != 1 {
		t.Errorf("audit holds %d after the replay, want 1", n)
	}
	back := drain(t, topo.Queue)
	if len(back) != 1 || back[0].Headers["tenant"] != "acme" || back[0].Headers["CC"] != nil || back[0].Headers["x-amqpretry-original-cc"] != nil {
		t.Errorf("replayed: %d messages, headers %v", len(back), back[0].Headers)
	}
}

// A dead letter the broker made has no x-original-exchange: its exchange and
// routing key are in x-death, and ReplayToOriginalExchange sends it there
// (issue 41, item 5); it used to skip it.
func TestReplayToOriginalExchangeReadsXDeath(t *testing.T) {
	work, _, dlq := brokertest.BrokerDeadLetter(t, "order.created")
	stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), dlq, dlx.ReplayToOriginalExchange())
	if err != nil || stats.Replayed != 1 || stats.Skipped != 0 {
		t.Fatalf("stats %+v, err %v; want the dead letter replayed", stats, err)
	}
	back := drain(t, work)
	if len(back) != 1 || back[0].MessageId != "m" || back[0].RoutingKey != "order.created" || back[0].Headers["x-death"] != nil {
		t.Fatalf("work queue: %d messages %+v", len(back), back)
	}
}
