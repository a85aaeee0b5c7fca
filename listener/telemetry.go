package listener

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// AttrSettlement ("amqpretry.settlement") is the process span attribute that
// says how the delivery was settled: ack, reject, requeue or release.
const AttrSettlement = telemetry.KeySettlement

// spanAttrs are the listener's fixed attributes, built once.
type spanAttrs struct {
	start    [fixedProcessAttrs]attribute.KeyValue // on every process span
	consumed *telemetry.Attrs                      // messaging.client.consumed.messages
	ok       *telemetry.Attrs                      // messaging.process.duration when handled
	queue    *telemetry.Attrs                      // consumers, parked
}

func newSpanAttrs(tel *telemetry.Telemetry, queue string) spanAttrs {
	return spanAttrs{
		start: [fixedProcessAttrs]attribute.KeyValue{
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName(telemetry.OperationProcess),
			semconv.MessagingDestinationName(queue),
		},
		consumed: tel.Messaging(telemetry.OperationProcess, queue, ""),
		ok:       tel.Messaging(telemetry.OperationProcess, queue, ""),
		queue:    tel.Attrs(telemetry.KeyDestinationName, queue),
	}
}

var (
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
	// newRoot: a span that Run's context may carry is not every delivery's
	// parent; the producer's span is linked instead (or is the parent, with
	// WithProducerAsParent).
	newRoot = trace.WithNewRoot()
)

// A process span starts with the listener's fixed attributes
// (spanAttrs.start) and at most five of the delivery's: routing key,
// delivery tag, body size, message id and correlation id.
const (
	fixedProcessAttrs = 4
	maxProcessAttrs   = fixedProcessAttrs + 5
)

// spanBuffers are a consumer's scratch space for starting process spans,
// reused so that a delivery allocates no more than the tracer does. Only the
// consumer's current reader starts spans, one at a time; the SDK copies what
// it keeps.
type spanBuffers struct {
	attrs [maxProcessAttrs]attribute.KeyValue
	// withAttrs[n] is trace.WithAttributes(attrs[:n]...), boxed the first
	// time a span starts with n attributes: it reads attrs, rewritten in
	// place, at each Start.
	withAttrs [maxProcessAttrs + 1]trace.SpanStartOption
	opts      [4]trace.SpanStartOption
	// link is the producer's span, rewritten for each delivery that has
	// one; withLink is trace.WithLinks(link[:]...), built once.
	link     [1]trace.Link
	withLink trace.SpanStartOption

	// The context spans start from (the consumer's, always the same) and
	// whether it carries a span context that a root span must ignore.
	ctx        context.Context
	ctxHasSpan bool
}

// startAttrs fills the attributes of d's process span and returns the
// option that carries them.
func (buf *spanBuffers) startAttrs(fixed *[fixedProcessAttrs]attribute.KeyValue, d *amqp.Delivery) trace.SpanStartOption {
	if buf.attrs[0].Key == "" {
		copy(buf.attrs[:], fixed[:]) // the listener's, the same for every span
	}
	n := len(fixed)
	buf.attrs[n] = semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey)
	buf.attrs[n+1] = semconv.MessagingRabbitMQMessageDeliveryTag(int(d.DeliveryTag))
	buf.attrs[n+2] = semconv.MessagingMessageBodySize(len(d.Body))
	n += 3
	if d.MessageId != "" {
		buf.attrs[n] = semconv.MessagingMessageID(d.MessageId)
		n++
	}
	if d.CorrelationId != "" {
		buf.attrs[n] = semconv.MessagingMessageConversationID(d.CorrelationId)
		n++
	}
	if buf.withAttrs[n] == nil {
		buf.withAttrs[n] = trace.WithAttributes(buf.attrs[:n]...)
	}
	return buf.withAttrs[n]
}

// linkTo returns the option that links a span to producer.
func (buf *spanBuffers) linkTo(producer trace.SpanContext) trace.SpanStartOption {
	buf.link[0] = trace.Link{SpanContext: producer}
	if buf.withLink == nil {
		buf.withLink = trace.WithLinks(buf.link[:]...)
	}
	return buf.withLink
}

// hasSpan reports whether ctx carries a span context. Only then must a root
// span be started with trace.WithNewRoot, which costs the SDK a context and
// a span to hide it; from a context without one, a span is a root anyway.
func (buf *spanBuffers) hasSpan(ctx context.Context) bool {
	if ctx != buf.ctx { // a consumer's spans all start from its context: ask once
		buf.ctx = ctx
		buf.ctxHasSpan = !trace.SpanContextFromContext(ctx).Equal(trace.SpanContext{})
	}
	return buf.ctxHasSpan
}

// startProcess opens the delivery's CONSUMER span, with the attributes a
// sampler may look at, linked to (or, WithProducerAsParent, a child of) the
// producer's span read from the headers.
func (l *Listener) startProcess(ctx context.Context, d *amqp.Delivery, buf *spanBuffers, now int64) (context.Context, trace.Span) {
	tel := l.tel
	tel.Consumed.Int64Counter.Add(ctx, 1, l.attrs.consumed.Add...)
	if !l.cfg.producerParent && !tel.TracingRoot(now) {
		return ctx, telemetry.NoSpan // nothing records: skip building the span
	}
	opts := append(buf.opts[:0], consumerKind, buf.startAttrs(&l.attrs.start, d))
	root := true
	if len(d.Headers) == 0 {
		// nothing to extract
	} else if producer := trace.SpanContextFromContext(tel.Propagators.Extract(context.Background(), telemetry.TableCarrier(d.Headers))); producer.IsValid() {
		if l.cfg.producerParent {
			ctx, root = trace.ContextWithRemoteSpanContext(ctx, producer), false
		} else {
			opts = append(opts, buf.linkTo(producer))
		}
	}
	if root && buf.hasSpan(ctx) {
		opts = append(opts, newRoot)
	}
	sctx, span := tel.Tracer.Start(ctx, l.spanName, opts...)
	if root {
		tel.ObserveRoot(span)
	}
	return sctx, span
}

// settlementAttrs are the amqpretry.settlement attributes, built once.
var settlementAttrs = func() (attrs [chainrun.Release + 1][]attribute.KeyValue) {
	for s := chainrun.Ack; s <= chainrun.Release; s++ {
		attrs[s] = []attribute.KeyValue{attribute.String(AttrSettlement, s.String())}
	}
	return attrs
}()

func settlementAttr(s chainrun.Settlement) []attribute.KeyValue {
	if int(s) < len(settlementAttrs) && settlementAttrs[s] != nil {
		return settlementAttrs[s]
	}
	return []attribute.KeyValue{attribute.String(AttrSettlement, s.String())}
}

// endProcess closes the span and records the processing time.
func (l *Listener) endProcess(ctx context.Context, span trace.Span, began int64, err error, s chainrun.Settlement) {
	failed := s != chainrun.Ack
	// The error's type (a type name, formatted) only for a span or a
	// histogram that records it: without an SDK, a failure costs no Sprintf.
	errType := ""
	if span.IsRecording() {
		span.SetAttributes(settlementAttr(s)...)
		if failed {
			errType = chainrun.ErrorType(err)
			span.SetStatus(codes.Error, errtext.String(err))
			span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		}
	}
	span.End()
	// Without a meter provider that wants it (no SDK), skip the clock read too.
	if h := l.tel.ProcessDuration.Float64Histogram; h.Enabled(ctx) {
		attrs := l.attrs.ok
		if failed {
			if errType == "" {
				errType = chainrun.ErrorType(err)
			}
			attrs = l.tel.Messaging(telemetry.OperationProcess, l.queue, errType)
		}
		h.Record(ctx, time.Duration(monotime()-began).Seconds(), attrs.Record...)
	}
}

// WithTracerProvider sets where the process spans go, and the attempt spans
// of a Retry in the chain that has no provider of its own. Default: the
// global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.telemetry.TracerProvider = tp }
}

// WithMeterProvider sets where the listener's metrics go, and those of the
// Retry and Recover in its chain. Default: the global provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.telemetry.MeterProvider = mp }
}

// WithPropagators sets how the producer's trace context is read from the
// message headers. Default: the global propagators.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.telemetry.Propagators = p }
}

// WithProducerAsParent makes the producer's span, read from the traceparent
// header, the parent of the process span. By default it is linked instead,
// as OpenTelemetry's messaging conventions advise: a consumer's trace then
// starts with it rather than hanging off a producer trace that may have
// ended long ago.
func WithProducerAsParent() Option { return func(c *config) { c.producerParent = true } }
