package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// publishPriorities publishes one message per priority, in the order given,
// its body naming it, and returns the bodies in the order basic.get hands
// them out.
func publishPriorities(t *testing.T, queue string, priorities []uint8) []string {
	t.Helper()
	msgs := make([]amqp.Publishing, len(priorities))
	for i, p := range priorities {
		msgs[i] = amqp.Publishing{Priority: p, Body: []byte(fmt.Sprint("p", p)), DeliveryMode: amqp.Persistent}
	}
	brokertest.Publish(t, queue, msgs...)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	var order []string
	brokertest.Eventually(t, 5*time.Second, "every message", func() bool { return brokertest.Depth(t, queue) == len(priorities) })
	for {
		d, ok := brokertest.Get(t, ch, queue)
		if !ok {
			return order
		}
		order = append(order, string(d.Body))
	}
}

// Topology.MaxPriority on a classic work queue: the broker delivers higher
// priorities first, and a message that goes round a retry tier comes back
// with its priority.
func TestMaxPriorityOnAClassicQueue(t *testing.T) {
	topo := topology(t, dlx.Topology{MaxPriority: 9, RetryDelays: []time.Duration{50 * time.Millisecond}})
	declare(t, topo)
	if got := fmt.Sprint(publishPriorities(t, topo.Queue, []uint8{0, 3, 9, 1, 7})); got != "[p9 p7 p3 p1 p0]" {
		t.Errorf("delivered %s, want [p9 p7 p3 p1 p0]", got)
	}

	pub := newPublisher(t)
	d := amqp.Delivery{Priority: 7, MessageId: "m", Body: []byte("x"), RoutingKey: topo.Queue, Headers: amqp.Table{}}
	if err := topo.Tiers(pub).Recover(chainrun.WithQueue(context.Background(), topo.Queue), &d, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	brokertest.Eventually(t, 5*time.Second, "the message back from its tier", func() bool { return brokertest.Depth(t, topo.Queue) == 1 })
	back, ok := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.Queue)
	if !ok || back.Priority != 7 {
		t.Errorf("back from the tier with priority %d (ok %v), want 7", back.Priority, ok)
	}
}

// What quorum queues do with message priorities, by broker (they refuse
// x-max-priority everywhere, so Validate refuses Topology.MaxPriority on
// them): RabbitMQ 3.10 ignores priorities; 4.0 delivers priorities above 4
// ahead of the rest, by a ratio rather than strictly; 4.3 orders strictly,
// a message without a priority counting as 4.
func TestQuorumQueuePriorities(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
	order := publishPriorities(t, q, []uint8{0, 1, 3, 5, 9, 31, 2, 7}) // 0: no priority sent
	major, minor := brokertest.Version(t)
	switch {
	case major < 4:
		if got := fmt.Sprint(order); got != "[p0 p1 p3 p5 p9 p31 p2 p7]" {
			t.Errorf("RabbitMQ %d.%d delivered %s, want the order published", major, minor, got)
		}
	case brokertest.AtLeast(t, 4, 3):
		if got := fmt.Sprint(order); got != "[p31 p9 p7 p5 p0 p3 p2 p1]" {
			t.Errorf("RabbitMQ %d.%d delivered %s, want strictly by priority, none as 4: [p31 p9 p7 p5 p0 p3 p2 p1]", major, minor, got)
		}
	default:
		if order[0] != "p5" || fmt.Sprint(order) == "[p0 p1 p3 p5 p9 p31 p2 p7]" {
			t.Errorf("RabbitMQ %d.%d delivered %s, want the first high priority (p5) first, not the order published", major, minor, order)
		}
	}
	t.Logf("RabbitMQ %d.%d: %v", major, minor, order)
}
