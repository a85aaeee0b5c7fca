package listener

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/errtext"
	"github.com/amqpretry/amqpretry/internal/telemetry"
	"github.com/amqpretry/amqpretry/middleware/chainrun"
)

// Events on a batch's process span (NewBatch), with AttrBatchIndex, the
// message's id and delivery tag: EventMessageFailed when the batch failed
// a message (with error.type and exception.message), EventMessageSettled
// when such a message is settled at last (with AttrSettlement).
const (
	EventMessageFailed  = "message failed"
	EventMessageSettled = "message settled"
	AttrBatchIndex      = telemetry.KeyBatchIndex // "amqpretry.batch.index": the message's place in its batch, 0-based
)

// batchSpan is a batch's CONSUMER span. It is started by the reader and
// ended by whichever goroutine settles the batch's last message.
type batchSpan struct{ span trace.Span }

// start counts the batch's messages as consumed and opens its span, linked
// to each message's producer span, and returns the context the handler and
// the failed messages' chains run in.
func (run *batchRun) start(ctx context.Context) context.Context {
	l := run.c.sv.l
	tel := l.tel
	n := len(run.dds)
	tel.Consumed.Int64Counter.Add(ctx, int64(n), l.attrs.consumed.Add...)
	run.span.span = telemetry.NoSpan
	if !tel.TracingRoot(monotime()) {
		return ctx // nothing records: skip building the span
	}
	attrs := make([]attribute.KeyValue, 0, fixedProcessAttrs+1)
	attrs = append(append(attrs, l.attrs.start[:]...), semconv.MessagingBatchMessageCount(n))
	var links []trace.Link
	for _, dd := range run.dds {
		if len(dd.Headers) == 0 {
			continue
		}
		if producer := trace.SpanContextFromContext(tel.Propagators.Extract(context.Background(), telemetry.TableCarrier(dd.Headers))); producer.IsValid() {
			if links == nil {
				links = make([]trace.Link, 0, n)
			}
			links = append(links, trace.Link{SpanContext: producer})
		}
	}
	opts := []trace.SpanStartOption{consumerKind, trace.WithAttributes(attrs...), trace.WithLinks(links...)}
	if !trace.SpanContextFromContext(ctx).Equal(trace.SpanContext{}) {
		opts = append(opts, newRoot)
	}
	sctx, span := tel.Tracer.Start(ctx, l.spanName, opts...)
	tel.ObserveRoot(span)
	run.span.span = span
	return sctx
}

// messageAttrs are the attributes that say which message of the batch an
// event is about.
func messageAttrs(dd *delivery, more int) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 3+more)
	attrs = append(attrs, attribute.Int(AttrBatchIndex, dd.fate.index), semconv.MessagingRabbitMQMessageDeliveryTag(int(dd.tag)))
	if dd.id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(dd.id))
	}
	return attrs
}

// failed notes that the batch failed dd with err.
func (s batchSpan) failed(dd *delivery, err error) {
	if !s.span.IsRecording() {
		return
	}
	attrs := append(messageAttrs(dd, 2), semconv.ErrorTypeKey.String(chainrun.ErrorType(err)),
		attribute.String(telemetry.KeyExceptionMessage, errtext.String(err)))
	s.span.AddEvent(EventMessageFailed, trace.WithAttributes(attrs...))
}

// settled notes how a message whose chain ran was settled.
func (s batchSpan) settled(dd *delivery, settlement chainrun.Settlement) {
	if !s.span.IsRecording() {
		return
	}
	s.span.AddEvent(EventMessageSettled, trace.WithAttributes(append(messageAttrs(dd, 1), settlementAttr(settlement)...)...))
}

// end closes the span once the batch's n messages are settled, notAcked of
// them otherwise than with an ack.
func (s batchSpan) end(n, notAcked int) {
	if s.span.IsRecording() && notAcked > 0 {
		s.span.SetStatus(codes.Error, fmt.Sprintf("%d of the %d messages of the batch were not acked", notAcked, n))
	}
	s.span.End()
}
