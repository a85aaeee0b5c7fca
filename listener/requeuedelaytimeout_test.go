package listener_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// The requeue delay holds a failed delivery unsettled, so it must fit the
// consumer timeout as the chain's waits do: on RabbitMQ 4.3 a delivery held
// past x-consumer-timeout makes the broker cancel the consumer and take it
// back uncounted, so a message that fails every time would never reach the
// queue's delivery limit (it looped: 17 deliveries in 15 s, the consumer
// cancelled 13 times). With the default delays (1 s doubling to 30 s) and a
// 1 s consumer timeout, each wait is cut to the time left: every failure is
// a counted reject, and the broker dead-letters the message at its limit.
func TestRequeueDelayFitsTheConsumerTimeout(t *testing.T) {
	t.Parallel()
	if !brokertest.AtLeast(t, 4, 3) {
		t.Skip("x-consumer-timeout on basic.consume is RabbitMQ 4.3's (3.10 and 4.0 ignore it)")
	}
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(4),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	handle := func(context.Context, *amqp.Delivery) error { return errors.New("the downstream says no") }
	var log testlog.Buffer
	r := start(t, q, nil, handle, listener.WithConsumerTimeoutArgument(time.Second), listener.WithLogger(log.Logger()))
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m", DeliveryMode: amqp.Persistent})
	brokertest.Eventually(t, 20*time.Second, "the message dead-lettered by the broker at its delivery limit", func() bool {
		return brokertest.Depth(t, dlq) == 1
	})
	r.Stop(t)
	if n := log.Count("cancelled a consumer"); n != 0 {
		t.Errorf("the broker cancelled the consumer %d times: a requeue delay outlived the consumer timeout\n%s", n, log.String())
	}
}

// A requeue delay set explicitly longer than the consumer timeout is refused
// at New, naming the option.
func TestRequeueDelayLongerThanTheConsumerTimeoutIsRefused(t *testing.T) {
	_, err := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.URL()), listener.WithConsumerTimeout(time.Minute), listener.WithRequeueDelay(time.Second, 2*time.Minute))
	if err == nil {
		t.Fatal("New accepted a requeue delay of up to 2m with a consumer timeout of 1m")
	}
	if want := "WithRequeueDelay"; !strings.Contains(err.Error(), want) {
		t.Errorf("New's error does not name %s: %v", want, err)
	}
}
