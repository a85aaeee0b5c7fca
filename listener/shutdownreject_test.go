package listener_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// A handler still running when the shutdown timeout passes sees its context
// cancelled; what it concludes then is not the message's fault, even when it
// calls it Permanent (a lookup that failed for good, say): the message goes
// back to its queue, not to the queue's DLX, as it does through Recover.
func TestShutdownNeverRejectsACutOffHandler(t *testing.T) {
	for name, mw := range map[string]middleware.Middleware{
		"no middleware": nil,
		"Timeout":       middleware.Timeout(time.Minute),
	} {
		t.Run(name, func(t *testing.T) {
			topo := dlx.Topology{Queue: brokertest.Name(t, "q")}
			t.Cleanup(func() {
				brokertest.DeleteQueue(t, topo.Queue)
				brokertest.DeleteQueue(t, topo.DLQ())
			})
			if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
				t.Fatal(err)
			}
			brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m"})
			started := make(chan struct{})
			r := start(t, topo.Queue, mw, func(ctx context.Context, _ *amqp.Delivery) error {
				close(started)
				<-ctx.Done()
				return middleware.Permanent(fmt.Errorf("look up the customer: %w", ctx.Err()))
			}, listener.WithShutdownTimeout(200*time.Millisecond))
			<-started
			r.Stop(t)
			brokertest.Eventually(t, 5*time.Second, "the message settled", func() bool {
				return brokertest.Depth(t, topo.Queue)+brokertest.Depth(t, topo.DLQ()) == 1
			})
			if w, d := brokertest.Depth(t, topo.Queue), brokertest.Depth(t, topo.DLQ()); w != 1 || d != 0 {
				t.Errorf("work queue %d, DLQ %d: want the message back on the work queue", w, d)
			}
		})
	}
}
