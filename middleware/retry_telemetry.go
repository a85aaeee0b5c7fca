package middleware

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// Attribute names of the attempt spans. AttrOutcome also labels the
// amqpretry.attempts and amqpretry.recoveries metrics and the "recovery"
// span event.
const (
	AttrAttempt    = telemetry.KeyAttempt    // "amqpretry.attempt": the attempt's number, 1-based
	AttrOutcome    = telemetry.KeyOutcome    // "amqpretry.outcome": how the attempt or the recovery ended
	AttrRetryDelay = telemetry.KeyRetryDelay // "amqpretry.retry.delay": seconds until the next attempt, on the "retry scheduled" event
	AttrRetryRule  = telemetry.KeyRetryRule  // "amqpretry.retry.rule": the rule that decided after a failed attempt (RuleApplied), when Retry has rules; also on the "recovery" event
)

// startAttempt opens the attempt's span and the context the chain below
// sees. Attempts are traced as children of a recording span (the listener's
// process span): under an unsampled parent they would be dropped anyway, and
// a root span per attempt is rarely wanted, so untraced deliveries pay
// nothing for tracing.
//
// The first attempt gets no span while it runs: most deliveries succeed at
// once, and for them the process span is the attempt (a second span would
// cost about 5% of throughput for nothing). If it fails, failedFirst records
// its span then, with its true start time, so a retried delivery shows one
// child span per attempt; spans the handler opened during that first attempt
// hang under the process span.
func (ex *execution) startAttempt(ctx context.Context, n int) (*attemptContext, trace.Span) {
	span := trace.SpanFromContext(ctx) // not recording: End and the rest do nothing
	sctx := ctx
	switch {
	case !span.IsRecording():
	case n == 1:
		ex.firstStart, ex.firstTraced = telemetry.Mono(), true // half the clock reads of time.Now
		span = telemetry.NoSpan
	default:
		sctx, span = ex.tel.Tracer.Start(ctx, "attempt", trace.WithAttributes(attribute.Int(AttrAttempt, n)))
	}
	if n == 1 {
		ex.first = attemptContext{Context: sctx, exec: ex, attempt: 1}
		return &ex.first, span
	}
	return &attemptContext{Context: sctx, exec: ex, attempt: n}, span
}

// failedFirst records the span of a first attempt that failed, from its
// start; other attempts keep the span they have.
func (ex *execution) failedFirst(ctx context.Context, n int, span trace.Span) trace.Span {
	if n != 1 || !ex.firstTraced {
		return span
	}
	_, span = ex.tel.Tracer.Start(ctx, "attempt", trace.WithTimestamp(telemetry.MonoTime(ex.firstStart)), trace.WithAttributes(attribute.Int(AttrAttempt, 1)))
	return span
}

// retryScheduled notes on the attempt's span the wait before the next one.
func (ex *execution) retryScheduled(span trace.Span, delay time.Duration) {
	if span.IsRecording() {
		span.AddEvent("retry scheduled", trace.WithAttributes(attribute.Float64(AttrRetryDelay, delay.Seconds())))
	}
}

// endAttempt closes the attempt's span and counts the attempt by outcome;
// rule is the rule that decided after it failed, or "".
func (ex *execution) endAttempt(ctx context.Context, span trace.Span, outcome telemetry.Outcome, err error, rule string) {
	if span.IsRecording() { // ours: startAttempt only starts spans that record
		span.SetAttributes(outcome.Attr())
		if err != nil {
			span.SetStatus(codes.Error, errtext.String(err))
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		}
		if rule != "" {
			span.SetAttributes(attribute.String(AttrRetryRule, rule))
		}
		span.End()
	}
	ex.tel.Attempts.Add(ctx, 1, ex.attrs.Outcome(outcome).Add...)
}
