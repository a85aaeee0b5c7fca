package listener_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds msg/s (first to last message) and the client's CPU per message:
// the broker shares the machine's cores, so a run's speed varies with what
// else the host does, but our CPU per message is the library's own cost.
func report(b *testing.B, first time.Time, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/time.Since(first).Seconds(), "msg/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/msg")
}

// fill publishes n small messages to q, unmeasured.
func fill(b *testing.B, q string, n int) {
	b.Helper()
	conn := brokertest.Dial(b)
	ch := brokertest.Channel(b, conn)
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 128)
	// In batches: amqp091 scans every outstanding confirm on each multiple ack.
	for sent := 0; sent < n; {
		var last *amqp.DeferredConfirmation
		for ; sent < n && (last == nil || sent%500 != 0); sent++ {
			dc, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{Body: body})
			if err != nil {
				b.Fatal(err)
			}
			last = dc
		}
		if !last.Wait() {
			b.Fatal("fill nacked")
		}
	}
	time.Sleep(time.Second) // let the broker settle: the previous run's queue is being deleted
}

// BenchmarkConsume measures draining b.N ready messages, from the first
// delivery handled to the last, with 2 consumers and
// the default prefetch: raw amqp091-go (consume, ack one by one) against the
// listener running Chain(Retry(5), Recover(Republish(...))) with no failures;
// NewBatch with the same chain handing batches of 100 to a handler that does
// nothing; and with acks coalesced, raw amqp091-go acking every 62nd delivery
// with multiple set against the listener with WithAckCoalescing(62, 50ms).
//
//	go test -run XXX -bench Consume -benchtime 20000x -count 5 ./listener
func BenchmarkConsume(b *testing.B) {
	const consumers, prefetch, every = 2, listener.DefaultPrefetch, listener.DefaultPrefetch / 4
	b.Run("raw", func(b *testing.B) { benchRaw(b, consumers, prefetch, 1) })
	b.Run("listener", func(b *testing.B) { benchListener(b, consumers, prefetch) })
	b.Run("batch", func(b *testing.B) { benchBatch(b, consumers, prefetch) })
	b.Run("listener-otel", func(b *testing.B) {
		// The real SDK, every span sampled and exported in batches (to an
		// exporter that drops them), every metric aggregated.
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardExporter{}))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer tp.Shutdown(context.Background())
		defer mp.Shutdown(context.Background())
		benchListener(b, consumers, prefetch, listener.WithTracerProvider(tp), listener.WithMeterProvider(mp))
	})
	b.Run("raw-coalesced", func(b *testing.B) { benchRaw(b, consumers, prefetch, every) })
	b.Run("listener-coalesced", func(b *testing.B) {
		benchListener(b, consumers, prefetch, listener.WithAckCoalescing(every, 50*time.Millisecond))
	})
}

// benchRaw consumes with amqp091-go alone, acking every every-th delivery
// with multiple set (each one alone when every is 1).
func benchRaw(b *testing.B, consumers, prefetch, every int) {
	q := brokertest.Name(b, "q")
	brokertest.Queue(b, q, nil)
	fill(b, q, b.N)
	conn := brokertest.Dial(b)
	var handled atomic.Int64
	done := make(chan struct{})
	var first time.Time
	var once sync.Once
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range consumers {
		ch := brokertest.Channel(b, conn)
		if err := ch.Qos(prefetch, 0, false); err != nil {
			b.Fatal(err)
		}
		deliveries, err := ch.Consume(q, fmt.Sprint("raw-", i), false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			count := 0
			for d := range deliveries {
				once.Do(func() { first = time.Now() })
				if count++; count%every == 0 {
					_ = d.Ack(every > 1)
				}
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
			}
		}()
	}
	<-done
	b.StopTimer()
	report(b, first, cpu0)
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// drainTally counts the messages a listener under benchmark has handled:
// when the first came and when b.N have.
type drainTally struct {
	n       int64
	handled atomic.Int64
	first   time.Time
	once    sync.Once
	done    chan struct{}
}

// add counts k handled messages.
func (t *drainTally) add(k int) {
	t.once.Do(func() { t.first = time.Now() })
	if n := t.handled.Add(int64(k)); n >= t.n && n-int64(k) < t.n {
		close(t.done)
	}
}

// benchDrain fills a fresh queue with b.N messages and drains it with the
// listener newListener makes on it (its chain Chain(Retry(5),
// Recover(Republish(...))) with a DLQ of its own, its options the
// benchmark's), reporting from the first message handled to the last.
func benchDrain(b *testing.B, consumers, prefetch int,
	newListener func(q string, chain middleware.Middleware, t *drainTally, opts ...listener.Option) (*listener.Listener, error),
	opts ...listener.Option) {
	q, dlq := brokertest.Name(b, "q"), brokertest.Name(b, "dlq")
	brokertest.Queue(b, q, nil)
	brokertest.Queue(b, dlq, nil)
	fill(b, q, b.N)
	pub, err := publisher.New(brokertest.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	t := &drainTally{n: int64(b.N), done: make(chan struct{})}
	chain := middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq)))
	l, err := newListener(q, chain, t,
		append([]listener.Option{listener.WithURL(brokertest.URL()), listener.WithConcurrentConsumers(consumers), listener.WithPrefetch(prefetch),
			listener.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	b.ResetTimer()
	cpu0 := cpuTime()
	go func() { ran <- l.Run(ctx) }()
	<-t.done
	b.StopTimer()
	report(b, t.first, cpu0)
	cancel()
	if err := <-ran; err != nil {
		b.Fatal(err)
	}
}

func benchListener(b *testing.B, consumers, prefetch int, opts ...listener.Option) {
	benchDrain(b, consumers, prefetch, func(q string, chain middleware.Middleware, t *drainTally, opts ...listener.Option) (*listener.Listener, error) {
		return listener.New(q, chain, func(context.Context, *amqp.Delivery) error {
			t.add(1)
			return nil
		}, opts...)
	}, opts...)
}

func benchBatch(b *testing.B, consumers, prefetch int) {
	benchDrain(b, consumers, prefetch, func(q string, chain middleware.Middleware, t *drainTally, opts ...listener.Option) (*listener.Listener, error) {
		return listener.NewBatch(q, chain, func(_ context.Context, batch []*amqp.Delivery) error {
			t.add(len(batch))
			return nil
		}, 100, 20*time.Millisecond, opts...)
	})
}
