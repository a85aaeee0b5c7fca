package listener_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
)

// A handler slower than the queue's consumer timeout, by broker. RabbitMQ
// 4.0 closes the consumer's channel (at its next check, on the channel's
// tick: a minute by default, 5 s on scripts/rabbit4.sh's nodes) and requeues
// every delivery on it. RabbitMQ 4.3 applies consumer timeouts to quorum
// queues only, and there cancels the consumer, returns its deliveries
// uncounted and keeps the channel open; it honours x-consumer-timeout as a
// queue argument and on basic.consume (WithConsumerTimeoutArgument). Either
// way the listener says so plainly, naming the queue and the setting,
// cancels the slow handler, replaces the consumer, and every message is
// handled: the slow one on its redelivery, the ones queued behind it on the
// same consumer too. 3.10 has only the global consumer_timeout, which a test
// on a shared broker must not change.
func TestSlowHandlerUnderAShortConsumerTimeoutLosesNothing(t *testing.T) {
	t.Parallel()
	if brokertest.Major(t) < 4 {
		t.Skip("RabbitMQ 3.x applies no per-queue consumer timeout (3.10 ignores x-consumer-timeout); its global consumer_timeout is shared")
	}
	v43 := brokertest.AtLeast(t, 4, 3)
	type layout struct {
		name     string
		args     amqp.Table
		opts     []listener.Option
		told     string // what the log says
		counting bool   // the redelivery counts toward x-delivery-count
	}
	var layouts []layout
	if v43 {
		layouts = []layout{
			{"quorum queue argument", amqp.Table{"x-queue-type": "quorum", "x-consumer-timeout": int64(1000)}, nil,
				"cancelled a consumer of a queue that still exists", false},
			{"consumer argument", amqp.Table{"x-queue-type": "quorum"}, []listener.Option{listener.WithConsumerTimeoutArgument(time.Second)},
				"cancelled a consumer of a queue that still exists", false},
			{"consumer argument, acks coalesced", amqp.Table{"x-queue-type": "quorum"},
				[]listener.Option{listener.WithConsumerTimeoutArgument(time.Second), listener.WithAckCoalescing(4, 100*time.Millisecond)},
				"cancelled a consumer of a queue that still exists", false},
		}
	} else {
		layouts = []layout{
			{"classic queue argument", amqp.Table{"x-consumer-timeout": int64(1000)}, nil,
				"stayed unacknowledged past the broker's consumer timeout", false},
			{"classic queue argument, acks coalesced", amqp.Table{"x-consumer-timeout": int64(1000)},
				[]listener.Option{listener.WithAckCoalescing(4, 100*time.Millisecond)},
				"stayed unacknowledged past the broker's consumer timeout", false},
		}
	}
	for _, lt := range layouts {
		t.Run(lt.name, func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, lt.args)
			var log testlog.Buffer
			var slowCalls atomic.Int64
			var redeliveredCount atomic.Value
			r := start(t, q, nil, func(ctx context.Context, d *amqp.Delivery) error {
				if d.MessageId == "0" {
					if slowCalls.Add(1) == 1 {
						<-ctx.Done() // the listener cancels it when the broker gives up on it
						return ctx.Err()
					}
					redeliveredCount.Store(fmt.Sprint(d.Headers["x-delivery-count"]))
				}
				return nil
			}, append(lt.opts, listener.WithLogger(log.Logger()))...)
			publishN(t, q, 6) // "0" is slow; 1 to 5 wait behind it on the same consumer
			begin := time.Now()
			brokertest.Eventually(t, 90*time.Second, "every message handled", func() bool { return r.Stats().Handled >= 6 })
			t.Logf("all handled %v after publishing; the slow one ran %d times", time.Since(begin).Round(time.Second), slowCalls.Load())
			time.Sleep(200 * time.Millisecond) // a handling twice would show
			r.Stop(t)
			if n := r.Stats().Handled; n != 6 {
				t.Errorf("handled %d, want 6: the deliveries the broker returned were handled where they were and again", n)
			}
			if n := brokertest.Depth(t, q); n != 0 {
				t.Errorf("the queue still holds %d", n)
			}
			if log.Count(lt.told) == 0 || log.Count("queue="+q) == 0 || log.Count("x-consumer-timeout") == 0 {
				t.Errorf("the log does not say plainly that the consumer timeout acted (%q), naming the queue and the setting:\n%s", lt.told, log.String())
			}
			if slowCalls.Load() != 2 {
				t.Errorf("the slow message ran %d times, want 2 (again after its redelivery)", slowCalls.Load())
			}
			if v43 && redeliveredCount.Load() != "<nil>" {
				t.Errorf("the slow message came back with x-delivery-count %v: a consumer timeout on 4.3 returns it uncounted", redeliveredCount.Load())
			}
		})
	}
}

// x-consumer-timeout on basic.consume, by broker: 3.10 and 4.0 accept it on
// a classic queue (and ignore it: see WithConsumerTimeoutArgument); 4.3
// refuses it on a classic queue, and Run ends at once with an error naming
// the option and the queue type instead of retrying for ever; a 4.3 quorum
// queue takes it.
func TestConsumerTimeoutArgument(t *testing.T) {
	v43 := brokertest.AtLeast(t, 4, 3)
	handle := func(context.Context, *amqp.Delivery) error { return nil }

	q := brokertest.Name(t, "classic")
	brokertest.Queue(t, q, nil)
	if !v43 {
		r := start(t, q, nil, handle, listener.WithConsumerTimeoutArgument(time.Hour))
		publishN(t, q, 3)
		brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return r.Stats().Handled == 3 })
	} else {
		l, err := listener.New(q, nil, handle, listener.WithURL(brokertest.URL()), listener.WithConsumerTimeoutArgument(time.Hour), logTo(t, false))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		begin := time.Now()
		err = l.Run(ctx)
		var refused *listener.ConsumeRefusedError
		if !errors.As(err, &refused) || !errors.Is(err, listener.ErrConsumeRefused) || refused.Err.Code != amqp.PreconditionFailed ||
			!strings.Contains(err.Error(), "WithConsumerTimeoutArgument(1h0m0s)") || !strings.Contains(err.Error(), "classic") {
			t.Fatalf("Run = %v, want a *ConsumeRefusedError (406) naming WithConsumerTimeoutArgument and the classic queue", err)
		}
		if took := time.Since(begin); took > 5*time.Second {
			t.Errorf("Run took %v to give up", took)
		}
		q = brokertest.Name(t, "quorum")
		brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum"})
		r := start(t, q, nil, handle, listener.WithConsumerTimeoutArgument(time.Hour))
		publishN(t, q, 3)
		brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return r.Stats().Handled == 3 })
	}
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
