package publisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/telemetry"
)

// WithTracerProvider sets where the publish (PRODUCER) spans go. Default: the
// global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(cfg *config) { cfg.telemetry.TracerProvider = tp }
}

// WithMeterProvider sets where messaging.client.sent.messages and
// messaging.client.operation.duration (publish until confirm) go. Default:
// the global provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(cfg *config) { cfg.telemetry.MeterProvider = mp }
}

// WithPropagators sets how the trace context is written into the message
// headers. Default: the global propagators.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return func(cfg *config) { cfg.telemetry.Propagators = p }
}

// destination is how the conventions name an exchange; the default one has
// no name of its own.
func destination(exchange string) string {
	if exchange == "" {
		return "amq.default"
	}
	return exchange
}

// startSend opens the PRODUCER span and writes its context into a copy of
// the message's headers (the caller's table is never changed), so the
// consumer, or whoever reads a dead letter, can link back to it. Like the
// listener, it starts no root span while the tracer is known to record
// nothing (no SDK set): building the span's attributes for a no-op tracer
// was a fifth of what the publisher allocated per message.
func (p *Publisher) startSend(ctx context.Context, exchange, key string, msg *amqp.Publishing) (context.Context, trace.Span) {
	// One look up ctx's chain for the span where Tracing and the check
	// below made two: behind a listener's chain, a long one.
	span, parent := telemetry.NoSpan, trace.SpanContextFromContext(ctx)
	sampled := parent.IsValid()
	if sampled || p.tel.TracingRoot(telemetry.Mono()) {
		ctx, span = p.startSpan(ctx, exchange, key, msg)
		sampled = trace.SpanContextFromContext(ctx).IsValid()
	}
	if sampled || baggage.FromContext(ctx).Len() > 0 {
		carrier := propagation.MapCarrier{}
		p.tel.Propagators.Inject(ctx, carrier)
		if len(carrier) > 0 {
			headers := make(amqp.Table, len(msg.Headers)+len(carrier))
			for k, v := range msg.Headers {
				headers[k] = v
			}
			for k, v := range carrier {
				headers[k] = v
			}
			msg.Headers = headers
		}
	}
	return ctx, span
}

// startSpan starts the PRODUCER span with the messaging conventions, and
// notes for Tracing whether the tracer records root spans.
func (p *Publisher) startSpan(ctx context.Context, exchange, key string, msg *amqp.Publishing) (context.Context, trace.Span) {
	root := !trace.SpanContextFromContext(ctx).IsValid()
	dest := destination(exchange)
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName(telemetry.OperationSend),
			semconv.MessagingDestinationName(dest),
			semconv.MessagingRabbitMQDestinationRoutingKey(key),
			semconv.MessagingMessageBodySize(len(msg.Body)),
		),
	}
	if msg.MessageId != "" {
		opts = append(opts, trace.WithAttributes(semconv.MessagingMessageID(msg.MessageId)))
	}
	if msg.CorrelationId != "" {
		opts = append(opts, trace.WithAttributes(semconv.MessagingMessageConversationID(msg.CorrelationId)))
	}
	ctx, span := p.tel.Tracer.Start(ctx, "send "+dest, opts...)
	if root {
		p.tel.ObserveRoot(span)
	}
	return ctx, span
}

// endSend closes the span and records the outcome.
func (p *Publisher) endSend(ctx context.Context, span trace.Span, began time.Time, exchange string, err error) {
	attrs := p.tel.Messaging(telemetry.OperationSend, destination(exchange), "")
	if err != nil {
		kind := publishErrorType(err)
		attrs = p.tel.Messaging(telemetry.OperationSend, destination(exchange), kind)
		if span.IsRecording() {
			span.SetStatus(codes.Error, errtext.String(err))
			span.SetAttributes(semconv.ErrorTypeKey.String(kind))
		}
	}
	span.End()
	p.tel.Sent.Int64Counter.Add(ctx, 1, attrs.Add...)
	p.tel.OperationDuration.Float64Histogram.Record(ctx, time.Since(began).Seconds(), attrs.Record...)
}

// publishErrorType is a low-cardinality name for a publish failure.
func publishErrorType(err error) string {
	var nf *ExchangeNotFoundError
	var ce *ChannelError
	switch {
	case errors.Is(err, ErrUnroutable):
		return "unroutable"
	case errors.Is(err, ErrNacked):
		return "nacked"
	case errors.Is(err, ErrNotConfirmed):
		return "not_confirmed"
	case errors.Is(err, ErrInvalidMessage):
		return "invalid_message"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.As(err, &nf):
		return "exchange_not_found"
	case errors.As(err, &ce):
		return fmt.Sprintf("channel_exception_%d", ce.Code)
	}
	return fmt.Sprintf("%T", err)
}
