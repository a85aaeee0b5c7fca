package listener_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/dlx"
	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
)

// handling is one handler call, for the order tests.
type handling struct {
	who        string
	id         int
	start, end time.Time
}

type handlings struct {
	mu  sync.Mutex
	all []*handling
}

func (h *handlings) begin(who string, id int) *handling {
	x := &handling{who: who, id: id, start: time.Now()}
	h.mu.Lock()
	h.all = append(h.all, x)
	h.mu.Unlock()
	return x
}

func (h *handlings) done(x *handling) {
	h.mu.Lock()
	x.end = time.Now()
	h.mu.Unlock()
}

func (h *handlings) ids(who string) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []int
	for _, x := range h.all {
		if x.who == who {
			ids = append(ids, x.id)
		}
	}
	return ids
}

// A single-active-consumer queue keeps its order across a graceful
// shutdown: the stopping listener finishes the message in its handler and
// hands back what it had prefetched before it gives up its consumer, so the
// standby (another instance of the service) starts only after that handler
// has finished, and takes the rest in queue order. Messages keep arriving
// during the shutdown, as they do in production.
func TestSingleActiveShutdownHandsOverInOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ      dlx.QueueType
		coalesce bool // WithAckCoalescing: the acks that wait are written before the channel closes
	}{{dlx.Classic, false}, {dlx.Quorum, false}, {dlx.Quorum, true}} {
		typ := tc.typ
		name := string(typ)
		if tc.coalesce {
			name += ", acks coalesced"
		}
		t.Run(name, func(t *testing.T) {
			q := brokertest.Name(t, "orders")
			topo := sacTopology(t, q, typ)
			const first, holdAt, total = 10, 10, 30
			var h handlings
			holding := make(chan struct{})
			handler := func(who string) func(ctx context.Context, d *amqp.Delivery) error {
				return func(ctx context.Context, d *amqp.Delivery) error {
					id, _ := strconv.Atoi(d.MessageId)
					x := h.begin(who, id)
					defer h.done(x)
					if who == "old" && id == holdAt {
						close(holding)
						time.Sleep(1500 * time.Millisecond) // a slow write, finished within the shutdown timeout
					}
					return nil
				}
			}
			newListener := func(who string) (*listener.Listener, context.CancelFunc, chan error) {
				opts := []listener.Option{listener.WithURL(brokertest.URL()), listener.WithDeclare(topo.Declare),
					listener.WithPrefetch(10), listener.WithShutdownTimeout(10 * time.Second), listener.WithConsumerTagPrefix(who), logTo(t, false)}
				if tc.coalesce {
					opts = append(opts, listener.WithAckCoalescing(5, time.Second))
				}
				l, err := listener.New(q, nil, handler(who), opts...)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- l.Run(ctx) }()
				t.Cleanup(func() {
					cancel()
					<-done
				})
				if err := l.WaitReady(ctx); err != nil {
					t.Fatal(err)
				}
				return l, cancel, done
			}
			_, stopOld, oldDone := newListener("old")
			newListener("new") // the standby (a quorum queue does not count it among its consumers)
			publish := func(from, to int) {
				for i := from; i <= to; i++ {
					brokertest.Publish(t, q, amqp.Publishing{MessageId: strconv.Itoa(i), DeliveryMode: amqp.Persistent})
				}
			}
			publish(1, first)
			select {
			case <-holding:
			case <-time.After(10 * time.Second):
				t.Fatal("the old listener never reached message 10")
			}
			stopOld() // SIGTERM while message 10 is in its handler
			for i := first + 1; i <= total; i++ {
				publish(i, i)
				time.Sleep(30 * time.Millisecond)
			}
			select {
			case err := <-oldDone:
				if err != nil {
					t.Errorf("the old listener's Run: %v", err)
				}
				oldDone <- nil // for the cleanup
			case <-time.After(15 * time.Second):
				t.Fatal("the old listener did not stop")
			}
			brokertest.Eventually(t, 15*time.Second, "every message handled", func() bool {
				return len(h.ids("old"))+len(h.ids("new")) >= total
			})
			h.mu.Lock()
			var heldEnd, newStart time.Time
			for _, x := range h.all {
				if x.who == "old" && x.id == holdAt {
					heldEnd = x.end
				}
				if x.who == "new" && newStart.IsZero() {
					newStart = x.start
				}
			}
			var order []int
			for _, x := range h.all {
				order = append(order, x.id)
			}
			h.mu.Unlock()
			if newStart.Before(heldEnd) {
				t.Errorf("the standby started handling %v before the old listener's handler of message %d ended: two handlers at once on an ordered queue",
					heldEnd.Sub(newStart).Round(time.Millisecond), holdAt)
			}
			for i := 1; i < len(order); i++ {
				if order[i] != order[i-1]+1 {
					t.Errorf("handled in the order %v, want 1..%d: old %v, new %v", order, total, h.ids("old"), h.ids("new"))
					break
				}
			}
			if len(order) != total {
				t.Errorf("%d handler calls, want %d: %s", len(order), total, fmt.Sprint(order))
			}
		})
	}
}
