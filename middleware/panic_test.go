package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

func explode(context.Context, *amqp.Delivery) error { panic("index out of range") }

func TestCatchPanics(t *testing.T) {
	err := middleware.CatchPanics()(explode)(context.Background(), &amqp.Delivery{})
	var pe *middleware.PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want a *PanicError", err)
	}
	if pe.Value != "index out of range" {
		t.Errorf("Value = %v", pe.Value)
	}
	if !strings.Contains(string(pe.Stack), "middleware_test.explode") {
		t.Errorf("stack does not show the panicking function:\n%s", pe.Stack)
	}
	if err.Error() != "middleware: handler panicked: index out of range" {
		t.Errorf("Error() = %q", err)
	}
}

func TestPanicIsRetriedAndRecovered(t *testing.T) {
	calls := 0
	h := func(ctx context.Context, d *amqp.Delivery) error {
		calls++
		return explode(ctx, d)
	}
	r := &recordingRecoverer{}
	chain := middleware.Chain(middleware.Retry(3, middleware.WithClock(middleware.NewFakeClock())), middleware.Recover(r), middleware.CatchPanics())
	if err := chain(h)(context.Background(), &amqp.Delivery{}); err != nil {
		t.Fatalf("err = %v, want nil after recovery", err)
	}
	var pe *middleware.PanicError
	if calls != 3 || r.Calls() != 1 || !errors.As(r.causes[0], &pe) {
		t.Fatalf("calls = %d, recovered %v; want 3 attempts and the panic recovered once", calls, r.causes)
	}
}

func TestPanicWithPermanentErrorIsNotRetried(t *testing.T) {
	calls := 0
	h := func(context.Context, *amqp.Delivery) error { calls++; panic(middleware.Permanent(errBoom)) }
	err := middleware.Chain(middleware.Retry(3), middleware.CatchPanics())(h)(context.Background(), &amqp.Delivery{})
	if calls != 1 || chainrun.SettlementFor(err) != chainrun.Reject || !errors.Is(err, errBoom) {
		t.Fatalf("err = %v after %d calls, want a rejected permanent panic after 1", err, calls)
	}
}

// unwrapPanics is a typed nil whose Unwrap reads a field.
type unwrapPanics struct{ cause error }

func (e *unwrapPanics) Error() string { return "unwrapPanics" }
func (e *unwrapPanics) Unwrap() error { return e.cause }

// A handler's error that panics when looked into (errors.Is calls its
// Unwrap) becomes a *PanicError that says so, which every middleware above
// and the settlement can look into; well-behaved errors pass unchanged, and
// so does the settlement of a hostile error that reached it some other way.
func TestCatchPanicsVetsTheHandlersError(t *testing.T) {
	var hostile *unwrapPanics
	err := middleware.CatchPanics()(func(context.Context, *amqp.Delivery) error { return hostile })(context.Background(), &amqp.Delivery{})
	var pe *middleware.PanicError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "*middleware_test.unwrapPanics whose Unwrap or Is method panicked") {
		t.Fatalf("err = %v, want a *PanicError naming the type", err)
	}
	plain := errors.New("plain")
	if got := middleware.CatchPanics()(func(context.Context, *amqp.Delivery) error { return plain })(context.Background(), &amqp.Delivery{}); got != plain {
		t.Errorf("a plain error came back as %v", got)
	}
	if got := chainrun.SettlementFor(fmt.Errorf("wrapped: %w", error(hostile))); got != chainrun.Requeue {
		t.Errorf("SettlementFor(hostile) = %v, want requeue", got)
	}
	if got := chainrun.ErrorType(hostile); got != "*middleware_test.unwrapPanics" {
		t.Errorf("ErrorType(hostile) = %q", got)
	}
}
