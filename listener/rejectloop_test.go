package listener_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

const rejectLoops = "a message rejected for good came back to this queue after an earlier rejection from it"

// In the single-delay layout every rejection goes to the retry queue and
// back: a Permanent error without RejectToRetry loops instead of reaching the
// DLQ. The listener cannot publish it elsewhere, but it says so, naming the
// fix, as soon as the message comes back.
func TestRejectThatLoopsIsReported(t *testing.T) {
	topo := singleDelayTopology(t)
	var logs testlog.Buffer
	var calls atomic.Int32
	r := start(t, topo.Queue, nil, func(context.Context, *amqp.Delivery) error {
		calls.Add(1)
		return middleware.Permanent(errors.New("invalid order"))
	}, listener.WithLogger(logs.Logger()))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "poison"})
	brokertest.Eventually(t, 10*time.Second, "the loop reported", func() bool { return logs.Count(rejectLoops) > 0 })
	r.Stop(t)
	if calls.Load() < 2 {
		t.Errorf("handled %d times, want the message back at least once", calls.Load())
	}
	for _, want := range []string{"queue=" + topo.Queue, "message_id=poison", "RejectToRetry"} {
		if logs.Count(want) == 0 {
			t.Errorf("the report does not name %q:\n%s", want, logs.String())
		}
	}
}

// RejectToRetry's own rejections go round on purpose, and its last one goes
// to the DLQ: nothing to report.
func TestRejectToRetryIsNotReportedAsALoop(t *testing.T) {
	topo := singleDelayTopology(t)
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var logs testlog.Buffer
	r := start(t, topo.Queue, middleware.Recover(topo.RejectToRetry(2, recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey()))),
		func(context.Context, *amqp.Delivery) error { return errors.New("downstream down") }, listener.WithLogger(logs.Logger()))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m"})
	brokertest.Eventually(t, 10*time.Second, "on the DLQ after two retries", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	r.Stop(t)
	if logs.Count(rejectLoops) != 0 {
		t.Errorf("RejectToRetry's retries were reported as a loop:\n%s", logs.String())
	}
}

func singleDelayTopology(t *testing.T) dlx.Topology {
	t.Helper()
	topo := dlx.Topology{Queue: brokertest.Name(t, "q"), SingleRetryDelay: 100 * time.Millisecond}
	t.Cleanup(func() {
		for _, q := range []string{topo.Queue, topo.SingleRetryQueue(), topo.DLQ()} {
			brokertest.DeleteQueue(t, q)
		}
	})
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
	return topo
}
