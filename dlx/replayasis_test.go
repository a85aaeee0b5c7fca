package dlx_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/recoverer"
)

// ReplayAsIs moves a dead letter to another holding queue (an archive)
// with every header it had, fault and death headers included, plus what
// edit adds; ReplayToHeader sends each back to the queue a header names,
// and a message without that header stays.
func TestReplayAsIsKeepsHeadersAndToHeaderRoutes(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	deadLetters(t, topo, 3)
	archive := brokertest.Name(t, "archive")
	brokertest.Queue(t, archive, nil)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	stats, err := dlx.Replay(context.Background(), ch, newPublisher(t), topo.DLQ(), dlx.ReplayTo(archive),
		dlx.ReplayAsIs(func(d *amqp.Delivery, h amqp.Table) { h["archived-from"] = topo.DLQ() }))
	if err != nil || stats.Replayed != 3 {
		t.Fatalf("to the archive: %+v %v", stats, err)
	}
	brokertest.Publish(t, archive, amqp.Publishing{MessageId: "stray"}) // no archived-from: it stays
	stats, err = dlx.Replay(context.Background(), ch, newPublisher(t), archive, dlx.ReplayToHeader("archived-from"),
		dlx.ReplayAsIs(func(d *amqp.Delivery, h amqp.Table) { delete(h, "archived-from") }))
	if err != nil || stats.Replayed != 3 || stats.Skipped != 1 {
		t.Fatalf("back: %+v %v", stats, err)
	}
	if n := brokertest.Depth(t, archive); n != 1 {
		t.Errorf("the archive holds %d, want the stray message", n)
	}
	back := drain(t, topo.DLQ())
	if len(back) != 3 {
		t.Fatalf("%d back on the DLQ, want 3", len(back))
	}
	for _, d := range back {
		for _, k := range []string{recoverer.HeaderExceptionMessage, recoverer.DefaultHeaderPrefix + recoverer.SuffixOriginalQueue, dlx.RetryCountHeader, "tenant"} {
			if _, ok := d.Headers[k]; !ok {
				t.Errorf("header %s lost on the way: %v", k, d.Headers)
			}
		}
		if _, ok := d.Headers["archived-from"]; ok {
			t.Errorf("the edit's delete did not take: %v", d.Headers)
		}
	}
}
