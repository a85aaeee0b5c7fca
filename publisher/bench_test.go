package publisher_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// BenchmarkOneBadAmong500 publishes 500 messages at once on one channel, the
// first to an internal exchange: the broker closes the channel with a 403
// whose text pins it on no message, and the publisher must find the culprit
// among the 500 unconfirmed and have the 499 others confirmed. It reports
// the confirm round trips spent one after another and the channels opened,
// per 500; "rtt=1ms" puts half a millisecond each way between the publisher
// and the broker, as a network would.
//
//	go test -run XXX -bench OneBadAmong500 -benchtime 10x ./publisher
func BenchmarkOneBadAmong500(b *testing.B) {
	for _, oneWay := range []time.Duration{0, 500 * time.Microsecond} {
		b.Run(fmt.Sprintf("rtt=%v", 2*oneWay), func(b *testing.B) { benchmarkOneBadAmong(b, 500, oneWay) })
	}
}

func benchmarkOneBadAmong(b *testing.B, inFlight int, oneWay time.Duration) {
	q := brokertest.Name(b, "q")
	brokertest.Queue(b, q, nil)
	internal := brokertest.Name(b, "internal")
	ch := brokertest.Channel(b, brokertest.Dial(b))
	if err := ch.ExchangeDeclare(internal, "fanout", false, true, true, false, nil); err != nil {
		b.Fatal(err)
	}
	proxy, url := brokertest.Proxy(b)
	proxy.RecordMethods()
	proxy.SetLatency(oneWay)
	p, err := publisher.New(url, publisher.WithChannels(1), publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	opened := proxy.Sent("channel.open")
	b.ResetTimer()
	for range b.N {
		errs := badAmongMany(b, ctx, p, proxy, internal, q, inFlight, nil)
		for i, err := range errs {
			if (i == 0) == (err == nil) {
				b.Fatalf("publish %d: %v", i, err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(publisher.SuspectRounds(p))/float64(b.N), "rounds/op")
	b.ReportMetric(float64(proxy.Sent("channel.open")-opened)/float64(b.N), "channels/op")
	if _, err := ch.QueuePurge(q, false); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPublishAsync publishes from one goroutine with a bounded window of
// unconfirmed messages: raw amqp091-go pipelining deferred confirms on one
// channel, PublishAsync on one channel and on the default four, and, for
// scale, Publish one message after another. Run them in one invocation and
// compare msg/s and allocs/op:
//
//	go test -run XXX -bench PublishAsync -benchtime 100000x -count 3 ./publisher
func BenchmarkPublishAsync(b *testing.B) {
	body := make([]byte, 256)
	const window = 256
	// A bounded queue (dropping its head) keeps the broker's memory flat
	// however long the run.
	queue := func(b *testing.B) string {
		q := brokertest.Name(b, "q")
		brokertest.Queue(b, q, amqp.Table{"x-max-length": int64(10_000)})
		return q
	}
	b.Run("raw-pipelined", func(b *testing.B) {
		q := queue(b)
		ch := brokertest.Channel(b, brokertest.Dial(b))
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu := processCPU(b)
		inFlight := make([]*amqp.DeferredConfirmation, 0, window)
		for range b.N {
			if len(inFlight) == window {
				if !inFlight[0].Wait() {
					b.Fatal("nacked")
				}
				inFlight = inFlight[1:]
			}
			dc, err := ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{Body: body})
			if err != nil {
				b.Fatal(err)
			}
			inFlight = append(inFlight, dc)
		}
		for _, dc := range inFlight {
			if !dc.Wait() {
				b.Fatal("nacked")
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		reportCPU(b, cpu)
	})
	for _, channels := range []int{1, 4} {
		b.Run(fmt.Sprintf("async-%dch", channels), func(b *testing.B) {
			q := queue(b)
			brokertest.Dial(b)
			p, err := publisher.New(brokertest.URL(), publisher.WithChannels(channels), publisher.WithMaxInFlight(window),
				publisher.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			var wg sync.WaitGroup
			var failed atomic.Int64
			done := func(err error) {
				if err != nil {
					failed.Add(1)
				}
				wg.Done()
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU(b)
			for range b.N {
				wg.Add(1)
				if err := p.PublishAsync(ctx, "", q, amqp.Publishing{Body: body}, done); err != nil {
					b.Fatal(err)
				}
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
			reportCPU(b, cpu)
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d not confirmed", n, b.N)
			}
		})
	}
	b.Run("sequential-Publish", func(b *testing.B) {
		q := queue(b)
		brokertest.Dial(b)
		p, err := publisher.New(brokertest.URL(), publisher.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu := processCPU(b)
		for range b.N {
			if err := p.Publish(ctx, "", q, amqp.Publishing{Body: body}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		reportCPU(b, cpu)
	})
}

// processCPU is the CPU time the test process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the client's CPU time per message since began, the
// measure of issue 35 (the relay's CPU against raw confirmed publishing).
func reportCPU(b *testing.B, began time.Duration) {
	b.ReportMetric(float64((processCPU(b)-began).Microseconds())/float64(b.N), "cpu-µs/msg")
}
