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

// A handler slower than the queue's consumer timeout: RabbitMQ closes the
// consumer's channel (at its next check, on the channel's tick: a minute by
// default, 5 s on scripts/rabbit4.sh's node) and requeues
// every delivery on it. The listener says so plainly, naming the queue and
// the setting, replaces the consumer, and every message is handled: the
// slow one on its redelivery, the ones queued behind it on the same channel
// too. RabbitMQ 4.0 honours a queue's x-consumer-timeout; 3.10 has only the
// global consumer_timeout, which a test on a shared broker must not change.
func TestSlowHandlerUnderAShortConsumerTimeoutLosesNothing(t *testing.T) {
	if brokertest.Major(t) < 4 {
		t.Skip("RabbitMQ 3.x applies no per-queue consumer timeout (3.10 ignores x-consumer-timeout); its global consumer_timeout is shared")
	}
	if testing.Short() {
		t.Skip("the broker checks consumer timeouts on its channel tick, once a minute by default")
	}
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-consumer-timeout": int64(1000)})
	var log testlog.Buffer
	var slowCalls atomic.Int64
	r := start(t, q, nil, func(ctx context.Context, d *amqp.Delivery) error {
		if d.MessageId == "0" && slowCalls.Add(1) == 1 {
			<-ctx.Done() // the listener cancels it when the broker closes the channel
			return ctx.Err()
		}
		return nil
	}, listener.WithLogger(log.Logger()))
	publishN(t, q, 6) // "0" is slow; 1 to 5 wait behind it on the same consumer
	begin := time.Now()
	brokertest.Eventually(t, 90*time.Second, "every message handled", func() bool { return r.Stats().Handled == 6 })
	t.Logf("all handled %v after publishing; the slow one ran %d times", time.Since(begin).Round(time.Second), slowCalls.Load())
	r.Stop(t)
	if n := brokertest.Depth(t, q); n != 0 {
		t.Errorf("the queue still holds %d", n)
	}
	if log.Count("stayed unacknowledged past the broker's consumer timeout") == 0 || log.Count("queue="+q) == 0 || log.Count("x-consumer-timeout") == 0 {
		t.Errorf("the log does not say plainly that the consumer timeout closed the channel, naming the queue and the setting:\n%s", log.String())
	}
	if slowCalls.Load() != 2 {
		t.Errorf("the slow message ran %d times, want 2 (again after its redelivery)", slowCalls.Load())
	}
}

// Both brokers accept x-consumer-timeout on basic.consume (neither applies
// it: see WithConsumerTimeoutArgument); the listener consumes with it.
func TestConsumerTimeoutArgumentIsAccepted(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { return nil }, listener.WithConsumerTimeoutArgument(time.Hour))
	publishN(t, q, 3)
	brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return r.Stats().Handled == 3 })
}

func TestIsConsumerTimeout(t *testing.T) {
	tests := []struct {
		err  *amqp.Error
		want bool
	}{
		// What RabbitMQ 4.0.5 sends (3.10.8's reads the same up to "timed out").
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - delivery acknowledgement on channel 2 timed out. Timeout value used: 2000 ms. This timeout value can be configured, see consumers doc guide to learn more"}, true},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown delivery tag 7"}, false},
		{&amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - broker forced connection closure"}, false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := listener.IsConsumerTimeout(tt.err); got != tt.want {
			t.Errorf("IsConsumerTimeout(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
