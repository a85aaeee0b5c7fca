package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/recoverer"
)

// deadLetters puts n messages on topo's DLQ the way the library does: taken
// from the work queue and republished with fault headers.
func deadLetters(t *testing.T, topo dlx.Topology, n int) {
	t.Helper()
	pub := newPublisher(t)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte(fmt.Sprint("body ", i)), Headers: amqp.Table{"tenant": "acme"}}
	}
	brokertest.Publish(t, topo.Queue, msgs...)
	rep := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey(), recoverer.WithHeaders(func(context.Context, *amqp.Delivery, error) amqp.Table {
		return amqp.Table{dlx.RetryCountHeader: int64(3)}
	}))
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for range n {
		d, ok, err := ch.Get(topo.Queue, false)
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		if err := rep.Recover(chainrun.WithQueue(context.Background(), topo.Queue), &d, errors.New("bug 42")); err != nil {
			t.Fatal(err)
		}
		_ = d.Ack(false)
	}
}

func drain(t *testing.T, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for {
		d, ok := brokertest.Get(t, ch, queue)
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func TestReplayMovesAndCleans(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{time.Second}})
	declare(t, topo)
	deadLetters(t, topo, 30)
	stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ())
	if err != nil || stats.Replayed != 30 || stats.Skipped != 0 {
		t.Fatalf("stats %+v, err %v", stats, err)
	}
	back := drain(t, topo.Queue)
	if len(back) != 30 || brokertest.Depth(t, topo.DLQ()) != 0 {
		t.Fatalf("%d back on the work queue, %d left on the DLQ", len(back), brokertest.Depth(t, topo.DLQ()))
	}
	for _, d := range back {
		if d.Headers["tenant"] != "acme" {
			t.Errorf("application header lost: %v", d.Headers)
		}
		for k := range d.Headers {
			if k != "tenant" {
				t.Errorf("header %s survived the replay", k)
			}
		}
	}
}

func TestReplayLimitAndMatch(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	deadLetters(t, topo, 10)
	even := dlx.ReplayMatch(func(d *amqp.Delivery) bool {
		return strings.HasSuffix(string(d.Body), "0") || strings.HasSuffix(string(d.Body), "2")
	})
	stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ(), even, dlx.ReplayLimit(1))
	if err != nil || stats.Replayed != 1 {
		t.Fatalf("stats %+v, err %v", stats, err)
	}
	stats, err = dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ(), even)
	if err != nil || stats.Replayed != 1 || stats.Skipped != 8 || stats.Scanned != 9 {
		t.Fatalf("second pass stats %+v, err %v", stats, err)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 8 {
		t.Errorf("DLQ holds %d, want the 8 that did not match", n)
	}
	other := brokertest.Name(t, "elsewhere")
	brokertest.Queue(t, other, nil)
	if stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ(), dlx.ReplayTo(other)); err != nil || stats.Replayed != 8 {
		t.Fatalf("ReplayTo: %+v %v", stats, err)
	}
	if n := brokertest.Depth(t, other); n != 8 {
		t.Errorf("%s holds %d", other, n)
	}
}

// The messages Replay skips go back with basic.nack: being looked at is not
// their failure, and RabbitMQ 4.3 counts a reject toward a quorum queue's
// delivery limit.
func TestReplayHandsBackSkippedMessagesWithNacks(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	deadLetters(t, topo, 4)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	first := dlx.ReplayMatch(func(d *amqp.Delivery) bool { return d.MessageId == "0" })
	stats, err := dlx.Replay(context.Background(), ch, newPublisher(t), topo.DLQ(), first)
	if err != nil || stats.Replayed != 1 || stats.Skipped != 3 {
		t.Fatalf("stats %+v, err %v", stats, err)
	}
	brokertest.Eventually(t, 5*time.Second, "the frames through the proxy", func() bool { return proxy.Sent("basic.nack")+proxy.Sent("basic.reject") >= 3 })
	if nacks, rejects, acks := proxy.Sent("basic.nack"), proxy.Sent("basic.reject"), proxy.Sent("basic.ack"); nacks != 3 || rejects != 0 || acks != 1 {
		t.Errorf("%d nacks, %d rejects, %d acks; want 3 nacks for the skipped and 1 ack for the replayed", nacks, rejects, acks)
	}
}

// Cancelled half-way: every message is on the DLQ or back on the work queue,
// none lost.
func TestInterruptedReplayLosesNothing(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	deadLetters(t, topo, 40)
	ctx, cancel := context.WithCancel(context.Background())
	stats, err := dlx.Replay(ctx, brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ(),
		dlx.ReplayProgress(func(s dlx.ReplayStats) {
			if s.Replayed == 17 {
				cancel()
			}
		}))
	if !errors.Is(err, context.Canceled) || stats.Replayed != 17 {
		t.Fatalf("stats %+v, err %v: want a cancelled replay after 17", stats, err)
	}
	seen := map[string]int{}
	for _, q := range []string{topo.Queue, topo.DLQ()} {
		for _, d := range drain(t, q) {
			seen[d.MessageId]++
		}
	}
	for i := range 40 {
		if seen[fmt.Sprint(i)] == 0 {
			t.Errorf("message %d lost", i)
		}
	}
}
