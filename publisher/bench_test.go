package publisher_test

import (
	"context"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/publisher"
)

// BenchmarkPublish32 compares Publish from 32 goroutines with raw amqp091-go
// publishing on the same number of confirm channels and waiting for each
// deferred confirm. Run both in one invocation and compare msg/s:
//
//	go test -run XXX -bench Publish32 -count 5 ./publisher
func BenchmarkPublish32(b *testing.B) {
	body := make([]byte, 256)
	const channels = 4
	b.Run("raw", func(b *testing.B) {
		q := brokertest.Name(b, "q")
		brokertest.Queue(b, q, nil)
		conn := brokertest.Dial(b)
		var chans []*amqp.Channel
		for range channels {
			ch := brokertest.Channel(b, conn)
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			chans = append(chans, ch)
		}
		var next atomic.Uint32
		b.SetParallelism(16) // 32 goroutines on 2 cores
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ch := chans[next.Add(1)%channels]
				dc, err := ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{Body: body})
				if err != nil {
					b.Error(err)
					return
				}
				if !dc.Wait() {
					b.Error("nacked")
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	})
	b.Run("publisher", func(b *testing.B) {
		q := brokertest.Name(b, "q")
		brokertest.Queue(b, q, nil)
		brokertest.Dial(b)
		p, err := publisher.New(brokertest.URL(), publisher.WithChannels(channels))
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		ctx := context.Background()
		b.SetParallelism(16)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := p.Publish(ctx, "", q, amqp.Publishing{Body: body}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	})
}
