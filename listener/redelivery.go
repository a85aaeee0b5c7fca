package listener

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/internal/chainctx"
	"github.com/amqpretry/amqpretry/middleware"
)

// A message that kills the process handling it never returns an error: the
// broker requeues it when the connection drops and hands it to the next
// consumer, which dies too. Quorum queues count those deliveries
// (x-delivery-count); past WithRedeliveryLimit the listener sends the
// message to the chain's recoverer without running the chain, whose user
// middleware may be what crashes.

// EventRedeliveryLimit is the event on the process span of a delivery that
// went to the recoverer (or was rejected) because of WithRedeliveryLimit,
// with the attributes AttrDeliveryCount and AttrRedeliveryLimit.
const EventRedeliveryLimit = "redelivery limit"

// Attributes of EventRedeliveryLimit.
const (
	AttrDeliveryCount   = "amqpretry.delivery_count"   // the broker's x-delivery-count
	AttrRedeliveryLimit = "amqpretry.redelivery_limit" // WithRedeliveryLimit's n
)

// overLimitHandler is what a delivery past the limit runs instead of the
// chain: a handler that fails for good with a *RedeliveryLimitError, inside
// Recover(r) when the chain has a recoverer r, so that the recovery is
// recorded, settled and telemetered as any other.
func overLimitHandler(r any, limit int) (h middleware.Handler, recovers bool) {
	h = func(_ context.Context, d *amqp.Delivery) error {
		return middleware.Permanent(&RedeliveryLimitError{Deliveries: amqphdr.DeliveryCount(d.Headers), Limit: limit})
	}
	rec, ok := r.(middleware.Recoverer)
	if !ok {
		return h, false
	}
	// A survey of its own, so that this Recover is not reported to one that
	// may be running around New (New called while a chain is built).
	chainctx.SurveyChain(func() { h = middleware.Recover(rec)(h) })
	return h, true
}

// overRedeliveryLimit reports whether d has been delivered the limit's
// times before, and its count.
func (l *Listener) overRedeliveryLimit(d *amqp.Delivery) (int, bool) {
	limit := l.cfg.redeliveryLimit
	if limit == 0 || !d.Redelivered {
		return 0, false
	}
	n, counted := amqphdr.Count(d.Headers[amqphdr.XDeliveryCount])
	if !counted {
		l.tellUncounted()
		return 0, false
	}
	return n, n >= limit
}

// tellUncounted says once that the queue gives no delivery count: a
// redelivered message without x-delivery-count (a classic queue). Counting
// the redelivered flag instead would recover every message that was in
// flight when a connection dropped.
func (l *Listener) tellUncounted() {
	if !l.uncountedToldOnce.CompareAndSwap(false, true) {
		return
	}
	l.cfg.logger.Warn("listener: WithRedeliveryLimit cannot act on this queue: it does not count deliveries "+
		"(a redelivered message came without x-delivery-count; classic queues only set the redelivered flag). "+
		"A message that kills the process will be redelivered for ever: use a quorum queue",
		"queue", l.queue, "redelivery_limit", l.cfg.redeliveryLimit)
}

// callOverLimit hands dd to the chain's recoverer, or fails it for good,
// without running the chain.
func (c *consumer) callOverLimit(dd *delivery, d *amqp.Delivery, count int, span trace.Span) error {
	l := c.sv.l
	if span.IsRecording() {
		span.AddEvent(EventRedeliveryLimit, trace.WithAttributes(
			attribute.Int(AttrDeliveryCount, count), attribute.Int(AttrRedeliveryLimit, l.cfg.redeliveryLimit)))
	}
	next := "rejecting it without requeue: the queue's dead-letter exchange takes it, if it has one (the chain has no Recover)"
	if l.hasRecoverer {
		next = "handing it to the chain's recoverer"
	}
	l.cfg.logger.Warn("listener: a message was delivered as often as WithRedeliveryLimit allows without being settled "+
		"(the process handling it may have died each time); not running the handler again, "+next,
		"queue", l.queue, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag,
		amqphdr.XDeliveryCount, count, "redelivery_limit", l.cfg.redeliveryLimit)
	return c.call(dd, l.overLimit, d)
}

// A crash takes every delivery in flight with it, and the broker counts a
// delivery for each. If the process came back at full prefetch, the messages
// returned beside the one that kills it would be in flight at each of its
// crashes and reach the limit with it: recovered without ever having run.
// So with WithRedeliveryLimit a connection starts careful: one consumer at
// prefetch 1, handling returned messages one at a time, so that the next
// crash counts only the message that causes it. Quorum queues deliver
// returned messages before the others, so the first message that was never
// delivered before ends it, once the consumer has run for a second (the
// broker may take a moment to return what a dead connection held, and a
// fresh message may come first); so does a second with no handler running.
// The listener then starts its consumers at full prefetch. The careful
// consumer handles what it still receives after its cancel rather than
// nacking it, which would count as a delivery.

// carefulFor is how long a careful consumer runs at least, unless it is
// idle, and how long it must have no handler running to be idle: the
// returned messages are through, or the one it holds waits between retries,
// not in a handler.
const carefulFor = time.Second

// calmEnough reports whether a fresh message may end the careful start.
func (s *session) calmEnough() bool {
	return s.careful && len(s.active) > 0 && time.Since(s.carefulSince) >= carefulFor
}

func (s *session) beCareful() {
	s.careful = true
	s.sv.l.cfg.logger.Info("listener: starting with one consumer at prefetch 1 until the messages returned unsettled are through, "+
		"so that a message that kills the process takes no other with it (WithRedeliveryLimit)", "queue", s.sv.l.queue)
}

// carefulIdle reports whether the careful consumer has had no handler running
// for carefulFor.
func (s *session) carefulIdle() bool {
	if len(s.active) == 0 {
		return false // not started yet: nothing has come back
	}
	now := monotime()
	for _, c := range s.active {
		if c.running.Load() > 0 || c.current.Load() != nil || time.Duration(now-c.lastActive.Load()) < carefulFor {
			return false
		}
	}
	return true
}

// endCare stops the careful consumer (its deliveries in flight finish and
// settle on its channel); fillToMin then starts the usual ones.
func (s *session) endCare(why string) {
	s.careful = false
	for _, c := range s.active {
		c.handOver.Store(true)
		c.stop()
	}
	s.active = s.active[:0]
	s.sv.l.cfg.logger.Info("listener: consuming at full prefetch", "queue", s.sv.l.queue, "why", why)
}

// WithRedeliveryLimit protects the fleet from a message that kills the
// process handling it (out of memory, a crash in cgo, os.Exit in a library,
// a SIGKILL for a stuck handler): no Retry ever sees an error, and the broker
// hands the message to the next instance, which dies too. A delivery that
// the broker says was delivered n times before without being settled
// (x-delivery-count, which only quorum queues report) goes to the chain's
// recoverer with a *RedeliveryLimitError, before the handler or any
// middleware runs; with no Recover in the chain it is rejected without
// requeue (the queue's dead-letter exchange takes it, if it has one).
//
// The recoverer is that of the Recover nearest the handler, the one a
// Permanent error of the handler reaches; New finds it by building the
// chain, never by running it. A recoverer that fails leaves the message on
// its queue, as always.
//
// Every return counts toward x-delivery-count: a crash, a lost connection,
// a requeue after a failure, and before RabbitMQ 4.3 a shutdown's nack. So
// that messages in flight beside the one that kills the process are not
// counted along with it at every crash, the listener starts (and restarts
// after a lost connection) with one consumer at prefetch 1 until the
// returned messages are through (see "Redelivery limit" in the package
// doc). Pick n above the returns a healthy message may see, 3 or more, and
// below the queue's own delivery limit (20 by default on RabbitMQ 4), past
// which the broker dead-letters or drops the message itself.
//
// Classic queues report no x-delivery-count, only the redelivered flag,
// which a single lost connection sets: there the limit cannot act, and the
// listener says so once, at the first redelivered message. Default: off.
func WithRedeliveryLimit(n int) Option {
	return func(c *config) {
		if n < 1 || n > amqphdr.MaxCount {
			c.fail("WithRedeliveryLimit expects 1 to %d, got %d", amqphdr.MaxCount, n)
		}
		c.redeliveryLimit = n
	}
}
