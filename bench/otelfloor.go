package main

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
)

// consumeOTelFloor is raw consumption plus the telemetry listener-otel
// produces for a healthy delivery, written straight against the SDK the way
// it costs least: what any instrumentation with that output pays. What the
// listener spends above this is ours to remove; below it, only the SDK's.
//
// The output matched, per delivery (TestOTelFloorMatchesListener checks it
// against the listener's):
//   - one CONSUMER span "process <queue>" with the listener's attributes,
//     the settlement set before it ends;
//   - messaging.client.consumed.messages +1 and a messaging.process.duration
//     measurement, both with messaging.system, messaging.operation.name and
//     messaging.destination.name;
//   - amqpretry.attempts +1 with messaging.destination.name and
//     amqpretry.outcome=succeeded (Retry counts the one attempt).
//
// The contexts match too: consumed messages is counted before the span
// starts, attempts and duration inside the span's context, where the SDK
// offers a sampled span's measurements to its exemplar reservoirs.
func consumeOTelFloor(ctx context.Context, e *env, q string, n int) (s Sample, err error) {
	sdk := newOTelSDK()
	defer func() { err = errors.Join(err, sdk.shutdown(ctx)) }()
	return consumeOTelFloorWith(ctx, e, q, n, sdk)
}

// consumeOTelFloorWith is consumeOTelFloor on providers of the caller's.
func consumeOTelFloorWith(ctx context.Context, e *env, q string, n int, sdk *otelSDK) (Sample, error) {
	f, err := newOTelFloor(sdk, q)
	if err != nil {
		return Sample{}, err
	}
	return consumeDirect(ctx, e, q, n, "otel-floor-", f.settler)
}

// floorDurationBuckets are the listener's messaging.process.duration
// buckets (internal/telemetry.DurationBuckets; the test compares them): the
// number of buckets is part of a measurement's cost.
var floorDurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// otelFloor holds the tracer, the instruments and the attribute sets, all
// built once, as the listener builds its own.
type otelFloor struct {
	tracer    trace.Tracer
	spanName  string
	spanStart []attribute.KeyValue // the fixed part of the span's attributes

	duration           metric.Float64Histogram
	consumed, attempts metric.Int64Counter
	// The options as slices built once: a lone variadic argument to an
	// interface method would be a new slice on the heap every call.
	messagingAdd    []metric.AddOption // messaging.system, operation, destination
	messagingRecord []metric.RecordOption
	succeeded       []metric.AddOption // destination, amqpretry.outcome=succeeded
}

var (
	floorConsumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
	floorSettledAck   = attribute.String("amqpretry.settlement", "ack")
)

func newOTelFloor(sdk *otelSDK, q string) (*otelFloor, error) {
	meter := sdk.mp.Meter("amqpretry-bench/otel-floor")
	duration, err1 := meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(floorDurationBuckets...))
	consumed, err2 := meter.Int64Counter("messaging.client.consumed.messages", metric.WithUnit("{message}"))
	attempts, err3 := meter.Int64Counter("amqpretry.attempts", metric.WithUnit("{attempt}"))
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, err
	}
	messaging := metric.WithAttributeSet(attribute.NewSet(
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(q)))
	return &otelFloor{
		tracer:   sdk.tp.Tracer("amqpretry-bench/otel-floor"),
		spanName: "process " + q,
		spanStart: []attribute.KeyValue{
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(q),
		},
		duration:        duration,
		consumed:        consumed,
		attempts:        attempts,
		messagingAdd:    []metric.AddOption{messaging},
		messagingRecord: []metric.RecordOption{messaging},
		succeeded: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			semconv.MessagingDestinationName(q),
			attribute.String("amqpretry.outcome", "succeeded")))},
	}, nil
}

// settler returns one consumer's settle func; its attribute buffer is
// reused from delivery to delivery, as the listener's consumers reuse
// theirs (the SDK copies what it keeps).
func (f *otelFloor) settler() func(amqp.Delivery) {
	var attrs []attribute.KeyValue
	return func(d amqp.Delivery) {
		began := time.Now()
		f.consumed.Add(context.Background(), 1, f.messagingAdd...)
		attrs = append(attrs[:0], f.spanStart...)
		attrs = append(attrs,
			semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey),
			semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag)),
			semconv.MessagingMessageBodySize(len(d.Body)))
		if d.MessageId != "" {
			attrs = append(attrs, semconv.MessagingMessageID(d.MessageId))
		}
		if d.CorrelationId != "" {
			attrs = append(attrs, semconv.MessagingMessageConversationID(d.CorrelationId))
		}
		ctx, span := f.tracer.Start(context.Background(), f.spanName, floorConsumerKind, trace.WithAttributes(attrs...))
		_ = d.Ack(false)
		f.attempts.Add(ctx, 1, f.succeeded...)
		span.SetAttributes(floorSettledAck)
		span.End()
		f.duration.Record(ctx, time.Since(began).Seconds(), f.messagingRecord...)
	}
}
