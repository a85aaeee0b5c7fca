package dlx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqpretry/amqpretry/internal/amqpconn"
	"github.com/amqpretry/amqpretry/internal/amqphdr"
	"github.com/amqpretry/amqpretry/middleware"
	"github.com/amqpretry/amqpretry/recoverer"
)

// DelayedRedelivery is RabbitMQ 4.3's delayed retry of a quorum queue, the
// broker-side retry without retry queues (MassTransit calls it delayed
// redelivery, Spring AMQP a stateful retry that the broker paces): a
// delivery that the consumer rejects with requeue waits in the queue itself
// before it is delivered again, and past Redeliveries the broker
// dead-letters it, at least once, to the DLX. Nothing is republished, no
// consumer holds a waiting message, no TTL queue exists.
//
// The broker's backoff is linear, not exponential: the k-th redelivery after
// a failure waits Min·k, capped at Max (Min 1s, Max 10s: 1s, 2s, 3s, ... 10s,
// 10s). A delivery returned by a lost connection or a crashed consumer counts
// and waits the same way; one handed back with basic.nack (a listener
// shutting down, a consumer timeout) neither counts nor waits.
//
// Recover with the topology's Redeliver recoverer: it hands each failure
// back to the broker and, on the last delivery, publishes the message to the
// DLQ with the fault headers (exception, stack, attempts) that a broker
// dead-lettering would not write.
type DelayedRedelivery struct {
	// Redeliveries is how many times the broker delivers a failed message
	// again, the work queue's x-delivery-limit: a message is delivered at
	// most Redeliveries+1 times. 1 to 10,000.
	Redeliveries int
	// Min is the wait before the first redelivery (x-delayed-retry-min), and
	// the step the waits grow by; at least 1ms, in whole milliseconds.
	Min time.Duration
	// Max caps each wait (x-delayed-retry-max); at least Min. Zero: Min
	// times Redeliveries, no cap.
	Max time.Duration
	// FallbackToTiers makes a Topology declared on a broker older than 4.3
	// lay out TTL retry tiers with the same delays (TierEquivalent) instead
	// of failing; Redeliver then publishes to them. Older brokers accept the
	// delayed-retry arguments and ignore them, which would redeliver every
	// failure at once: without this option Declare refuses them.
	FallbackToTiers bool
}

// MaxRedeliveries bounds DelayedRedelivery.Redeliveries.
const MaxRedeliveries = 10000

// Delay is the broker's wait before redelivery k (1 for the first).
func (r DelayedRedelivery) Delay(k int) time.Duration {
	d := r.Min * time.Duration(max(k, 1))
	if r.Max > 0 {
		d = min(d, r.Max)
	}
	return d
}

// Schedule is every wait, first to last: Redeliveries of them.
func (r DelayedRedelivery) Schedule() []time.Duration {
	s := make([]time.Duration, 0, r.Redeliveries)
	for k := 1; k <= r.Redeliveries; k++ {
		s = append(s, r.Delay(k))
	}
	return s
}

func (r DelayedRedelivery) validate(t Topology) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if t.Type != Quorum {
		bad("dlx: Topology.DelayedRedelivery is a quorum queue's delayed retry (RabbitMQ 4.3): it needs Type: dlx.Quorum, got %q", cmp.Or(t.Type, Classic))
	}
	if len(t.RetryDelays) > 0 || t.SingleRetryDelay > 0 {
		bad("dlx: Topology.DelayedRedelivery has the work queue wait itself: drop Topology.RetryDelays and Topology.SingleRetryDelay (or DelayedRedelivery, for TTL tiers)")
	}
	if t.SkipWorkQueue {
		bad("dlx: Topology.DelayedRedelivery is set on the work queue as it is declared: not with Topology.SkipWorkQueue")
	}
	if r.Redeliveries < 1 || r.Redeliveries > MaxRedeliveries {
		bad("dlx: Topology.DelayedRedelivery.Redeliveries expects 1 to %d, got %d", MaxRedeliveries, r.Redeliveries)
	}
	if r.Min < time.Millisecond || r.Min%time.Millisecond != 0 {
		bad("dlx: Topology.DelayedRedelivery.Min expects whole milliseconds, at least 1ms, got %v", r.Min)
	}
	if r.Max != 0 && (r.Max < r.Min || r.Max%time.Millisecond != 0) {
		bad("dlx: Topology.DelayedRedelivery.Max expects 0 (no cap) or whole milliseconds, at least Min (%v), got %v", r.Min, r.Max)
	}
	if r.Max > math.MaxUint32*time.Millisecond {
		bad("dlx: Topology.DelayedRedelivery.Max expects at most %v (the broker's limit), got %v", math.MaxUint32*time.Millisecond, r.Max)
	}
	if t.DeliveryLimit != 0 && t.DeliveryLimit != r.Redeliveries {
		bad("dlx: Topology.DeliveryLimit %d and Topology.DelayedRedelivery.Redeliveries %d both set the work queue's x-delivery-limit: drop DeliveryLimit", t.DeliveryLimit, r.Redeliveries)
	}
	return errs
}

// arguments are the work queue's arguments for the broker's delayed retry.
func (r DelayedRedelivery) arguments() amqp.Table {
	args := amqp.Table{
		"x-delayed-retry-type": "failed",
		"x-delayed-retry-min":  r.Min.Milliseconds(),
		"x-delivery-limit":     int64(r.Redeliveries),
	}
	if r.Max > 0 {
		args["x-delayed-retry-max"] = r.Max.Milliseconds()
	}
	return args
}

// TierEquivalent is the TTL-tier layout that retries as DelayedRedelivery
// does, for brokers older than 4.3: one tier per distinct wait of the
// schedule and as many retries, then the DLQ. Recover it with Tiers and
// MaxRetries(Redeliveries); Redeliver does so when the fallback applies.
func (t Topology) TierEquivalent() Topology {
	r := t.DelayedRedelivery
	if r == nil {
		return t
	}
	tiers := t
	tiers.DelayedRedelivery = nil
	tiers.RetryDelays = slices.Compact(r.Schedule())
	return tiers
}

// ErrNeedsRabbitMQ43 is what Declare returns, inside a *VersionError, for a
// DelayedRedelivery on a broker older than RabbitMQ 4.3 without
// FallbackToTiers, or on a channel whose broker it cannot tell.
var ErrNeedsRabbitMQ43 = errors.New("dlx: delayed redelivery needs RabbitMQ 4.3 or newer")

// VersionError says which broker refused a layout and what to use instead.
type VersionError struct {
	Queue  string
	Broker string // "RabbitMQ 4.0.5", or "" when it cannot be told
}

func (e *VersionError) Error() string {
	if e.Broker == "" {
		return fmt.Sprintf("dlx: cannot tell the broker's version on this channel, and Topology.DelayedRedelivery of queue %q needs RabbitMQ 4.3 "+
			"(older brokers accept its arguments and ignore them): declare it with Topology.DeclareOn(conn) or listener.WithDeclare(topo.Declare), "+
			"which know the broker", e.Queue)
	}
	return fmt.Sprintf("dlx: Topology.DelayedRedelivery of queue %q needs RabbitMQ 4.3 or newer (a quorum queue's x-delayed-retry), but the broker is %s, "+
		"which would accept the arguments and redeliver every failure at once: set DelayedRedelivery.FallbackToTiers to lay out TTL retry tiers "+
		"with the same delays instead (Topology.TierEquivalent), or use Topology.RetryDelays and Tiers", e.Queue, e.Broker)
}

func (e *VersionError) Unwrap() error { return ErrNeedsRabbitMQ43 }

// useTiers tells, for a channel to the broker, whether the topology's
// delayed redelivery runs as TTL tiers there, or why it cannot run at all.
func (t Topology) useTiers(v amqpconn.ServerVersion) (bool, error) {
	switch {
	case t.DelayedRedelivery == nil:
		return false, nil
	case v.AtLeast(4, 3):
		return false, nil
	case !v.Known:
		return false, &VersionError{Queue: t.Queue}
	case t.DelayedRedelivery.FallbackToTiers:
		return true, nil
	}
	return false, &VersionError{Queue: t.Queue, Broker: v.Product + " " + v.String()}
}

// DeclareOn is Declare on a channel of its own on conn, which it closes
// after: it knows the broker's version, which DelayedRedelivery needs.
func (t Topology) DeclareOn(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("dlx: open a channel to declare %s: %w", t.Queue, err)
	}
	defer ch.Close()
	defer amqpconn.Remember(ch, amqpconn.VersionOf(conn.Properties))()
	return t.Declare(ch)
}

// RedeliveryRecoverer is the recoverer of a DelayedRedelivery topology; see
// Redeliver.
type RedeliveryRecoverer struct {
	t     Topology
	dlq   *recoverer.Republisher
	tiers *TierRecoverer // the fallback, nil without FallbackToTiers
	// answers[k-1] is the answer to a failure of delivery k, made once:
	// every failure below the last returns one, and they never change.
	answers []redeliveryError
}

var _ middleware.Recoverer = (*RedeliveryRecoverer)(nil)

// Redeliver returns the recoverer for the topology's DelayedRedelivery. A
// failure below the last delivery goes back to the broker
// (middleware.ErrRedeliver: basic.reject with requeue, counted, and the
// queue waits before delivering it again); on the last delivery, which
// x-delivery-count tells, and for a Permanent error at once, it publishes
// the message to the DLQ with the fault headers and waits for the broker's
// confirm, so the dead letter says why it failed and how often. Local retries
// compose in front:
//
//	middleware.Chain(middleware.Retry(3), middleware.Recover(topo.Redeliver(pub)))
//
// makes three quick attempts per delivery, then the broker's slower ones.
// Should the publish to the DLQ fail on the last delivery (the publisher
// cut off for longer than the publish timeout), the listener requeues the
// message as for any failed recovery, and the broker, past its limit,
// dead-letters it itself: it reaches the DLQ without the fault headers.
// On a broker older than 4.3 with FallbackToTiers it recovers through the
// TierEquivalent layout instead (it knows the broker from the delivery's
// channel, as the listener opens it). Redeliver panics if the topology is
// invalid or has no DelayedRedelivery, or pub is nil, naming every problem.
func (t Topology) Redeliver(pub recoverer.Publisher, opts ...TierOption) *RedeliveryRecoverer {
	errs := []error{t.Validate()}
	if t.DelayedRedelivery == nil {
		errs = append(errs, errors.New("dlx: Redeliver needs Topology.DelayedRedelivery"))
	}
	if err := errors.Join(errs...); err != nil {
		panic(err.Error())
	}
	cfg := tierConfig{}
	for _, opt := range opts {
		opt(&cfg)
	}
	// The dead letter says how often the broker redelivered it, as the
	// tiers' do (x-retry-count); x-delivery-count is the broker's and is
	// dropped.
	retries := recoverer.WithHeaders(func(_ context.Context, d *amqp.Delivery, _ error) amqp.Table {
		return amqp.Table{RetryCountHeader: int64(Deliveries(d) - 1)}
	})
	dlq, err := republish(pub, t.DLX(), t.DLQRoutingKey(), append(cfg.opts[:len(cfg.opts):len(cfg.opts)], retries))
	if err != nil {
		panic(err.Error())
	}
	r := &RedeliveryRecoverer{t: t, dlq: dlq, answers: make([]redeliveryError, t.DelayedRedelivery.Redeliveries)}
	for k := range r.answers {
		r.answers[k] = redeliveryError{delivery: k + 1, of: t.DelayedRedelivery.Redeliveries + 1, wait: t.DelayedRedelivery.Delay(k + 1)}
	}
	if t.DelayedRedelivery.FallbackToTiers {
		r.tiers = t.TierEquivalent().Tiers(pub, append([]TierOption{MaxRetries(t.DelayedRedelivery.Redeliveries)}, opts...)...)
	}
	return r
}

// Recover hands d back to the broker for a delayed redelivery, or, on its
// last delivery or for a Permanent error, publishes it to the DLQ.
func (r *RedeliveryRecoverer) Recover(ctx context.Context, d *amqp.Delivery, cause error) error {
	if r.throughTiers(d) {
		return r.tiers.Recover(ctx, d, cause)
	}
	if answer := r.handBack(d, cause); answer != nil {
		return answer
	}
	return r.dlq.Recover(ctx, d, cause)
}

// RecoversAtOnce reports whether Recover will hand d back to the broker,
// which it does without I/O, rather than publish it (to the DLQ, or a tier
// on an older broker). middleware.Recover asks, so that a listener goes on
// reading on the same goroutine after such a failure.
func (r *RedeliveryRecoverer) RecoversAtOnce(d *amqp.Delivery, cause error) bool {
	return !r.throughTiers(d) && r.handBack(d, cause) != nil
}

// throughTiers reports whether d's failure goes through the TierEquivalent
// layout: FallbackToTiers, on a broker older than 4.3.
func (r *RedeliveryRecoverer) throughTiers(d *amqp.Delivery) bool {
	if r.tiers == nil || d == nil || d.Acknowledger == nil {
		return false
	}
	tiers, _ := r.t.useTiers(amqpconn.ChannelVersion(d.Acknowledger))
	return tiers
}

// handBack is the answer that hands d back to the broker, or nil when d
// goes to the DLQ: on its last delivery, for a Permanent error, or when it
// would expire in the delay.
func (r *RedeliveryRecoverer) handBack(d *amqp.Delivery, cause error) *redeliveryError {
	k := Deliveries(d)
	if k > len(r.answers) || middleware.IsPermanent(cause) || r.expiresInDelay(d, r.answers[k-1].wait) {
		return nil
	}
	return &r.answers[k-1]
}

// expiresInDelay reports whether d's per-message TTL (its expiration, in
// milliseconds) is no longer than the broker's wait before its next
// delivery: it would expire inside the delay and reach the DLQ as "expired",
// without its fault headers and unseen by the listener, so the recoverer
// dead-letters it now instead. (The TTL runs from when the message was
// queued, so one that has waited already may have less left: the whole TTL
// is the most it can have.)
func (r *RedeliveryRecoverer) expiresInDelay(d *amqp.Delivery, delay time.Duration) bool {
	if d == nil || d.Expiration == "" {
		return false
	}
	ttl, err := strconv.ParseInt(d.Expiration, 10, 64)
	if err != nil || ttl < 0 {
		return false // not a TTL the broker would have taken either
	}
	return time.Duration(ttl)*time.Millisecond <= delay
}

// RedeliversThroughBroker reports that the recoverer hands failures back
// to the broker, which counts each as a delivery (x-delivery-count): a
// listener refuses it with WithRedeliveryLimit, which counts the same
// deliveries as crashes.
func (r *RedeliveryRecoverer) RedeliversThroughBroker() bool { return true }

// Last reports whether d is on its last delivery: the broker dead-letters
// it if it fails again.
func (r *RedeliveryRecoverer) Last(d *amqp.Delivery) bool {
	return Deliveries(d) > r.t.DelayedRedelivery.Redeliveries
}

// NextDelay is how long the broker waits before delivering d again if it
// fails now, or 0 when it would go to the DLQ.
func (r *RedeliveryRecoverer) NextDelay(d *amqp.Delivery) time.Duration {
	if r.Last(d) {
		return 0
	}
	return r.t.DelayedRedelivery.Delay(Deliveries(d))
}

// Deliveries is which delivery of the message d is, 1 for the first, from
// the broker's x-delivery-count (the returns counted before this one).
func Deliveries(d *amqp.Delivery) int {
	if d == nil {
		return 1
	}
	n, _ := amqphdr.Count(d.Headers[amqphdr.XDeliveryCount])
	return min(n, amqphdr.MaxCount-1) + 1
}

// redeliveryError is Redeliver's answer below the last delivery.
type redeliveryError struct {
	delivery, of int
	wait         time.Duration
}

func (e *redeliveryError) Error() string {
	return fmt.Sprintf("dlx: delivery %d of %d failed; the broker delivers it again in %v", e.delivery, e.of, e.wait)
}

func (e *redeliveryError) Unwrap() error { return middleware.ErrRedeliver }
