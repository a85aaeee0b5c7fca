package dlx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/pubtest"
	"github.com/amqpretry/amqpretry/internal/testlog"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func TestDelayedRedeliverySchedule(t *testing.T) {
	tests := []struct {
		r    dlx.DelayedRedelivery
		want string
	}{
		{dlx.DelayedRedelivery{Redeliveries: 3, Min: time.Second}, "[1s 2s 3s]"},
		{dlx.DelayedRedelivery{Redeliveries: 5, Min: 200 * time.Millisecond, Max: 500 * time.Millisecond}, "[200ms 400ms 500ms 500ms 500ms]"},
		{dlx.DelayedRedelivery{Redeliveries: 2, Min: time.Second, Max: time.Second}, "[1s 1s]"},
	}
	for _, tt := range tests {
		if got := fmt.Sprint(tt.r.Schedule()); got != tt.want {
			t.Errorf("%+v: schedule %s, want %s", tt.r, got, tt.want)
		}
	}
	topo := dlx.Topology{Queue: "orders", Type: dlx.Quorum, DelayedRedelivery: &tests[1].r}
	tiers := topo.TierEquivalent()
	if got := fmt.Sprint(tiers.RetryDelays); got != "[200ms 400ms 500ms]" || tiers.DelayedRedelivery != nil || tiers.Type != dlx.Quorum {
		t.Errorf("TierEquivalent: delays %s (want [200ms 400ms 500ms]), delayed redelivery %v, type %s", got, tiers.DelayedRedelivery, tiers.Type)
	}
	if err := tiers.Validate(); err != nil {
		t.Errorf("the tier equivalent is invalid: %v", err)
	}
}

func TestValidateDelayedRedelivery(t *testing.T) {
	ok := func() *dlx.DelayedRedelivery {
		return &dlx.DelayedRedelivery{Redeliveries: 3, Min: time.Second, Max: 5 * time.Second}
	}
	tests := []struct {
		name string
		topo dlx.Topology
		want string // "" for valid
	}{
		{"valid", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: ok()}, ""},
		{"classic", dlx.Topology{DelayedRedelivery: ok()}, `needs Type: dlx.Quorum, got "classic"`},
		{"with tiers", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: ok(), RetryDelays: []time.Duration{time.Second}}, "drop Topology.RetryDelays"},
		{"no redeliveries", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Min: time.Second}}, "Redeliveries expects 1 to 10000, got 0"},
		{"no min", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 1}}, "Min expects whole milliseconds, at least 1ms, got 0s"},
		{"sub-millisecond", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 1, Min: 1500 * time.Microsecond}}, "got 1.5ms"},
		{"max below min", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 1, Min: time.Second, Max: time.Millisecond}}, "at least Min (1s), got 1ms"},
		{"two limits", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: ok(), DeliveryLimit: 7}, "DeliveryLimit 7 and Topology.DelayedRedelivery.Redeliveries 3"},
		{"skip work queue", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: ok(), SkipWorkQueue: true}, "not with Topology.SkipWorkQueue"},
		{"argument overridden", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: ok(), QueueArguments: amqp.Table{"x-delayed-retry-min": int64(5)}}, `QueueArguments["x-delayed-retry-min"] = 5`},
		{"same argument", dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: ok(), QueueArguments: amqp.Table{"x-delivery-limit": 3}}, ""},
		{"priority on quorum", dlx.Topology{Type: dlx.Quorum, MaxPriority: 5}, "refuses on quorum queues"},
		{"priority too high", dlx.Topology{MaxPriority: 256}, "MaxPriority expects 0 to 255, got 256"},
		{"priority", dlx.Topology{MaxPriority: 10}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.topo.Queue = "orders"
			err := tt.topo.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate() = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// delivery is a delivery with the given x-delivery-count (absent for < 1)
// on a channel whose broker the listener would have remembered.
func redelivery(count int, ack amqp.Acknowledger) *amqp.Delivery {
	d := &amqp.Delivery{Acknowledger: ack, MessageId: "m", Body: []byte("x"), RoutingKey: "orders", Headers: amqp.Table{}}
	if count > 0 {
		d.Headers["x-delivery-count"] = int64(count)
	}
	return d
}

func TestRedeliverHandsFailuresBackUntilTheLastDelivery(t *testing.T) {
	topo := dlx.Topology{Queue: "orders", Type: dlx.Quorum, DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 3, Min: time.Second}}
	pub := &pubtest.Publisher{}
	r := topo.Redeliver(pub)
	ctx := chainrun.WithQueue(context.Background(), "orders")
	boom := errors.New("boom")
	for count := range 3 { // deliveries 1, 2 and 3 of 4
		if !r.RecoversAtOnce(redelivery(count, nil), boom) {
			t.Errorf("delivery %d: RecoversAtOnce = false, want true (handed back, no I/O)", count+1)
		}
		err := r.Recover(ctx, redelivery(count, nil), boom)
		if !errors.Is(err, middleware.ErrRedeliver) || chainrun.SettlementFor(err) != chainrun.Requeue {
			t.Fatalf("delivery %d: Recover = %v (settled %v), want ErrRedeliver, a requeue", count+1, err, chainrun.SettlementFor(err))
		}
		if want := fmt.Sprintf("dlx: delivery %d of 4 failed; the broker delivers it again in %v", count+1, time.Duration(count+1)*time.Second); err.Error() != want {
			t.Errorf("delivery %d: %q, want %q", count+1, err, want)
		}
		if len(pub.Sent()) != 0 {
			t.Fatalf("delivery %d published %v", count+1, pub.Sent())
		}
	}
	if r.RecoversAtOnce(redelivery(3, nil), boom) || r.RecoversAtOnce(redelivery(0, nil), middleware.Permanent(boom)) {
		t.Error("RecoversAtOnce = true for a publish to the DLQ")
	}
	if err := r.Recover(ctx, redelivery(3, nil), boom); err != nil {
		t.Fatalf("last delivery: Recover = %v, want nil (published to the DLQ)", err)
	}
	if err := r.Recover(ctx, redelivery(0, nil), middleware.Permanent(boom)); err != nil {
		t.Fatalf("permanent: Recover = %v, want nil (published to the DLQ)", err)
	}
	sent := pub.Sent()
	if len(sent) != 2 {
		t.Fatalf("published %d, want 2 (the last delivery and the permanent failure)", len(sent))
	}
	for _, p := range sent {
		if p.Exchange != topo.DLX() || p.Key != topo.DLQRoutingKey() || p.Msg.Headers["x-exception-message"] != "boom" {
			t.Errorf("published to %q/%q with x-exception-message %v, want the DLX with the fault headers", p.Exchange, p.Key, p.Msg.Headers["x-exception-message"])
		}
	}
	if got := sent[0].Msg.Headers[dlx.RetryCountHeader]; got != int64(3) {
		t.Errorf("the dead letter's %s = %v, want 3 (the broker's redeliveries)", dlx.RetryCountHeader, got)
	}
	if _, ok := sent[0].Msg.Headers["x-delivery-count"]; ok {
		t.Error("the dead letter carries the broker's x-delivery-count")
	}
}

func TestRedeliverFallsBackToTiersOnAnOlderBroker(t *testing.T) {
	topo := dlx.Topology{Queue: "orders", Type: dlx.Quorum,
		DelayedRedelivery: &dlx.DelayedRedelivery{Redeliveries: 2, Min: time.Second, FallbackToTiers: true}}
	pub := &pubtest.Publisher{}
	r := topo.Redeliver(pub)
	old, current := &amqp.Channel{}, &amqp.Channel{}
	defer amqpconn.Remember(old, amqpconn.ServerVersion{Major: 4, Minor: 0, Patch: 5, Known: true})()
	defer amqpconn.Remember(current, amqpconn.ServerVersion{Major: 4, Minor: 3, Patch: 6, Known: true})()
	ctx := chainrun.WithQueue(context.Background(), "orders")
	if err := r.Recover(ctx, redelivery(0, current), errors.New("boom")); !errors.Is(err, middleware.ErrRedeliver) {
		t.Fatalf("on 4.3: Recover = %v, want ErrRedeliver", err)
	}
	if err := r.Recover(ctx, redelivery(0, old), errors.New("boom")); err != nil {
		t.Fatalf("on 4.0: Recover = %v, want nil (published to the first tier)", err)
	}
	sent := pub.Sent()
	if len(sent) != 1 || sent[0].Exchange != "" || sent[0].Key != topo.RetryQueue(time.Second) || sent[0].Msg.Headers[dlx.RetryCountHeader] != int64(1) {
		t.Fatalf("on 4.0 published %+v, want one copy to %s with x-retry-count 1", sent, topo.RetryQueue(time.Second))
	}
}

// Declare on each broker: the delayed-retry arguments on 4.3; on older
// brokers, which accept them and ignore them, an error that names the
// fallback, or with FallbackToTiers the TTL tiers; on a channel whose broker
// it cannot know, an error that says how to declare it.
func TestDeclareDelayedRedelivery(t *testing.T) {
	native := brokertest.AtLeast(t, 4, 3)
	r := dlx.DelayedRedelivery{Redeliveries: 2, Min: 100 * time.Millisecond, Max: 150 * time.Millisecond}
	topo := topology(t, dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: &r})

	err := topo.Declare(brokertest.Channel(t, brokertest.Dial(t)))
	var verr *dlx.VersionError
	if !errors.As(err, &verr) || verr.Broker != "" || !strings.Contains(err.Error(), "DeclareOn(conn)") {
		t.Fatalf("Declare on a channel of our own = %v, want a *VersionError saying the broker cannot be told and naming DeclareOn", err)
	}

	err = topo.DeclareOn(brokertest.Dial(t))
	switch {
	case native && err != nil:
		t.Fatalf("DeclareOn on RabbitMQ 4.3: %v", err)
	case !native && (!errors.Is(err, dlx.ErrNeedsRabbitMQ43) || !strings.Contains(err.Error(), "FallbackToTiers")):
		t.Fatalf("DeclareOn on an older broker = %v, want ErrNeedsRabbitMQ43 naming FallbackToTiers", err)
	}
	if brokertest.QueueExists(t, topo.Queue) != native {
		t.Fatalf("work queue declared: %v, want %v", brokertest.QueueExists(t, topo.Queue), native)
	}

	r.FallbackToTiers = true
	if err := topo.DeclareOn(brokertest.Dial(t)); err != nil {
		t.Fatalf("DeclareOn with FallbackToTiers: %v", err)
	}
	for _, d := range []time.Duration{100 * time.Millisecond, 150 * time.Millisecond} {
		if brokertest.QueueExists(t, topo.RetryQueue(d)) == native {
			t.Errorf("tier %s declared: %v, want %v", topo.RetryQueue(d), !native, !native)
		}
	}
}

// arrivalLog records, per message id, when each delivery of it began and
// ended and what x-delivery-count and x-retry-count it came with.
type arrivalLog struct {
	mu   sync.Mutex
	seen map[string][]deliverySeen
}

type deliverySeen struct {
	began, ended   time.Time
	count, retries any
}

func (a *arrivalLog) begin(d *amqp.Delivery) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string][]deliverySeen{}
	}
	a.seen[d.MessageId] = append(a.seen[d.MessageId], deliverySeen{began: time.Now(), count: d.Headers["x-delivery-count"], retries: d.Headers[dlx.RetryCountHeader]})
	return len(a.seen[d.MessageId])
}

func (a *arrivalLog) end(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.seen[id]
	s[len(s)-1].ended = time.Now()
}

func (a *arrivalLog) of(id string) []deliverySeen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]deliverySeen(nil), a.seen[id]...)
}

// runListener runs a listener on topo's work queue, declaring the topology
// as the README wires it, until stop is called; Run must then return nil.
func runListener(t *testing.T, topo dlx.Topology, chain middleware.Middleware, h middleware.Handler, opts ...listener.Option) (stop func()) {
	t.Helper()
	l, err := listener.New(topo.Queue, chain, h, append([]listener.Option{listener.WithURL(brokertest.URL()), listener.WithDeclare(topo.Declare)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// The broker's delayed retry end to end, through the listener wired as the
// README wires it: a message that always fails is redelivered after
// Min·k (within 100 ms), healthy messages flow past it meanwhile, and on its
// last delivery it reaches the DLQ with the fault headers. On brokers older
// than 4.3 the same topology with FallbackToTiers runs the same schedule
// through TTL tiers.
func TestDelayedRedeliveryEndToEnd(t *testing.T) {
	native := brokertest.AtLeast(t, 4, 3)
	r := &dlx.DelayedRedelivery{Redeliveries: 3, Min: 300 * time.Millisecond, Max: 700 * time.Millisecond, FallbackToTiers: true}
	topo := topology(t, dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: r})
	pub := newPublisher(t)
	var arrivals arrivalLog
	var attempts sync.Map
	var healthy sync.WaitGroup
	healthy.Add(20)
	handle := func(ctx context.Context, d *amqp.Delivery) error {
		if d.MessageId != "poison" {
			healthy.Done()
			return nil
		}
		if middleware.Attempt(ctx) == 1 {
			arrivals.begin(d)
		}
		n, _ := attempts.LoadOrStore(d.MessageId, new(int))
		*n.(*int)++
		if middleware.Attempt(ctx) == 2 {
			arrivals.end(d.MessageId)
		}
		return errors.New("boom: the payment service said no")
	}
	chain := middleware.Chain(
		middleware.Retry(2, middleware.WithInitialInterval(5*time.Millisecond), middleware.WithMaxInterval(5*time.Millisecond)),
		middleware.Recover(topo.Redeliver(pub)))
	var log testlog.Buffer
	stop := runListener(t, topo, chain, handle, listener.WithLogger(log.Logger()),
		listener.WithRequeueDelay(time.Minute, time.Minute)) // a delay of its own would show
	defer stop()
	brokertest.Eventually(t, 10*time.Second, "the work queue declared", func() bool { return brokertest.QueueExists(t, topo.Queue) })
	msgs := []amqp.Publishing{{MessageId: "poison", Body: []byte("{}"), DeliveryMode: amqp.Persistent}}
	for i := range 20 {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint("ok-", i), Body: []byte("{}"), DeliveryMode: amqp.Persistent})
	}
	brokertest.Publish(t, topo.Queue, msgs...)
	brokertest.Eventually(t, 20*time.Second, "the dead letter on the DLQ", func() bool { return brokertest.Depth(t, topo.DLQ()) == 1 })

	seen := arrivals.of("poison")
	if len(seen) != r.Redeliveries+1 {
		t.Fatalf("the failing message was delivered %d times, want %d", len(seen), r.Redeliveries+1)
	}
	var gaps []time.Duration
	for k := 1; k < len(seen); k++ {
		gap := seen[k].began.Sub(seen[k-1].ended)
		gaps = append(gaps, gap.Round(time.Millisecond))
		// Never early (the delay is honoured); late by at most what a
		// loaded machine adds (a tier's TTL fires when the broker gets to
		// it: 720ms for 600ms was seen under load).
		if want := r.Delay(k); gap < want-20*time.Millisecond || gap > want+500*time.Millisecond {
			t.Errorf("redelivery %d came %v after the failure, want %v (-20ms/+500ms)", k, gap, want)
		}
	}
	t.Logf("native=%v: the broker redelivered after %v (schedule %v)", native, gaps, r.Schedule())
	if n, _ := attempts.Load("poison"); *n.(*int) != 2*(r.Redeliveries+1) {
		t.Errorf("the handler ran %d times, want %d (2 local attempts per delivery)", *n.(*int), 2*(r.Redeliveries+1))
	}
	waited := make(chan struct{})
	go func() { healthy.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("the healthy messages were not all handled")
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	dead, ok := brokertest.Get(t, ch, topo.DLQ())
	if !ok {
		t.Fatal("no dead letter")
	}
	if dead.MessageId != "poison" || dead.Headers["x-exception-message"] != "boom: the payment service said no" ||
		dead.Headers["x-exception-stacktrace"] == nil || dead.Headers[dlx.RetryCountHeader] != int64(r.Redeliveries) {
		t.Errorf("the dead letter %q has x-exception-message %v, a stack %v, x-retry-count %v: want the fault headers and %d broker retries",
			dead.MessageId, dead.Headers["x-exception-message"], dead.Headers["x-exception-stacktrace"] != nil, dead.Headers[dlx.RetryCountHeader], r.Redeliveries)
	}
	if native {
		if !strings.Contains(log.String(), "the broker delivers it again in") {
			t.Errorf("the log does not say the broker redelivers the message:\n%s", log.String())
		}
		if n := brokertest.Depth(t, topo.Queue); n != 0 {
			t.Errorf("the work queue still holds %d", n)
		}
	}
}

// A listener shut down while a message waits between its local attempts
// hands it back with a nack: on RabbitMQ 4.3 that neither counts toward the
// delivery limit nor waits, so the next listener gets it at once and with the
// same count; on older brokers (the tier fallback) the x-retry-count the
// tiers go by is unchanged. Nothing is lost, no attempt is used up.
func TestDelayedRedeliveryShutdownUsesUpNoAttempt(t *testing.T) {
	native := brokertest.AtLeast(t, 4, 3)
	r := &dlx.DelayedRedelivery{Redeliveries: 3, Min: 200 * time.Millisecond, FallbackToTiers: true}
	topo := topology(t, dlx.Topology{Type: dlx.Quorum, DelayedRedelivery: r})
	pub := newPublisher(t)
	var arrivals arrivalLog
	run := func(longWait bool) (stop func()) {
		backoff := 5 * time.Millisecond
		if longWait {
			backoff = time.Minute
		}
		chain := middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(backoff), middleware.WithMaxInterval(backoff)), middleware.Recover(topo.Redeliver(pub)))
		return runListener(t, topo, chain, func(ctx context.Context, d *amqp.Delivery) error {
			if middleware.Attempt(ctx) == 1 {
				arrivals.begin(d)
			}
			return errors.New("boom")
		}, listener.WithLogger(quiet))
	}
	stop := run(false)
	brokertest.Eventually(t, 10*time.Second, "the work queue declared", func() bool { return brokertest.QueueExists(t, topo.Queue) })
	brokertest.Publish(t, topo.Queue, amqp.Publishing{MessageId: "m", Body: []byte("x"), DeliveryMode: amqp.Persistent})
	brokertest.Eventually(t, 10*time.Second, "the message's first delivery", func() bool { return len(arrivals.of("m")) == 1 })
	stop()
	// Now it waits for its first redelivery in the broker (or a tier).
	stop = run(true)
	brokertest.Eventually(t, 10*time.Second, "the second delivery, waiting between its local attempts", func() bool { return len(arrivals.of("m")) == 2 })
	time.Sleep(100 * time.Millisecond) // its first attempt has failed: it waits a minute now
	stop()
	stopped := time.Now()
	stop = run(true)
	defer stop()
	brokertest.Eventually(t, 10*time.Second, "the message again after the shutdown", func() bool { return len(arrivals.of("m")) == 3 })
	seen := arrivals.of("m")
	after := seen[2].began.Sub(stopped)
	if native {
		if fmt.Sprint(seen[2].count) != fmt.Sprint(seen[1].count) || after > time.Second {
			t.Errorf("after the shutdown: x-delivery-count %v (before it %v), back after %v: want the same count, at once (a nack neither counts nor waits)",
				seen[2].count, seen[1].count, after)
		}
	} else if fmt.Sprint(seen[2].retries) != fmt.Sprint(seen[1].retries) {
		t.Errorf("after the shutdown: x-retry-count %v, before it %v: a shutdown must use up no tier retry", seen[2].retries, seen[1].retries)
	}
	if n := brokertest.Depth(t, topo.DLQ()); n != 0 {
		t.Errorf("the DLQ holds %d: the shutdown sent the message there", n)
	}
}
