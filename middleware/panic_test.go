package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
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
	if calls != 1 || middleware.SettlementFor(err) != middleware.Reject || !errors.Is(err, errBoom) {
		t.Fatalf("err = %v after %d calls, want a rejected permanent panic after 1", err, calls)
	}
}
