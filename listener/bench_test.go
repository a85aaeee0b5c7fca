package listener_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

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
}

// BenchmarkConsume measures draining b.N ready messages with 2 consumers and
// the default prefetch: raw amqp091-go (consume, ack one by one) against the
// listener running Chain(Retry(5), Recover(Republish(...))) with no failures.
//
//	go test -run XXX -bench Consume -benchtime 20000x -count 5 ./listener
func BenchmarkConsume(b *testing.B) {
	const consumers, prefetch = 2, listener.DefaultPrefetch
	b.Run("raw", func(b *testing.B) {
		q := brokertest.Name(b, "q")
		brokertest.Queue(b, q, nil)
		fill(b, q, b.N)
		conn := brokertest.Dial(b)
		var handled atomic.Int64
		done := make(chan struct{})
		b.ResetTimer()
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
				for d := range deliveries {
					_ = d.Ack(false)
					if handled.Add(1) == int64(b.N) {
						close(done)
					}
				}
			}()
		}
		<-done
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	})
	b.Run("listener", func(b *testing.B) {
		q, dlq := brokertest.Name(b, "q"), brokertest.Name(b, "dlq")
		brokertest.Queue(b, q, nil)
		brokertest.Queue(b, dlq, nil)
		fill(b, q, b.N)
		pub, err := publisher.New(brokertest.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		var handled atomic.Int64
		done := make(chan struct{})
		l, err := listener.New(q,
			middleware.Chain(middleware.Retry(5), middleware.Recover(recoverer.Republish(pub, "", dlq))),
			func(context.Context, *amqp.Delivery) error {
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			},
			listener.WithURL(brokertest.URL()), listener.WithConcurrentConsumers(consumers), listener.WithPrefetch(prefetch),
			listener.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		b.ResetTimer()
		go func() { ran <- l.Run(ctx) }()
		<-done
		b.StopTimer()
		cancel()
		if err := <-ran; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	})
}
