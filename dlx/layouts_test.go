package dlx_test

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

// held counts the messages on every queue of topo, and on extra queues: a
// queue that is not there holds none.
func held(t *testing.T, topo dlx.Topology, extra ...string) int {
	t.Helper()
	queues := append([]string{topo.Queue, topo.DLQ()}, extra...)
	if topo.SingleRetryDelay > 0 {
		queues = append(queues, topo.SingleRetryQueue())
	}
	for _, d := range topo.RetryDelays {
		queues = append(queues, topo.RetryQueue(d))
	}
	n := 0
	for _, q := range queues {
		if brokertest.QueueExists(t, q) {
			n += brokertest.Depth(t, q)
		}
	}
	return n
}

// layoutCase is a layout and what happens in it; want messages must be
// somewhere on its queues after settle, or Validate must refuse the layout
// naming refusal.
type layoutCase struct {
	name     string
	topo     dlx.Topology
	scenario func(t *testing.T, topo dlx.Topology) (want int)
	settle   time.Duration
	refusal  string
}

// runLayouts declares each layout with Declare: either Validate refuses it
// naming what drops messages, or the broker keeps every message the
// scenario sends through it.
func runLayouts(t *testing.T, cases []layoutCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			topo := topology(t, c.topo)
			err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t)))
			if err != nil {
				if c.refusal == "" || !strings.Contains(err.Error(), c.refusal) {
					t.Fatalf("Declare: %v", err)
				}
				t.Logf("refused: %v", err)
				return
			}
			want := c.scenario(t, topo)
			time.Sleep(c.settle)
			if got := held(t, topo); got != want {
				t.Errorf("%d of %d messages left on the topology's queues: the broker dropped %d without a word", got, want, want-got)
			}
		})
	}
}

// A retry that comes back to a work queue that is full: the tier (or the
// single-delay retry queue) dead-letters it back, at most once, and a
// classic work queue with x-overflow reject-publish refuses it, so RabbitMQ
// drops it (3.10.8, 4.0.5 and 4.3.6 alike). Validate refuses that layout; a
// quorum work queue takes the returning message past its limit, and
// drop-head or reject-publish-dlx dead-letter a message to the DLQ, which is
// not silent.
func TestARetryBackToAFullWorkQueueIsNotDropped(t *testing.T) {
	full := amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}
	tier := 200 * time.Millisecond
	backFromTier := func(t *testing.T, topo dlx.Topology) int {
		brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "a", Body: []byte("a")})
		retry := topo.SingleRetryQueue()
		if len(topo.RetryDelays) > 0 {
			retry = topo.RetryQueue(tier)
		}
		brokertest.Publish(t, retry, amqp.Publishing{MessageId: "b", Body: []byte("b")})
		return 2
	}
	refusal := `QueueArguments["x-overflow"] = "reject-publish"`
	runLayouts(t, []layoutCase{
		{name: "classic tiers, reject-publish", topo: dlx.Topology{RetryDelays: []time.Duration{tier}, QueueArguments: full},
			scenario: backFromTier, settle: time.Second, refusal: refusal},
		{name: "classic single delay, reject-publish", topo: dlx.Topology{SingleRetryDelay: tier, QueueArguments: full},
			scenario: backFromTier, settle: time.Second, refusal: refusal},
		{name: "classic tiers, reject-publish by bytes", topo: dlx.Topology{RetryDelays: []time.Duration{tier},
			QueueArguments: amqp.Table{"x-max-length-bytes": int64(1), "x-overflow": "reject-publish"}},
			scenario: backFromTier, settle: time.Second, refusal: refusal},
		{name: "classic tiers, reject-publish-dlx", topo: dlx.Topology{RetryDelays: []time.Duration{tier},
			QueueArguments: amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish-dlx"}},
			scenario: backFromTier, settle: time.Second},
		{name: "classic tiers, drop-head", topo: dlx.Topology{RetryDelays: []time.Duration{tier}, QueueArguments: amqp.Table{"x-max-length": int64(1)}},
			scenario: backFromTier, settle: time.Second},
		{name: "quorum tiers, reject-publish", topo: dlx.Topology{Type: dlx.Quorum, RetryDelays: []time.Duration{tier}, QueueArguments: full},
			scenario: backFromTier, settle: time.Second},
		{name: "quorum at-least-once tiers, reject-publish", topo: dlx.Topology{Type: dlx.Quorum, AtLeastOnce: true, RetryDelays: []time.Duration{tier},
			QueueArguments: amqp.Table{"x-max-length": int64(1)}},
			scenario: backFromTier, settle: time.Second},
		{name: "quorum single delay, reject-publish", topo: dlx.Topology{Type: dlx.Quorum, SingleRetryDelay: tier, QueueArguments: full},
			scenario: backFromTier, settle: time.Second},
	})
}
