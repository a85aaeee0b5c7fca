package dlx_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// queueArguments is what the broker lists as each queue's arguments.
func queueArguments(t *testing.T) map[string]string {
	t.Helper()
	out := brokertest.Rabbitmqctl(t, "list_queues", "-q", "--no-table-headers", "name", "arguments")
	args := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if name, a, ok := strings.Cut(line, "\t"); ok {
			args[name] = a
		}
	}
	return args
}

// Topology.SingleActiveConsumer, classic and quorum: the work queue gets
// x-single-active-consumer and delivers to its first consumer while the
// second waits, the retry queues and the DLQ do not get it, and a work
// queue that exists without it is a *ConflictError naming the argument.
func TestSingleActiveConsumerOnTheWorkQueueOnly(t *testing.T) {
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			topo := topology(t, dlx.Topology{Type: typ, SingleActiveConsumer: true, RetryDelays: []time.Duration{time.Second}})
			declare(t, topo)
			declare(t, topo) // idempotent
			args := queueArguments(t)
			if a := args[topo.Queue]; !strings.Contains(a, `{"x-single-active-consumer",true}`) {
				t.Errorf("the work queue's arguments are %s, want x-single-active-consumer true", a)
			}
			for _, q := range []string{topo.DLQ(), topo.RetryQueue(time.Second)} {
				if a, ok := args[q]; !ok || strings.Contains(a, "x-single-active-consumer") {
					t.Errorf("%s has the arguments %s (listed: %v): only the work queue gets single active consumer", q, a, ok)
				}
			}

			conn := brokertest.Dial(t)
			var got [2]chan amqp.Delivery
			for i := range got {
				ch := brokertest.Channel(t, conn)
				d, err := ch.Consume(topo.Queue, []string{"first", "second"}[i], true, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				got[i] = make(chan amqp.Delivery, 10)
				go func() {
					for m := range d {
						got[i] <- m
					}
				}()
			}
			brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "a"}, amqp.Publishing{MessageId: "b"})
			for _, id := range []string{"a", "b"} {
				select {
				case m := <-got[0]:
					if m.MessageId != id {
						t.Errorf("the first consumer got %s, want %s", m.MessageId, id)
					}
				case m := <-got[1]:
					t.Fatalf("the second consumer got %s while the first was there", m.MessageId)
				case <-time.After(10 * time.Second):
					t.Fatalf("message %s never delivered", id)
				}
			}
			activity := brokertest.Rabbitmqctl(t, "list_consumers", "-q", "--no-table-headers", "queue_name", "consumer_tag", "activity_status")
			var rows []string
			for _, line := range strings.Split(activity, "\n") {
				if q, rest, ok := strings.Cut(line, "\t"); ok && q == topo.Queue {
					rows = append(rows, rest)
				}
			}
			slices.Sort(rows)
			if want := []string{"first\tsingle_active", "second\twaiting"}; !slices.Equal(rows, want) {
				t.Errorf("the broker lists the consumers as %q, want %q", rows, want)
			}
		})
	}

	t.Run("existing queue without it", func(t *testing.T) {
		topo := topology(t, dlx.Topology{})
		declare(t, topo)
		topo.SingleActiveConsumer = true
		err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t)))
		var ce *dlx.ConflictError
		if !errors.As(err, &ce) || ce.Argument != "x-single-active-consumer" || ce.Name != topo.Queue {
			t.Fatalf("Declare = %v, want a *ConflictError naming x-single-active-consumer on the work queue", err)
		}
	})
}

// The TTL tiers that stand in for a delayed redelivery on an older broker
// keep single active consumer.
func TestTierEquivalentKeepsSingleActiveConsumer(t *testing.T) {
	topo := dlx.Topology{Queue: "q", Type: dlx.Quorum, SingleActiveConsumer: true,
		DelayedRedelivery: &dlx.DelayedRedelivery{Min: time.Second, Max: time.Second, Redeliveries: 2, FallbackToTiers: true}}
	if !topo.TierEquivalent().SingleActiveConsumer {
		t.Error("TierEquivalent dropped SingleActiveConsumer")
	}
}
