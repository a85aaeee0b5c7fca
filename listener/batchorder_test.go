package listener_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/brokertest"
	"github.com/amqpretry/amqpretry/listener"
	"github.com/amqpretry/amqpretry/middleware"
)

// A handler that sorts its batch in place (to take row locks in one order)
// and returns PerMessage in the sorted order: each result belongs to the
// delivery the slice holds at that index when the handler returns, not to
// the one the broker sent there.
func TestBatchResultsFollowAReorderedBatch(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	dlq, recover := dlqFixture(t)
	publishN(t, q, 6)
	var mu sync.Mutex
	calls := map[string]int{}
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		// Descending: the opposite of the broker's order.
		slices.SortFunc(batch, func(a, b *amqp.Delivery) int { return strings.Compare(b.MessageId, a.MessageId) })
		errs := make([]error, len(batch))
		mu.Lock()
		defer mu.Unlock()
		for i, d := range batch {
			calls[d.MessageId]++
			if d.MessageId == "1" {
				errs[i] = middleware.Permanent(errors.New("row 1 is invalid"))
			}
		}
		return listener.PerMessage(errs)
	}
	r := startBatch(t, q, middleware.Chain(middleware.Retry(2, middleware.WithInitialInterval(10*time.Millisecond)), recover), h, 6, 5*time.Second)
	brokertest.Eventually(t, 10*time.Second, "all settled", func() bool { st := r.Stats(); return st.Handled == 6 && st.InFlight == 0 })
	r.Stop(t)
	if got := drain(t, dlq); fmt.Sprint(got) != "[1]" {
		t.Errorf("DLQ holds %v, want [1]: the failed message, and only it", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range calls {
		if n != 1 {
			t.Errorf("message %s handled %d times, want once (a success is not retried)", id, n)
		}
	}
}

// A handler that swaps a delivery of its batch for another (a copy, or one
// twice) leaves results the listener cannot match: the batch fails with
// ErrBatchResults, nothing is acked as handled.
func TestBatchThatNoLongerHoldsItsDeliveriesFails(t *testing.T) {
	q := brokertest.Name(t, "q")
	brokertest.Queue(t, q, nil)
	publishN(t, q, 3)
	var causes sync.Map
	var first sync.Once
	h := func(_ context.Context, batch []*amqp.Delivery) error {
		replaced := false
		first.Do(func() {
			if len(batch) == 3 {
				batch[2] = batch[0] // the first twice, the last gone
				replaced = true
			}
		})
		if replaced {
			return listener.PerMessage(make([]error, 3))
		}
		return listener.PerMessage(make([]error, len(batch)))
	}
	rec := middleware.RecovererFunc(func(_ context.Context, d *amqp.Delivery, cause error) error {
		causes.Store(d.MessageId, cause)
		return nil
	})
	r := startBatch(t, q, middleware.Recover(rec), h, 3, 5*time.Second)
	brokertest.Eventually(t, 10*time.Second, "all settled", func() bool { st := r.Stats(); return st.Handled == 3 && st.InFlight == 0 })
	r.Stop(t)
	for i := range 3 {
		cause, ok := causes.Load(fmt.Sprint(i))
		if !ok || !errors.Is(cause.(error), listener.ErrBatchResults) {
			t.Errorf("message %d recovered with %v, want ErrBatchResults", i, cause)
		}
	}
}
