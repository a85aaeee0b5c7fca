package listener_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

func TestEndToEndExactlyOnce(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 2000)
	s := newSeen()
	r := start(t, q, middleware.Chain(middleware.Retry(3), requeueExhausted()), func(_ context.Context, d *amqp.Delivery) error {
		s.add(d.MessageId)
		return nil
	}, listener.WithConcurrentConsumers(4))

	brokertest.Eventually(t, 30*time.Second, "all 2000 handled", func() bool { return s.distinct() == 2000 })
	if n := brokertest.Consumers(t, q); n != 4 {
		t.Errorf("broker counts %d consumers, want 4", n)
	}
	r.Stop(t)
	if d := s.duplicates(); d != 0 {
		t.Errorf("%d duplicates without any fault", d)
	}
	if st := r.Stats(); st.Handled != 2000 || st.Consumers != 0 || st.InFlight != 0 {
		t.Errorf("stats after shutdown = %+v", st)
	}
	if n := brokertest.Consumers(t, q); n != 0 {
		t.Errorf("broker counts %d consumers after shutdown, want 0", n)
	}
	if n := brokertest.Depth(t, q); n != 0 {
		t.Errorf("queue holds %d, want 0", n)
	}
}

// Spring's blocking-retry case with one consumer: msg1 always fails and is
// retried, msg2 is healthy. msg2 must not wait for msg1's retries.
func TestHealthyMessagePassesARetryingOne(t *testing.T) {
	t.Parallel()
	q, dlx, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlx"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	brokertest.Exchange(t, dlx, "fanout")
	brokertest.Bind(t, dlq, dlx, "")
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	brokertest.Publish(t, q, amqp.Publishing{MessageId: "msg1"}, amqp.Publishing{MessageId: "msg2"})
	begin := time.Now()
	var msg2At atomic.Int64
	s := newSeen()
	chain := middleware.Chain(
		middleware.Retry(5, middleware.WithInitialInterval(200*time.Millisecond)), // waits 0.2+0.4+0.8+1.6 = 3s
		middleware.Recover(recoverer.Republish(pub, dlx, "")),
	)
	start(t, q, chain, func(_ context.Context, d *amqp.Delivery) error {
		s.add(d.MessageId)
		if d.MessageId == "msg1" {
			return errors.New("user service down")
		}
		msg2At.Store(int64(time.Since(begin)))
		return nil
	}, listener.WithConcurrentConsumers(1))

	brokertest.Eventually(t, 10*time.Second, "msg1 on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	if at := time.Duration(msg2At.Load()); at == 0 || at > time.Second {
		t.Fatalf("msg2 handled after %v: it waited for msg1's retries", at)
	}
	if i := s.indexOf("msg2"); i < 0 || i > 2 {
		t.Errorf("msg2 handled as call %d, want right after msg1's first attempt", i)
	}
	if s.count["msg1"] != 5 {
		t.Errorf("msg1 attempted %d times, want 5", s.count["msg1"])
	}
}

func TestPoisonWithoutRecovererDoesNotSpin(t *testing.T) {
	t.Parallel()
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "poison"})
	var calls atomic.Int64
	start(t, q, nil, func(context.Context, *amqp.Delivery) error {
		calls.Add(1)
		return errors.New("always")
	}, listener.WithRequeueDelay(500*time.Millisecond, time.Second))
	time.Sleep(3 * time.Second)
	// Without the delay this is in the thousands (a requeue loop runs at >1000/s).
	if n := calls.Load(); n < 2 || n > 8 {
		t.Fatalf("%d deliveries in 3s, want a handful: requeues of redelivered messages must be delayed", n)
	}
}

func TestPermanentErrorGoesToTheQueuesDLX(t *testing.T) {
	dlx, dlq := brokertest.Name(t, "dlx"), brokertest.Name(t, "dlq")
	brokertest.Exchange(t, dlx, "fanout")
	brokertest.Queue(t, dlq, nil)
	brokertest.Bind(t, dlq, dlx, "")
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, amqp.Table{"x-dead-letter-exchange": dlx})
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "bad"})
	var calls atomic.Int64
	r := start(t, q, middleware.Chain(middleware.Retry(5), rejectExhausted()), func(context.Context, *amqp.Delivery) error {
		calls.Add(1)
		return middleware.Permanent(errors.New("invalid JSON"))
	})
	brokertest.Eventually(t, 5*time.Second, "the message on the queue's DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	// Stats counts the reject once it is written, a moment after the
	// broker may have routed it (ci19 read it in between, under load).
	brokertest.Eventually(t, 5*time.Second, "the rejection counted", func() bool { return r.Stats().Rejected == 1 })
	if calls.Load() != 1 {
		t.Fatalf("calls %d, stats %+v: want one attempt", calls.Load(), r.Stats())
	}
}

func TestHandlerPanicIsRetriedThenRecovered(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "p"})
	var calls atomic.Int64
	start(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(10*time.Millisecond)), middleware.Recover(recoverer.Republish(pub, "", dlq))),
		func(context.Context, *amqp.Delivery) error { calls.Add(1); panic("nil map") })
	brokertest.Eventually(t, 5*time.Second, "the panicking message on the DLQ", func() bool { return brokertest.Depth(t, dlq) == 1 })
	d, _ := brokertest.Get(t, brokertest.Channel(t, brokertest.Dial(t)), dlq)
	if calls.Load() != 3 || d.Headers["x-amqpretry-error-type"] != "panic" || !strings.Contains(fmt.Sprint(d.Headers["x-exception-stacktrace"]), "panic: nil map") {
		t.Fatalf("calls %d, headers %v", calls.Load(), d.Headers)
	}
}

func TestShutdownMidHandlerLetsItFinish(t *testing.T) {
	q, dlq := brokertest.Name(t, "q"), brokertest.Name(t, "dlq")
	brokertest.Queue(t, q, nil)
	brokertest.Queue(t, dlq, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "slow"})
	started := make(chan struct{})
	var finished atomic.Bool
	r := start(t, q, middleware.Chain(middleware.Retry(3), middleware.Recover(neverRecover(t))), func(ctx context.Context, _ *amqp.Delivery) error {
		close(started)
		time.Sleep(500 * time.Millisecond)
		finished.Store(true)
		return nil
	})
	<-started
	took := r.Stop(t)
	if !finished.Load() || took < 400*time.Millisecond {
		t.Fatalf("Run returned after %v, handler finished: %v; want it to wait for the handler", took, finished.Load())
	}
	if brokertest.Depth(t, q) != 0 || r.Stats().Handled != 1 {
		t.Fatalf("depth %d, stats %+v: want the message acked", brokertest.Depth(t, q), r.Stats())
	}
}

func TestShutdownMidBackoffRequeuesAtOnce(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "m"})
	var calls atomic.Int64
	r := start(t, q, middleware.Chain(middleware.Retry(3, middleware.WithInitialInterval(time.Minute), middleware.WithMaxInterval(time.Minute)), middleware.Recover(neverRecover(t))),
		func(context.Context, *amqp.Delivery) error { calls.Add(1); return errors.New("down") })
	brokertest.Eventually(t, 5*time.Second, "the first attempt", func() bool { return calls.Load() == 1 })
	time.Sleep(100 * time.Millisecond) // now waiting a minute for attempt 2
	if took := r.Stop(t); took > 2*time.Second {
		t.Errorf("shutdown took %v: a delivery in backoff must be requeued at once", took)
	}
	if n := brokertest.Depth(t, q); n != 1 {
		t.Fatalf("queue holds %d, want the message back", n)
	}
}

func TestShutdownTimeoutCancelsHandlers(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	brokertest.Publish(t, q, amqp.Publishing{MessageId: "stuck"})
	started := make(chan struct{})
	r := start(t, q, middleware.Chain(middleware.Retry(3), middleware.Recover(neverRecover(t))), func(ctx context.Context, _ *amqp.Delivery) error {
		close(started)
		<-ctx.Done() // a handler that only stops when told to
		return ctx.Err()
	}, listener.WithShutdownTimeout(300*time.Millisecond))
	<-started
	took := r.Stop(t)
	if took < 300*time.Millisecond || took > 3*time.Second {
		t.Errorf("shutdown took %v, want about the 300ms timeout", took)
	}
	if n := brokertest.Depth(t, q); n != 1 {
		t.Fatalf("queue holds %d, want the interrupted message requeued", n)
	}
}

// neverRecover fails the test if a recoverer is called: shutdown must never
// send a message to the DLQ.
func neverRecover(t *testing.T) middleware.Recoverer {
	return middleware.RecovererFunc(func(_ context.Context, d *amqp.Delivery, cause error) error {
		t.Errorf("recoverer called for %s during the test: %v", d.MessageId, cause)
		return errors.New("no")
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	h := func(context.Context, *amqp.Delivery) error { return nil }
	tests := []struct {
		name  string
		queue string
		mw    middleware.Middleware
		h     middleware.Handler
		opts  []listener.Option
		want  string
	}{
		{"empty queue", "", nil, h, nil, `New expects a queue name, got ""`},
		{"nil handler", "q", nil, nil, nil, "New expects a non-nil handler"},
		{"min below one", "q", nil, h, []listener.Option{listener.WithConcurrentConsumers(0)}, "WithConcurrentConsumers expects 1 to 1000, got 0"},
		{"max below min", "q", nil, h, []listener.Option{listener.WithConcurrentConsumers(3), listener.WithMaxConcurrentConsumers(2)}, "WithMaxConcurrentConsumers expects at least the concurrent consumers (3), got 2"},
		{"negative prefetch", "q", nil, h, []listener.Option{listener.WithPrefetch(-1)}, "WithPrefetch expects 1 to 65535, got -1"},
		{"unlimited prefetch", "q", nil, h, []listener.Option{listener.WithPrefetch(0)}, "WithPrefetch expects 1 to 65535, got 0 (no limit)"},
		{"TLS with amqp://", "q", nil, h, []listener.Option{listener.WithURL("amqp://u:hunter2@localhost/"), listener.WithTLS(&tls.Config{})}, "WithTLS: amqp://u:xxxxx@localhost/ is amqp://, which never uses TLS"},
		{"retries hidden behind a copy of the delivery", "q", middleware.Chain(copyDelivery, middleware.Retry(100, middleware.WithMaxInterval(10*time.Minute))), h, nil, "may hold a delivery for 15h"},
		{"bad scheme", "q", nil, h, []listener.Option{listener.WithURL("http://u:hunter2@localhost/")}, "WithURL: invalid AMQP URL \"http://u:xxxxx@localhost/\""},
		{"bad node", "q", nil, h, []listener.Option{listener.WithURLs("amqp://u:hunter2@a/", "http://u:hunter2@b/")}, "WithURLs: invalid AMQP URL \"http://u:xxxxx@b/\""},
		{"no nodes", "q", nil, h, []listener.Option{listener.WithURLs()}, "WithURLs expects at least one URL"},
		{"retries with nowhere to put what they exhaust", "q", middleware.Chain(middleware.Retry(3)), h, nil, "the middleware has a Retry but no Recover: a message that exhausts its retries would go back to the queue and fail again, for ever. End the chain with Recover("},
		{"retries with nowhere to put what they exhaust, named", "q", middleware.Retry(1), h, nil, "WithRedeliveryLimit(n)"},
		{"retries with nowhere to put what they exhaust, the way out", "q", middleware.Retry(1), h, nil, "Recover(recoverer.Requeue())"},
		{"retries past consumer_timeout", "q", middleware.Retry(300), h, nil, "the middleware's retries may hold a delivery for 49m25s (their waits, and the handler's Timeouts on every attempt), longer than the consumer timeout 30m0s"},
		{"handler timeouts past consumer_timeout", "q", middleware.Chain(middleware.Retry(3), middleware.Timeout(10*time.Minute)), h, nil, "may hold a delivery for 30m3s"},
		{"custom consumer timeout", "q", middleware.Retry(5), h, []listener.Option{listener.WithConsumerTimeout(10 * time.Second)}, "retry tiers (package dlx)"},
		{"nil logger", "q", nil, h, []listener.Option{listener.WithLogger(nil)}, "WithLogger expects a non-nil logger"},
		{"requeue delay", "q", nil, h, []listener.Option{listener.WithRequeueDelay(time.Second, time.Millisecond)}, "WithRequeueDelay expects 0 <= initial <= max, got 1s, 1ms"},
		{"scale interval", "q", nil, h, []listener.Option{listener.WithScaleInterval(5 * time.Millisecond)}, "WithScaleInterval expects at least 10ms, got 5ms"},
		{"idle timeout", "q", nil, h, []listener.Option{listener.WithIdleTimeout(0)}, "WithIdleTimeout expects a duration > 0, got 0s"},
		{"consumer timeout argument below 1s", "q", nil, h, []listener.Option{listener.WithConsumerTimeoutArgument(500 * time.Millisecond)}, "WithConsumerTimeoutArgument expects whole milliseconds, at least 1s, got 500ms"},
		{"consumer timeout argument below the retries", "q", middleware.Retry(5), h, []listener.Option{listener.WithConsumerTimeoutArgument(10 * time.Second)}, "longer than the consumer timeout 10s"},
		{"redelivery limit 0", "q", nil, h, []listener.Option{listener.WithRedeliveryLimit(0)}, "WithRedeliveryLimit expects 1 to 1073741824, got 0"},
		{"negative redelivery limit", "q", nil, h, []listener.Option{listener.WithRedeliveryLimit(-3)}, "WithRedeliveryLimit expects 1 to 1073741824, got -3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := listener.New(tt.queue, tt.mw, tt.h, tt.opts...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error leaks the password: %v", err)
			}
		})
	}
}

func TestAccessRefusedIsFatal(t *testing.T) {
	t.Parallel()
	brokertest.Dial(t)
	l, err := listener.New("q", nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.WithCredentials("guest", "wrong-hunter2")), logTo(t, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = l.Run(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "refused the login") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Run = %v, want the refused login at once, password hidden", err)
	}
	if err := l.Run(context.Background()); !errors.Is(err, listener.ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
}

func TestMissingQueue(t *testing.T) {
	q := brokertest.Name(t, "q")
	t.Run("fatal", func(t *testing.T) {
		brokertest.Dial(t)
		l, _ := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
			listener.WithURL(brokertest.URL()), listener.WithMissingQueueFatal(), logTo(t, false))
		if err := l.Run(context.Background()); !errors.Is(err, listener.ErrQueueNotFound) || !strings.Contains(err.Error(), q) {
			t.Fatalf("Run = %v, want ErrQueueNotFound naming the queue", err)
		}
	})
	t.Run("retried until it appears", func(t *testing.T) {
		s := newSeen()
		start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil })
		time.Sleep(700 * time.Millisecond)
		brokertest.Queue(t, q, nil)
		publishN(t, q, 5)
		brokertest.Eventually(t, 10*time.Second, "the messages handled once the queue exists", func() bool { return s.distinct() == 5 })
	})
}

func TestDeclareOnConnectAndConflict(t *testing.T) {
	q := brokertest.Name(t, "q")
	t.Cleanup(func() { brokertest.DeleteQueue(t, q) })
	declare := func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(100)})
		return err
	}
	s := newSeen()
	r := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { s.add(d.MessageId); return nil }, listener.WithDeclare(declare))
	brokertest.Eventually(t, 5*time.Second, "the declared queue consumed", func() bool {
		return brokertest.QueueExists(t, q) && brokertest.Consumers(t, q) == 1
	})
	publishN(t, q, 3)
	brokertest.Eventually(t, 5*time.Second, "messages handled", func() bool { return s.distinct() == 3 })
	r.Stop(t)

	conflicting := func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(5)})
		return err
	}
	l, _ := listener.New(q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithURL(brokertest.URL()), listener.WithDeclare(conflicting), logTo(t, false))
	err := l.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "PRECONDITION_FAILED") {
		t.Fatalf("Run = %v, want the declaration conflict", err)
	}
}

// copyDelivery hands the next handler a copy of the delivery, as a decoding
// or decompressing step does.
func copyDelivery(next middleware.Handler) middleware.Handler {
	return func(ctx context.Context, d *amqp.Delivery) error {
		c := *d
		return next(ctx, &c)
	}
}

// New builds the chain to find its Retries and runs none of it: a middleware
// that reads a header every real message has, or writes an audit record, is
// not called on a message that does not exist.
func TestNewRunsNoneOfTheChain(t *testing.T) {
	calls := 0
	tenant := func(next middleware.Handler) middleware.Handler {
		return func(ctx context.Context, d *amqp.Delivery) error {
			calls++
			_ = d.Headers["tenant"].(string) // every message of ours has one
			return next(ctx, d)
		}
	}
	handled := 0
	h := func(context.Context, *amqp.Delivery) error { handled++; return nil }
	l, err := listener.New("q", middleware.Chain(tenant, middleware.Retry(3), middleware.Recover(neverRecover(t))), h)
	if err != nil || l == nil {
		t.Fatalf("New = %v", err)
	}
	if calls != 0 || handled != 0 {
		t.Errorf("New ran the middleware %d and the handler %d times, want neither", calls, handled)
	}
}
