package recoverer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/publisher"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The poison path (issue 37): a flood of messages that fail for good, each
// republished with fault headers and acked once the copy is confirmed. These
// benchmarks take the recoverer and the publisher alone, without a listener,
// so that their allocations and CPU per message can be compared before and
// after a change:
//
//	go test -run XXX -bench Poison -benchmem -count 3 ./recoverer

var errPoison = errors.New("bench: poison message")

// poisonDelivery is a delivery of the bench's poison flood.
func poisonDelivery(q string) *amqp.Delivery {
	return &amqp.Delivery{RoutingKey: q, Body: []byte("x"), DeliveryTag: 1}
}

// BenchmarkPoisonMessage builds the copy of a delivery that failed with
// Permanent(err): the fault headers alone.
func BenchmarkPoisonMessage(b *testing.B) {
	r := recoverer.Republish(frameOnly{}, "", "q.dlq")
	ctx := chainctx.WithQueue(context.Background(), "q")
	d, cause := poisonDelivery("q"), middleware.Permanent(errPoison)
	b.ReportAllocs()
	for range b.N {
		if _, err := r.Message(ctx, d, cause); err != nil {
			b.Fatal(err)
		}
	}
}

// frameOnly is the recoverer.Publisher Message needs.
type frameOnly struct{}

func (frameOnly) Publish(context.Context, string, string, amqp.Publishing) error {
	return errors.New("frameOnly publishes nothing")
}
func (frameOnly) FrameMax() int    { return 131072 }
func (frameOnly) Username() string { return "guest" }

// BenchmarkPoisonRecoverAsync republishes with RecoverAsync through a
// *publisher.Publisher, a window of copies awaiting their confirm, as the
// listener does with two consumers of prefetch 250; raw-annotated is
// amqp091-go pipelining the same copies (the same headers) on one confirm
// channel. Compare allocs/op and cpu-µs/msg.
func BenchmarkPoisonRecoverAsync(b *testing.B) {
	const window = 500
	queue := func(b *testing.B) string {
		q := brokertest.Name(b, "dlq")
		brokertest.Queue(b, q, amqp.Table{"x-max-length": int64(10_000)})
		return q
	}
	ctx := chainctx.WithQueue(context.Background(), "q")
	cause := middleware.Permanent(errPoison)
	b.Run("raw-annotated", func(b *testing.B) {
		q := queue(b)
		msg, err := recoverer.Republish(frameOnly{}, "", q).Message(ctx, poisonDelivery("q"), cause)
		if err != nil {
			b.Fatal(err)
		}
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
			dc, err := ch.PublishWithDeferredConfirm("", q, true, false,
				amqp.Publishing{Headers: msg.Headers, Body: []byte("x"), DeliveryMode: amqp.Persistent})
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
	b.Run("RecoverAsync", func(b *testing.B) { benchmarkRecoverAsync(b, ctx, queue(b), window) })
	// A listener hands RecoverAsync a context that ends with the listener:
	// the publisher then watches it for each copy, which a background
	// context spares it.
	b.Run("RecoverAsync-cancelable", func(b *testing.B) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		benchmarkRecoverAsync(b, ctx, queue(b), window)
	})
}

// benchmarkRecoverAsync republishes to q with RecoverAsync, window copies
// awaiting their confirm at most.
func benchmarkRecoverAsync(b *testing.B, ctx context.Context, q string, window int) {
	cause := middleware.Permanent(errPoison)
	brokertest.Dial(b)
	p, err := publisher.New(brokertest.URL(), publisher.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	r := recoverer.Republish(p, "", q)
	d := poisonDelivery("q")
	room := make(chan struct{}, window)
	var wg sync.WaitGroup
	var failed error
	var mu sync.Mutex
	done := func(err error) {
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
		<-room
		wg.Done()
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU(b)
	for range b.N {
		room <- struct{}{}
		wg.Add(1)
		started, err := r.RecoverAsync(ctx, d, cause, done)
		if err != nil || !started {
			b.Fatal(started, err)
		}
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	reportCPU(b, cpu)
	if failed != nil {
		b.Fatal(failed)
	}
}

// processCPU is the CPU time the test process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, began time.Duration) {
	b.ReportMetric(float64((processCPU(b)-began).Microseconds())/float64(b.N), "cpu-µs/msg")
}
