package deadletter

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/brokertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// queueOf declares a durable queue of kind (classic or quorum) holding n
// messages, ids m-0000 on, deleted when the test ends.
func queueOf(t *testing.T, kind string, n int) string {
	t.Helper()
	name := brokertest.Name(t, kind)
	brokertest.Queue(t, name, amqp.Table{"x-queue-type": kind})
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprintf("m-%04d", i), Body: []byte(fmt.Sprintf("body %d", i))}
	}
	brokertest.Publish(t, name, msgs...)
	return name
}

func ids(msgs []amqp.Delivery) []string {
	out := make([]string, len(msgs))
	for i, d := range msgs {
		out[i] = d.MessageId
	}
	return out
}

func wantIDs(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("m-%04d", i))
	}
	return out
}

// drain takes every message off queue, acked, and returns their ids
// sorted; it logs their x-delivery-counts (a quorum queue's).
func drain(t *testing.T, queue string) []string {
	t.Helper()
	ch := brokertest.Channel(t, brokertest.Dial(t))
	var out []string
	counts := map[int]int{}
	for {
		d, ok := brokertest.Get(t, ch, queue)
		if !ok {
			slices.Sort(out)
			t.Logf("x-delivery-count of the %d messages: %v", len(out), counts)
			return out
		}
		c, _ := amqphdr.Count(d.Headers[amqphdr.XDeliveryCount])
		counts[c]++
		out = append(out, d.MessageId)
	}
}

// A look takes the queue's messages head first, as many as the limit or
// the queue holds, or up to the one stop picks, and Return hands them all
// back: the queue holds every one again (a classic queue in its order; a
// quorum queue of RabbitMQ 3.x puts them back behind the others).
func TestLookTakesInOrderAndHandsBack(t *testing.T) {
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			const n = 300
			q := queueOf(t, kind, n)
			ch := brokertest.Channel(t, brokertest.Dial(t))
			ctx := context.Background()
			for _, tc := range []struct {
				name  string
				limit int
				stop  func(amqp.Delivery) bool
				want  []string
			}{
				{"all", 0, nil, wantIDs(0, n)},
				{"limit", 120, nil, wantIDs(0, 120)},
				{"more than it holds", 1000, nil, wantIDs(0, n)},
				{"stop", 0, func(d amqp.Delivery) bool { return d.MessageId == "m-0041" }, wantIDs(0, 42)},
			} {
				msgs, err := Look(ctx, ch, q, tc.limit, tc.stop)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				got := ids(msgs)
				switch {
				case kind == "classic" && !slices.Equal(got, tc.want):
					t.Errorf("%s: took %d messages %v…, want %d from the head", tc.name, len(got), got[:min(5, len(got))], len(tc.want))
				case tc.stop != nil && (len(got) == 0 || got[len(got)-1] != "m-0041"):
					t.Errorf("%s: the look did not end at the message stop picked: %v", tc.name, got)
				case tc.stop == nil && len(got) != len(tc.want):
					t.Errorf("%s: took %d messages, want %d", tc.name, len(got), len(tc.want))
				}
				if d := brokertest.Depth(t, q); d != n {
					t.Errorf("%s: the queue holds %d after the look, want %d", tc.name, d, n)
				}
			}
			if got := drain(t, q); !slices.Equal(got, wantIDs(0, n)) {
				t.Errorf("after the looks the queue holds %d messages", len(got))
			}
		})
	}
}

// An empty queue is a look of nothing, at once.
func TestLookAtAnEmptyQueue(t *testing.T) {
	q := queueOf(t, "classic", 0)
	ch := brokertest.Channel(t, brokertest.Dial(t))
	for _, limit := range []int{0, 10} {
		msgs, err := Look(context.Background(), ch, q, limit, nil)
		if err != nil || len(msgs) != 0 {
			t.Errorf("limit %d: %d messages, %v", limit, len(msgs), err)
		}
	}
}

// A look cut off halfway, by its context or by its connection closing,
// loses nothing: every message is back on the queue.
func TestLookCutOffLosesNothing(t *testing.T) {
	for _, kind := range []string{"classic", "quorum"} {
		for _, cut := range []string{"context", "connection"} {
			t.Run(kind+"/"+cut, func(t *testing.T) {
				const n = 2000
				q := queueOf(t, kind, n)
				conn := brokertest.Dial(t)
				ch := brokertest.Channel(t, conn)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				seen := 0
				msgs, err := Peek(ctx, ch, q, 0, func(amqp.Delivery) bool {
					if seen++; seen == n/2 {
						if cut == "context" {
							cancel()
						} else {
							_ = conn.Close()
						}
					}
					return false
				})
				if err == nil || msgs != nil {
					t.Fatalf("a look cut off at %d of %d: %d messages, %v", n/2, n, len(msgs), err)
				}
				t.Logf("cut off after %d deliveries: %v", seen, err)
				if cut == "context" {
					_ = ch.Close() // as the console does when a look ends
				}
				brokertest.Eventually(t, 20*time.Second, "every message back on the queue", func() bool { return brokertest.Depth(t, q) == n })
				if got := drain(t, q); !slices.Equal(got, wantIDs(0, n)) {
					t.Errorf("after the cut the queue holds %d of %d messages", len(got), n)
				}
			})
		}
	}
}

// What a look costs a quorum queue's messages, by broker version: the
// x-delivery-count and the redelivered flag the next look finds. A look is
// a consumer's deliveries handed back with one basic.nack(multiple,
// requeue), applied before the channel closes (Return).
func TestWhatALookCountsOnAQuorumQueue(t *testing.T) {
	const n, looks = 100, 5
	name := brokertest.Name(t, "quorum")
	brokertest.Queue(t, name, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": 1000})
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprintf("m-%04d", i)}
	}
	brokertest.Publish(t, name, msgs...)
	perLook := 0
	if !brokertest.AtLeast(t, 4, 3) {
		perLook = 1
	}
	for i := range looks + 1 {
		ch := brokertest.Channel(t, brokertest.Dial(t))
		got, err := Look(context.Background(), ch, name, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = ch.Close()
		if len(got) != n {
			t.Fatalf("look %d took %d of %d", i, len(got), n)
		}
		counts, redelivered := map[int]int{}, 0
		for _, d := range got {
			c, _ := amqphdr.Count(d.Headers[amqphdr.XDeliveryCount])
			counts[c]++
			if d.Redelivered {
				redelivered++
			}
		}
		major, minor := brokertest.Version(t)
		t.Logf("RabbitMQ %d.%d, look %d: x-delivery-count %v, %d of %d redelivered", major, minor, i, counts, redelivered, n)
		if counts[i*perLook] != n {
			t.Errorf("look %d: x-delivery-count %v, want %d for all", i, counts, i*perLook)
		}
	}
}
