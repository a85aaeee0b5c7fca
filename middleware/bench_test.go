package middleware_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/middleware"
)

func handledAtOnce(context.Context, *amqp.Delivery) error { return nil }

// BenchmarkDirect is the baseline: the handler called without a chain.
func BenchmarkDirect(b *testing.B) {
	h := middleware.Handler(handledAtOnce)
	ctx, d := context.Background(), &amqp.Delivery{}
	b.ReportAllocs()
	for b.Loop() {
		_ = h(ctx, d)
	}
}

// BenchmarkChainSuccess is the success path of the usual chain: what every
// healthy message pays for retry and recovery being available.
func BenchmarkChainSuccess(b *testing.B) {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	h := middleware.Chain(middleware.Retry(5), middleware.Recover(r))(handledAtOnce)
	ctx, d := context.Background(), &amqp.Delivery{}
	b.ReportAllocs()
	for b.Loop() {
		_ = h(ctx, d)
	}
}

// BenchmarkChainSuccessWithPanicGuard adds CatchPanics, as the listener does.
func BenchmarkChainSuccessWithPanicGuard(b *testing.B) {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	h := middleware.Chain(middleware.Retry(5), middleware.Recover(r), middleware.CatchPanics())(handledAtOnce)
	ctx, d := context.Background(), &amqp.Delivery{}
	b.ReportAllocs()
	for b.Loop() {
		_ = h(ctx, d)
	}
}

// BenchmarkChainSuccessWithRules is BenchmarkChainSuccess with per-error
// rules: a healthy message never looks at them.
func BenchmarkChainSuccessWithRules(b *testing.B) {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	h := middleware.Chain(middleware.Retry(5,
		middleware.RetryOn(middleware.ErrorIs("timeout", context.DeadlineExceeded), 5),
		middleware.NoRetryOn(middleware.ErrorAs[*middleware.PermanentError]("permanent"))),
		middleware.Recover(r))(handledAtOnce)
	ctx, d := context.Background(), &amqp.Delivery{}
	b.ReportAllocs()
	for b.Loop() {
		_ = h(ctx, d)
	}
}

// BenchmarkRecoveredByRule is a failure that a rule does not retry, routed
// to its recoverer: the cost of matching the rules and naming the one that
// applied, against BenchmarkRecoveredAtOnce.
func BenchmarkRecoveredByRule(b *testing.B) {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	h := middleware.Chain(middleware.Retry(5,
		middleware.RetryOn(middleware.ErrorIs("timeout", context.DeadlineExceeded), 5),
		middleware.NoRetryOn(middleware.ErrorIs("validation", errBoom))),
		middleware.Recover(r))(func(context.Context, *amqp.Delivery) error { return errBoom })
	ctx, d := context.Background(), &amqp.Delivery{}
	b.ReportAllocs()
	for b.Loop() {
		_ = h(ctx, d)
	}
}

// BenchmarkRecoveredAtOnce is a Permanent failure recovered by a Retry
// without rules.
func BenchmarkRecoveredAtOnce(b *testing.B) {
	r := middleware.RecovererFunc(func(context.Context, *amqp.Delivery, error) error { return nil })
	permanent := middleware.Permanent(errBoom)
	h := middleware.Chain(middleware.Retry(5), middleware.Recover(r))(func(context.Context, *amqp.Delivery) error { return permanent })
	ctx, d := context.Background(), &amqp.Delivery{}
	b.ReportAllocs()
	for b.Loop() {
		_ = h(ctx, d)
	}
}
