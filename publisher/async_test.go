package publisher_test

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
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// outcomes collects what done is called with, and fails the test if any
// done is called twice.
type outcomes struct {
	t     testing.TB
	mu    sync.Mutex
	errs  map[int]error
	calls atomic.Int64
}

func newOutcomes(t testing.TB) *outcomes { return &outcomes{t: t, errs: map[int]error{}} }

// done is the callback for publish i.
func (o *outcomes) done(i int) func(error) {
	return func(err error) {
		o.calls.Add(1)
		o.mu.Lock()
		defer o.mu.Unlock()
		if prev, ok := o.errs[i]; ok {
			o.t.Errorf("done of publish %d called twice: %v, then %v", i, prev, err)
		}
		o.errs[i] = err
	}
}

// wait waits until n dones have been called.
func (o *outcomes) wait(n int, within time.Duration) {
	o.t.Helper()
	brokertest.Eventually(o.t, within, fmt.Sprintf("%d dones", n), func() bool { return o.calls.Load() >= int64(n) })
}

func (o *outcomes) get(i int) (error, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	err, ok := o.errs[i]
	return err, ok
}

// Many async publishes: each done is called exactly once, with nil, and
// every message is on the queue.
func TestPublishAsyncAllConfirmed(t *testing.T) {
	const n = 5000
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL(), publisher.WithMaxInFlight(256))
	o := newOutcomes(t)
	ctx := ctxTimeout(t, time.Minute)
	for i := range n {
		if err := p.PublishAsync(ctx, "", q, amqp.Publishing{Body: []byte(fmt.Sprint(i))}, o.done(i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	o.wait(n, 30*time.Second)
	for i := range n {
		if err, _ := o.get(i); err != nil {
			t.Errorf("publish %d: %v", i, err)
		}
	}
	if got := brokertest.Depth(t, q); got != n {
		t.Fatalf("queue holds %d, want %d", got, n)
	}
	time.Sleep(50 * time.Millisecond)
	if got := o.calls.Load(); got != n {
		t.Fatalf("%d dones for %d publishes", got, n)
	}
}

// Each outcome Publish gives, PublishAsync gives its done, matching the
// same errors.
func TestPublishAsyncOutcomesAreThoseOfPublish(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	full := brokertest.Name(t, "full")
	brokertest.Queue(t, full, amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"})
	p := newPublisher(t, brokertest.URL())
	ctx := ctxTimeout(t, 20*time.Second)
	if err := p.Publish(ctx, "", full, amqp.Publishing{Body: []byte("fits")}); err != nil {
		t.Fatal(err)
	}
	missing := brokertest.Name(t, "no-such-exchange")
	tests := []struct {
		name          string
		exchange, key string
		ok            func(error) bool
	}{
		{"confirmed", "", q, func(err error) bool { return err == nil }},
		{"unroutable", "amq.direct", brokertest.Name(t, "nobody-binds-this"), func(err error) bool {
			var ue *publisher.UnroutableError
			return errors.Is(err, publisher.ErrUnroutable) && errors.As(err, &ue) && ue.ReplyCode == 312
		}},
		{"nacked", "", full, func(err error) bool { return errors.Is(err, publisher.ErrNacked) }},
		{"missing exchange", missing, "k", func(err error) bool {
			var nf *publisher.ExchangeNotFoundError
			return errors.As(err, &nf) && nf.Exchange == missing
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan error, 2)
			if err := p.PublishAsync(ctx, tt.exchange, tt.key, amqp.Publishing{Body: []byte(tt.name)}, func(err error) { got <- err }); err != nil {
				t.Fatalf("PublishAsync = %v, want nil: it was sent", err)
			}
			select {
			case err := <-got:
				if !tt.ok(err) {
					t.Errorf("done(%v)", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("done was not called")
			}
			select {
			case err := <-got:
				t.Errorf("done called again: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		})
	}
}

// What fails before anything is sent is returned at once, and done is
// never called for it.
func TestPublishAsyncReturnsWhatFailsBeforeSending(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL())
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	called := make(chan error, 4)
	done := func(err error) { called <- err }
	if err := p.PublishAsync(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{Expiration: "1.5"}, done); !errors.Is(err, publisher.ErrInvalidMessage) {
		t.Errorf("invalid message: %v, want ErrInvalidMessage", err)
	}
	if err := p.PublishAsync(cancelled, "", q, amqp.Publishing{}, done); !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v, want ErrNotConfirmed wrapping context.Canceled", err)
	}
	if err := p.PublishAsync(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{}, nil); err == nil {
		t.Error("a nil done was taken")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.PublishAsync(ctxTimeout(t, 5*time.Second), "", q, amqp.Publishing{}, done); !errors.Is(err, publisher.ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
	select {
	case err := <-called:
		t.Fatalf("done called with %v for a publish that returned an error", err)
	case <-time.After(50 * time.Millisecond):
	}
	if n := brokertest.Depth(t, q); n != 0 {
		t.Fatalf("queue holds %d, want none", n)
	}
}

// No confirm comes (the broker hangs): done gets ErrNotConfirmed after the
// confirm timeout, or at the context's deadline when that comes first, or
// when the context is cancelled.
func TestPublishAsyncWithoutAConfirm(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	short := newPublisher(t, url, publisher.WithConfirmTimeout(300*time.Millisecond))
	long := newPublisher(t, url, publisher.WithConfirmTimeout(time.Minute))
	t.Cleanup(func() { proxy.Blackhole(false) })

	tests := []struct {
		name    string
		p       *publisher.Publisher
		ctx     func() (context.Context, context.CancelFunc)
		cancel  bool // cancel after 300ms
		match   func(error) bool
		atLeast time.Duration
	}{
		{"confirm timeout", short, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
			false, func(err error) bool { return strings.Contains(err.Error(), "WithConfirmTimeout") }, 300 * time.Millisecond},
		{"context deadline", long, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, false, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }, 300 * time.Millisecond},
		{"context cancelled", long, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			true, func(err error) bool { return errors.Is(err, context.Canceled) }, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
				t.Fatal(err)
			}
			proxy.Blackhole(true)
			defer proxy.Blackhole(false)
			ctx, cancel := tt.ctx()
			defer cancel()
			got := make(chan error, 1)
			began := time.Now()
			if err := tt.p.PublishAsync(ctx, "", q, amqp.Publishing{Body: []byte(tt.name)}, func(err error) { got <- err }); err != nil {
				t.Fatal(err)
			}
			if tt.cancel {
				time.Sleep(300 * time.Millisecond)
				cancel()
			}
			select {
			case err := <-got:
				took := time.Since(began)
				if !errors.Is(err, publisher.ErrNotConfirmed) || !tt.match(err) {
					t.Errorf("done(%v)", err)
				}
				if took < tt.atLeast || took > 5*time.Second {
					t.Errorf("done after %v, want about %v", took, tt.atLeast)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("done was not called")
			}
		})
	}
}

// WithMaxInFlight bounds the async publishes awaiting their outcome:
// PublishAsync waits for room, until its context ends.
func TestPublishAsyncWaitsForRoom(t *testing.T) {
	const window = 10
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithMaxInFlight(window), publisher.WithChannels(1))
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	o := newOutcomes(t)
	for i := range window {
		if err := p.PublishAsync(ctxTimeout(t, 20*time.Second), "", q, amqp.Publishing{Body: []byte(fmt.Sprint(i))}, o.done(i)); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	err := p.PublishAsync(ctxTimeout(t, 300*time.Millisecond), "", q, amqp.Publishing{Body: []byte("one too many")}, o.done(window))
	if !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "WithMaxInFlight") ||
		!strings.HasSuffix(err.Error(), "it was not sent") {
		t.Errorf("past the window: %v, want ErrNotConfirmed naming WithMaxInFlight and saying it was not sent", err)
	}
	if waited := time.Since(began); waited < 300*time.Millisecond {
		t.Errorf("returned after %v, want it to wait for room until the deadline", waited)
	}
	if n := publisher.Unconfirmed(p); n != window {
		t.Errorf("%d unconfirmed, want %d", n, window)
	}
	// Room comes back as confirms do.
	waiting := make(chan error, 1)
	go func() {
		waiting <- p.PublishAsync(ctxTimeout(t, 20*time.Second), "", q, amqp.Publishing{Body: []byte("later")}, o.done(window+1))
	}()
	time.Sleep(100 * time.Millisecond)
	proxy.Blackhole(false)
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
	o.wait(window+1, 10*time.Second)
	for i := range window + 2 {
		if err, called := o.get(i); err != nil || called != (i != window) {
			t.Errorf("publish %d: called %v with %v", i, called, err)
		}
	}
}

// The connection is cut twice under a stream of async publishes: every done
// is called, the messages lost with the connection are sent again, and
// every confirmed message is on the queue.
func TestPublishAsyncAcrossCutConnections(t *testing.T) {
	const n = 4000
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithMaxInFlight(200))
	o := newOutcomes(t)
	ctx := ctxTimeout(t, time.Minute)
	for i := range n {
		if i == n/4 || i == n*2/3 {
			proxy.CutAll()
		}
		id := fmt.Sprint(i)
		if err := p.PublishAsync(ctx, "", q, amqp.Publishing{MessageId: id, Body: []byte(id)}, o.done(i)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	o.wait(n, 45*time.Second)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	onQueue := map[string]int{}
	for {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			break
		}
		onQueue[d.MessageId]++
	}
	failed, duplicates := 0, 0
	for i := range n {
		err, _ := o.get(i)
		if err != nil {
			failed++
			t.Errorf("publish %d: %v", i, err)
			continue
		}
		if onQueue[fmt.Sprint(i)] == 0 {
			t.Errorf("message %d was confirmed but is not on the queue", i)
		}
	}
	for _, c := range onQueue {
		duplicates += c - 1
	}
	t.Logf("%d async publishes across 2 cuts: %d failed; on the queue %d distinct, %d duplicates", n, failed, len(onQueue), duplicates)
	if proxy.Accepted() < 3 {
		t.Errorf("%d connections, want 3: the test cut nothing", proxy.Accepted())
	}
}

// Close with async publishes awaiting a confirm that cannot come: when
// Close returns, every done has been called, with an error saying the
// message may be stored.
func TestCloseCallsEveryDone(t *testing.T) {
	const n = 50
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	proxy, url := brokertest.Proxy(t)
	p, err := publisher.New(url, publisher.WithCloseTimeout(200*time.Millisecond), publisher.WithConfirmTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	o := newOutcomes(t)
	for i := range n {
		if err := p.PublishAsync(context.Background(), "", q, amqp.Publishing{Body: []byte(fmt.Sprint(i))}, o.done(i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	_ = p.Close()
	if got := o.calls.Load(); got != n {
		t.Fatalf("Close returned with %d of %d dones called", got, n)
	}
	for i := range n {
		if err, _ := o.get(i); !errors.Is(err, publisher.ErrNotConfirmed) || !errors.Is(err, publisher.ErrClosed) {
			t.Errorf("publish %d: %v, want ErrNotConfirmed and ErrClosed", i, err)
		}
	}
}

// 500 async publishes are in flight on one channel when the broker closes it
// with an exception whose text pins it on none of them: the culprit's done
// gets a *ChannelError, every other done nil.
func TestPublishAsyncUnpinnedExceptionAmongMany(t *testing.T) {
	const n = 500
	q, internal, ch := unpinnedFixture(t)
	proxy, url := brokertest.Proxy(t)
	p := newPublisher(t, url, publisher.WithChannels(1), publisher.WithMaxInFlight(n))
	if err := p.Publish(ctxTimeout(t, 10*time.Second), "", q, amqp.Publishing{Body: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(q, false); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, time.Minute)
	o := newOutcomes(t)
	proxy.Blackhole(true)
	if err := p.PublishAsync(ctx, internal, "", amqp.Publishing{Body: []byte("bad")}, o.done(0)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if err := p.PublishAsync(ctx, "", q, amqp.Publishing{Body: []byte(fmt.Sprint(i))}, o.done(i)); err != nil {
			t.Fatal(err)
		}
	}
	brokertest.Eventually(t, 10*time.Second, "every message sent", func() bool { return publisher.Unconfirmed(p) == n })
	proxy.Blackhole(false)
	o.wait(n, 45*time.Second)
	var chErr *publisher.ChannelError
	if err, _ := o.get(0); !errors.As(err, &chErr) || chErr.Code != amqp.AccessRefused {
		t.Errorf("the culprit: %v, want a *ChannelError with 403", err)
	}
	for i := 1; i < n; i++ {
		if err, _ := o.get(i); err != nil {
			t.Errorf("innocent %d: %v", i, err)
		}
	}
	distinct := map[string]bool{}
	for {
		d, ok := brokertest.Get(t, ch, q)
		if !ok {
			break
		}
		distinct[string(d.Body)] = true
	}
	if len(distinct) != n-1 {
		t.Fatalf("%d distinct messages on the queue, want all %d innocent ones", len(distinct), n-1)
	}
}

// An async publish is one PRODUCER span, like Publish's, and it has ended
// when done is called.
func TestPublishAsyncSpanEndsWhenDoneIsCalled(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p := newPublisher(t, brokertest.URL(), publisher.WithTracerProvider(tp))
	got := make(chan []string, 1)
	err := p.PublishAsync(ctxTimeout(t, 10*time.Second), "amq.direct", brokertest.Name(t, "unbound"), amqp.Publishing{}, func(err error) {
		var ended []string
		for _, s := range spans.Ended() {
			ended = append(ended, s.Name()+" "+s.Status().Code.String())
		}
		got <- ended
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ended := <-got:
		if !slices.Equal(ended, []string{"send amq.direct Error"}) {
			t.Errorf("spans ended when done ran: %q, want the one failed send span", ended)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("done was not called")
	}
}

func TestWithMaxInFlightRejectsBadInput(t *testing.T) {
	_, err := publisher.New(brokertest.URL(), publisher.WithMaxInFlight(0))
	if err == nil || !strings.Contains(err.Error(), "WithMaxInFlight expects at least 1, got 0") {
		t.Fatalf("New = %v, want it to name WithMaxInFlight and 0", err)
	}
}

// Routable and unroutable async publishes from several goroutines,
// interleaved on shared channels: each done gets its own message's outcome,
// never a neighbour's.
func TestPublishAsyncConcurrentOutcomesAreNotMixedUp(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Bind(t, q, "amq.direct", q)
	p := newPublisher(t, brokertest.URL(), publisher.WithChannels(2), publisher.WithMaxInFlight(64))
	unbound := brokertest.Name(t, "unbound")
	const workers, perWorker = 8, 200
	o := newOutcomes(t)
	ctx := ctxTimeout(t, 30*time.Second)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				n := w*perWorker + i
				key := q
				if n%2 == 1 {
					key = unbound
				}
				id := fmt.Sprint(n)
				if err := p.PublishAsync(ctx, "amq.direct", key, amqp.Publishing{MessageId: id, Body: []byte(id)}, o.done(n)); err != nil {
					t.Errorf("publish %d: %v", n, err)
				}
			}
		}()
	}
	wg.Wait()
	o.wait(workers*perWorker, 20*time.Second)
	for n := range workers * perWorker {
		err, _ := o.get(n)
		if routed := n%2 == 0; (routed && err != nil) || (!routed && !errors.Is(err, publisher.ErrUnroutable)) {
			t.Errorf("publish %d (routed: %v): %v", n, routed, err)
		}
	}
	if got := brokertest.Depth(t, q); got != workers*perWorker/2 {
		t.Fatalf("queue holds %d, want %d", got, workers*perWorker/2)
	}
}

// A done that panics is logged; the Publisher goes on completing the others
// and gives its room back.
func TestPublishAsyncSurvivesAPanickingDone(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	p := newPublisher(t, brokertest.URL(), publisher.WithMaxInFlight(1))
	ctx := ctxTimeout(t, 10*time.Second)
	if err := p.PublishAsync(ctx, "", q, amqp.Publishing{}, func(error) { panic("a bug in the caller") }); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	if err := p.PublishAsync(ctx, "", q, amqp.Publishing{}, func(err error) { got <- err }); err != nil {
		t.Fatalf("the next publish found no room: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
