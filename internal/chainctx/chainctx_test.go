package chainctx_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqpretry/amqpretry/internal/chainctx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type hook struct{ calls int }

func (h *hook) WillWait() { h.calls++ }

// keyed answers for WaitHookKey in its own Value, as the listener's
// per-delivery context does.
type keyed struct {
	context.Context
	h *hook
}

func (k keyed) Value(key any) any {
	if key == chainctx.WaitHookKey {
		return k.h
	}
	return k.Context.Value(key)
}

func TestValuesRoundTrip(t *testing.T) {
	ctx := context.Background()
	if chainctx.Queue(ctx) != "" || chainctx.Interrupt(ctx) != nil {
		t.Fatal("an empty context should carry no queue and no interrupt")
	}
	chainctx.WillWait(ctx) // no hook: nothing happens, nothing panics

	interrupt := make(chan struct{})
	h := &hook{}
	ctx = chainctx.WithWaitHook(chainctx.WithInterrupt(chainctx.WithQueue(ctx, "orders"), interrupt), h)
	if got := chainctx.Queue(ctx); got != "orders" {
		t.Errorf("Queue = %q", got)
	}
	if chainctx.Interrupt(ctx) != (<-chan struct{})(interrupt) {
		t.Error("Interrupt did not return the channel given")
	}
	chainctx.WillWait(ctx)
	other := &hook{}
	chainctx.WillWait(keyed{context.Background(), other})
	if h.calls != 1 || other.calls != 1 {
		t.Errorf("WillWait reached the hook %d and the keyed hook %d times, want once each", h.calls, other.calls)
	}
}

// A chain whose middlewares report their waits to the probe: WorstCaseWait
// adds them up without the handler doing anything else.
func TestWorstCaseWaitAddsWhatTheChainReports(t *testing.T) {
	report := func(d time.Duration, next func(context.Context, *amqp.Delivery) error) func(context.Context, *amqp.Delivery) error {
		return func(ctx context.Context, dl *amqp.Delivery) error {
			if p, ok := chainctx.ProbeFrom(ctx); ok && dl == chainctx.ProbeDelivery {
				p.Wait += d
			}
			return next(ctx, dl)
		}
	}
	handled := 0
	h := func(context.Context, *amqp.Delivery) error { handled++; return nil }
	if got := chainctx.WorstCaseWait(report(time.Second, report(2*time.Second, h))); got != 3*time.Second || handled != 1 {
		t.Fatalf("WorstCaseWait = %v after %d handler calls, want 3s after one", got, handled)
	}
}
