package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// topology returns a Topology on a fresh queue name whose queues are all
// deleted when the test ends.
func topology(t *testing.T, topo dlx.Topology) dlx.Topology {
	t.Helper()
	if topo.Queue == "" {
		topo.Queue = brokertest.Name(t, "work")
	}
	t.Cleanup(func() {
		brokertest.DeleteQueue(t, topo.Queue)
		brokertest.DeleteQueue(t, topo.DLQ())
		brokertest.DeleteQueue(t, topo.SingleRetryQueue())
		for _, d := range append(topo.RetryDelays, topo.TierEquivalent().RetryDelays...) {
			brokertest.DeleteQueue(t, topo.RetryQueue(d))
		}
	})
	return topo
}

func declare(t *testing.T, topo dlx.Topology) {
	t.Helper()
	if err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t))); err != nil {
		t.Fatal(err)
	}
}

func newPublisher(t *testing.T) *publisher.Publisher {
	t.Helper()
	brokertest.Dial(t)
	p, err := publisher.New(brokertest.URL(), publisher.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// arrival is one delivery of a message to the handler.
type arrival struct {
	at         time.Time
	retryCount int
}

// listen runs a listener on topo.Queue with mw and a handler that always fails
// with err, recording arrivals.
func listen(t *testing.T, topo dlx.Topology, mw middleware.Middleware, err error) func() []arrival {
	t.Helper()
	var mu sync.Mutex
	var arrivals []arrival
	l, lerr := listener.New(topo.Queue, mw, func(_ context.Context, d *amqp.Delivery) error {
		mu.Lock()
		arrivals = append(arrivals, arrival{time.Now(), dlx.RetryCount(d)})
		mu.Unlock()
		return err
	}, listener.WithURL(brokertest.URL()), listener.WithLogger(quiet), listener.WithDeclare(topo.Declare))
	if lerr != nil {
		t.Fatal(lerr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return func() []arrival {
		mu.Lock()
		defer mu.Unlock()
		return append([]arrival(nil), arrivals...)
	}
}

func TestTiersEscalateThenDLQ(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{time.Second, 2 * time.Second}})
	declare(t, topo)
	pub := newPublisher(t)
	arrivals := listen(t, topo, middleware.Recover(topo.Tiers(pub)), errors.New("payment gateway down"))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "order-7", Body: []byte("x")})

	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	got := arrivals()
	if len(got) != 3 {
		t.Fatalf("%d arrivals, want 3 (first, after 1s, after 2s)", len(got))
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		gap := got[i+1].at.Sub(got[i].at)
		t.Logf("tier %d: back after %v with retry-count %d", i+1, gap, got[i+1].retryCount)
		if gap < want-250*time.Millisecond || gap > want+250*time.Millisecond {
			t.Errorf("arrival %d came %v after the previous one, want %v ± 250ms", i+2, gap, want)
		}
		if got[i+1].retryCount != i+1 {
			t.Errorf("arrival %d has retry-count %d, want %d", i+2, got[i+1].retryCount, i+1)
		}
	}
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.DLQ())
	if d.MessageId != "order-7" || d.Headers["x-exception-message"] != "payment gateway down" ||
		d.Headers[dlx.RetryCountHeader] != int64(2) || d.Headers["x-amqpretry-original-queue"] != topo.Queue {
		t.Errorf("DLQ message %s with headers %v", d.MessageId, d.Headers)
	}
	for _, q := range []string{topo.Queue, topo.RetryQueue(time.Second), topo.RetryQueue(2 * time.Second)} {
		if n := brokertest.Depth(t, q); n != 0 {
			t.Errorf("%s holds %d", q, n)
		}
	}
}

// Local retries first, handed to the tiers once the next wait is too long.
func TestLocalRetriesHandOffToTiers(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{time.Second}})
	declare(t, topo)
	pub := newPublisher(t)
	chain := middleware.Chain(
		middleware.Retry(10, middleware.WithInitialInterval(100*time.Millisecond), middleware.HandOffAfter(250*time.Millisecond)),
		middleware.Recover(topo.Tiers(pub)),
	)
	arrivals := listen(t, topo, chain, errors.New("down"))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m"})
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	// 3 local attempts (waits 100ms, 200ms; 400ms is past the hand-off),
	// the tier, 3 more local attempts, then the DLQ.
	got := arrivals()
	if len(got) != 6 || got[2].retryCount != 0 || got[3].retryCount != 1 {
		t.Fatalf("%d arrivals (%+v), want 3 local attempts, a tier, 3 local attempts", len(got), got)
	}
	if gap := got[3].at.Sub(got[2].at); gap < 900*time.Millisecond {
		t.Errorf("the tier returned the message after %v, want about 1s", gap)
	}
}

func TestPermanentErrorsSkipTheTiers(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{time.Second}})
	declare(t, topo)
	arrivals := listen(t, topo, middleware.Recover(topo.Tiers(newPublisher(t))), middleware.Permanent(errors.New("invalid JSON")))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m"})
	brokertest.Eventually(t, 5*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	if n := len(arrivals()); n != 1 {
		t.Errorf("%d arrivals, want 1", n)
	}
}

func TestQuorumTopology(t *testing.T) {
	topo := topology(t, dlx.Topology{
		Type: dlx.Quorum, RetryDelays: []time.Duration{500 * time.Millisecond}, DeliveryLimit: 20, AtLeastOnce: true,
	})
	declare(t, topo)
	declare(t, topo) // idempotent
	out := brokertest.Rabbitmqctl(t, "list_queues", "name", "type", "arguments")
	for _, q := range []string{topo.Queue, topo.DLQ(), topo.RetryQueue(500 * time.Millisecond)} {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, q+"\t") {
				line = l
			}
		}
		if !strings.Contains(line, "quorum") {
			t.Errorf("%s is not a quorum queue: %q", q, line)
		}
	}
	arrivals := listen(t, topo, middleware.Recover(topo.Tiers(newPublisher(t))), errors.New("down"))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "q"})
	brokertest.Eventually(t, 10*time.Second, "the message on the quorum DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	if n := len(arrivals()); n != 2 {
		t.Errorf("%d arrivals, want 2 (first, after the tier)", n)
	}
}

func TestConflictingDeclaration(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{10 * time.Second}})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	if _, err := ch.QueueDeclare(topo.RetryQueue(10*time.Second), true, false, false, false, amqp.Table{"x-message-ttl": int64(5000)}); err != nil {
		t.Fatal(err)
	}
	err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t)))
	var ce *dlx.ConflictError
	if !errors.As(err, &ce) || ce.Name != topo.RetryQueue(10*time.Second) || ce.Argument != "x-message-ttl" {
		t.Fatalf("err = %v, want a ConflictError on the tier's x-message-ttl", err)
	}
	for _, want := range []string{topo.RetryQueue(10 * time.Second), "x-message-ttl", "rabbitmqctl delete_queue"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not mention %q: %v", want, err)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := map[string]dlx.Topology{
		"dlx: Topology.Queue is required": {},
		"dlx: Topology.Type must be":      {Queue: "q", Type: "stream"},
		"not both":                        {Queue: "q", RetryDelays: []time.Duration{time.Second}, SingleRetryDelay: time.Second},
		"in increasing order":             {Queue: "q", RetryDelays: []time.Duration{time.Minute, time.Second}},
		"need Type: dlx.Quorum":           {Queue: "q", DeliveryLimit: 3},
		// The single-delay layout's work queue dead-letters everything into
		// its retry queue: what it dead-letters without a rejection goes
		// round a cycle the broker drops silently (TestSingleRetryLayoutDropsWhatItDoesNotReject).
		"Topology.DeliveryLimit 3: past it the broker dead-letters the message (reason delivery_limit)": {
			Queue: "q", Type: dlx.Quorum, SingleRetryDelay: time.Second, DeliveryLimit: 3},
		`QueueArguments["x-delivery-limit"]: past the limit`: {
			Queue: "q", Type: dlx.Quorum, SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-delivery-limit": int64(3)}},
		`QueueArguments["x-message-ttl"]: a message that expires on it is dead-lettered`: {
			Queue: "q", SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-message-ttl": int64(60000)}},
		`QueueArguments["x-max-length"]: a message dropped for length is dead-lettered`: {
			Queue: "q", SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-max-length": int64(10)}},
		`QueueArguments["x-max-length-bytes"]`: {
			Queue: "q", SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-max-length-bytes": int64(1 << 20), "x-overflow": "drop-head"}},
		"dlx: Topology.RetryDelays[0] must be at least 1ms, got 0s": {Queue: "q", RetryDelays: []time.Duration{0}},
		"two retry tiers share the queue name \"q.retry.1s\"":       {Queue: "q", RetryDelays: []time.Duration{time.Second, time.Second}},
		`DLQWithBrokerDefaultLimit is for a quorum DLQ created without x-delivery-limit: it needs Type: dlx.Quorum, got "classic"`: {
			Queue: "q", DLQWithBrokerDefaultLimit: true},
		"DLQWithBrokerDefaultLimit declares the DLQ without x-delivery-limit, but Topology.DLQArguments sets it to 50": {
			Queue: "q", Type: dlx.Quorum, DLQWithBrokerDefaultLimit: true, DLQArguments: amqp.Table{"x-delivery-limit": int64(50)}},
	}
	for want, topo := range tests {
		if err := topo.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(%+v) = %v, want %q", topo, err, want)
		}
	}
	if got := (dlx.Topology{Queue: "orders"}).RetryQueue(90 * time.Second); got != "orders.retry.90s" {
		t.Errorf("RetryQueue = %q", got)
	}
	for d, want := range map[time.Duration]string{500 * time.Millisecond: "500ms", time.Minute: "1m", 2 * time.Hour: "2h", 90 * time.Minute: "90m"} {
		if got := dlx.FormatDelay(d); got != want {
			t.Errorf("FormatDelay(%v) = %q, want %q", d, got, want)
		}
	}
}

// Validate and Tiers name every problem at once, not the first.
func TestValidateNamesEveryProblem(t *testing.T) {
	topo := dlx.Topology{Type: "stream", DeliveryLimit: -1, RetryDelays: []time.Duration{time.Minute, 0},
		ExchangeKind: "fanout", QueueArguments: amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "x"}}
	err := topo.Validate()
	for _, want := range []string{"Topology.Queue is required", `Type must be "classic" or "quorum", got "stream"`,
		"DeliveryLimit must be >= 0, got -1", "RetryDelays[1] must be at least 1ms, got 0s", "increasing order, got 0s after 1m0s",
		`ExchangeKind "fanout" needs Topology.Exchange`, `QueueArguments["x-queue-type"] = "quorum"`,
		`QueueArguments["x-dead-letter-exchange"] = "x"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want it to say %q", err, want)
		}
	}
	defer func() {
		got := fmt.Sprint(recover())
		for _, want := range []string{"Topology.Queue is required", "Tiers needs Topology.RetryDelays", "MaxRetries expects n >= 0, got -2"} {
			if !strings.Contains(got, want) {
				t.Errorf("Tiers panicked with %q; want it to say %q", got, want)
			}
		}
	}()
	dlx.Topology{}.Tiers(&pubtest.Publisher{}, dlx.MaxRetries(-2))
}

// The single-delay layout: a rejection is a retry, atomically in the broker.
func TestSingleRetryDelayLayout(t *testing.T) {
	topo := topology(t, dlx.Topology{SingleRetryDelay: 300 * time.Millisecond})
	declare(t, topo)
	pub := newPublisher(t)
	final := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey())
	arrivals := listen(t, topo, middleware.Recover(topo.RejectToRetry(2, final)), errors.New("down"))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "s"})
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	got := arrivals()
	if len(got) != 3 {
		t.Fatalf("%d arrivals, want 3 (first and two retries)", len(got))
	}
	if gap := got[1].at.Sub(got[0].at); gap < 250*time.Millisecond {
		t.Errorf("retried after %v, want the 300ms TTL", gap)
	}
	if got[2].retryCount != 2 {
		t.Errorf("RetryCount from x-death = %d on the last arrival, want 2", got[2].retryCount)
	}
}

// Inspecting or filtering a DLQ hands messages back, which counts as a
// delivery: the DLQ must never carry Topology.DeliveryLimit, and gets a limit
// of math.MaxInt32 so that RabbitMQ 4's default of 20 does not apply either.
func TestQuorumDLQGetsNoTopologyDeliveryLimit(t *testing.T) {
	topo := topology(t, dlx.Topology{
		Type: dlx.Quorum, DeliveryLimit: 2, RetryDelays: []time.Duration{time.Second},
		DLQArguments: amqp.Table{"x-max-length": int64(100000)},
	})
	declare(t, topo)
	args := map[string]string{}
	for _, line := range strings.Split(brokertest.Rabbitmqctl(t, "list_queues", "name", "arguments"), "\n") {
		if name, a, ok := strings.Cut(line, "\t"); ok {
			args[name] = a
		}
	}
	for _, q := range []string{topo.Queue, topo.RetryQueue(time.Second)} {
		if !strings.Contains(args[q], `{"x-delivery-limit",2}`) {
			t.Errorf("%s should carry the delivery limit 2: %q", q, args[q])
		}
	}
	if !strings.Contains(args[topo.DLQ()], `{"x-delivery-limit",2147483647}`) || !strings.Contains(args[topo.DLQ()], "x-max-length") {
		t.Errorf("DLQ arguments %q: want DLQArguments and x-delivery-limit 2147483647", args[topo.DLQ()])
	}
	// Three messages looked at three times, as three `dlq list` would. A
	// closed channel's unacked messages can reach the quorum queue again a
	// moment after Close returns (seen once on 3.10 under -race): wait for
	// them rather than read a depth of 0.
	brokertest.Publish(t, topo.DLQ(), amqp.Publishing{}, amqp.Publishing{}, amqp.Publishing{})
	allBack := func() bool { return brokertest.Depth(t, topo.DLQ()) == 3 }
	for look := range 3 {
		brokertest.Eventually(t, 5*time.Second, fmt.Sprintf("all 3 dead letters back on the DLQ before look %d", look+1), allBack)
		ch := brokertest.Channel(t, brokertest.Dial(t))
		for range 3 {
			if _, ok, err := ch.Get(topo.DLQ(), false); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		ch.Close()
	}
	brokertest.Eventually(t, 5*time.Second, "all 3 dead letters on the DLQ after three looks", allBack)
}

// A quorum DLQ created before the Topology gave it x-delivery-limit cannot
// take it now: Declare says so and how to get out, and
// DLQWithBrokerDefaultLimit declares it as it is.
func TestQuorumDLQCreatedWithoutDeliveryLimit(t *testing.T) {
	topo := topology(t, dlx.Topology{Type: dlx.Quorum})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	if _, err := ch.QueueDeclare(topo.DLQ(), true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t)))
	var ce *dlx.ConflictError
	if !errors.As(err, &ce) || ce.Name != topo.DLQ() || ce.Argument != "x-delivery-limit" {
		t.Fatalf("err = %v, want a ConflictError on the DLQ's x-delivery-limit", err)
	}
	for _, want := range []string{
		"quorum DLQ " + fmt.Sprintf("%q", topo.DLQ()) + " was created without x-delivery-limit",
		"drops a dead letter after 20",
		"amqpretry dlq replay " + topo.DLQ() + " sends the dead letters back",
		"--to QUEUE",
		"rabbitmqctl delete_queue " + topo.DLQ() + " --if-empty",
		"set Topology.DLQWithBrokerDefaultLimit",
		"safe on RabbitMQ 3.x",
		"rabbitmqctl set_policy " + topo.DLQ() + "-delivery-limit '^" + regexp.QuoteMeta(topo.DLQ()) + "$' '{\"delivery-limit\": 2147483647}' --apply-to quorum_queues",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}

	topo.DLQWithBrokerDefaultLimit = true
	declare(t, topo)
	declare(t, topo) // idempotent
}

// The original exchange and routing key survive the tier hops, so a replay
// to them reaches every queue bound there again.
func TestOriginalDestinationSurvivesTiers(t *testing.T) {
	shop := brokertest.Name(t, "shop")
	brokertest.Exchange(t, shop, "topic")
	topo := topology(t, dlx.Topology{Exchange: shop, ExchangeKind: "topic", BindingKeys: []string{"orders.*"},
		RetryDelays: []time.Duration{200 * time.Millisecond}})
	declare(t, topo)
	pub := newPublisher(t)
	tiers := topo.Tiers(pub, dlx.WithRepublishOptions(
		recoverer.WithHeaders(func(context.Context, *amqp.Delivery, error) amqp.Table { return amqp.Table{"x-mine": "kept"} })))
	listen(t, topo, middleware.Recover(tiers), errors.New("down"))
	if err := pub.Publish(context.Background(), shop, "orders.created", amqp.Publishing{MessageId: "o1"}); err != nil {
		t.Fatal(err)
	}
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.DLQ())
	if d.Headers["x-original-exchange"] != shop || d.Headers["x-original-routingKey"] != "orders.created" {
		t.Errorf("original destination %v / %v after a tier hop, want %s / orders.created", d.Headers["x-original-exchange"], d.Headers["x-original-routingKey"], shop)
	}
	if d.Headers["x-mine"] != "kept" {
		t.Errorf("WithRepublishOptions(WithHeaders(...)) was dropped: %v", d.Headers)
	}
}

// A message the broker dead-lettered itself names its queue in
// x-first-death-queue: Replay sends it back there.
func TestReplayOfABrokerDeadLetter(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "rejected"})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, _, _ := ch.Get(topo.Queue, false)
	_ = d.Reject(false) // the work queue's own DLX takes it
	brokertest.Eventually(t, 5*time.Second, "on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), newPublisher(t), topo.DLQ())
	if err != nil || stats.Replayed != 1 || brokertest.Depth(t, topo.Queue) != 1 {
		t.Fatalf("stats %+v, err %v, work queue %d", stats, err, brokertest.Depth(t, topo.Queue))
	}
}

func TestReplayWithACustomPrefix(t *testing.T) {
	topo := topology(t, dlx.Topology{})
	declare(t, topo)
	pub := newPublisher(t)
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "p"})
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, _, _ := ch.Get(topo.Queue, false)
	rep := recoverer.Republish(pub, topo.DLX(), topo.DLQRoutingKey(), recoverer.WithHeaderPrefix("acme-"))
	if err := rep.Recover(chainrun.WithQueue(context.Background(), topo.Queue), &d, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	_ = d.Ack(false)
	stats, err := dlx.Replay(context.Background(), brokertest.Channel(t, brokertest.Dial(t)), pub, topo.DLQ(), dlx.ReplayHeaderPrefix("acme-"))
	if err != nil || stats.Replayed != 1 {
		t.Fatalf("stats %+v, err %v: the acme- headers name the destination", stats, err)
	}
	back, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.Queue)
	for k := range back.Headers {
		if strings.HasPrefix(k, "acme-") || strings.HasPrefix(k, "x-exception") {
			t.Errorf("header %s survived the replay", k)
		}
	}
}

// MaxRetries above the number of tiers sends the later retries through the
// last tier again; the DLQ copy carries the final count.
func TestMaxRetriesReusesTheLastTier(t *testing.T) {
	topo := topology(t, dlx.Topology{RetryDelays: []time.Duration{200 * time.Millisecond, 500 * time.Millisecond}})
	declare(t, topo)
	arrivals := listen(t, topo, middleware.Recover(topo.Tiers(newPublisher(t), dlx.MaxRetries(3))), errors.New("down"))
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m"})
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })
	got := arrivals()
	if len(got) != 4 {
		t.Fatalf("%d arrivals (%+v), want 4: the first and 3 broker retries", len(got), got)
	}
	for i, want := range []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond} {
		gap := got[i+1].at.Sub(got[i].at)
		if gap < want-50*time.Millisecond || gap > want+400*time.Millisecond {
			t.Errorf("retry %d came back after %v, want about %v", i+1, gap, want)
		}
		if got[i+1].retryCount != i+1 {
			t.Errorf("retry %d has retry-count %d", i+1, got[i+1].retryCount)
		}
	}
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), topo.DLQ())
	if d.Headers[dlx.RetryCountHeader] != int64(3) {
		t.Errorf("DLQ copy has %s = %v, want 3", dlx.RetryCountHeader, d.Headers[dlx.RetryCountHeader])
	}
}

// What Declare would ignore or overwrite is refused, naming the field and
// its value, rather than declared differently from what was written.
func TestValidateRefusesWhatDeclareWouldNotDo(t *testing.T) {
	name := func(time.Duration) string { return "custom" }
	tests := []struct {
		name string
		topo dlx.Topology
		want string
	}{
		{"ExchangeKind without Exchange", dlx.Topology{Queue: "q", ExchangeKind: "topic"},
			`Topology.ExchangeKind "topic" needs Topology.Exchange`},
		{"BindingKeys without Exchange", dlx.Topology{Queue: "q", BindingKeys: []string{"orders.*"}},
			`Topology.BindingKeys ["orders.*"] need Topology.Exchange`},
		{"QueueArguments with SkipWorkQueue", dlx.Topology{Queue: "q", SkipWorkQueue: true, QueueArguments: amqp.Table{"x-max-length": int64(10)}},
			"Topology.QueueArguments map[x-max-length:10] are not used with Topology.SkipWorkQueue"},
		{"BindingKeys with SkipWorkQueue", dlx.Topology{Queue: "q", SkipWorkQueue: true, Exchange: "shop", BindingKeys: []string{"a"}},
			`Topology.BindingKeys ["a"] are not used with Topology.SkipWorkQueue`},
		{"RetryQueueName with SingleRetryDelay", dlx.Topology{Queue: "q", SingleRetryDelay: time.Second, RetryQueueName: name},
			`Topology.RetryQueueName is not used with Topology.SingleRetryDelay 1s: that layout's retry queue is always Queue+".retry" ("q.retry")`},
		{"x-dead-letter-exchange", dlx.Topology{Queue: "q", QueueArguments: amqp.Table{"x-dead-letter-exchange": "mine"}},
			`Topology.QueueArguments["x-dead-letter-exchange"] = "mine": Declare sets it to the topology's DLX, "q.dlx"; name that with Topology.DeadLetterExchange`},
		{"x-dead-letter-routing-key", dlx.Topology{Queue: "q", QueueArguments: amqp.Table{"x-dead-letter-routing-key": "k"}},
			`Topology.QueueArguments["x-dead-letter-routing-key"] = "k": Declare sets it to the topology's DLQ routing key, "q"; name that with Topology.DeadLetterRoutingKey`},
		{"x-dead-letter-exchange, single delay", dlx.Topology{Queue: "q", SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-dead-letter-exchange": "mine"}},
			`Topology.QueueArguments["x-dead-letter-exchange"] = "mine": Declare sets it to "", with Topology.SingleRetryDelay the work queue dead-letters into its retry queue`},
		{"x-overflow, quorum at-least-once", dlx.Topology{Queue: "q", Type: dlx.Quorum, AtLeastOnce: true, QueueArguments: amqp.Table{"x-overflow": "drop-head"}},
			`Topology.QueueArguments["x-overflow"] = "drop-head": Declare sets it to "reject-publish", which Topology.AtLeastOnce needs`},
		{"x-dead-letter-strategy, quorum at-least-once", dlx.Topology{Queue: "q", Type: dlx.Quorum, AtLeastOnce: true, QueueArguments: amqp.Table{"x-dead-letter-strategy": "at-most-once"}},
			`Topology.QueueArguments["x-dead-letter-strategy"] = "at-most-once": Declare sets it to "at-least-once"`},
		{"x-delivery-limit with DeliveryLimit", dlx.Topology{Queue: "q", Type: dlx.Quorum, DeliveryLimit: 5, QueueArguments: amqp.Table{"x-delivery-limit": int64(9)}},
			`Topology.QueueArguments["x-delivery-limit"] = 9: Declare sets it to Topology.DeliveryLimit, 5`},
		{"x-queue-type in QueueArguments", dlx.Topology{Queue: "q", QueueArguments: amqp.Table{"x-queue-type": "quorum"}},
			`Topology.QueueArguments["x-queue-type"] = "quorum": the retry queues and the DLQ would not get it; set Topology.Type`},
		{"reject-publish, classic tiers", dlx.Topology{Queue: "q", RetryDelays: []time.Duration{time.Second}, QueueArguments: amqp.Table{"x-max-length": int64(10), "x-overflow": "reject-publish"}},
			`Topology.QueueArguments["x-overflow"] = "reject-publish" with a length limit: a retry sent back by its retry tiers while the classic work queue q is full is refused, and RabbitMQ drops it`},
		{"reject-publish, classic single delay", dlx.Topology{Queue: "q", SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-max-length-bytes": int64(1 << 20), "x-overflow": "reject-publish"}},
			`a retry sent back by q.retry while the classic work queue q is full is refused, and RabbitMQ drops it without a word (dead-lettering is not confirmed): drop the length limit, or use Type: dlx.Quorum`},
		{"x-queue-type in DLQArguments", dlx.Topology{Queue: "q", Type: dlx.Quorum, DLQArguments: amqp.Table{"x-queue-type": "classic"}},
			`Topology.DLQArguments["x-queue-type"] = "classic": the other queues of the topology would not get it; set Topology.Type`},
		{"SingleActiveConsumer with SkipWorkQueue", dlx.Topology{Queue: "q", SkipWorkQueue: true, SingleActiveConsumer: true},
			"Topology.SingleActiveConsumer is not used with Topology.SkipWorkQueue"},
		{"x-single-active-consumer false with SingleActiveConsumer", dlx.Topology{Queue: "q", SingleActiveConsumer: true, QueueArguments: amqp.Table{"x-single-active-consumer": false}},
			`Topology.QueueArguments["x-single-active-consumer"] = false: Declare sets it to true for Topology.SingleActiveConsumer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.topo.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v\nwant it to say %s", err, tt.want)
			}
		})
	}
}

// What Declare does pass on stays allowed.
func TestValidateAcceptsWhatDeclarePassesOn(t *testing.T) {
	tests := map[string]dlx.Topology{
		"QueueArguments":           {Queue: "q", QueueArguments: amqp.Table{"x-max-length": int64(10), "x-overflow": "reject-publish"}},
		"exchange, kind, keys":     {Queue: "q", Exchange: "shop", ExchangeKind: "topic", BindingKeys: []string{"orders.*"}},
		"exchange, SkipWorkQueue":  {Queue: "q", Exchange: "shop", ExchangeKind: "topic", SkipWorkQueue: true},
		"quorum x-overflow":        {Queue: "q", Type: dlx.Quorum, QueueArguments: amqp.Table{"x-overflow": "drop-head"}},
		"quorum x-delivery-limit":  {Queue: "q", Type: dlx.Quorum, QueueArguments: amqp.Table{"x-delivery-limit": int64(5)}},
		"DLQArguments":             {Queue: "q", DLQArguments: amqp.Table{"x-max-length": int64(10), "x-dead-letter-exchange": "graveyard"}},
		"RetryQueueName, tiers":    {Queue: "q", RetryDelays: []time.Duration{time.Second}, RetryQueueName: func(time.Duration) string { return "r" }},
		"single delay, arguments":  {Queue: "q", Type: dlx.Quorum, SingleRetryDelay: time.Second, QueueArguments: amqp.Table{"x-max-length": int64(10), "x-overflow": "reject-publish"}},
		"quorum DLQ as it was":     {Queue: "q", Type: dlx.Quorum, DLQWithBrokerDefaultLimit: true},
		"quorum DLQ limit of mine": {Queue: "q", Type: dlx.Quorum, DLQArguments: amqp.Table{"x-delivery-limit": int64(1000)}},
		// What Declare sets anyway, said again: harmless, and in configurations
		// that worked before Validate looked at arguments.
		"x-queue-type as Type":      {Queue: "q", Type: dlx.Quorum, QueueArguments: amqp.Table{"x-queue-type": "quorum"}, DLQArguments: amqp.Table{"x-queue-type": "quorum"}},
		"x-queue-type classic":      {Queue: "q", QueueArguments: amqp.Table{"x-queue-type": "classic"}},
		"x-overflow as AtLeastOnce": {Queue: "q", Type: dlx.Quorum, AtLeastOnce: true, QueueArguments: amqp.Table{"x-overflow": "reject-publish"}},
		"the topology's own DLX":    {Queue: "q", QueueArguments: amqp.Table{"x-dead-letter-exchange": "q.dlx", "x-dead-letter-routing-key": "q"}},
		"DeliveryLimit, said again": {Queue: "q", Type: dlx.Quorum, DeliveryLimit: 5, QueueArguments: amqp.Table{"x-delivery-limit": 5}},
		"single active consumer":    {Queue: "q", Type: dlx.Quorum, SingleActiveConsumer: true, QueueArguments: amqp.Table{"x-single-active-consumer": true}},
		"x-single-active-consumer":  {Queue: "q", QueueArguments: amqp.Table{"x-single-active-consumer": true}},
	}
	for name, topo := range tests {
		if err := topo.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v, want nil", name, err)
		}
	}
}
