package listener_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// What goes over the wire after the chain's recoverer: a recoverer that
// could not put the message somewhere safe (its publish failed) hands it
// back with a nack, which RabbitMQ 4.3 does not count, so that the next
// delivery tries again; recoverer.Requeue, which asks on purpose for the
// message to stay on its queue as a failure, rejects it with requeue, which
// counts toward a quorum queue's delivery limit as any failure does.
func TestFailedRecoveryIsANackAndRequeueOnPurposeAReject(t *testing.T) {
	for _, tc := range []struct {
		name         string
		rec          middleware.Recoverer
		nack, reject int
	}{
		{"recovery failed", middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error {
			return errors.New("publish to the DLQ timed out")
		}), 1, 0},
		{"recoverer.Requeue", recoverer.Requeue(), 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, proxy, url := recordedQueue(t)
			r := start(t, q, middleware.Recover(tc.rec), func(context.Context, *amqp.Delivery) error { return errors.New("boom") },
				listener.WithURL(url), listener.WithRequeueDelay(10*time.Minute, 10*time.Minute))
			publishN(t, q, 1)
			// The first delivery goes back at once; the redelivery would
			// wait ten minutes.
			brokertest.Eventually(t, 10*time.Second, "the first delivery settled", func() bool {
				return proxy.Sent("basic.nack")+proxy.Sent("basic.reject") == 1
			})
			if n, j := proxy.Sent("basic.nack"), proxy.Sent("basic.reject"); n != tc.nack || j != tc.reject {
				t.Errorf("%d nacks, %d rejects; want %d and %d", n, j, tc.nack, tc.reject)
			}
			r.Stop(t)
		})
	}
}
