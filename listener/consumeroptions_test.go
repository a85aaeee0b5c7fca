package listener_test

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
)

func TestConsumerOptionsRefusedAtNew(t *testing.T) {
	ok := func(context.Context, *amqp.Delivery) error { return nil }
	above, below := int64(math.MaxInt32)+1, int64(math.MinInt32)-1
	if int64(int(above)) != above {
		t.Skip("int has 32 bits here: every int is a valid priority")
	}
	for _, tc := range []struct {
		name string
		opts []listener.Option
		want []string // in the error
	}{
		{"priority above int32", []listener.Option{listener.WithConsumerPriority(int(above))}, []string{"WithConsumerPriority", "2147483648"}},
		{"priority below int32", []listener.Option{listener.WithConsumerPriority(int(below))}, []string{"WithConsumerPriority", "-2147483649"}},
		{"empty tag prefix", []listener.Option{listener.WithConsumerTagPrefix("")}, []string{"WithConsumerTagPrefix", `""`}},
		{"long tag prefix", []listener.Option{listener.WithConsumerTagPrefix(strings.Repeat("x", 201))}, []string{"WithConsumerTagPrefix", "at most 200", "201"}},
		{"tag prefix with a newline", []listener.Option{listener.WithConsumerTagPrefix("orders\nsvc")}, []string{"WithConsumerTagPrefix", `"orders\nsvc"`}},
		{"tag prefix not UTF-8", []listener.Option{listener.WithConsumerTagPrefix("orders\xff")}, []string{"WithConsumerTagPrefix", `"orders\xff"`}},
		{"exclusive with concurrent consumers", []listener.Option{listener.WithExclusive(), listener.WithConcurrentConsumers(2)},
			[]string{"WithExclusive", "WithConcurrentConsumers(2)", "SingleActiveConsumer"}},
		{"exclusive with max consumers", []listener.Option{listener.WithExclusive(), listener.WithMaxConcurrentConsumers(3)},
			[]string{"WithExclusive", "WithMaxConcurrentConsumers(3)"}},
		{"exclusive with both", []listener.Option{listener.WithConcurrentConsumers(2), listener.WithMaxConcurrentConsumers(4), listener.WithExclusive()},
			[]string{"WithExclusive", "WithConcurrentConsumers(2) and WithMaxConcurrentConsumers(4)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := listener.New("q", nil, ok, tc.opts...)
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New = %v, want it to say %s", err, w)
				}
			}
		})
	}
	for _, opts := range [][]listener.Option{
		{listener.WithConsumerPriority(math.MaxInt32), listener.WithConsumerTagPrefix(strings.Repeat("é", 100))},
		{listener.WithConsumerPriority(math.MinInt32), listener.WithExclusive(), listener.WithMaxConcurrentConsumers(1)},
	} {
		if _, err := listener.New("q", nil, ok, opts...); err != nil {
			t.Errorf("New = %v, want the limits accepted", err)
		}
	}
	l, err := listener.New("q", nil, ok)
	if err != nil {
		t.Fatal(err)
	}
	for _, opt := range []listener.Option{listener.WithConsumerPriority(1), listener.WithExclusive(), listener.WithConsumerTagPrefix("x")} {
		if _, err := listener.NewGroup([]*listener.Listener{l}, opt); err == nil || !strings.Contains(err.Error(), "belongs to each listener's New") {
			t.Errorf("NewGroup = %v, want a consumer option refused as the listener's", err)
		}
	}
}

// consumerRow is a line of rabbitmqctl list_consumers.
type consumerRow struct {
	tag, activity, arguments string
}

// listConsumers is what the broker says of the queue's consumers.
func listConsumers(t *testing.T, queue string) []consumerRow {
	t.Helper()
	out := brokertest.Rabbitmqctl(t, "list_consumers", "-q", "--no-table-headers", "queue_name", "consumer_tag", "activity_status", "arguments")
	var rows []consumerRow
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) == 4 && f[0] == queue {
			rows = append(rows, consumerRow{tag: f[1], activity: f[2], arguments: f[3]})
		}
	}
	return rows
}

// The tags and arguments of the listener's consumers, as the broker lists
// them: the prefix, a count and the process's random part; x-priority.
func TestConsumerTagPrefixAndPriorityReachTheBroker(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	r := start(t, q, nil, func(context.Context, *amqp.Delivery) error { return nil },
		listener.WithConsumerTagPrefix("orders-svc@host-7"), listener.WithConsumerPriority(-3), listener.WithConcurrentConsumers(2))
	brokertest.Eventually(t, 10*time.Second, "2 channels", func() bool { return r.Stats().Channels == 2 })
	var rows []consumerRow
	brokertest.Eventually(t, 10*time.Second, "the broker to list 2 consumers", func() bool { rows = listConsumers(t, q); return len(rows) == 2 })
	tag := regexp.MustCompile(`^orders-svc@host-7-[0-9]+-([0-9a-f]{8})$`)
	var random []string
	for _, row := range rows {
		m := tag.FindStringSubmatch(row.tag)
		if m == nil {
			t.Errorf("consumer tag %q, want orders-svc@host-7-<n>-<8 hex digits>", row.tag)
			continue
		}
		random = append(random, m[1])
		if !strings.Contains(row.arguments, `"x-priority",-3`) {
			t.Errorf("consumer %s has arguments %s, want x-priority -3", row.tag, row.arguments)
		}
	}
	if len(random) == 2 && (random[0] != random[1] || rows[0].tag == rows[1].tag) {
		t.Errorf("tags %q and %q: want distinct tags with the process's one random part", rows[0].tag, rows[1].tag)
	}
}

// ids is a set of message ids handled, safe for concurrent use.
type ids struct {
	mu  sync.Mutex
	ids []int
}

func (s *ids) add(d *amqp.Delivery) {
	var n int
	fmt.Sscan(d.MessageId, &n)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, n)
}

func (s *ids) sorted() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.ids))
}

func (s *ids) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func span(from, to int) []int {
	var r []int
	for i := from; i < to; i++ {
		r = append(r, i)
	}
	return r
}

// publishRange publishes messages with ids from to to-1.
func publishRange(t *testing.T, queue string, from, to int) {
	t.Helper()
	var msgs []amqp.Publishing
	for i := from; i < to; i++ {
		msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprint(i), Body: []byte(fmt.Sprint(i)), DeliveryMode: amqp.Persistent})
	}
	brokertest.Publish(t, queue, msgs...)
}

// Two listeners on a queue, the second with WithConsumerPriority: the broker
// hands the first messages to it, up to its prefetch (its handler holds the
// first, so none is acked), and the rest to the other only once it is full.
// Without priorities the broker would share them out in turn, the first to
// the listener that registered first.
func TestConsumerPriorityOrdersDeliveryBetweenListeners(t *testing.T) {
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, amqp.Table{"x-queue-type": string(typ)})
			const prefetch, more = 5, 7
			var low, high ids
			lowL := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { low.add(d); return nil }, listener.WithPrefetch(50))
			brokertest.Eventually(t, 10*time.Second, "the low-priority listener consuming", func() bool { return lowL.Stats().Consumers == 1 })
			release := make(chan struct{})
			highL := start(t, q, nil, func(ctx context.Context, d *amqp.Delivery) error {
				high.add(d)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, listener.WithConsumerPriority(10), listener.WithPrefetch(prefetch))
			brokertest.Eventually(t, 10*time.Second, "the high-priority listener consuming", func() bool { return highL.Stats().Consumers == 1 })

			publishRange(t, q, 0, prefetch)
			brokertest.Eventually(t, 10*time.Second, "the first messages delivered", func() bool { return brokertest.Depth(t, q) == 0 })
			publishRange(t, q, prefetch, prefetch+more)
			brokertest.Eventually(t, 10*time.Second, "the low-priority listener to handle the later ones", func() bool { return low.len() >= more })
			close(release)
			brokertest.Eventually(t, 10*time.Second, "every message handled", func() bool { return low.len()+high.len() >= prefetch+more })
			if got, want := high.sorted(), span(0, prefetch); !slices.Equal(got, want) {
				t.Errorf("the high-priority listener handled %v, want %v: the messages while it had room", got, want)
			}
			if got, want := low.sorted(), span(prefetch, prefetch+more); !slices.Equal(got, want) {
				t.Errorf("the low-priority listener handled %v, want %v: the messages once the other was full", got, want)
			}
		})
	}
}

// Consumer priorities on a single-active-consumer queue, as each broker
// does it: a quorum queue on RabbitMQ 4.0 and 4.3 makes a higher-priority
// consumer that joins the active one; a classic queue, and a quorum queue
// on 3.10, keep the one that registered first.
func TestConsumerPriorityOnASingleActiveQueue(t *testing.T) {
	for _, typ := range []dlx.QueueType{dlx.Classic, dlx.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			q := brokertest.Name(t, "q")
			brokertest.Queue(t, q, amqp.Table{"x-queue-type": string(typ), "x-single-active-consumer": true})
			var first, higher ids
			a := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { first.add(d); return nil })
			brokertest.Eventually(t, 10*time.Second, "the first listener consuming", func() bool { return a.Stats().Consumers == 1 })
			b := start(t, q, nil, func(_ context.Context, d *amqp.Delivery) error { higher.add(d); return nil }, listener.WithConsumerPriority(10))
			brokertest.Eventually(t, 10*time.Second, "the higher-priority listener consuming", func() bool { return b.Stats().Consumers == 1 })
			publishRange(t, q, 0, 10)
			brokertest.Eventually(t, 10*time.Second, "the messages handled", func() bool { return first.len()+higher.len() == 10 })
			takesOver := typ == dlx.Quorum && brokertest.AtLeast(t, 4, 0)
			if got := higher.len() == 10; got != takesOver || (!takesOver && first.len() != 10) {
				t.Errorf("the first listener handled %d and the higher-priority one %d; want the higher-priority one to take over: %v",
					first.len(), higher.len(), takesOver)
			}
		})
	}
}
