package recoverer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/recoverer"
)

// The fault headers' values are boxed once while they repeat: copies made
// one after another, and at once from several goroutines, each still carry
// their own failure's text, queue and routing key.
func TestMessageFaultTextOfEachFailure(t *testing.T) {
	r := recoverer.Republish(frameOnly{}, "", "q.dlq")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				n := (g + i) % 3
				q, key := fmt.Sprint("queue-", n), fmt.Sprint("key-", n)
				cause := fmt.Errorf("step %d: %w", n, errors.New("boom"))
				msg, err := r.Message(chainctx.WithQueue(context.Background(), q), &amqp.Delivery{RoutingKey: key, Exchange: "x"}, cause)
				if err != nil {
					t.Error(err)
					return
				}
				h := msg.Headers
				if got, want := h[recoverer.HeaderExceptionMessage], cause.Error(); got != want {
					t.Errorf("message %q, want %q", got, want)
				}
				if got := h[recoverer.HeaderExceptionStacktrace].(string); !strings.Contains(got, fmt.Sprintf("step %d:", n)) {
					t.Errorf("stack trace %q does not name step %d", got, n)
				}
				if got := h[recoverer.DefaultHeaderPrefix+recoverer.SuffixOriginalQueue]; got != q {
					t.Errorf("queue %q, want %q", got, q)
				}
				if got := h[recoverer.HeaderOriginalRoutingKey]; got != key {
					t.Errorf("routing key %q, want %q", got, key)
				}
			}
		}()
	}
	wg.Wait()
}
