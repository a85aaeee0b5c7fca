package console

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/middleware"
)

// benchDeadLetters is the size of the DLQ the benchmarks look at: the
// console's default --limit.
const benchDeadLetters = DefaultLimit

// benchKinds are four causes, 10,000 dead letters in all: ids, UUIDs,
// durations and a panic's stack differ from one message to the next.
var benchKinds = []failure{
	{"customer", 5000, func(i int) error { return fmt.Errorf("customer %d not found", 100000+i) }},
	{"tax", 3000, func(i int) error {
		return fmt.Errorf("tax service: request %08x-1d2e-4f3a-8b9c-0123456789ab timed out after %dms: %w", i, 3000+i%500, context.DeadlineExceeded)
	}},
	{"panic", 1500, func(i int) error {
		return &middleware.PanicError{Value: fmt.Sprintf("index out of range [%d] with length 3", 3+i%40),
			Stack: []byte(fmt.Sprintf("goroutine %d [running]:\nmain.handle(0xc000%06x)\n\t/src/orders/handle.go:%d +0x1d\n", i, i, 40+i%3))}
	}},
	{"hostile", 500, func(i int) error {
		return middleware.Permanent(fmt.Errorf("bad field <script>x</script> \u202e item %d", i))
	}},
}

// benchQueue is a DLQ holding benchDeadLetters dead letters.
func benchQueue(b *testing.B) dlx.Topology {
	b.Helper()
	topo := topology(b)
	if n := fill(b, topo, benchKinds); n != benchDeadLetters {
		b.Fatalf("%d dead letters, want %d", n, benchDeadLetters)
	}
	return topo
}

// BenchmarkSnapshotAndGroup is one look at a DLQ of 10,000 dead letters
// (a consumer with a prefetch of 10,000, one basic.nack(multiple) back, a
// wait until the queue shows them ready again) and their grouping by cause:
// what the overview costs. BenchmarkRawConsumeNack is its baseline.
func BenchmarkSnapshotAndGroup(b *testing.B) {
	topo := benchQueue(b)
	s := serve(b, Config{Queues: []string{topo.DLQ()}})
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		snap, err := s.Snapshot(ctx, topo.DLQ(), true)
		if err != nil {
			b.Fatal(err)
		}
		if len(snap.Messages) != benchDeadLetters {
			b.Fatalf("the look took %d", len(snap.Messages))
		}
		if g := Groups(snap.Messages, ByCause); len(g) != len(benchKinds) {
			b.Fatalf("%d groups", len(g))
		}
	}
	b.ReportMetric(float64(benchDeadLetters*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkRawConsumeNack is the same look with amqp091-go alone: a
// consumer with a prefetch of 10,000, cancelled once it has them all, one
// basic.nack(multiple, requeue) on the last tag, and passive declares until
// the queue shows them ready again; the baseline of
// BenchmarkSnapshotAndGroup.
func BenchmarkRawConsumeNack(b *testing.B) {
	topo := benchQueue(b)
	ch := brokertest.Channel(b, brokertest.Dial(b))
	if err := ch.Qos(benchDeadLetters, 0, false); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		tag := fmt.Sprintf("raw-%d", i)
		deliveries, err := ch.Consume(topo.DLQ(), tag, false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		var last amqp.Delivery
		for range benchDeadLetters {
			d, ok := <-deliveries
			if !ok {
				b.Fatal("the channel closed")
			}
			last = d
		}
		if err := ch.Cancel(tag, false); err != nil {
			b.Fatal(err)
		}
		for range deliveries {
		}
		if err := last.Nack(true, true); err != nil {
			b.Fatal(err)
		}
		for {
			q, err := ch.QueueDeclarePassive(topo.DLQ(), true, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			if q.Messages == benchDeadLetters {
				break
			}
		}
	}
	b.ReportMetric(float64(benchDeadLetters*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkRawGetNack is a look as the console took it before it read with
// a consumer, with amqp091-go alone: basic.get each, basic.nack each.
func BenchmarkRawGetNack(b *testing.B) {
	topo := benchQueue(b)
	ch := brokertest.Channel(b, brokertest.Dial(b))
	b.ResetTimer()
	for range b.N {
		var tags []uint64
		for range benchDeadLetters {
			d, ok, err := ch.Get(topo.DLQ(), false)
			if err != nil || !ok {
				b.Fatalf("get: %v, %v", ok, err)
			}
			tags = append(tags, d.DeliveryTag)
		}
		for _, tag := range tags {
			if err := ch.Nack(tag, false, true); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(benchDeadLetters*b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkGroup is the grouping alone, of a snapshot of 10,000 dead
// letters.
func BenchmarkGroup(b *testing.B) {
	topo := benchQueue(b)
	s := serve(b, Config{Queues: []string{topo.DLQ()}})
	snap, err := s.Snapshot(context.Background(), topo.DLQ(), true)
	if err != nil {
		b.Fatal(err)
	}
	for _, by := range []GroupBy{ByCause, ByStack} {
		b.Run(string(by), func(b *testing.B) {
			for range b.N {
				if g := Groups(snap.Messages, by); len(g) != len(benchKinds) {
					b.Fatalf("%d groups", len(g))
				}
			}
			b.ReportMetric(float64(benchDeadLetters*b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
