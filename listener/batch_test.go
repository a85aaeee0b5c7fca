package listener_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// startBatch runs a batch listener on queue until the test ends or Stop is
// called.
func startBatch(t *testing.T, queue string, mw middleware.Middleware, h listener.BatchHandler, size int, wait time.Duration, opts ...listener.Option) *running {
	t.Helper()
	brokertest.Dial(t)
	opts = append([]listener.Option{listener.WithURL(brokertest.URL()), logTo(t, false)}, opts...)
	l, err := listener.NewBatch(queue, mw, h, size, wait, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Listener: l, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- l.Run(ctx) }()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// batches records the batches a handler was given, as message ids.
type batches struct {
	mu  sync.Mutex
	all [][]string
}

func (b *batches) add(batch []*amqp.Delivery) []string {
	ids := make([]string, len(batch))
	for i, d := range batch {
		ids[i] = d.MessageId
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all = append(b.all, ids)
	return ids
}

func (b *batches) get() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.all)
}

// handled counts the messages of every batch so far.
func (b *batches) handled() int {
	n := 0
	for _, ids := range b.get() {
		n += len(ids)
	}
	return n
}

// calls counts how often id was in a batch, and in a batch of its own.
func (b *batches) calls(id string) (inBatches, alone int) {
	for _, ids := range b.get() {
		if slices.Contains(ids, id) {
			inBatches++
			if len(ids) == 1 {
				alone++
			}
		}
	}
	return inBatches, alone
}

// dlqFixture is a dead-letter queue and a Recover that republishes to it.
func dlqFixture(t *testing.T) (dlq string, recover middleware.Middleware) {
	t.Helper()
	dlq = brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return dlq, middleware.Recover(recoverer.Republish(pub, "", dlq))
}

// drain takes every message off q and returns their ids, sorted.
func drain(t *testing.T, q string) []string {
	t.Helper()
	ch := brokertest.Channel(t, brokertest.Dial(t))
	var ids []string
	for {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			break
		}
		ids = append(ids, d.MessageId)
	}
	slices.Sort(ids)
	return ids
}

func TestBatchFillsUpToItsSize(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 10)
	var b batches
	// The wait is long enough that a batch ends short only when nothing
	// more can come: 10 ready messages make batches of 4, 4 and 2.
	r := startBatch(t, q, nil, func(_ context.Context, batch []*amqp.Delivery) error {
		b.add(batch)
		return nil
	}, 4, 2*time.Second, listener.WithPrefetch(4))
	brokertest.Eventually(t, 10*time.Second, "10 handled", func() bool { return b.handled() == 10 })
	r.Stop(t)
	got := b.get()
	want := [][]string{{"0", "1", "2", "3"}, {"4", "5", "6", "7"}, {"8", "9"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("batches %v, want %v", got, want)
	}
	if st := r.Stats(); st.Handled != 10 || st.Failed != 0 || brokertest.Depth(t, q) != 0 {
		t.Errorf("stats %+v, depth %d: want 10 acked", st, brokertest.Depth(t, q))
	}
}

// A partial batch goes to the handler once the wait has passed since its
// first message: three messages never fill a batch of 100.
func TestBatchPartialAfterTheWait(t *testing.T) {
	for _, wait := range []time.Duration{0, 100 * time.Millisecond} {
		t.Run(fmt.Sprint(wait), func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, nil)
			publishN(t, q, 3)
			var b batches
			r := startBatch(t, q, nil, func(_ context.Context, batch []*amqp.Delivery) error {
				b.add(batch)
				return nil
			}, 100, wait)
			brokertest.Eventually(t, 10*time.Second, "3 handled", func() bool { return b.handled() == 3 })
			if st := r.Stats(); st.InFlight != 0 {
				brokertest.Eventually(t, 5*time.Second, "all settled", func() bool { return r.Stats().InFlight == 0 })
			}
			r.Stop(t)
			if wait > 0 && len(b.get()) != 1 {
				t.Errorf("batches %v, want the three ready messages in one", b.get())
			}
			if brokertest.Depth(t, q) != 0 || r.Stats().Handled != 3 {
				t.Errorf("depth %d, stats %+v", brokertest.Depth(t, q), r.Stats())
			}
		})
	}
}

// Some messages of a batch fail: only they go through the chain, each
// alone; the rest are acked once.
func TestBatchPerMessageResults(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	dlq, recover := dlqFixture(t)
	publishN(t, q, 10)
	var b batches
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		ids := b.add(batch)
		errs := make([]error, len(batch))
		for i, id := range ids {
			switch {
			case id == "7": // fails every time: retried alone, then to the DLQ
				errs[i] = errors.New("bad row")
			case id == "3" && len(batch) > 1: // fails in the batch, succeeds alone
				errs[i] = errors.New("deadlock")
			case id == "5": // fails for good: to the DLQ at once
				errs[i] = middleware.Permanent(errors.New("invalid"))
			}
		}
		return listener.PerMessage(errs)
	}
	r := startBatch(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond)), recover), h, 10, 5*time.Second)
	brokertest.Eventually(t, 10*time.Second, "5 and 7 on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 2 })
	brokertest.Eventually(t, 10*time.Second, "all settled", func() bool { st := r.Stats(); return st.Handled == 10 && st.InFlight == 0 })
	r.Stop(t)

	if first := b.get()[0]; len(first) != 10 {
		t.Fatalf("first batch %v, want all 10", first)
	}
	for _, c := range []struct {
		id               string
		inBatches, alone int
		why              string
	}{
		{"0", 1, 0, "a success is handled once"},
		{"9", 1, 0, "a success is handled once"},
		{"3", 2, 1, "a failure is retried alone, and succeeds"},
		{"7", 3, 2, "Retry(3) counts the batch as the first attempt"},
		{"5", 1, 0, "a Permanent failure is not retried"},
	} {
		if in, alone := b.calls(c.id); in != c.inBatches || alone != c.alone {
			t.Errorf("message %s: in %d batches, %d of them alone; want %d, %d: %s", c.id, in, alone, c.inBatches, c.alone, c.why)
		}
	}
	if got := drain(t, dlq); fmt.Sprint(got) != "[5 7]" {
		t.Errorf("DLQ holds %v, want [5 7]", got)
	}
	if st := r.Stats(); st.Handled != 10 || st.Recovered != 2 || st.Failed != 0 || brokertest.Depth(t, q) != 0 {
		t.Errorf("stats %+v, depth %d: want every message acked, two of them recovered", st, brokertest.Depth(t, q))
	}
}

// A batch whose messages all fail runs each one's chain, and each waits
// between its retries on its own: the five wait side by side, not one
// after the other.
func TestBatchFailuresWaitSideBySide(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 5)
	var b batches
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		b.add(batch)
		return errors.New("database down")
	}
	waiting := newSeen()
	chain := middleware.Chain(
		middleware.Retry(3, middleware.WithInitialInterval(time.Minute), middleware.WithMaxInterval(time.Minute),
			middleware.OnRetry(func(_ context.Context, e middleware.RetryEvent) { waiting.add(e.Delivery.MessageId) })),
		middleware.Recover(neverRecover(t)))
	r := startBatch(t, q, chain, h, 5, 5*time.Second)
	brokertest.Eventually(t, 10*time.Second, "all five waiting for their second attempt", func() bool { return waiting.distinct() == 5 })
	if st := r.Stats(); st.Parked != 5 {
		t.Errorf("stats %+v: want the five parked", st)
	}
	r.Stop(t)
	if got := b.get(); len(got) != 1 || len(got[0]) != 5 {
		t.Errorf("batches %v, want the one batch of five", got)
	}
	if n := brokertest.Depth(t, q); n != 5 {
		t.Errorf("queue holds %d, want all five back after the shutdown", n)
	}
}

// A panic fails every message of the batch, each through the chain: none
// is lost, each ends on the DLQ with the panic as its fault.
func TestBatchPanicFailsTheBatchLosingNothing(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	dlq, recover := dlqFixture(t)
	publishN(t, q, 6)
	var b batches
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		if ids := b.add(batch); len(ids) > 1 || ids[0] == "2" {
			panic("nil map") // the batch, and message 2 alone
		}
		return nil
	}
	r := startBatch(t, q, middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Millisecond)), recover), h, 6, 5*time.Second)
	brokertest.Eventually(t, 10*time.Second, "all settled", func() bool { st := r.Stats(); return st.Handled == 6 && st.InFlight == 0 })
	r.Stop(t)
	if first := b.get()[0]; len(first) != 6 {
		t.Fatalf("first batch %v, want all 6", first)
	}
	ch := brokertest.Channel(t, brokertest.Dial(t))
	d, ok := brokertest.Get(t, ch, dlq)
	if !ok || d.MessageId != "2" || d.Headers["x-amqpretry-error-type"] != "panic" || !strings.Contains(fmt.Sprint(d.Headers["x-exception-stacktrace"]), "nil map") {
		t.Errorf("DLQ: %v %q %v, want message 2 with the panic", ok, d.MessageId, d.Headers)
	}
	if _, more := brokertest.Get(t, ch, dlq); more || brokertest.Depth(t, q) != 0 {
		t.Error("more than message 2 failed for good, or a message is left on the queue")
	}
	for i := range 6 {
		if _, alone := b.calls(fmt.Sprint(i)); alone != 1 {
			t.Errorf("message %d handled alone %d times, want once after the panic", i, alone)
		}
	}
}

// PerMessage with the wrong number of results fails the whole batch: the
// listener cannot tell which result is whose.
func TestBatchWrongNumberOfResultsFailsTheBatch(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 4)
	var b batches
	var causes sync.Map
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		b.add(batch)
		return listener.PerMessage(make([]error, 3)) // all nil, but one short
	}
	rec := middleware.RecovererFunc(func(_ context.Context, d *amqp.Delivery, cause error) error {
		causes.Store(d.MessageId, cause)
		return nil
	})
	r := startBatch(t, q, middleware.Recover(rec), h, 4, 5*time.Second)
	brokertest.Eventually(t, 10*time.Second, "all settled", func() bool { st := r.Stats(); return st.Handled == 4 && st.InFlight == 0 })
	r.Stop(t)
	for i := range 4 {
		cause, ok := causes.Load(fmt.Sprint(i))
		if !ok || !errors.Is(cause.(error), listener.ErrBatchResults) {
			t.Errorf("message %d recovered with %v, want ErrBatchResults", i, cause)
		}
	}
}

// A shutdown while a batch runs hands back every message that did not
// succeed, with a nack: none reaches the recoverer, none is lost.
func TestBatchShutdownMidBatchLosesAndRecoversNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		// handler is what the batch does once shutdown has begun
		handler func(ctx context.Context, batch []*amqp.Delivery) error
		acked   int
	}{
		{"cut off", func(ctx context.Context, _ []*amqp.Delivery) error {
			<-ctx.Done()
			return ctx.Err()
		}, 0},
		{"finishes with failures", func(_ context.Context, batch []*amqp.Delivery) error {
			errs := make([]error, len(batch))
			for i := range errs {
				if i%2 == 0 {
					errs[i] = middleware.Permanent(errors.New("invalid"))
				}
			}
			return listener.PerMessage(errs)
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, nil)
			publishN(t, q, 4)
			started, stopping := make(chan struct{}), make(chan struct{})
			var calls atomic.Int64
			h := func(ctx context.Context, batch []*amqp.Delivery) error {
				if calls.Add(1) > 1 {
					t.Errorf("a second batch call, of %d messages", len(batch))
					return nil
				}
				close(started)
				<-stopping
				return tc.handler(ctx, batch)
			}
			chain := middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(time.Minute), middleware.WithMaxInterval(time.Minute)), middleware.Recover(neverRecover(t)))
			r := startBatch(t, q, chain, h, 4, 5*time.Second, listener.WithShutdownTimeout(300*time.Millisecond))
			<-started
			go func() {
				// Once the listener is told to stop, the handler goes on.
				time.Sleep(100 * time.Millisecond)
				close(stopping)
			}()
			r.Stop(t)
			if n := brokertest.Depth(t, q); n != 4-tc.acked {
				t.Errorf("queue holds %d, want %d back", n, 4-tc.acked)
			}
			if st := r.Stats(); st.Handled != uint64(tc.acked) || st.Rejected != 0 || st.Requeued != uint64(4-tc.acked) {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// A delivery waiting between its retries does not hold up the batches
// behind it.
func TestBatchRetryingMessageDoesNotBlockTheNextBatch(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "poison"})
	var b batches
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		ids := b.add(batch)
		errs := make([]error, len(batch))
		for i, id := range ids {
			if id == "poison" {
				errs[i] = errors.New("down")
			}
		}
		return listener.PerMessage(errs)
	}
	chain := middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(time.Minute), middleware.WithMaxInterval(time.Minute)), middleware.Recover(neverRecover(t)))
	r := startBatch(t, q, chain, h, 5, 50*time.Millisecond, listener.WithPrefetch(10))
	brokertest.Eventually(t, 5*time.Second, "the poison message's first attempt", func() bool { return b.handled() == 1 })
	publishN(t, q, 5)
	brokertest.Eventually(t, 10*time.Second, "the next five handled while the first waits a minute", func() bool { return r.Stats().Handled == 5 })
	if st := r.Stats(); st.Parked != 1 || st.InFlight != 1 {
		t.Errorf("stats %+v: want the poison message parked", st)
	}
	r.Stop(t)
	if n := brokertest.Depth(t, q); n != 1 {
		t.Errorf("queue holds %d, want the poison message back", n)
	}
}

func TestNewBatchRejectsBadArguments(t *testing.T) {
	h := func(context.Context, []*amqp.Delivery) error { return nil }
	for _, tc := range []struct {
		name string
		h    listener.BatchHandler
		size int
		wait time.Duration
		opts []listener.Option
		want []string
	}{
		{"explicit prefetch below size", h, 20, time.Second, []listener.Option{listener.WithPrefetch(10)}, []string{"batch size of 20", "prefetch of 10"}},
		{"size 0", h, 0, time.Second, nil, []string{"batch size of at least 1, got 0"}},
		{"negative wait", h, 10, -time.Second, nil, []string{"batch wait of at least 0, got -1s"}},
		{"nil handler", nil, 10, time.Second, nil, []string{"NewBatch expects a non-nil handler"}},
		{"wait past the consumer timeout", h, 10, time.Hour, nil, []string{"longer than the consumer timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := listener.NewBatch("q", nil, tc.h, tc.size, tc.wait, tc.opts...)
			if err == nil || l != nil {
				t.Fatalf("NewBatch = %v, %v; want an error", l, err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			// Only what the user passed is named (the batch's own ack
			// coalescing is not WithAckCoalescing).
			if strings.Contains(err.Error(), "WithAckCoalescing") {
				t.Errorf("error %q names WithAckCoalescing, which was not passed", err)
			}
		})
	}
	if _, err := listener.NewBatch("q", nil, h, 250, time.Second); err != nil {
		t.Errorf("a batch as large as the default prefetch: %v", err)
	}
}

// One process span per batch, linked to each message's producer, with
// the failures on it; the metrics count messages.
func TestBatchTelemetry(t *testing.T) {
	o := observe(t)
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	var producers []trace.SpanContext
	for i := range 5 {
		producers = append(producers, producerSpan(t, o, q, amqp.Publishing{MessageId: fmt.Sprint(i)}))
	}
	var calls atomic.Int64
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		calls.Add(1)
		errs := make([]error, len(batch))
		for i, d := range batch {
			if d.MessageId == "3" && len(batch) > 1 {
				errs[i] = errors.New("deadlock")
			}
		}
		return listener.PerMessage(errs)
	}
	r := startBatch(t, q, middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Millisecond)), requeueExhausted()), h, 5, 5*time.Second, o.options()...)
	brokertest.Eventually(t, 10*time.Second, "all handled", func() bool { st := r.Stats(); return st.Handled == 5 && st.InFlight == 0 })
	r.Stop(t)

	processes := o.named("process " + q)
	if len(processes) != 1 {
		t.Fatalf("%d process spans, want one for the batch", len(processes))
	}
	p := processes[0]
	if p.SpanKind() != trace.SpanKindConsumer || attr(p, "messaging.batch.message_count").AsInt64() != 5 ||
		attr(p, "messaging.destination.name").AsString() != q || p.Parent().IsValid() {
		t.Errorf("batch span: kind %v, attributes %v, parent %v", p.SpanKind(), p.Attributes(), p.Parent())
	}
	var linked []trace.SpanID
	for _, l := range p.Links() {
		linked = append(linked, l.SpanContext.SpanID())
	}
	for i, pc := range producers {
		if !slices.Contains(linked, pc.SpanID()) {
			t.Errorf("the batch span has no link to message %d's producer", i)
		}
	}
	if len(linked) != 5 {
		t.Errorf("%d links, want 5", len(linked))
	}
	var failed, settled []sdkEvent
	for _, e := range p.Events() {
		ev := sdkEvent{e.Name, attribute.NewSet(e.Attributes...)}
		switch e.Name {
		case listener.EventMessageFailed:
			failed = append(failed, ev)
		case listener.EventMessageSettled:
			settled = append(settled, ev)
		}
	}
	if len(failed) != 1 || failed[0].get(listener.AttrBatchIndex).AsInt64() != 3 || failed[0].get("messaging.message.id").AsString() != "3" ||
		failed[0].get("exception.message").AsString() != "deadlock" {
		t.Errorf("message failed events %v, want one for message 3", failed)
	}
	if len(settled) != 1 || settled[0].get(listener.AttrSettlement).AsString() != "ack" {
		t.Errorf("message settled events %v, want message 3 acked", settled)
	}
	if p.Status().Code == codes.Error {
		t.Errorf("batch span status %v, want unset: every message was acked in the end", p.Status())
	}
	attempts := o.named("attempt")
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want message 3's two", len(attempts))
	}
	for _, a := range attempts {
		if a.Parent().SpanID() != p.SpanContext().SpanID() {
			t.Error("an attempt span is not a child of the batch span")
		}
	}
	for _, c := range []struct {
		metric string
		want   int64
	}{
		{"messaging.client.consumed.messages", 5},
		{"messaging.process.duration", 5},
		{"amqpretry.attempts", 2},
	} {
		if got := o.sum(t, c.metric); got != c.want {
			t.Errorf("%s = %d, want %d", c.metric, got, c.want)
		}
	}
}

type sdkEvent struct {
	name  string
	attrs attribute.Set
}

func (e sdkEvent) get(key string) attribute.Value {
	v, _ := e.attrs.Value(attribute.Key(key))
	return v
}

func (e sdkEvent) String() string { return e.name + " " + e.attrs.Encoded(attribute.DefaultEncoder()) }

// A message past WithRedeliveryLimit is left out of its batch and goes to
// the chain's recoverer, or, without one, is rejected: here to the quorum
// queue's DLQ.
func TestBatchRedeliveryLimit(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, dlq, nil)
	brokertest.Queue(t, q, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
	var b batches
	r := startBatch(t, q, nil, func(_ context.Context, batch []*amqp.Delivery) error {
		b.add(batch)
		return errors.New("down")
	}, 10, 10*time.Millisecond, listener.WithRedeliveryLimit(2), listener.WithRequeueDelay(0, 0))
	publishN(t, q, 1)
	brokertest.Eventually(t, 10*time.Second, "the message on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	r.Stop(t)
	if in, _ := b.calls("0"); in != 2 {
		t.Errorf("the message was in %d batches, want 2: the third delivery (x-delivery-count 2) must not reach the handler", in)
	}
}

// The broker closes the listener's connection while a batch runs: the
// batch's messages come back to the queue (its handler's context ends), the
// listener redials, and every message is written, none lost.
func TestBatchConnectionKilledMidBatch(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 1000)
	name := brokertest.Name(t, "listener")
	s := newSeen()
	cut := make(chan struct{})
	var calls, held atomic.Int64
	r := startBatch(t, q, middleware.Chain(middleware.Retry(3), middleware.Recover(neverRecover(t))), func(ctx context.Context, batch []*amqp.Delivery) error {
		if calls.Add(1) > 5 {
			held.Add(1)
			select {
			case <-cut:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for _, d := range batch {
			s.add(d.MessageId)
		}
		return nil
	}, 50, 100*time.Millisecond, listener.WithConcurrentConsumers(2), listener.WithConnectionName(name), listener.WithPrefetch(100))

	brokertest.Eventually(t, 20*time.Second, "five batches handled and the next held", func() bool { return calls.Load() >= 5 && held.Load() > 0 })
	if n := brokertest.CloseConnections(t, name); n != 1 {
		t.Fatalf("closed %d connections, want the listener's one", n)
	}
	atCut := s.distinct()
	close(cut)
	if atCut >= 1000 {
		t.Fatal("every message was handled before the cut: the test proves nothing")
	}
	brokertest.Eventually(t, 30*time.Second, "all 1000 handled after the redial", func() bool { return s.distinct() == 1000 })
	brokertest.Eventually(t, 10*time.Second, "the queue empty and acked", func() bool {
		return brokertest.Depth(t, q) == 0 && r.Stats().InFlight == 0
	})
	t.Logf("cut after %d of 1000; duplicates (in flight when the connection died, redelivered): %d", atCut, s.duplicates())
}

// A batch's successes go out as one basic.ack with multiple set, not one
// ack each: 300 messages in batches of 100 take a handful of ack frames.
func TestBatchAcksItsSuccessesTogether(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	proxy.RecordMethods()
	const n, size = 300, 100
	publishN(t, q, n)
	var b batches
	r := startBatch(t, q, nil, func(_ context.Context, batch []*amqp.Delivery) error {
		b.add(batch)
		return nil
	}, size, time.Second, listener.WithURL(url), listener.WithPrefetch(size))
	brokertest.Eventually(t, 20*time.Second, "every message acked", func() bool { return r.Stats().Handled == n })
	r.Stop(t)
	acks, multiple := proxy.Sent("basic.ack"), proxy.Sent("basic.ack multiple")
	t.Logf("%d messages in %d batches: %d ack frames, %d of them multiple", n, len(b.get()), acks, multiple)
	if acks > len(b.get())+1 || multiple == 0 {
		t.Errorf("%d ack frames (%d multiple) for %d messages in %d batches: want about one multiple ack per batch", acks, multiple, n, len(b.get()))
	}
	if depth := brokertest.Depth(t, q); depth != 0 {
		t.Errorf("%d messages back on the queue", depth)
	}
}
