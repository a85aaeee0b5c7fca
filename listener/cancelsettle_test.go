package listener_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// After RabbitMQ 4.3 cancels a consumer for its consumer timeout, the
// broker has taken back the consumer's deliveries and hands them to another:
// nothing more is settled on that channel, from the cancel itself (a late
// ack there settled messages the broker had returned, or copies another
// consumer held). Here the handler finishes just after the cancel reached
// the client, while the listener is still finding out why it came (a round
// trip, slowed by latency): its ack must not go out. The message is handled
// again on its redelivery, and only that one is acked.
func TestNothingSettledAfterAConsumerTimeoutCancel(t *testing.T) {
	t.Parallel()
	if !brokertest.AtLeast(t, 4, 3) {
		t.Skip("RabbitMQ 4.3 cancels a consumer at its consumer timeout (earlier brokers close the channel)")
	}
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
	proxy, url := brokertest.Proxy(t)
	var calls atomic.Int32
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		if calls.Add(1) > 1 {
			return nil // the redelivery
		}
		// Hold the first delivery past the consumer timeout, and return
		// just after the broker's cancel reached the client.
		cancels := d.Acknowledger.(*amqp.Channel).NotifyCancel(make(chan string, 1))
		proxy.SetLatency(300 * time.Millisecond)
		select {
		case <-cancels:
		case <-time.After(20 * time.Second):
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	var log testlog.Buffer
	r := start(t, q, nil, handle, listener.WithURL(url), listener.WithPrefetch(1),
		listener.WithConsumerTimeoutArgument(time.Second), listener.WithLogger(log.Logger()))
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m", DeliveryMode: amqp.Persistent})
	brokertest.Eventually(t, 30*time.Second, "the message handled again after the cancel", func() bool { return calls.Load() >= 2 && r.Stats().InFlight == 0 })
	proxy.SetLatency(0)
	brokertest.Eventually(t, 10*time.Second, "the queue empty", func() bool { return brokertest.Depth(t, q) == 0 })
	r.Stop(t)
	if h := r.Stats().Handled; h != 1 {
		t.Errorf("%d acks written, want 1 (the redelivery's): the first delivery was acked after the broker cancelled its consumer\n%s", h, log.String())
	}
}
